"""The wheel step's checks and the repacked plugin wheel."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipeline import locks, patcher, series, source, targets, wheels
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


STAND_IN_BUILD_PYTHON = '''#!{python}
"""Stands in for the image's venv python: claims a CUDA torch, accepts the build
requirements, and for `-m pip wheel` leaves setup.py's litter in the source tree and
writes a wheel tagged for the running interpreter, as setup.py really does."""
import sys, zipfile
from pathlib import Path
args = sys.argv[1:]
if args[:1] == ["-c"] and "version_info" in args[1]:
    print("3.12")
elif args[:1] == ["-c"]:
    sys.stdout.write("13.0")
elif args[:3] == ["-m", "pip", "install"]:
    pass
elif args[:3] == ["-m", "pip", "wheel"]:
    src, dist = Path(args[-1]), Path(args[args.index("--wheel-dir") + 1])
    (src / "build" / "lib").mkdir(parents=True)
    (src / "vllm.egg-info").mkdir()
    (src / "vllm" / "_C.abi3.so").write_bytes(b"binary")
    dist.mkdir(parents=True, exist_ok=True)
    info = "vllm-0.32.0.dist-info"
    with zipfile.ZipFile(dist / "vllm-0.32.0-cp311-cp311-linux_x86_64.whl", "w") as whl:
        whl.writestr("vllm/__init__.py", (src / "vllm" / "__init__.py").read_text())
        whl.writestr("vllm/_C.abi3.so", b"binary")
        whl.writestr(f"{{info}}/METADATA", "Name: vllm\\nVersion: 0.32.0\\n")
        whl.writestr(
            f"{{info}}/WHEEL",
            "Wheel-Version: 1.0\\nRoot-Is-Purelib: false\\nTag: cp311-cp311-linux_x86_64\\n",
        )
        whl.writestr(f"{{info}}/RECORD", "")
else:
    sys.exit(f"stand-in python: unexpected {{args}}")
'''


@pytest.fixture
def stand_in_build(tmp_path: Path) -> tuple[Path, Path, str]:
    """A small vLLM-like tree, a stand-in build python, and the release wheel's name."""
    import sys

    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("patched = True\n")
    (tree / "requirements" / "build").mkdir(parents=True)
    # The pinned sdist's build requirements, as the build-cuda lock records them.
    lock = locks.path(targets.load().lock("build-cuda"), "3.12")
    inputs = locks.recorded_inputs(lock.read_text())
    (tree / "requirements" / "build" / "cuda.txt").write_text("\n".join(inputs) + "\n")
    python = tmp_path / "stand-in-python"
    python.write_text(STAND_IN_BUILD_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    release = tmp_path / "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    release.write_bytes(b"only its name is read")
    return tree, python, release.name


def test_vllm_build_leaves_the_patched_tree_untouched_with_stand_in_python(
    tmp_path: Path, stand_in_build: tuple[Path, Path, str]
) -> None:
    """The label's tree digest is taken after the build: the build must not write into it."""
    tree, python, release = stand_in_build
    before = patcher.tree_digest(tree)
    wheels.build_vllm(tree, "0.32.0", tmp_path / release, tmp_path / "out", python=str(python))
    assert patcher.tree_digest(tree) == before
    assert sorted(p.name for p in tree.iterdir()) == ["requirements", "vllm"]


def test_vllm_wheel_keeps_the_release_tags_with_stand_in_python(
    tmp_path: Path, stand_in_build: tuple[Path, Path, str]
) -> None:
    """Built by a 3.11 builder, the wheel must still install on the runtime's 3.12."""
    import base64
    import csv
    import hashlib
    import subprocess
    import sys

    tree, python, release = stand_in_build
    built = wheels.build_vllm(
        tree, "0.32.0", tmp_path / release, tmp_path / "out", python=str(python)
    )
    assert built.name == "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(built) as archive:
        wheel_file = archive.read("vllm-0.32.0.dist-info/WHEEL").decode()
        assert "Tag: cp38-abi3-manylinux_2_28_x86_64" in wheel_file
        assert "cp311" not in wheel_file
        rows = list(csv.reader(archive.read("vllm-0.32.0.dist-info/RECORD").decode().splitlines()))
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                continue
            data = archive.read(name)
            expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expect.decode() and int(size) == len(data), name
    for version in ("3.11", "3.12", "3.13"):
        check = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--no-deps",
                "--no-index",
                "--only-binary=:all:",
                "--target",
                str(tmp_path / "t"),
                "--python-version",
                version,
                "--implementation",
                "cp",
                "--platform",
                "manylinux_2_28_x86_64",
                str(built),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode == 0, (version, check.stderr)


def test_a_tree_whose_build_requirements_differ_from_the_lock_is_refused(
    tmp_path: Path, stand_in_build: tuple[Path, Path, str]
) -> None:
    """A git source at another commit: its build requirements are not the locked ones."""
    tree, python, release = stand_in_build
    (tree / "requirements" / "build" / "cuda.txt").write_text("torch==2.14.0\n")
    with pytest.raises(PipelineError, match=r"differs from the pinned sdist's.*make lock"):
        wheels.build_vllm(tree, "0.32.0", tmp_path / release, tmp_path / "out", python=str(python))
