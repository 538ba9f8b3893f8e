"""The shipped profiles render against the installed vLLM exactly as intended."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from entrypoint.argv.render import render

SPEC = '{"method":"dflash","model":"z-lab/Qwen3.6-27B-DFlash","num_speculative_tokens":15}'
REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"


def options(name: str) -> list[str]:
    rendered = render(read_env_file(str(PROFILES / name)))
    return rendered.argv[len(rendered.program) :]


def pairs(argv: list[str]) -> dict[str, str | None]:
    """--opt value / --flag pairs, for order-free comparison."""
    out: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


GLM5_SPEC = '{"method":"mtp","num_speculative_tokens":3}'
GLM5_GGUF = "/models/GLM-5-GGUF/UD-Q4_K_XL/GLM-5-UD-Q4_K_XL-00001-of-00010.gguf"


def test_glm5(vllm_table) -> None:
    argv = options("glm5.env")
    assert argv[:2] == ["--model", GLM5_GGUF]
    assert pairs(argv) == {
        "--model": GLM5_GGUF,
        "--hf-config-path": "zai-org/GLM-5",
        "--tokenizer": "zai-org/GLM-5",
        "--served-model-name": "glm-5",
        "--tensor-parallel-size": "8",
        "--max-model-len": "4096",
        "--gpu-memory-utilization": "0.90",
        "--dtype": "bfloat16",
        "--trust-remote-code": None,
        "--hf-overrides": '{"indexer_rope_interleave":true}',
        "--speculative-config": GLM5_SPEC,
        "--disable-access-log-for-endpoints": "/health,/v1/models",
        "--shutdown-timeout": "30",
    }
    assert "SERVE_PREFLIGHT_GGUF" in read_env_file(str(PROFILES / "glm5.env"))


def glm5_2node_env() -> dict[str, str]:
    """glm5-2node.env layered on glm5.env, as Kubernetes and `docker run` read them."""
    return {
        **read_env_file(str(PROFILES / "glm5.env")),
        **read_env_file(str(PROFILES / "glm5-2node.env")),
    }


def test_glm5_2node_holds_only_what_differs() -> None:
    base = read_env_file(str(PROFILES / "glm5.env"))
    layer = read_env_file(str(PROFILES / "glm5-2node.env"))
    assert [k for k, v in layer.items() if base.get(k) == v] == []
    assert set(layer) == {
        "SERVE_NNODES", "SERVE_TENSOR_PARALLEL_SIZE", "SERVE_PIPELINE_PARALLEL_SIZE",
        "SERVE_MASTER_PORT", "SERVE_LEADER_TIMEOUT", "SERVE_SPECULATIVE_CONFIG",
    }  # fmt: skip
    assert layer["SERVE_SPECULATIVE_CONFIG"] == ""  # cleared: refused with PP (nodes test)


def test_glm5_lws_layers_the_two_profiles() -> None:
    # Both LeaderWorkerSet templates (and their init containers) read glm5.env's
    # ConfigMap first and glm5-2node.env's last, so the layer's keys win.
    yaml = pytest.importorskip("yaml")
    (lws,) = [d for d in yaml.safe_load_all((REPO / "deploy/kubernetes/glm5-lws.yaml").read_text())
              if d and d.get("kind") == "LeaderWorkerSet"]  # fmt: skip
    seen = 0
    for pod in _pod_templates(lws):
        for container in (*pod.get("initContainers", []), *pod["containers"]):
            maps = [e["configMapRef"]["name"] for e in container["envFrom"]]
            assert maps == ["glm5-profile", "glm5-2node-profile"], container["name"]
            seen += 1
    assert seen == 4


@pytest.mark.parametrize(("rank", "program"), [
    ("0", "vllm.entrypoints.openai.api_server"), ("1", "entrypoint.start.vllm_serve")])
def test_glm5_2node(vllm_table, rank: str, program: str) -> None:
    """TP4 × PP2 over 2 nodes; each node adds its rank and the leader's address (LWS)."""
    env = {**glm5_2node_env(), "SERVE_NODE_RANK": rank,
           "SERVE_MASTER_ADDR": "glm5-lws-0.glm5-lws.default"}  # fmt: skip
    rendered = render(env)
    argv = rendered.argv[len(rendered.program) :]
    assert rendered.program[-1] == program
    single = pairs(options("glm5.env"))
    del single["--tensor-parallel-size"]
    del single["--speculative-config"]  # vLLM 0.32 cannot run it under PP
    assert pairs(argv) == {
        **single,
        "--tensor-parallel-size": "4",
        "--pipeline-parallel-size": "2",
        "--nnodes": "2",
        "--node-rank": rank,
        "--master-addr": "glm5-lws-0.glm5-lws.default",
        "--master-port": "29501",
        **({"--headless": None} if rank == "1" else {}),
    }
    assert rendered.node.role == ("leader" if rank == "0" else "worker")


