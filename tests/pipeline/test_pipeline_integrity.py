"""Pipeline integrity: no false green from a broken pins file, one writer per work
folder, and nothing left behind by a killed run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import pins
from pipeline.errors import PipelineError
from pipeline.worklock import locked

from .conftest import SOME_PIN, write_pins

REPO = Path(__file__).resolve().parents[2]


def test_a_pins_file_without_entries_is_refused_not_verified(tmp_path: Path) -> None:
    path = tmp_path / "pins.toml"
    for text in ("", "[files]\n", '[vllm-git]\nurl = "x"\nref = "y"\n'):
        path.write_text(text)
        with pytest.raises(PipelineError, match="nothing is pinned"):
            pins.load(path)


def test_verify_pins_on_an_empty_file_exits_non_zero(tmp_path: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "--pins", str(path), "verify"],
        cwd=REPO, env={"PYTHONPATH": str(REPO / "build"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert "every pinned file matches" not in done.stdout
    assert "nothing is pinned" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('files = 3\n', r"\[files\] must be a table, got int"),
        ("[files]\nx = 1\n", r"\[files.x\] must be a table, got int"),
        (
            '[files.x]\nproject = "x"\nversion = 1\nfilename = "x.whl"\nsha256 = "'
            + "0" * 64 + '"\n',
            r"\[files.x\] must give strings; not: version \(int\)",
        ),
        (
            '[files.x]\nproject = ["x"]\nversion = "1"\nfilename = "x.whl"\nsha256 = "'
            + "0" * 64 + '"\n',
            r"not: project \(list\)",
        ),
        ('next-vllm = "0.33.0"\n[files.x]\nproject = "x"\nversion = "1"\nfilename = "x.whl"\n'
         'sha256 = "' + "0" * 64 + '"\n', r"\[next-vllm\] must be a table, got str"),
        ('vllm-git = 5\n[files.x]\nproject = "x"\nversion = "1"\nfilename = "x.whl"\n'
         'sha256 = "' + "0" * 64 + '"\n', r"\[vllm-git\] must be a table"),
        ('[vllm-git]\nurl = 1\nref = "y"\n[files.x]\nproject = "x"\nversion = "1"\n'
         'filename = "x.whl"\nsha256 = "' + "0" * 64 + '"\n', r"\[vllm-git\] must give strings"),
    ],
)  # fmt: skip
def test_entries_of_the_wrong_type_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(text)
    with pytest.raises(PipelineError, match=message):
        pins.load(path)


def test_a_well_formed_entry_still_loads(tmp_path: Path) -> None:
    loaded = pins.load(write_pins(tmp_path / "pins.toml", {"some": SOME_PIN}))
    assert loaded.file("some").filename == "some-1.whl"


HOLDER = """
import sys, time
sys.path.insert(0, {build!r})
from pathlib import Path
from pipeline.worklock import locked
with locked(Path({folder!r}), "holder"):
    print("held", flush=True)
    time.sleep({hold})
"""


def test_a_second_writer_waits_for_the_first(tmp_path: Path) -> None:
    folder = tmp_path / "trees"
    hold = 1.5
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(build=str(REPO / "build"), folder=str(folder),
                                             hold=hold)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with locked(folder, "second"):
        waited = time.monotonic() - started
    holder.wait(timeout=10)
    # The holder sleeps `hold` s after saying "held"; getting in sooner means no lock.
    assert waited > hold * 0.6, f"got the lock after {waited:.2f} s, while it was held"


def test_a_killed_holder_releases_the_lock(tmp_path: Path) -> None:
    folder = tmp_path / "trees"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(build=str(REPO / "build"), folder=str(folder),
                                             hold=60)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait(timeout=10)
    started = time.monotonic()
    with locked(folder, "after-kill"):
        assert time.monotonic() - started < 5


def test_staging_folders_of_a_killed_run_are_removed_under_the_lock(tmp_path: Path) -> None:
    folder = tmp_path / "trees"
    left = folder / ".vllm.k3j2x9"  # what source._staging names its folders
    (left / "vllm").mkdir(parents=True)
    kept = folder / "vllm"
    kept.mkdir()
    with locked(folder, "cleanup"):
        assert not left.exists()
        assert kept.is_dir()


def test_sigterm_runs_the_pipelines_cleanup(tmp_path: Path) -> None:
    """python3 -m pipeline turns SIGTERM into SystemExit, so `finally` blocks run."""
    marker = tmp_path / "cleaned"
    code = f"""
import runpy, signal, sys, os, time
sys.path.insert(0, {str(REPO / "build")!r})
import pipeline.cli
def main():
    try:
        print("started", flush=True)
        time.sleep(60)
    finally:
        open({str(marker)!r}, "w").close()
pipeline.cli.main = main
runpy.run_module("pipeline", run_name="__main__")
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    proc.terminate()
    assert proc.wait(timeout=10) == 128 + 15
    assert marker.exists()
