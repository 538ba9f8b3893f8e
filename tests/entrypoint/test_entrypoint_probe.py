"""`probe` and `status` read the watcher's files; no process is started here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from entrypoint.watch.probe import main, probe, status_text
from entrypoint.watch.statusfile import process_start, write_json_atomic
from entrypoint.watch.statusfile import write_ready as write_ready_file


def write_ready(folder: Path, heartbeat: float, pid: int | None = None) -> str:
    path = folder / "ready"
    write_ready_file(
        str(path),
        {"phase": "ready", "pid": pid or os.getpid(), "heartbeat": heartbeat, "stale_after": 15.0,
         "pid_start": process_start(pid or os.getpid())},  # fmt: skip
    )
    return str(path)


def test_fresh_ready_file_passes(tmp_path: Path) -> None:
    code, line = probe(write_ready(tmp_path, 100.0), now=101.0)
    assert code == 0 and line == f"ready: pid {os.getpid()}, heartbeat 1.0s ago"


def test_stale_heartbeat_fails(tmp_path: Path) -> None:
    code, line = probe(write_ready(tmp_path, 100.0), now=116.0)
    assert code == 1 and line == "stale: heartbeat 16.0s old (limit 15s)"
    assert probe(write_ready(tmp_path, 100.0), max_age=30, now=116.0)[0] == 0


def test_dead_pid_fails(tmp_path: Path) -> None:
    code, line = probe(write_ready(tmp_path, 100.0, pid=2**22 + 7), now=101.0)
    assert code == 1 and line.startswith("exited: vLLM pid")


def test_unreadable_ready_file_fails(tmp_path: Path) -> None:
    (tmp_path / "ready").write_text("pid=x\nheartbeat=1\n")
    assert probe(str(tmp_path / "ready")) == (1, f"unreadable readiness file {tmp_path}/ready")


def test_missing_ready_file_reports_phase(tmp_path: Path) -> None:
    assert probe(str(tmp_path / "ready")) == (1, "unknown: no readiness file")
    write_json_atomic(
        str(tmp_path / "status.json"),
        {"phase": "exited", "reason": "vLLM killed by SIGKILL after it was ready"},
    )
    assert probe(str(tmp_path / "ready")) == (
        1,
        "exited: vLLM killed by SIGKILL after it was ready",
    )


def test_status_text_adds_readable_times(tmp_path: Path) -> None:
    write_json_atomic(
        str(tmp_path / "status.json"), {"phase": "ready", "since": 0.0, "heartbeat": 10.0}
    )
    code, text = status_text(str(tmp_path / "ready"), now=12.0)
    data = json.loads(text)
    assert code == 0 and data["since_utc"] == "1970-01-01T00:00:00+00:00"
    assert data["heartbeat_age_s"] == 2.0
    assert status_text(str(tmp_path / "nothing" / "ready"))[0] == 1


def test_main_parses_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    ready = write_ready(tmp_path, time.time())
    assert main(["probe", "--ready-file", ready]) == 0
    assert capsys.readouterr().out.startswith("ready: pid")
    monkeypatch.setenv("SERVE_READY_FILE", ready)
    assert main(["probe", "--max-age=0.000001"]) == 1
    assert main(["status"]) == 1  # no status file beside this ready file
    assert "no status file" in capsys.readouterr().out
    assert main(["probe", "--bogus", "1"]) == 2
    assert "unknown option --bogus" in capsys.readouterr().err


def test_probe_reads_the_ready_file_an_env_file_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --env-file F` with SERVE_READY_FILE only in F: `probe --env-file F` finds it."""
    import time

    ready = write_ready(tmp_path, time.time())
    env_file = tmp_path / "profile.env"
    env_file.write_text(f"SERVE_READY_FILE={ready}\n")
    assert main(["probe", "--env-file", str(env_file)]) == 0
    assert capsys.readouterr().out.startswith("ready: pid")
    assert main(["probe"]) == 1  # the default path holds nothing
    capsys.readouterr()
    assert main(["probe", "--env-file", str(tmp_path / "missing.env")]) == 2
    assert "frontier-serve: error: env file" in capsys.readouterr().err


@pytest.mark.process
def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`frontier-serve status | head -1`: the pipe closes before status writes."""
    import subprocess
    import sys

    from fixtures.serving import PYTHONPATH, REPO

    write_json_atomic(str(tmp_path / "status.json"), {"phase": "starting", "pid": 1})
    child = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "status", "--ready-file", str(tmp_path / "ready")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before the first byte
    code = child.wait(timeout=60)
    err = child.stderr.read().decode()
    assert code in (0, 141) and "Traceback" not in err, (code, err)