def test_qwen36_dflash(vllm_table) -> None:
    """No forced attention backend: vLLM's own choice for target and drafter (the
    profile says why)."""
    argv = options("qwen36-dflash.env")
    assert pairs(argv) == {
        "--model": "Qwen/Qwen3.6-27B",
        "--speculative-config": SPEC,
        "--tensor-parallel-size": "2",
        "--max-num-batched-tokens": "32768",
        "--disable-access-log-for-endpoints": "/health,/v1/models",
        "--shutdown-timeout": "30",
    }


def test_qwen36_thinking_off_as_the_profile_documents(vllm_table) -> None:
    text = (PROFILES / "qwen36-dflash.env").read_text()
    line = 'SERVE_DEFAULT_CHAT_TEMPLATE_KWARGS={"enable_thinking": false}'
    assert f"#   {line}" in text
    env = read_env_file(str(PROFILES / "qwen36-dflash.env"))
    key, value = line.split("=", 1)
    argv = render({**env, key: value}).argv
    assert pairs(argv)["--default-chat-template-kwargs"] == '{"enable_thinking":false}'


@pytest.mark.parametrize("name", ["glm5.env", "glm5-2node.env", "qwen36-dflash.env"])
def test_profiles_are_portable(name: str) -> None:
    """Only SERVE_ names, and nothing that compose or Kubernetes would read differently."""
    text = (PROFILES / name).read_text()
    for key, value in read_env_file(str(PROFILES / name)).items():
        assert key.startswith("SERVE_"), key
        assert not value.startswith(("'", '"')) and "$" not in value and " #" not in value
    assert "VLLM_" not in text


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def test_every_service_drains_within_its_stop_grace_period() -> None:
    """SIGTERM drains for SERVE_SHUTDOWN_TIMEOUT, then vLLM tears down; the runtime's
    SIGKILL must come after both, or a drain is cut off uncleanly."""
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    checked = []
    for name, service in compose["services"].items():
        env: dict[str, str] = {}
        for env_file in service.get("env_file", []):
            env.update(read_env_file(str(REPO / env_file)))
        env.update({k: str(v) for k, v in (service.get("environment") or {}).items()})
        shutdown = float(env.get("SERVE_SHUTDOWN_TIMEOUT", "0"))
        teardown = 30 if "deploy" in service else 10  # GPU workers take longer to stop
        grace = _seconds(service["stop_grace_period"])
        assert shutdown > 0, f"{name}: no SERVE_SHUTDOWN_TIMEOUT, so a stop aborts at once"
        assert grace >= shutdown + teardown, f"{name}: stop_grace_period {grace:g} s"
        checked.append(name)
    assert {"glm5", "qwen36-dflash", "smoke", "smoke-gguf"} <= set(checked)
    seen = 0
    for manifest in sorted((REPO / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            for pod in _pod_templates(doc or {}):
                serve = next(c for c in pod["containers"] if c["name"] == "serve")
                # The profiles are the ConfigMaps made from profiles/NAME.env (NAME-profile),
                # later ones layered on earlier ones.
                env: dict[str, str] = {}
                for source in serve["envFrom"]:
                    name = source["configMapRef"]["name"].removesuffix("-profile")
                    env.update(read_env_file(str(REPO / "profiles" / f"{name}.env")))
                shutdown = float(env["SERVE_SHUTDOWN_TIMEOUT"])
                grace = pod["terminationGracePeriodSeconds"]
                assert grace >= shutdown + 30, f"{manifest.name}: grace {grace} s"
                seen += 1
    assert seen == 4  # glm5, qwen36-dflash, and glm5-lws's leader and worker


def _pod_templates(doc: dict) -> list[dict]:
    if doc.get("kind") == "Deployment":
        return [doc["spec"]["template"]["spec"]]
    if doc.get("kind") == "LeaderWorkerSet":
        group = doc["spec"]["leaderWorkerTemplate"]
        return [group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]]
    return []
