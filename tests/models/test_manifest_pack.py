"""etserve.json (app/models/manifest.py) and pack / unpack (app/models/pack.py) on small directories:
what the server refuses, what an archive holds, and that one build packs to the same bytes.
The real model is packed, unpacked and served from a serve-only install in tests/e2e/test_serve_only.py."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile

import pytest

from app.models.manifest import (MANIFEST, ManifestError, add_checksums, check_model_dir, check_program,
                                 read_manifest, write_manifest)
from app.models.pack import pack, unpack

FIELDS = {"name": "tiny", "variant": "ctx8-fp32", "max_seq_len": 8, "vocab_size": 5,
          "built_at": "2026-11-30T08:00:00Z"}


@pytest.fixture
def built(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "model.pte").write_bytes(bytes(range(256)) * 40)
    (d / "tokenizer.json").write_text('{"model": {}}')
    (d / "tokenizer_config.json").write_text("{}")
    write_manifest(d, FIELDS)
    return d


def test_write_records_every_file_and_the_check_passes(built):
    m = check_model_dir(built)
    assert m["manifest_version"] == 1 and m["name"] == "tiny"
    assert m["files"] == {"model.pte": 10240, "tokenizer.json": 13, "tokenizer_config.json": 2}
    assert m["sha256"]["model.pte"] == hashlib.sha256((built / "model.pte").read_bytes()).hexdigest()
    assert set(m["sha256"]) == set(m["files"])
    assert not list(built.glob(".*")), "the temporary manifest was left behind"


def test_no_manifest_is_not_checked(tmp_path):
    (tmp_path / "model.pte").write_bytes(b"x")
    assert check_model_dir(tmp_path) is None


def _refused(directory) -> ManifestError:
    with pytest.raises(ManifestError) as e:
        check_model_dir(directory)
    return e.value


def test_a_changed_byte_is_refused_naming_the_file(built):
    data = bytearray((built / "tokenizer.json").read_bytes())
    data[3] ^= 1
    (built / "tokenizer.json").write_bytes(bytes(data))
    e = _refused(built)
    assert e.path == built / "tokenizer.json"
    assert str(e).startswith(f"{built / 'tokenizer.json'}: does not match its SHA-256 in etserve.json")
    assert e.public.startswith("model directory refused: tokenizer.json does not match") and str(built) not in e.public


def test_a_truncated_or_missing_file_is_refused_before_hashing(built):
    with open(built / "model.pte", "r+b") as f:
        f.truncate(1000)
    assert "model.pte: has 1000 bytes where etserve.json says 10240" in str(_refused(built))
    (built / "model.pte").unlink()
    assert "model.pte: is missing: etserve.json lists it" in str(_refused(built))


@pytest.mark.parametrize("text, problem", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"manifest_version": 2, "files": {"model.pte": 1}}', "has manifest_version 2; this etserve reads version 1"),
    ('{"manifest_version": 1}', "does not list the directory's files"),
    ('{"manifest_version": 1, "files": {"../model.pte": 1}}', "which is not a file name in its directory"),
    ('{"manifest_version": 1, "files": {"model.pte": true}}', "has a bad entry for 'model.pte'"),
    ('{"manifest_version": 1, "files": {"model.pte": 10240}, "sha256": {"x": "00"}}', "files it does not list: x"),
])
def test_a_bad_manifest_is_refused_naming_it(built, text, problem):
    (built / MANIFEST).write_text(text)
    e = _refused(built)
    assert e.path == built / MANIFEST and problem in str(e), str(e)


def test_the_program_must_agree_with_the_manifest(built):
    m = check_model_dir(built)
    check_program(m, built / "model.pte", max_seq_len=8, vocab_size=5)
    with pytest.raises(ManifestError, match="model.pte: has max_seq_len 16 where etserve.json says 8"):
        check_program(m, built / "model.pte", max_seq_len=16, vocab_size=5)


def test_an_old_manifest_gets_its_checksums_once(built):
    m = read_manifest(built)
    del m["sha256"]
    (built / MANIFEST).write_text(json.dumps(m))
    assert check_model_dir(built).get("sha256") is None  # sizes still checked
    assert add_checksums(built) is True
    assert check_model_dir(built)["sha256"]["tokenizer.json"]
    assert add_checksums(built) is False


def test_pack_is_deterministic_and_unpacks_checked(built, tmp_path):
    archive, digest = pack(built, tmp_path / "out1")
    again, digest2 = pack(built, tmp_path / "out2")
    assert archive.name == "tiny-ctx8-fp32.tar" and digest == digest2
    assert archive.read_bytes() == again.read_bytes()
    assert (archive.parent / "tiny-ctx8-fp32.tar.sha256").read_text() == f"{digest}  tiny-ctx8-fp32.tar\n"
    # sha256sum -c is how a box without etserve checks it
    assert subprocess.run(["sha256sum", "-c", archive.name + ".sha256"], cwd=archive.parent,
                          capture_output=True).returncode == 0
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        assert names[:2] == ["tiny-ctx8-fp32", "tiny-ctx8-fp32/etserve.json"]  # manifest before its files
        assert {m.uid for m in tar.getmembers()} == {0} and {m.mtime for m in tar.getmembers()} == {1796025600}
    target = unpack(archive, tmp_path / "box" / "tiny")
    assert check_model_dir(target) == read_manifest(built)
    assert (target / "model.pte").read_bytes() == (built / "model.pte").read_bytes()
    with pytest.raises(FileExistsError):
        unpack(archive, target)


def test_pack_gives_an_old_build_checksums_in_the_archive_only(built, tmp_path):
    m = read_manifest(built)
    del m["sha256"]
    (built / MANIFEST).write_text(json.dumps(m))
    before = (built / MANIFEST).read_bytes()
    archive, _ = pack(built, tmp_path / "out")
    assert (built / MANIFEST).read_bytes() == before  # the build directory is only read
    target = unpack(archive, tmp_path / "box" / "tiny")
    assert check_model_dir(target)["sha256"] == write_manifest(built, FIELDS)["sha256"]


def test_pack_refuses_a_build_that_does_not_match(built, tmp_path):
    (built / "tokenizer_config.json").write_text("[]")
    with pytest.raises(ManifestError, match="tokenizer_config.json: does not match"):
        pack(built, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_unpack_refuses_a_corrupted_archive_and_leaves_nothing(built, tmp_path):
    archive, _ = pack(built, tmp_path / "out")
    data = bytearray(archive.read_bytes())
    data[5000] ^= 1  # inside model.pte's bytes
    archive.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"ctx8-fp32\.tar: does not match its SHA-256 in tiny-ctx8-fp32\.tar\.sha256"):
        unpack(archive, tmp_path / "box" / "tiny")
    (archive.parent / (archive.name + ".sha256")).unlink()  # without the sum, the manifest still catches it
    with pytest.raises(ManifestError, match="model.pte: does not match its SHA-256 in etserve.json"):
        unpack(archive, tmp_path / "box" / "tiny")
    assert not (tmp_path / "box").exists() or not list((tmp_path / "box").iterdir())


def _tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(data, str):  # a symlink to data
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("members, problem", [
    ([("a/etserve.json", b"{}")], "it must hold one directory"),
    ([("a", None), ("a/../../evil", b"x")], "unexpected member 'a/../../evil'"),
    ([("a", None), ("a/link", "/etc/passwd")], "unexpected member 'a/link'"),
    ([("a", None), ("b/etserve.json", b"{}")], "unexpected member 'b/etserve.json'"),
    ([("a", None), ("a/model.pte", b"x"), ("a/etserve.json", b"{}")], "etserve.json does not come first"),
    ([("a", None), ("a/etserve.json", json.dumps({"name": "..", "variant": "v", "files": {}}).encode())],
     "bad name or variant"),
    ([("a", None), ("a/etserve.json", json.dumps({"name": "n", "variant": "v", "files": {}}).encode()),
      ("a/extra", b"x")], "files its etserve.json does not list: a/extra"),
])
def test_unpack_refuses_what_is_not_a_model_archive(tmp_path, members, problem):
    archive = tmp_path / "x.tar"
    _tar(archive, members)
    with pytest.raises(ManifestError, match=problem.replace(".", r"\.")):
        unpack(archive, tmp_path / "box" / "m")
    assert not (tmp_path / "box").exists()


def test_pack_and_unpack_from_the_command_line(built, tmp_path, monkeypatch):
    monkeypatch.setenv("ETSERVE_CACHE", str(tmp_path / "cache"))
    run = [sys.executable, "-m", "app.models"]
    out = subprocess.run(run + ["pack", "smollm2-135m", "--out", str(built), "--dest", str(tmp_path / "a")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    archive = tmp_path / "a" / "tiny-ctx8-fp32.tar"
    assert out.stdout.splitlines()[0] == str(archive)
    out = subprocess.run(run + ["unpack", str(archive)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "cache" / "models" / "tiny" / "ctx8-fp32")  # where --model finds it
    out = subprocess.run(run + ["unpack", str(archive)], capture_output=True, text=True)
    assert out.returncode == 1 and "already exists" in out.stderr
