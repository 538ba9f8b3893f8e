"""vLLM's default program runs in serve's interpreter (entrypoint/start/vllm_in_process.py).

The modules here are written to a temporary folder and run for real; the real vLLM
run through this path is covered by the CPU tier's server tests (fixtures/serving.py)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from entrypoint.start import vllm_in_process
from entrypoint.start.vllm_in_process import module_of

# The conftest tripwire replaces run_module in unit tests; these call the real one.
REAL_RUN_MODULE = vllm_in_process.run_module


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return tmp_path


def write_module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(textwrap.dedent(body))
    sys.modules.pop(name, None)


def test_only_serves_own_default_program_runs_here() -> None:
    default = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert module_of(default, "") == "vllm.entrypoints.openai.api_server"
    assert module_of([sys.executable, "-m", "entrypoint.start.vllm_serve"], " ") == (
        "entrypoint.start.vllm_serve"
    )
    assert module_of(default, '["python", "-m", "x"]') is None  # SERVE_EXEC set: exec
    assert module_of(["python3", "-m", "vllm.entrypoints.openai.api_server"], "") is None
    assert module_of([sys.executable, "-X", "importtime", "-m", "m"], "") is None
    assert module_of(["vllm", "serve"], "") is None


def test_the_module_runs_as_main_with_the_arguments(module_dir: Path) -> None:
    write_module(module_dir, "fake_server_main", """
        import sys
        if __name__ == "__main__":
            sys.modules["fake_server_record"].seen.append(
                (sys.argv[0], sys.argv[1:], sys.modules["__main__"].__spec__.name))
    """)
    record = type(sys)("fake_server_record")
    record.seen = []  # type: ignore[attr-defined]
    sys.modules["fake_server_record"] = record
    try:
        code = REAL_RUN_MODULE("fake_server_main", ["--port", "8000"])
    finally:
        del sys.modules["fake_server_record"]
    assert code == 0
    [(argv0, args, main_name)] = record.seen  # type: ignore[attr-defined]
    assert argv0 == str(module_dir / "fake_server_main.py") and args == ["--port", "8000"]
    # What multiprocessing's spawn re-imports in vLLM's engine processes.
    assert main_name == "fake_server_main"
    assert sys.modules["__main__"].__spec__ is None or (
        sys.modules["__main__"].__spec__.name != "fake_server_main"
    )


def test_an_exit_or_a_crash_ends_serve_as_it_would_a_fresh_interpreter(
    module_dir: Path,
) -> None:
    write_module(module_dir, "fake_server_exits", """
        if __name__ == "__main__":
            raise SystemExit(4)
    """)
    with pytest.raises(SystemExit) as ended:
        REAL_RUN_MODULE("fake_server_exits", [])
    assert ended.value.code == 4
    write_module(module_dir, "fake_server_crashes", """
        if __name__ == "__main__":
            raise OSError(98, "Address already in use")
    """)
    with pytest.raises(OSError, match="Address already in use"):
        REAL_RUN_MODULE("fake_server_crashes", [])
