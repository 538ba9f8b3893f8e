"""Console script `frontier-serve` (and `python -m entrypoint`): a light dispatcher.

`probe` and `status` run from stdlib-only modules, because compose and Kubernetes
call them every few seconds and typer alone costs more than their 100 ms budget.
Every other command, and any `--help`, goes to the typer app in `entrypoint.app`.
"""

from __future__ import annotations

import sys

FAST_COMMANDS = ("probe", "status")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if args and args[0] in FAST_COMMANDS and "--help" not in args:
            from entrypoint.watch.probe import main as fast_main

            code = fast_main(args)
            sys.stdout.flush()
            return code
        from entrypoint.app import app

        app(args=args, prog_name="frontier-serve")
        return 0
    except BrokenPipeError:
        # `frontier-serve status | head`: the reader left; no traceback for that.
        # Point stdout at /dev/null so the interpreter's own final flush stays quiet.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it
