"""engine.sh's reclaim_docker (CI's first step, `make reclaim-space`) with a stand-in
docker client: the real engine's prune runs at the start of every `.ci/run`."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in client: `info` names the data root, every other call is logged, and
# prunes fail when FAIL is set.
STAND_IN = """#!/bin/sh
if [ "$1" = info ]; then echo "$ROOT"; exit 0; fi
echo "$*" >> "$CALLS"
[ -z "$FAIL" ] || { echo "stand-in docker: $* failed" >&2; exit 1; }
echo "Total reclaimed space: 0B"
"""


def reclaim(
    tmp_path: Path, need_gb: int | str, fail: bool
) -> tuple[subprocess.CompletedProcess, list]:
    client = tmp_path / "docker"
    client.write_text(STAND_IN)
    client.chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    script = (
        "set -euo pipefail; source build/docker/engine.sh; "
        f'DOCKER={client}; reclaim_docker {need_gb}; echo "reclaim rc=$?"'
    )
    env = {"PATH": "/usr/bin:/bin", "REPO": str(REPO), "ROOT": str(tmp_path),
           "CALLS": str(calls), "FAIL": "1" if fail else ""}  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    return done, calls.read_text().splitlines()


def test_stand_in_docker_enough_free_space_prunes_nothing(tmp_path: Path) -> None:
    done, calls = reclaim(tmp_path, 0, fail=False)
    assert done.returncode == 0, done.stderr
    assert calls == []
    assert "(at least 0 wanted)" in done.stderr


def test_stand_in_docker_short_of_space_prunes_oldest_cache_first(tmp_path: Path) -> None:
    # No filesystem has a million GB free, so every step runs, in this order.
    done, calls = reclaim(tmp_path, 1_000_000, fail=False)
    assert done.returncode == 0, done.stderr
    assert calls == ["image prune -f"] + [
        f"builder prune -f --filter until={age}" for age in ("72h", "24h", "6h", "1h")
    ]


def test_stand_in_docker_failing_prunes_never_fail_the_step(tmp_path: Path) -> None:
    done, calls = reclaim(tmp_path, 1_000_000, fail=True)
    assert done.returncode == 0 and "reclaim rc=0" in done.stdout, done.stderr
    assert len(calls) == 5
    assert done.stderr.count("failed (ignored)") == 5


def test_stand_in_docker_need_that_is_no_number_is_named_and_prunes_nothing(
    tmp_path: Path,
) -> None:
    done, calls = reclaim(tmp_path, "30GB", fail=False)
    assert done.returncode == 2 and "reclaim rc" not in done.stdout
    assert "error: NEED_GB='30GB' is not a whole number of GB" in done.stderr
    assert calls == []
