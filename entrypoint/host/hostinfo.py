"""Facts about the host and container that `doctor` judges; stdlib only, nothing imported
that would start CUDA (torch's CUDA version is read from its files, not by importing it).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import resource
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

SHM = "/dev/shm"


def shm_bytes(path: str = SHM) -> int | None:
    """Size of the shared-memory mount (Docker's default is 64 MB); None when absent."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def memlock_limit() -> int | None:
    """`ulimit -l` in bytes (the soft limit, which is what applies); None for unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def existing_ancestor(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a cache made on first use)."""
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


@dataclass(frozen=True)
class Space:
    where: Path  # the folder that exists (the cache itself, or the folder it will be made in)
    free: int  # bytes this (unprivileged) process may still write
    writable: bool
    device: int  # st_dev, to name each filesystem once


def space_for(path: Path) -> Space:
    where = existing_ancestor(path)
    st = os.statvfs(where)
    return Space(where, st.f_bavail * st.f_frsize, os.access(where, os.W_OK | os.X_OK),
                 os.stat(where).st_dev)  # fmt: skip


def _torch_version_file_cuda() -> tuple[str | None, str] | None:
    """torch/version.py's `cuda = '13.0'` (None for a CPU build), read without importing."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        if isinstance(target, ast.Name) and target.id == "cuda":
            value = getattr(node, "value", None)
            if isinstance(value, ast.Constant) and (value.value is None or
                                                   isinstance(value.value, str)):  # fmt: skip
                return value.value, f"torch {_torch_version()} at {path}"
    return None


def _torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "?"


def _cuda_home_version() -> tuple[str | None, str] | None:
    """`$CUDA_HOME/version.json` as NVIDIA's toolkits write it."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        return None
    path = Path(home) / "version.json"
    try:
        found = json.loads(path.read_text())["cuda"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(found), f"{path}"


def parse_cuda(text: str | None) -> tuple[int, int] | None:
    """'13.0' or '13.0.88' -> (13, 0)."""
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def image_cuda() -> tuple[tuple[int, int] | None, str]:
    """(the CUDA version the image's torch was built for, where that was read).

    torch is what loads the CUDA runtime, so its version file decides; a CUDA_HOME
    toolkit (JIT compilers) is the fallback where torch is absent."""
    for source in (_torch_version_file_cuda(), _cuda_home_version()):
        if source is not None:
            return parse_cuda(source[0]), source[1]
    return None, "neither torch nor $CUDA_HOME/version.json is here"
