"""The GLM-5 Kubernetes manifest pre-fetches what its profile names from the hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from entrypoint.argv.envfile import read_env_file
from entrypoint.start import hub_files

REPO = Path(__file__).resolve().parents[2]
yaml = pytest.importorskip("yaml")


def _pod() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "glm5.yaml").read_text())
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_glm5_profile_names_a_hub_repo_for_config_and_tokenizer() -> None:
    (repo,) = hub_files.repos_from_env(read_env_file(str(REPO / "profiles" / "glm5.env")))
    assert repo.repo == "zai-org/GLM-5"
    assert repo.names == ("SERVE_HF_CONFIG_PATH", "SERVE_TOKENIZER")


def test_init_container_fetches_into_the_serve_containers_hf_cache() -> None:
    pod = _pod()
    (init,) = pod["initContainers"]
    (serve,) = pod["containers"]
    assert init["command"][-1] == "fetch-config" and "serve" not in init["command"]
    assert init["image"] == serve["image"]
    assert init["envFrom"] == serve["envFrom"]  # the same profile ConfigMap

    def by_name(entries: list[dict[str, Any]], name: str) -> dict[str, Any]:
        return next(e for e in entries if e["name"] == name)

    assert by_name(init["env"], "HF_TOKEN") == by_name(serve["env"], "HF_TOKEN")
    cache = by_name(serve["volumeMounts"], "hf-cache")
    assert by_name(init["volumeMounts"], "hf-cache") == cache
    assert cache["mountPath"] == "/home/serve/.cache/huggingface"  # HF_HOME under HOME
    assert "nvidia.com/gpu" not in str(init.get("resources"))  # fetching needs no GPU
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
