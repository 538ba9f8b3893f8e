"""Run the typer app in-process with exec and the watcher's Popen recorded, not started."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from typer.testing import CliRunner

from entrypoint.app import app

runner = CliRunner()


def invoke(env: dict[str, str], *args: str) -> Any:
    return runner.invoke(app, list(args), env=env)


class Recorder:
    """Stands in for os.execvp, the in-process run and the watcher's Popen; records
    instead of starting. A run here records `python -m MODULE ARGS` and returns
    `run_code`, as vLLM returning would."""

    def __init__(self) -> None:
        self.exec_argv: list[str] | None = None
        self.popen_args: list[str] | None = None
        self.popen_env: dict[str, str] = {}
        self.ran_here = False
        self.run_code = 0

    def execvp(self, file: str, argv: list[str]) -> None:
        self.exec_argv = argv
        raise OSError(2, "No such file or directory (recorded, not executed)")

    def run_module(self, module: str, args: list[str]) -> int:
        self.exec_argv = [sys.executable, "-m", module, *args]
        self.ran_here = True
        return self.run_code

    def popen(self, args: list[str], **kwargs: object) -> Any:
        self.popen_args = args
        # what the watcher inherits (no env= is passed: it takes os.environ)
        self.popen_env = dict(os.environ) if "env" not in kwargs else dict(kwargs["env"])
        return types.SimpleNamespace(terminate=lambda: None, wait=lambda: 0)
