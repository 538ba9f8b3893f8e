"""A cached build environment for `pip wheel --no-build-isolation` of vLLM.

vLLM's setup.py decides what to package from `torch.version.cuda`, so the
build needs the CUDA build of the torch its `requirements/build/cuda.txt`
pins, even though nothing is compiled. pip's configured find-links may offer a
`+cpu` torch of the same version (as on these CI machines), which pip would
prefer; so the environment is installed with `pip --isolated` from the
configured indexes only. It is reused while its lock (locks/build-cuda-*.txt,
made from the pinned sdist's requirements/build/cuda.txt) is unchanged."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import locks, pipconfig
from .errors import PipelineError
from .paths import cache_dir


def _python(env: Path) -> str:
    return str(env / "bin" / "python")


def torch_cuda(env: Path | str) -> str | None:
    python = env if isinstance(env, str) else _python(env)
    out = subprocess.run(
        [python, "-c", "import torch, sys; sys.stdout.write(str(torch.version.cuda))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() != "None" else None


def build_lock(tree: Path, python: str) -> Path:
    """The build-cuda lock for python, refusing a tree whose build requirements
    are not the ones the lock was made from (a git source at another commit)."""
    requirements = tree / "requirements" / "build" / "cuda.txt"
    if not requirements.is_file():
        raise PipelineError(f"{tree}: no requirements/build/cuda.txt to build against")
    lock = locks.lock_for("build-cuda", python)
    ours = locks.requirement_lines(requirements.read_text())
    if ours != locks.recorded_inputs(lock.read_text()):
        raise PipelineError(
            f"{requirements} differs from the pinned sdist's, which {lock.name} was "
            "made from; update build/pins.toml and run `make lock`"
        )
    return lock


def ensure(tree: Path) -> str:
    """Python of a build env holding the build-cuda lock (for this interpreter's Python)."""
    lock = build_lock(tree, sys.executable)
    key = hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    env = cache_dir().parent / f"build-env-{key}"
    ready = env / ".frontier-ready"
    if ready.is_file():
        return _python(env)
    if env.exists():
        shutil.rmtree(env)
    config = pipconfig.read()
    index_args = pipconfig.index_args(config)
    if config.cert:
        index_args += ["--cert", config.cert]
    print(f"[wheels] creating build env {env} from {lock.name} (once; the CUDA torch is large)")
    staging = env.with_name(env.name + ".part")
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(staging)], check=True)
    python = str(staging / "bin" / "python")
    try:
        locks.install(python, lock, pip_options=("--isolated",), options=tuple(index_args))
    except PipelineError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    staging.rename(env)  # venv scripts keep the staging path; we only ever run `python -m`
    if torch_cuda(env) is None:
        raise PipelineError(
            f"{env}: torch has no CUDA (torch.version.cuda is None); vLLM's setup.py would not "
            "package the CUDA binaries. Point pip's index at one that serves the CUDA torch build."
        )
    ready.write_text(key + "\n")
    os.sync()
    return _python(env)


def use(python: str, tree: Path) -> str:
    """An existing interpreter (the image's venv, which already holds the CUDA torch)
    with the build-cuda lock added, so the torch/CUDA set is fetched once."""
    lock = build_lock(tree, python)
    if torch_cuda(python) is None:
        raise PipelineError(
            f"{python}: torch is missing or has no CUDA (torch.version.cuda is None); "
            "vLLM's setup.py would not package the CUDA binaries"
        )
    print(f"[wheels] adding {lock.name} to {python}'s environment")
    locks.install(python, lock)
    return python
