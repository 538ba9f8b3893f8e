"""The typer commands: exit codes and messages, with exec and spawning replaced."""

from __future__ import annotations

import json
import os
import shlex
import sys
import types
from pathlib import Path

import pytest

import entrypoint.start.serve as serve_module
from entrypoint.argv import settings
from entrypoint.watch.statusfile import read_json
from tests.entrypoint.recording import Recorder, invoke


def test_render_text_and_json(vllm_table, base_env: dict[str, str]) -> None:
    env = {**base_env, "SERVE_SPECULATIVE_CONFIG": '{"method": "dflash"}'}
    text = invoke(env, "render")
    as_json = invoke(env, "render", "--json")
    assert text.exit_code == 0 and as_json.exit_code == 0, text.output
    argv = json.loads(as_json.stdout)
    assert shlex.split(text.stdout) == argv
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"dflash"}'


def test_render_exec_target_override(vllm_table, base_env: dict[str, str]) -> None:
    result = invoke({**base_env, "SERVE_EXEC": '["vllm", "serve"]'}, "render", "--json")
    assert json.loads(result.stdout)[:4] == ["vllm", "serve", "--model", "org/model"]


def test_render_bad_exec_target(vllm_table, base_env: dict[str, str]) -> None:
    result = invoke({**base_env, "SERVE_EXEC": '"vllm serve"'}, "render")
    assert result.exit_code == 2
    assert "SERVE_EXEC must be a non-empty JSON array of strings" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"SERVE_SPECULATIVE_CONFIG": "{method: x}"},
            "error: SERVE_SPECULATIVE_CONFIG: invalid JSON at line 1 column 2 (char 1)",
        ),
        (
            {"SERVE_TENSOR_PARALEL_SIZE": "8"},
            "error: SERVE_TENSOR_PARALEL_SIZE: --tensor-paralel-size is not an option",
        ),
        (
            {"SERVE_TENSOR_PARALLEL_SIZE": "eight"},
            "error: SERVE_TENSOR_PARALLEL_SIZE='eight': --tensor-parallel-size expects an integer",
        ),
        (
            {"SERVE_TRUST_REMOTE_CODE": "yes please"},
            "error: SERVE_TRUST_REMOTE_CODE='yes please': expected a boolean",
        ),
        (
            {"SERVE_EXTRA_ARGS": '{"seed": 1}'},
            "error: SERVE_EXTRA_ARGS must be a JSON array of strings",
        ),
        (
            {"SERVE_EXTRA_ARGS": '["--no-such-option"]'},
            "error: vLLM rejects the arguments (check SERVE_EXTRA_ARGS): unrecognized arguments",
        ),
        ({"SERVE_MODEL": ""}, "error: SERVE_MODEL is not set"),
    ],
)
def test_bad_input_fails_before_anything_starts(
    vllm_table, base_env: dict[str, str], recorder: Recorder, extra: dict[str, str], message: str
) -> None:
    for command in ("render", "serve"):
        result = invoke({**base_env, **extra}, command)
        assert result.exit_code == 2, result.output
        assert message in result.output
    assert recorder.exec_argv is None and recorder.popen_args is None


