"""An unusable FRONTIER_CACHE ends every pipeline step with one `error:` line naming the
path and the setting, exit 1, no traceback (issue: bad inputs by name).

Tests run as root here, which ignores file modes; the pipeline runs under `setpriv`
with the capabilities that bypass them dropped, as an ordinary user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WITHOUT_OVERRIDE = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                    "--inh-caps=-all"]  # fmt: skip


def run_step(step: str, cache: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    as_user = WITHOUT_OVERRIDE if os.geteuid() == 0 else []
    if as_user and shutil.which("setpriv") is None:
        pytest.fail("running as root needs setpriv (util-linux) to drop DAC override")
    env = {**os.environ, "FRONTIER_CACHE": str(cache), "FRONTIER_WORK": str(tmp_path / "work"),
           "PYTHONPATH": str(REPO / "build")}  # fmt: skip
    return subprocess.run([*as_user, sys.executable, "-m", "pipeline", step], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


def unusable(kind: str, tmp_path: Path) -> tuple[Path, str, str]:
    """(FRONTIER_CACHE, the path the error names, strerror) for each kind of bad folder."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if kind == "read-only":
        return locked, f"{locked}/pins", "Permission denied"
    if kind == "a file":
        file = tmp_path / "file"
        file.write_text("")
        return file, f"{file}/pins", "Not a directory"
    return locked / "sub" / "cache", f"{locked}/sub", "Permission denied"


@pytest.mark.parametrize("kind", ["read-only", "a file", "parent not writable"])
@pytest.mark.parametrize("step", ["fetch", "venv"])
def test_an_unusable_cache_is_named_without_a_traceback(
    step: str, kind: str, tmp_path: Path
) -> None:
    cache, named, why = unusable(kind, tmp_path)
    result = run_step(step, cache, tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {named}: {why}; FRONTIER_CACHE={cache} must be a folder "
                      "this user can write"], result.stderr[-2000:]  # fmt: skip
