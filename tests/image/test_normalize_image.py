"""build/docker/normalize_image.py (build-image.sh, targets with `normalize`) on archives
laid out as `docker save` writes them: two builds that differ only in the times the
engine wrote come out as one image ID, and nothing but those times changes."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from tests.image.test_image_diff import BASE, Files, _save, image_diff

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "normalize_image", REPO / "build" / "docker" / "normalize_image.py")
normalize_image = importlib.util.module_from_spec(_spec)
sys.modules["normalize_image"] = normalize_image
_spec.loader.exec_module(normalize_image)

EPOCH = 1_000_000


def _app(build_time: int) -> Files:
    """A layer whose step wrote its files at the epoch (reproducible.sh) while the
    engine dated a mount's directory at build time."""
    return [("in", None, 0o755, build_time, 0), ("opt", None, 0o755, EPOCH, 0),
            ("opt/app.py", b"print(1)\n", 0o644, EPOCH, 0),
            ("opt/data", b"x" * 1000, 0o600, 123, 10001)]


def _build(tmp: Path, name: str, build_time: int) -> Path:
    return _save(tmp / f"{name}.tar", [BASE, _app(build_time)], created="2026-12-07T10:00:00Z")


def _members(path: Path, index: int) -> dict[str, tarfile.TarInfo]:
    image = image_diff.open_image(path)
    with tarfile.open(path) as archive:
        raw = archive.extractfile(image.layer_members[index])
        with tarfile.open(fileobj=raw) as layer:
            return {m.name: m for m in layer.getmembers()}


def test_two_builds_differing_in_build_times_become_one_image(tmp_path: Path, capsys) -> None:
    a, b = _build(tmp_path, "a", EPOCH + 50), _build(tmp_path, "b", EPOCH + 90)
    assert image_diff.main([str(a), str(b)]) == 1  # as built: the times differ
    ids = [normalize_image.normalize(x, tmp_path / f"n{x.name}", EPOCH, keep_layers=1)
           for x in (a, b)]
    assert ids[0] == ids[1]
    capsys.readouterr()
    assert image_diff.main([str(tmp_path / "na.tar"), str(tmp_path / "nb.tar")]) == 0
    assert "image IDs: the same" in capsys.readouterr().out


def test_only_late_times_change_and_the_archive_is_loadable(tmp_path: Path, capsys) -> None:
    a = _build(tmp_path, "a", EPOCH + 50)
    got = normalize_image.normalize(a, tmp_path / "n.tar", EPOCH, keep_layers=1)
    n = tmp_path / "n.tar"
    image = image_diff.open_image(n)
    assert got == image.image_id  # the ID is the config's sha256, as docker load computes it
    with tarfile.open(n) as archive:
        for diff_id, member in zip(image.layers, image.layer_members, strict=True):
            data = archive.extractfile(member).read()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == diff_id
        manifest = json.loads(archive.extractfile("manifest.json").read())
    assert manifest[0]["RepoTags"] == ["t:x"]
    assert image.config["created"] == "1970-01-12T13:46:40Z"
    assert image.layers[0] == image_diff.open_image(a).layers[0]  # the base, byte for byte
    members = _members(n, 1)
    assert members["in"].mtime == EPOCH  # clamped
    assert members["opt/data"].mtime == 123  # earlier times stay
    assert (members["opt/data"].mode, members["opt/data"].uid) == (0o600, 10001)
    capsys.readouterr()
    image_diff.main([str(a), str(n)])
    out = capsys.readouterr().out
    assert "1 path differs (time: 1)" in out and "layer  1 same" in out
    assert "/in: time 1000050 vs 1000000" in out


def test_pax_time_records_go_and_a_second_pass_changes_nothing(tmp_path: Path) -> None:
    a = _save(tmp_path / "a.tar", [BASE, _app(EPOCH)])
    # rewrite layer 2 with an atime record, as GNU tar and BuildKit can write them
    image = image_diff.open_image(a)
    with tarfile.open(a) as archive:
        raw = archive.extractfile(image.layer_members[1]).read()
    src = io.BytesIO(raw)
    out = io.BytesIO()
    with tarfile.open(fileobj=src) as layer, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as dst:
        for m in layer.getmembers():
            m.pax_headers = {"atime": "1796600000.5"}
            dst.addfile(m, layer.extractfile(m) if m.isreg() else None)
    diff_id, clamped = normalize_image.rewrite_layer(io.BytesIO(out.getvalue()), io.BytesIO(),
                                                     EPOCH)
    assert clamped == len(_app(EPOCH))
    first = normalize_image.normalize(a, tmp_path / "n1.tar", EPOCH)
    second = normalize_image.normalize(tmp_path / "n1.tar", tmp_path / "n2.tar", EPOCH)
    assert first == second


def test_bad_input_is_named(tmp_path: Path, capsys) -> None:
    a = _save(tmp_path / "a.tar", [BASE])
    assert normalize_image.main([str(a), str(tmp_path / "n.tar"), "--epoch", "1",
                                 "--keep-layers", "3"]) == 1
    assert "--keep-layers 3, but the image has 1 layers" in capsys.readouterr().err
    assert normalize_image.main([str(tmp_path / "missing.tar"), str(tmp_path / "n.tar"),
                                 "--epoch", "1"]) == 1
    assert "normalize-image: error:" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        normalize_image.main([str(a), str(tmp_path / "n.tar"), "--epoch", "-1"])
