"""Run vLLM's default program in the interpreter that validated its arguments.

Validation builds vLLM's own parser, which imports most of vLLM and torch (7 s of a
Gemma start on two cores). Exec'ing `python -m vllm.entrypoints.openai.api_server`
then pays the same imports again in a fresh interpreter. When the program is the
default one, `serve` runs that module here instead, as `python -m` would: same pid,
same argv after the module name, `__main__` set to the module while it runs, so
vLLM's spawned engine processes re-import the module they would import after an
exec. vLLM reads its environment lazily and reconfigures logging from its parsed
arguments, so what `serve` sets before this call reaches it as through an exec.

SERVE_EXEC (any program, even the same one) keeps the exec.
"""

from __future__ import annotations

import runpy
import sys


def module_of(program: list[str], exec_setting: str) -> str | None:
    """The module to run here, or None to exec `program`.

    Only the default program, `sys.executable -m MODULE` chosen by serve itself
    (SERVE_EXEC unset): that is the interpreter and import path validation used."""
    if exec_setting.strip():
        return None
    if len(program) == 3 and program[0] == sys.executable and program[1] == "-m":
        return program[2]
    return None


def run_module(module: str, args: list[str]) -> int:
    """`python -m MODULE ARGS...` in this interpreter; 0 when it returns.

    Its SystemExit and exceptions propagate as they would end a fresh interpreter."""
    sys.argv = [module, *args]  # runpy puts the module's file in argv[0]
    sys.stdout.flush()
    sys.stderr.flush()
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0
