"""Where app/engine/native.py finds libetserve.so: ETSERVE_NATIVE_LIB, else inside the installed
package (the platform wheel's app/_native/), else the checkout's native/build."""

from __future__ import annotations

import pytest

from app.engine import native
from app.engine.native import NativeError, library_path


@pytest.fixture
def places(tmp_path, monkeypatch):
    monkeypatch.delenv("ETSERVE_NATIVE_LIB", raising=False)
    packaged, checkout = tmp_path / "app" / "_native" / "libetserve.so", tmp_path / "native" / "build" / "libetserve.so"
    monkeypatch.setattr(native, "_LIBRARY_PLACES", (packaged, checkout))
    return packaged, checkout


def _make(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_the_packaged_library_comes_before_the_checkouts(places):
    packaged, checkout = places
    _make(checkout)
    assert library_path() == checkout
    _make(packaged)
    assert library_path() == packaged


def test_the_environment_wins_and_must_exist(places, tmp_path, monkeypatch):
    _make(places[0])
    monkeypatch.setenv("ETSERVE_NATIVE_LIB", str(_make(tmp_path / "mine.so")))
    assert library_path() == tmp_path / "mine.so"
    monkeypatch.setenv("ETSERVE_NATIVE_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(NativeError, match="missing.so \\(ETSERVE_NATIVE_LIB\\)"):
        library_path()


def test_no_library_names_every_place(places):
    with pytest.raises(NativeError) as e:
        library_path()
    assert str(places[0]) in str(e.value) and str(places[1]) in str(e.value)


def test_the_real_places():
    """In a checkout, the package's _native/ (empty here: only a wheel fills it) then native/build."""
    packaged, checkout = native._LIBRARY_PLACES
    assert packaged.parts[-3:] == ("app", "_native", "libetserve.so")
    assert checkout.parts[-3:] == ("native", "build", "libetserve.so") and checkout.parents[2] == packaged.parents[2]