def test_serve_unwritable_ready_folder(
    vllm_table, base_env: dict[str, str], recorder: Recorder, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = invoke({**base_env, "SERVE_READY_FILE": str(blocker / "ready")}, "serve")
    assert result.exit_code == 2
    assert f"error: SERVE_READY_FILE={blocker}/ready: cannot write in {blocker}" in result.output
    assert recorder.exec_argv is None


def test_serve_port_in_use(
    vllm_table, base_env: dict[str, str], recorder: Recorder, listening_port: int
) -> None:
    result = invoke({**base_env, "SERVE_PORT": str(listening_port)}, "serve")
    assert result.exit_code == 2
    assert (
        f"error: SERVE_PORT={listening_port}: port {listening_port} on 127.0.0.1 is already in use"
    ) in result.output
    assert recorder.exec_argv is None


def test_serve_port_check_can_be_turned_off(
    vllm_table, base_env: dict[str, str], recorder: Recorder, listening_port: int
) -> None:
    env = {**base_env, "SERVE_PORT": str(listening_port), "SERVE_CHECK_PORT": "false"}
    invoke(env, "serve")
    assert recorder.exec_argv is not None


def test_serve_bad_reserved_value(vllm_table, base_env: dict[str, str], recorder: Recorder) -> None:
    result = invoke({**base_env, "SERVE_HEALTH_FAILURES": "three"}, "serve")
    assert result.exit_code == 2
    assert "error: SERVE_HEALTH_FAILURES='three': expected a whole number" in result.output


def test_serve_starts_watcher_then_runs_vllm_here(
    vllm_table, base_env: dict[str, str], recorder: Recorder
) -> None:
    ready = Path(base_env["SERVE_READY_FILE"])
    ready.parent.mkdir(parents=True)
    ready.write_text("{}")  # a stale file from an earlier run
    rendered = json.loads(invoke(base_env, "render", "--json").stdout)
    recorder.run_code = 3
    result = invoke(base_env, "serve")
    # The default program runs in this interpreter; its return is serve's exit code.
    assert recorder.ran_here and recorder.exec_argv == rendered
    assert result.exit_code == 3
    assert "frontier-serve: run in this process " in result.output
    assert recorder.popen_args is not None
    assert recorder.popen_args[:3] == [sys.executable, "-m", "entrypoint.watch.watcher"]
    config = json.loads(recorder.popen_args[3])
    assert config["pid"] == os.getpid()
    assert config["base_url"] == f"http://127.0.0.1:{base_env['SERVE_PORT']}"
    assert config["ready_file"] == str(ready)
    assert not ready.exists()


def test_serve_execs_a_serve_exec_program(
    vllm_table, base_env: dict[str, str], recorder: Recorder
) -> None:
    # Even the default program named through SERVE_EXEC is exec'd, not run here.
    program = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    env = {**base_env, "SERVE_EXEC": json.dumps(program)}
    rendered = json.loads(invoke(env, "render", "--json").stdout)
    result = invoke(env, "serve")
    # The recorder's execvp fails like a missing program would: exit 127, status says so.
    assert result.exit_code == 127
    assert not recorder.ran_here and recorder.exec_argv == rendered
    assert rendered[:3] == program
    status = read_json(str(Path(base_env["SERVE_READY_FILE"]).parent / "status.json"))
    assert status is not None
    assert status["phase"] == "exited" and status["exit_code"] == 127
    assert "exec of" in status["reason"] and status["argv_digest"].startswith("sha256:")


def test_serve_without_watcher(vllm_table, base_env: dict[str, str], recorder: Recorder) -> None:
    invoke({**base_env, "SERVE_WATCHER": "false"}, "serve")
    assert recorder.exec_argv is not None and recorder.popen_args is None


def test_serve_uds_needs_watcher_off(
    vllm_table, base_env: dict[str, str], recorder: Recorder
) -> None:
    result = invoke({**base_env, "SERVE_UDS": "/tmp/x.sock"}, "serve")
    assert (
        result.exit_code == 2 and "SERVE_UDS: the watcher checks health over TCP" in result.output
    )


@pytest.fixture
def fake_gguf_check(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    module = types.ModuleType("entrypoint.start.gguf_check")

    def main(path: str, hf_config: str) -> int:
        calls.append((path, hf_config))
        return 1 if "bad" in path else 0  # 1: the check found gaps

    module.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "entrypoint.start.gguf_check", module)
    return calls


def test_check_gguf_calls_the_check(fake_gguf_check: list[tuple[str, str]]) -> None:
    assert invoke({}, "check-gguf", "/m/ok.gguf", "--hf-config", "/cfg").exit_code == 0
    assert invoke({}, "check-gguf", "/m/bad.gguf", "--hf-config", "/cfg").exit_code == 1
    assert fake_gguf_check == [("/m/ok.gguf", "/cfg"), ("/m/bad.gguf", "/cfg")]


def test_serve_runs_gguf_check_first(
    vllm_table,
    base_env: dict[str, str],
    recorder: Recorder,
    fake_gguf_check: list[tuple[str, str]],
    tmp_path: Path,
) -> None:
    env = {**base_env, "SERVE_MODEL": "/m/bad.gguf", "SERVE_HF_CONFIG_PATH": str(tmp_path)}
    result = invoke(env, "serve")
    assert result.exit_code == 1 and "GGUF preflight failed (exit 1)" in result.output
    assert fake_gguf_check == [("/m/bad.gguf", str(tmp_path))]
    assert recorder.exec_argv is None and recorder.popen_args is None


def test_serve_gguf_check_passes_then_execs(
    vllm_table,
    base_env: dict[str, str],
    recorder: Recorder,
    fake_gguf_check: list[tuple[str, str]],
) -> None:
    invoke({**base_env, "SERVE_MODEL": "/m/ok.gguf"}, "serve")
    assert fake_gguf_check == [("/m/ok.gguf", "/m")]  # default config folder: the model's
    assert recorder.exec_argv is not None


def test_serve_gguf_check_off_or_not_gguf(
    vllm_table,
    base_env: dict[str, str],
    recorder: Recorder,
    fake_gguf_check: list[tuple[str, str]],
) -> None:
    invoke({**base_env, "SERVE_MODEL": "/m/bad.gguf", "SERVE_PREFLIGHT_GGUF": "false"}, "serve")
    invoke({**base_env, "SERVE_MODEL": "/m/model-dir"}, "serve")  # no .gguf, no check asked
    assert fake_gguf_check == []


def test_serve_refuses_a_gguf_check_asked_for_a_model_that_is_no_gguf(
    vllm_table,
    base_env: dict[str, str],
    recorder: Recorder,
    fake_gguf_check: list[tuple[str, str]],
) -> None:
    """Asked for explicitly, the check is never skipped in silence."""
    result = invoke({**base_env, "SERVE_PREFLIGHT_GGUF": "true"}, "serve")  # org/model
    assert result.exit_code == 2, result.output
    assert (
        "frontier-serve: error: SERVE_PREFLIGHT_GGUF=true, but SERVE_MODEL='org/model' is not "
        "a .gguf file" in result.output
    )
    assert fake_gguf_check == [] and recorder.exec_argv is None and recorder.popen_args is None


def test_reserved_lists_names() -> None:

    result = invoke({}, "reserved")
    assert result.exit_code == 0 and "SERVE_READY_FILE" in result.stdout
    for name, meaning in settings.RESERVED.items():
        assert name in result.stdout and meaning.split(" (")[0] in result.stdout, name


def test_each_reserved_name_is_described_once_where_reserved_shows_it() -> None:
    source = Path(settings.__file__).read_text()
    assert "render --help" not in source and "`frontier-serve reserved`" in source
    # the constants carry no second description in a trailing comment
    import re

    assert not re.findall(r'(?m)^[A-Z_]+ = "SERVE_[A-Z_]+"[ \t]*#.*$', source)


def test_serve_model_is_named_in_one_module() -> None:
    package = Path(settings.__file__).parents[1]
    defining = [
        str(p.relative_to(package))
        for p in sorted(package.rglob("*.py"))
        if '= "SERVE_MODEL"' in p.read_text()
    ]
    assert defining == ["argv/settings.py"]


def test_the_watcher_reaches_vllm_where_preflight_says_it_listens() -> None:
    """One host default: health_url derives from preflight.listen_host."""
    import argparse
    import inspect

    assert "listen_host(" in inspect.getsource(serve_module.health_url)
    cases = [
        (None, "http://127.0.0.1:8000"),
        ("", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("10.0.0.2", "http://10.0.0.2:8000"),
    ]
    for host, url in cases:
        assert serve_module.health_url(argparse.Namespace(host=host, port=8000)) == url


def test_env_file_is_layered_under_environment(
    vllm_table, base_env: dict[str, str], tmp_path: Path
) -> None:
    env_file = tmp_path / "p.env"
    env_file.write_text("# comment\nSERVE_SEED=1\nSERVE_DTYPE=float16\n")
    result = invoke(
        {**base_env, "SERVE_SEED": "2"}, "render", "--json", "--env-file", str(env_file)
    )
    argv = json.loads(result.stdout)
    assert argv[argv.index("--seed") + 1] == "2"
    assert argv[argv.index("--dtype") + 1] == "float16"


def test_env_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.env"
    bad.write_text("SERVE_SEED 1\n")
    result = invoke({}, "render", "--env-file", str(bad))
    assert result.exit_code == 2 and f"env file {bad}:1: expected KEY=VALUE" in result.output
    result = invoke({}, "render", "--env-file", str(tmp_path / "none.env"))
    assert result.exit_code == 2 and "No such file or directory" in result.output


@pytest.mark.parametrize(("explicit", "expected"), [("", 0), ("true", 3)])
def test_preflight_skips_unknown_architectures_unless_asked(
    monkeypatch: pytest.MonkeyPatch, explicit: str, expected: int
) -> None:
    import argparse

    from entrypoint.start import preflight

    module = types.ModuleType("entrypoint.start.gguf_check")
    module.main = lambda path, hf_config: 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "entrypoint.start.gguf_check", module)
    env = {"SERVE_PREFLIGHT_GGUF": explicit} if explicit else {}
    namespace = argparse.Namespace(model="/m/gemma.gguf", hf_config_path="/cfg")
    assert preflight.gguf_preflight(env, namespace) == expected


def test_env_file_values_reach_the_watcher(
    vllm_table,
    base_env: dict[str, str],
    recorder: Recorder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SERVE_API_KEY only in the env file: the watcher needs it for /v1/models."""
    env_file = tmp_path / "p.env"
    ready = tmp_path / "elsewhere" / "ready"
    env_file.write_text(f"SERVE_API_KEY=s3cret\nSERVE_READY_FILE={ready}\n")
    env = {k: v for k, v in base_env.items() if k != "SERVE_READY_FILE"}
    monkeypatch.delenv("SERVE_API_KEY", raising=False)
    result = invoke(env, "serve", "--env-file", str(env_file))
    assert recorder.popen_args is not None, result.output
    assert recorder.popen_env.get("SERVE_API_KEY") == "s3cret"
    assert json.loads(recorder.popen_args[-1])["ready_file"] == str(ready)
    assert "give probe the same --env-file" in result.output
