"""fixtures/backend/pinned_upstream.py (`make kernel-upstream`) where the pinned sdist cannot
be had, as on the GPU machine, which has no package index: one clear error, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_sdist_and_no_index_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "links").mkdir()  # pip's own configuration may name a wheelhouse
    env = {
        **os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "links"),
    }  # fmt: skip
    run = subprocess.run(
        [sys.executable, "fixtures/backend/pinned_upstream.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert "pinned_upstream: error: vllm-0.32.0.tar.gz" in run.stderr
    assert "carry .work/kernel-upstream/ with the checkout" in run.stderr
