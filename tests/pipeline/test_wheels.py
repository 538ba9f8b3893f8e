"""The wheel step's checks and the repacked plugin wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline import patcher, series, source, wheels
from pipeline.errors import PipelineError


def test_precompiled_wheel_of_another_version_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "vllm-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    other.write_bytes(b"not used")
    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(
        PipelineError,
        match=r"source version 0.32.0 differs from the precompiled wheel "
        r"vllm-0.31.0-.*\(0.31.0\)",
    ):
        wheels.build_vllm(tree, "0.32.0", other, tmp_path / "out")
    assert not (tmp_path / "out").exists(), "nothing may be built or created"


def test_plugin_wheel_carries_patched_files_and_valid_record(tmp_path: Path, real_file) -> None:  # noqa: ANN001
    release = real_file("gguf-plugin-wheel")
    tree = source.unpack_wheel(release, tmp_path / "tree")
    plugin = series.load("vllm-gguf-plugin")
    patcher.apply_series(plugin, tree)
    built = wheels.repack_plugin(tree, release, "abc", tmp_path / "out")
    assert built.name.startswith("vllm_gguf_plugin-0.0.5+frontier.abc-cp310-abi3-")
    with zipfile.ZipFile(built) as archive:
        names = archive.namelist()
        info = "vllm_gguf_plugin-0.0.5+frontier.abc.dist-info"
        assert f"{info}/METADATA" in names and f"{info}/RECORD" in names
        assert b"Version: 0.0.5+frontier.abc" in archive.read(f"{info}/METADATA")
        weight_utils = "vllm_gguf_plugin/weight_utils.py"
        assert archive.read(weight_utils) == (tree / weight_utils).read_bytes()
        assert b"quantized_param_name" in archive.read(weight_utils)
        for rel in plugin.files:
            assert rel.as_posix() in names
        record = archive.read(f"{info}/RECORD").decode()
        assert all(name in record for name in names)
        assert not any(name.startswith(patcher.STAMP_PREFIX) for name in names)
    # Same inputs, same bytes.
    again = wheels.repack_plugin(tree, release, "abc", tmp_path / "again")
    assert again.read_bytes() == built.read_bytes()
