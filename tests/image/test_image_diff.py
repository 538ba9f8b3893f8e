"""checks/repro/image_diff.py (make repro-image) on archives laid out as `docker save`
writes them. The same code runs on two real images in `make e2e`."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "image_diff", REPO / "checks" / "repro" / "image_diff.py"
)
image_diff = importlib.util.module_from_spec(_spec)
sys.modules["image_diff"] = image_diff  # dataclasses look their module up
_spec.loader.exec_module(image_diff)

# (path, content or None for a directory, mode, mtime, uid)
Files = list[tuple[str, bytes | None, int, int, int]]


def _layer(files: Files) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data, mode, mtime, uid in files:
            info = tarfile.TarInfo(path)
            info.mode, info.mtime, info.uid = mode, mtime, uid
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _save(path: Path, layers: list[Files], created: str = "1980-01-01T00:00:00Z") -> Path:
    """An archive as `docker save` (classic layout) writes it."""
    blobs = [_layer(f) for f in layers]
    diff_ids = ["sha256:" + hashlib.sha256(b).hexdigest() for b in blobs]
    config = json.dumps({
        "architecture": "amd64",
        "created": created,
        "history": [{"created": created, "created_by": f"RUN step {i}"} for i in range(len(blobs))],
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    names = [f"{d[7:]}/layer.tar" for d in diff_ids]
    manifest = json.dumps([{"Config": config_name, "RepoTags": ["t:x"], "Layers": names}])
    with tarfile.open(path, "w") as tar:
        for name, data in [("manifest.json", manifest.encode()), (config_name, config),
                           *zip(names, blobs, strict=True)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


BASE: Files = [("etc", None, 0o755, 100, 0), ("etc/os-release", b"debian\n", 0o644, 100, 0)]
APP: Files = [("opt", None, 0o755, 200, 0), ("opt/app.py", b"print(1)\n", 0o644, 200, 0),
              ("opt/data", b"x" * 1000, 0o600, 200, 10001)]


def test_the_same_image_twice_is_the_same(tmp_path: Path, capsys) -> None:
    a = _save(tmp_path / "a.tar", [BASE, APP])
    b = _save(tmp_path / "b.tar", [BASE, APP])
    assert image_diff.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "image IDs: the same" in out
    assert out.count(" same    sha256:") == 2


def test_each_difference_is_named_in_its_layer(tmp_path: Path, capsys) -> None:
    changed: Files = [("opt", None, 0o755, 200, 0),
                      ("opt/app.py", b"print(2)\n", 0o644, 200, 0),  # content
                      ("opt/data", b"x" * 1000, 0o644, 999, 0),  # mode, owner, time
                      ("opt/new.pyc", b"\x00", 0o644, 200, 0)]  # only in B
    a = _save(tmp_path / "a.tar", [BASE, APP])
    b = _save(tmp_path / "b.tar", [BASE, changed], created="2026-12-07T00:00:00Z")
    assert image_diff.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "image IDs: DIFFER" in out
    assert "layer  1 same" in out and "layer  2 DIFFERS" in out
    assert "/opt/app.py: content (9 B" in out
    assert "/opt/data: mode 600 vs 644; owner 10001:0 vs 0:0; time 200 vs 999" in out
    assert "/opt/new.pyc: only in B" in out
    assert "3 paths differ" in out
    # history times are in the config, which the image ID hashes
    assert "created: '1980-01-01T00:00:00Z' vs '2026-12-07T00:00:00Z'" in out
    assert "history[1].created" in out


def test_a_time_alone_changes_the_layer(tmp_path: Path, capsys) -> None:
    later = [(p, d, m, t + 1 if p == "opt/app.py" else t, u) for p, d, m, t, u in APP]
    a = _save(tmp_path / "a.tar", [BASE, APP])
    b = _save(tmp_path / "b.tar", [BASE, later])
    assert image_diff.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "1 path differs (time: 1)" in out
    assert "/opt/app.py: time 200 vs 201" in out


def test_the_list_is_cut_at_the_limit(tmp_path: Path, capsys) -> None:
    many: Files = [(f"opt/f{i}", bytes([i]), 0o644, 1, 0) for i in range(10)]
    other: Files = [(f"opt/f{i}", bytes([i]), 0o644, 2, 0) for i in range(10)]
    a = _save(tmp_path / "a.tar", [many])
    b = _save(tmp_path / "b.tar", [other])
    assert image_diff.main([str(a), str(b), "--limit", "3"]) == 1
    out = capsys.readouterr().out
    assert "10 paths differ (time: 10)" in out
    assert "... 7 more" in out


@pytest.mark.parametrize("content", [b"not a tar", None, b'[{"RepoTags": []}]'])
def test_an_unreadable_archive_is_an_error_by_name(tmp_path: Path, capsys, content) -> None:
    a = _save(tmp_path / "a.tar", [BASE])
    bad = tmp_path / "bad.tar"
    if content is None:  # a tar without manifest.json
        with tarfile.open(bad, "w") as tar:
            tar.addfile(tarfile.TarInfo("x"), io.BytesIO(b""))
    elif content.startswith(b"["):  # a manifest naming no config or layers
        with tarfile.open(bad, "w") as tar:
            info = tarfile.TarInfo("manifest.json")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    else:
        bad.write_bytes(content)
    assert image_diff.main([str(a), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("image-diff: error: ") and str(bad) in err
