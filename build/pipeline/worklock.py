"""One writer per work folder: an exclusive lock, and what a killed run left behind.

Two `make patch-check` runs in one checkout would otherwise unpack, patch and
digest the same `.work/trees/<upstream>` at once, and one could exit 0 with the
other's half-written tree. The lock is an flock on a file beside the folder, so
the kernel releases it however the holder ends (even on SIGKILL).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def locked(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder`'s lock for the block, waiting (and saying so) while another run has it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock_path = folder.parent / f".{folder.name}.lock"
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            print(f"{what}: waiting for another run (pid {holder}) that holds {lock_path}",
                  file=sys.stderr)  # fmt: skip
            started = time.monotonic()
            fcntl.flock(handle, fcntl.LOCK_EX)
            print(f"{what}: got {lock_path} after {time.monotonic() - started:.0f} s",
                  file=sys.stderr)  # fmt: skip
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        remove_leftovers(folder)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_leftovers(folder: Path) -> None:
    """Staging folders of killed runs inside `folder` (`.<name>.<random>`, see
    source._staging). Only called under the lock, so none of them is in use."""
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name.startswith(".") and entry.name.count(".") >= 2 and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                print(f"removed {entry} (left by a run that was killed)", file=sys.stderr)
