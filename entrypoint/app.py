"""The typer application: render, serve, fetch-config, probe, status, wait, check-gguf,
doctor, reserved.

Loaded through `entrypoint.cli.main`, which answers `probe` and `status` without it.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Annotated, NoReturn

import typer

from entrypoint.argv import settings
from entrypoint.errors import USAGE_EXIT, ConfigError

app = typer.Typer(
    name="frontier-serve",
    help="Start vLLM from SERVE_* environment variables, and report its readiness.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

EnvFiles = Annotated[
    list[str] | None,
    typer.Option(
        "--env-file",
        help="KEY=VALUE file (e.g. profiles/glm5.env) read first; the environment wins.",
    ),
]
ReadyFile = Annotated[
    str | None,
    typer.Option("--ready-file", help=f"readiness file (default ${settings.READY_FILE})"),
]


def fail(error: ConfigError, code: int = USAGE_EXIT) -> NoReturn:
    for problem in error.problems:
        typer.echo(f"frontier-serve: error: {problem}", err=True)
    raise typer.Exit(code)


def _environment(env_files: list[str] | None) -> dict[str, str]:
    from entrypoint.argv.envfile import layered_environment

    try:
        return layered_environment(env_files or [])
    except ConfigError as exc:
        fail(exc)


@app.command()
def render(
    env_file: EnvFiles = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON array")] = False,
) -> None:
    """Print the argv that `serve` would exec. Execs nothing."""
    from entrypoint.argv.render import render as render_env

    try:
        rendered = render_env(_environment(env_file))
    except ConfigError as exc:
        fail(exc)
    typer.echo(json.dumps(rendered.argv) if as_json else shlex.join(rendered.argv))


@app.command()
def serve(env_file: EnvFiles = None) -> None:
    """Validate, start the readiness watcher, then exec vLLM in this process."""
    from entrypoint.start.serve import (
        drop_service_link_port,
        exec_vllm,
        mark_refused,
        mark_validating,
        prepare,
    )
    from entrypoint.start.vllm_in_process import module_of

    env = _environment(env_file)
    steps = mark_validating(env)
    # Before anything reads it: vLLM would die on the URI only after the checks.
    warnings = {drop_service_link_port(os.environ), drop_service_link_port(env)}  # type: ignore[arg-type]
    for warning in sorted(w for w in warnings if w):
        typer.echo(f"frontier-serve: warning: {warning}", err=True)
    try:
        rendered, config, gguf_code = prepare(env, steps)
    except ConfigError as exc:
        mark_refused(env, exc.problems, USAGE_EXIT)
        fail(exc)
    if gguf_code != 0:
        why = f"GGUF preflight failed (exit {gguf_code})"
        mark_refused(env, [why], gguf_code)
        typer.echo(f"frontier-serve: error: {why}", err=True)
        raise typer.Exit(gguf_code)
    # Values only the env files hold become this process's environment, so the
    # watcher (SERVE_API_KEY for /v1/models) and vLLM (its own VLLM_* names) see them.
    from_files = {name: value for name, value in env.items() if name not in os.environ}
    os.environ.update(from_files)
    if settings.READY_FILE in from_files and config is not None:
        typer.echo(
            f"frontier-serve: warning: {settings.READY_FILE} is set only in an env file; "
            "give probe the same --env-file (or --ready-file) so it reads that file",
            err=True,
        )
    here = module_of(rendered.program, env.get(settings.EXEC, ""))
    raise typer.Exit(exec_vllm(rendered, config, here))


@app.command("fetch-config")
def fetch_config(
    repos: Annotated[
        list[str] | None,
        typer.Argument(
            help="hub repo ids (owner/name); default: those SERVE_HF_CONFIG_PATH and "
            "SERVE_TOKENIZER name"
        ),
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="branch, tag or commit of REPOS")
    ] = None,
    env_file: EnvFiles = None,
) -> None:
    """Fetch config and tokenizer files (never weights) of hub-named repos into the HF cache.

    What `serve` does before its GGUF preflight, alone: for air-gapped hosts and init containers.

    Needs no GPU and no vLLM. HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE and HF_HOME apply.
    """
    from entrypoint.start import hub_files

    if repos:
        wanted = hub_files.hub_repos(("repo", r, revision) for r in repos)
        unknown = [r for r in repos if hub_files.hub_repo_id(r) is None]
        if unknown:
            fail(ConfigError([f"{r!r} is not a hub repo id (owner/name)" for r in unknown]))
    else:
        wanted = hub_files.repos_from_env(_environment(env_file))
    if not wanted:
        typer.echo(
            "frontier-serve: nothing to fetch: SERVE_HF_CONFIG_PATH and SERVE_TOKENIZER "
            "name no hub repo",
            err=True,
        )
        return
    try:
        folders = hub_files.fetch_all(wanted)
    except ConfigError as exc:
        fail(exc)
    for folder in folders.values():
        typer.echo(str(folder))


@app.command()
def probe(
    ready_file: ReadyFile = None,
    max_age: Annotated[
        float | None, typer.Option("--max-age", help="heartbeat age limit in seconds")
    ] = None,
    env_file: EnvFiles = None,
) -> None:
    """Exit 0 only if vLLM is ready: fresh readiness file, live pid. Prints the phase."""
    from entrypoint.watch.probe import probe as run_probe

    code, line = run_probe(ready_file or settings.ready_file_from(_environment(env_file)), max_age)
    typer.echo(line)
    raise typer.Exit(code)


@app.command()
def status(
    ready_file: ReadyFile = None,
    env_file: EnvFiles = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the status JSON")] = False,
) -> None:
    """Print what vLLM is doing: step, progress, ETA, errors, speculative decoding."""
    from entrypoint.watch.probe import status_summary, status_text

    path = ready_file or settings.ready_file_from(_environment(env_file))
    code, text = status_text(path) if as_json else status_summary(path)
    typer.echo(text)
    raise typer.Exit(code)


@app.command("wait")
def wait_ready(
    ready_file: ReadyFile = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="give up after SECONDS (exit 124)")
    ] = None,
    env_file: EnvFiles = None,
) -> None:
    """Block until vLLM is ready (exit 0); exit 1 if it exits or turns unhealthy, 124 at --timeout.

    Prints a line per phase change and loading step (a live line on a terminal).
    """
    import sys

    from entrypoint.watch.wait import wait

    if timeout is not None and not 0 < timeout < 1e9:
        fail(ConfigError([f"--timeout {timeout}: must be a positive number of seconds"]))
    path = ready_file or settings.ready_file_from(_environment(env_file))
    raise typer.Exit(wait(path, timeout, out=typer.echo, live=sys.stdout.isatty()))


@app.command("check-gguf")
def check_gguf(
    path: Annotated[str, typer.Argument(help="the .gguf file")],
    hf_config: Annotated[str, typer.Option("--hf-config", help="HF config folder or file")],
) -> None:
    """Check a GGUF file against its Hugging Face config before serving it."""
    from entrypoint.start.gguf_hook import run_gguf_check

    try:
        code = run_gguf_check(path, hf_config)
    except ConfigError as exc:
        fail(exc)
    raise typer.Exit(code)


@app.command()
def doctor(env_file: EnvFiles = None) -> None:
    """Check host, container and settings before a long start: one verdict per line.

    ok, warn, FAIL (a blocker) or skip, each with its reason; exit 1 on any FAIL.
    Starts nothing and downloads nothing (the hub is asked for a file list only).
    """
    from entrypoint.doctor.report import run

    raise typer.Exit(run(_environment(env_file), out=typer.echo))


@app.command()
def reserved() -> None:
    """List the SERVE_* names the entrypoint keeps for itself (never passed to vLLM)."""
    for name, meaning in settings.RESERVED.items():
        typer.echo(f"{name:24} {meaning}")
