"""The ctypes binding (app/engine/native.py) against etserve.h: status codes, struct layouts, the load check."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from app.engine import native
from app.engine.native import ABI_STRUCTS, NativeError, Status, check_abi

from pathlib import Path

NATIVE = Path(__file__).resolve().parents[2] / "native"

HEADER = (NATIVE / "include" / "etserve.h").read_text()


def header_status_codes() -> dict[str, int]:
    body = re.search(r"enum\s*\{(.*?)\};", HEADER, re.S).group(1)
    return {name: int(value) for name, value in re.findall(r"\b(ETS_[A-Z_]+)\s*=\s*(\d+)", body)}


def header_struct_fields(name: str) -> list[str]:
    body = re.search(r"typedef struct \{([^}]*)\}\s*" + name + ";", HEADER).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [re.search(r"(\w+)(\[\d+\])?\s*$", decl.strip()).group(1) for decl in body.split(";") if decl.strip()]


def test_status_enum_is_the_headers():
    codes = header_status_codes()
    assert len(codes) >= 6
    expected = {"OK" if name == "ETS_OK" else name.removeprefix("ETS_ERR_"): value for name, value in codes.items()}
    assert {s.name: s.value for s in Status} == expected


@pytest.mark.parametrize("name, struct", ABI_STRUCTS)
def test_ctypes_structs_follow_the_header_field_by_field(name, struct):
    assert [f[0] for f in struct._fields_] == header_struct_fields(name)


def test_the_library_reports_the_bindings_sizes(etserve_lib):
    etserve_lib.ets_abi_sizes.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
    sizes = (ctypes.c_int64 * 4)(-1, -1, -1, -1)
    assert etserve_lib.ets_abi_sizes(sizes, 4) == len(ABI_STRUCTS)
    assert list(sizes[:len(ABI_STRUCTS)]) == [ctypes.sizeof(s) for _, s in ABI_STRUCTS]
    assert sizes[len(ABI_STRUCTS)] == -1  # wrote no more than it has
    check_abi(etserve_lib)


def test_a_mismatched_struct_is_refused_at_load(etserve_lib, monkeypatch):
    class Shorter(ctypes.Structure):
        _fields_ = native._Sampling._fields_[:-1]  # as if etserve.h had grown a field

    monkeypatch.setattr(native, "ABI_STRUCTS", (ABI_STRUCTS[0], ("ets_sampling", Shorter)))
    with pytest.raises(NativeError, match=r"ets_sampling: \d+ bytes in the library, \d+ in app/engine/native.py"
                                          r".*rebuild it") as e:
        native._load_library(NATIVE / "build" / "libetserve.so")
    assert e.value.code == Status.INVALID_ARGUMENT


def test_native_errors_carry_a_status():
    assert NativeError("x", 4).code is Status.STATE
    assert NativeError("x").code is Status.RUNTIME
    assert NativeError("x", 99).code == 99  # unknown to the binding: kept as the number


TEST_ENTRY_POINTS = ("etserve_test_sample", "etserve_test_custom_sdpa", "etserve_test_update_cache",
                     "etserve_test_custom_quantized_sdpa", "etserve_test_sdpa_with_kv_cache")


def test_test_entry_points_live_only_in_the_test_library(etserve_lib, etserve_test_lib):
    for name in TEST_ENTRY_POINTS:
        assert not hasattr(etserve_lib, name), f"libetserve.so exports {name}: it belongs in libetserve_test.so"
        assert hasattr(etserve_test_lib, name), name


def header_functions() -> set[str]:
    """The functions etserve.h declares (ETS_API), read from the header so that new ones count."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", HEADER, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\bETS_API\b[^;{]*?\b([A-Za-z_]\w*)\s*\(", text))


def dynamic_symbols(path: Path) -> set[str]:
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in nm.stdout.splitlines() if line.strip()}


def test_production_library_exports_exactly_the_header(etserve_lib_path):
    """libetserve.so's dynamic symbols are etserve.h's functions and nothing else: no test hook
    (they live in libetserve_test.so), no C++ template instance (native/Makefile's version script)."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    declared = header_functions()
    assert {"ets_model_open", "ets_forward", "ets_sample"} <= declared, declared
    exported = dynamic_symbols(etserve_lib_path)
    assert exported == declared, (f"exported, not in etserve.h: {sorted(exported - declared)}; "
                                  f"in etserve.h, not exported: {sorted(declared - exported)}")


TEST_HOOKS = ("etserve_llm_op_count", "etserve_llm_op_name", "etserve_llm_ops_registered",
              "etserve_test_kv_layouts", "etserve_test_current_kv_layouts")


def test_test_hooks_live_in_the_test_library(etserve_lib, etserve_test_lib):
    for name in TEST_HOOKS:
        assert not hasattr(etserve_lib, name), f"libetserve.so exports {name}: it belongs in libetserve_test.so"
        assert hasattr(etserve_test_lib, name), name
