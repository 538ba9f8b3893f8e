"""Build the patched wheels.

vLLM: `pip wheel` of the patched tree with VLLM_USE_PRECOMPILED=1, taking the
compiled .so files from the pinned release wheel, so no CUDA compile runs.
The GGUF plugin: its CUDA extension `_C_gguf` can only be built with a CUDA
toolchain, so we repack the pinned release wheel with our patched Python files
and a local version label instead of building its sdist."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from .errors import PipelineError
from .patcher import STAMP_PREFIX

_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<tags>.+)\.whl$")


def wheel_name_parts(wheel: Path) -> tuple[str, str, str]:
    """(name, version, tags) of a wheel's file name."""
    match = _WHEEL_NAME.match(wheel.name)
    if not match:
        raise PipelineError(f"{wheel.name}: not a wheel file name")
    return match.group("name", "version", "tags")


def wheel_version(wheel: Path) -> str:
    return wheel_name_parts(wheel)[1]


def _zip_time() -> tuple[int, int, int, int, int, int]:
    import time

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # 1980-01-01, zip's minimum
    return time.gmtime(max(epoch, 315532800))[:6]


def build_vllm(
    tree: Path, source_version: str, precompiled: Path, out: Path, python: str | None = None
) -> Path:
    """Patched vLLM wheel from tree, with binaries from the precompiled wheel.

    `python` is an interpreter that already holds the build requirements (the
    image's own venv); without it, a cached build env is made (build_env.py).
    The build runs in a copy of tree, so tree stays exactly what the series made
    and its digest still equals `make patch-check`'s. The wheel gets the
    precompiled wheel's tags: its binaries are that wheel's (abi3), so it fits
    every Python the release fits, not only the one that ran setup.py."""
    from . import build_env

    base = wheel_version(precompiled).split("+", 1)[0]
    if source_version.split("+", 1)[0] != base:
        raise PipelineError(
            f"source version {source_version} differs from the precompiled wheel "
            f"{precompiled.name} ({base}); its binaries would not match the source"
        )
    python = build_env.use(python, tree) if python else build_env.ensure(tree)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("vllm-*.whl"):
        old.unlink()
    env = {
        **os.environ,
        "VLLM_USE_PRECOMPILED": "1",
        "VLLM_PRECOMPILED_WHEEL_LOCATION": str(precompiled),
        "VLLM_TARGET_DEVICE": "cuda",
    }
    with tempfile.TemporaryDirectory(prefix="frontier-wheel-") as tmp:
        work = Path(tmp) / "src"
        # setup.py writes build/, *.egg-info and the precompiled .so files into its tree.
        shutil.copytree(tree, work, symlinks=True)
        print(
            f"pip wheel {tree} (in a copy; precompiled binaries from {precompiled.name}); "
            "this takes a minute or two"
        )
        result = subprocess.run(
            [
                python,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
                str(Path(tmp) / "dist"),
                str(work),
            ],
            env=env,
            check=False,
        )
        if result.returncode != 0:
            raise PipelineError(f"pip wheel of {tree} failed (exit {result.returncode})")
        built = list((Path(tmp) / "dist").glob("vllm-*.whl"))
        if len(built) != 1:
            raise PipelineError(f"expected one vllm wheel, got {[p.name for p in built]}")
        final = retag(built[0], wheel_name_parts(precompiled)[2], out)
    return final


def retag(wheel: Path, tags: str, out: Path) -> Path:
    """A copy of wheel in out, with the compatibility tags `tags` (file name and WHEEL)."""
    name, version, _ = wheel_name_parts(wheel)
    info = f"{name}-{version}.dist-info"
    python, abi, platforms = tags.split("-")
    tag_lines = [
        f"Tag: {py}-{ab}-{plat}"
        for py in python.split(".")
        for ab in abi.split(".")
        for plat in platforms.split(".")
    ]
    final = out / f"{name}-{version}-{tags}.whl"
    part = final.with_name(final.name + ".part")
    with (
        zipfile.ZipFile(wheel) as source,
        # Level 1: the wheel holds ~1 GB of binaries, and level 6 took minutes here.
        zipfile.ZipFile(part, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as dest,
    ):
        entries = source.infolist()
        wheel_file = source.read(f"{info}/WHEEL").decode()
        kept = [line for line in wheel_file.splitlines() if not line.startswith("Tag:")]
        new_wheel = ("\n".join(kept + tag_lines) + "\n").encode()
        record = io.StringIO()
        writer = csv.writer(record, lineterminator="\n")
        for entry in entries:
            if entry.filename == f"{info}/RECORD":
                continue
            data = new_wheel if entry.filename == f"{info}/WHEEL" else source.read(entry)
            dest.writestr(entry, data, compresslevel=1)
            if not entry.is_dir():
                writer.writerow([entry.filename, _record_hash(data), len(data)])
        writer.writerow([f"{info}/RECORD", "", ""])
        dest.writestr(source.getinfo(f"{info}/RECORD"), record.getvalue())
    os.replace(part, final)
    return final


def check_wheel_has_tree_files(wheel: Path, tree: Path, rel_paths: list[str]) -> None:
    """The built wheel must carry our patched bytes, not stale upstream ones."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for rel in rel_paths:
            if rel not in names:
                raise PipelineError(f"{wheel.name} lacks {rel}")
            if archive.read(rel) != (tree / rel).read_bytes():
                raise PipelineError(f"{wheel.name}: {rel} differs from the patched tree")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack_plugin(tree: Path, release_wheel: Path, label: str, out: Path) -> Path:
    """A wheel of the patched plugin tree, versioned `<release>+frontier.<label>`."""
    name, version, tags = wheel_name_parts(release_wheel)
    new_version = f"{version}+frontier.{label}"
    old_info, new_info = f"{name}-{version}.dist-info", f"{name}-{new_version}.dist-info"
    if not (tree / old_info).is_dir():
        raise PipelineError(f"{tree}: no {old_info}; is it the unpacked {release_wheel.name}?")
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree).as_posix()
        if (
            not path.is_file()
            or rel.startswith(STAMP_PREFIX)
            or "__pycache__" in rel
            or rel.endswith(".pyc")
        ):
            continue
        if rel == f"{old_info}/RECORD":
            continue
        data = path.read_bytes()
        if rel == f"{old_info}/METADATA":
            data = re.sub(rb"(?m)^Version: .*$", b"Version: " + new_version.encode(), data, count=1)
        target = rel.replace(old_info + "/", new_info + "/", 1)
        files[target] = data
        modes[target] = path.stat().st_mode & 0o777
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, data in files.items():
        writer.writerow([rel, _record_hash(data), len(data)])
    writer.writerow([f"{new_info}/RECORD", "", ""])
    files[f"{new_info}/RECORD"] = record.getvalue().encode()
    modes[f"{new_info}/RECORD"] = 0o644
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{name}-*.whl"):
        old.unlink()
    final = out / f"{name}-{new_version}-{tags}.whl"
    part = final.with_name(final.name + ".part")
    stamp = _zip_time()
    with zipfile.ZipFile(part, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for rel, data in files.items():  # dist-info last is conventional; RECORD is last
            info = zipfile.ZipInfo(rel, date_time=stamp)
            info.external_attr = (0o100000 | modes[rel]) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    os.replace(part, final)
    return final
