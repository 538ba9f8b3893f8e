"""Hub-named config and tokenizer (profiles/glm5.env: zai-org/GLM-5), against a stand-in hub.

The child-process tests give huggingface_hub its settings the way a container does, as
environment (HF_ENDPOINT, HF_HOME, HF_HUB_OFFLINE), since it reads them at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.start import hub_files
from fixtures.serving import free_port
from tests.entrypoint.stand_in_hub import COMMIT, StandInHub, running_stand_in_hub

REPO = Path(__file__).resolve().parents[2]
GLM = "zai-org/GLM-5"
SMALL = {
    "config.json": json.dumps({"model_type": "glm_moe_dsa", "hidden_size": 64}).encode(),
    "generation_config.json": b'{"eos_token_id": 1}',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "tokenizer_config.json": b'{"tokenizer_class": "PreTrainedTokenizerFast"}',
    "configuration_glm.py": b"# trust_remote_code config\n",
}
WEIGHTS = {
    "model-00001-of-00002.safetensors": b"\0" * 4096,
    "model.safetensors.index.json": b'{"weight_map": {}}',
    "GLM-5-Q4_K_M.gguf": b"GGUF" + b"\0" * 64,
    "README.md": b"# GLM-5\n",
}


@pytest.fixture
def stand_in_hub() -> Iterator[StandInHub]:
    with running_stand_in_hub({GLM: {**SMALL, **WEIGHTS}}) as hub:
        yield hub


def hub_env(tmp_path: Path, endpoint: str, **extra: str) -> dict[str, str]:
    """The child's environment: only our HF settings, no proxy between it and 127.0.0.1."""
    ours = ("HF_", "SERVE_", "TRANSFORMERS_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(ours) and "proxy" not in k.lower()}  # fmt: skip
    return {**env, "PYTHONPATH": str(REPO), "NO_PROXY": "127.0.0.1", "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf-home"), **extra}  # fmt: skip


def run(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=timeout)  # fmt: skip


def fetch_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run(env, "-m", "entrypoint", "fetch-config", "--env-file", "profiles/glm5.env")


def snapshot(tmp_path: Path) -> Path:
    return tmp_path / "hf-home" / "hub" / "models--zai-org--GLM-5" / "snapshots" / COMMIT


def assert_names_repo_and_prefetch(result: subprocess.CompletedProcess[str], why: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("frontier-serve:")]
    assert ours and all(line.startswith("frontier-serve: error: ") for line in ours), ours
    assert f"SERVE_HF_CONFIG_PATH/SERVE_TOKENIZER={GLM}:" in result.stderr
    assert why in result.stderr
    assert f"frontier-serve fetch-config {GLM}" in result.stderr
    assert f"hf download {GLM} --include config.json" in result.stderr
    assert "--include 'tokenizer*'" in result.stderr and ".safetensors" not in result.stderr


@pytest.mark.process
def test_fetch_config_takes_small_files_from_the_stand_in_hub(
    stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    env = hub_env(tmp_path, stand_in_hub.url)
    first = fetch_config(env)
    assert first.returncode == 0, first.stderr
    folder = snapshot(tmp_path)
    assert first.stdout.strip() == str(folder)
    assert {p.name for p in folder.iterdir()} == set(SMALL)
    for name in SMALL:
        assert f"fetching {stand_in_hub.url}/{GLM} {name}" in first.stderr
    assert stand_in_hub.requested_files() == set(SMALL)  # weights never asked for
    assert not any(name in path for name in WEIGHTS for _, path in stand_in_hub.requests)

    again = fetch_config(env)  # cached: nothing downloaded again
    assert again.returncode == 0 and f"all {len(SMALL)} config/tokenizer files are cached" in (
        again.stderr
    )
    offline = fetch_config({**env, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert offline.returncode == 0, offline.stderr  # the cache alone serves an offline start
    assert offline.stdout.strip() == str(folder)


@pytest.mark.process
def test_offline_with_an_empty_cache_names_the_repo_and_the_prefetch(
    stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    result = fetch_config(hub_env(tmp_path, stand_in_hub.url, HF_HUB_OFFLINE="1"))
    assert_names_repo_and_prefetch(result, "HF_HUB_OFFLINE is set")
    assert stand_in_hub.requests == []  # offline means no traffic at all


@pytest.mark.process
def test_fetch_config_needs_neither_vllm_nor_torch(
    stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    """An init container without a GPU: the CUDA build's vLLM must not even be imported."""
    code = ("import sys\nfrom entrypoint.cli import main\ntry:\n    main(['fetch-config', "
            f"'{GLM}'])\nexcept SystemExit as e:\n    print('exit', e.code)\n"
            "print('heavy', [m for m in ('vllm', 'torch', 'transformers') if m in sys.modules])")
    result = run(hub_env(tmp_path, stand_in_hub.url), "-c", code)
    assert result.stdout.splitlines()[-2:] == ["exit 0", "heavy []"], result.stderr


@pytest.mark.process
def test_hub_down_with_an_empty_cache_names_the_repo_and_the_prefetch(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = fetch_config(hub_env(tmp_path, closed))
    assert_names_repo_and_prefetch(result, f"cannot be fetched from {closed}: the hub cannot be")


@pytest.mark.process
def test_unknown_repo_says_so(stand_in_hub: StandInHub, tmp_path: Path) -> None:
    result = run(hub_env(tmp_path, stand_in_hub.url), "-m", "entrypoint", "fetch-config",
                 "zai-org/no-such-model")  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "repo=zai-org/no-such-model" in result.stderr
    assert "no such repo, or it is private and HF_TOKEN is missing" in result.stderr


def serve_settings(tmp_path: Path) -> dict[str, str]:
    ready = str(tmp_path / "run" / "ready")
    return {"SERVE_HOST": "127.0.0.1", "SERVE_PORT": str(free_port()), "SERVE_READY_FILE": ready}


@pytest.mark.process
def test_hf_token_reaches_a_private_repo(tmp_path: Path) -> None:
    private = "acme/private-glm"
    with running_stand_in_hub({private: SMALL}, private={private: "hf_stand_in"}) as hub:
        refused = run(hub_env(tmp_path, hub.url), "-m", "entrypoint", "fetch-config", private)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "private and HF_TOKEN is missing or wrong" in refused.stderr
        taken = run(hub_env(tmp_path, hub.url, HF_TOKEN="hf_stand_in"),
                    "-m", "entrypoint", "fetch-config", private)  # fmt: skip
        assert taken.returncode == 0, taken.stderr
        assert hub.requested_files() == set(SMALL)


SERVE_WITH_RECORDING_CHECK = """
import json, os, sys, types
check = types.ModuleType("entrypoint.start.gguf_check")
def main(path, hf_config):
    listing = sorted(os.listdir(hf_config)) if os.path.isdir(hf_config) else None
    print("CHECK " + json.dumps([path, hf_config, listing]), flush=True)
    return 1  # stop here: never exec vLLM
check.main = main
sys.modules["entrypoint.start.gguf_check"] = check
from entrypoint.cli import main as cli
sys.exit(cli(["serve", "--env-file", "profiles/glm5.env"]))
"""


@pytest.mark.process
@pytest.mark.slow
def test_serve_fetches_first_and_the_preflight_gets_the_local_folder(
    stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    env = hub_env(tmp_path, stand_in_hub.url, **serve_settings(tmp_path))
    result = run(env, "-c", SERVE_WITH_RECORDING_CHECK, timeout=300)
    checks = [json.loads(line[6:]) for line in result.stdout.splitlines()
              if line.startswith("CHECK ")]  # fmt: skip
    assert checks, result.stderr[-3000:]
    (model, hf_config, listing), = checks
    assert model.endswith("GLM-5-UD-Q4_K_XL-00001-of-00010.gguf")
    assert hf_config == str(snapshot(tmp_path)) and "config.json" in (listing or [])
    assert result.returncode == 1 and "GGUF preflight failed (exit 1)" in result.stderr
    assert stand_in_hub.requested_files() == set(SMALL)


@pytest.mark.process
@pytest.mark.slow
def test_serve_offline_with_an_empty_cache_exits_2_before_the_preflight(
    stand_in_hub: StandInHub, tmp_path: Path
) -> None:
    env = hub_env(tmp_path, stand_in_hub.url, HF_HUB_OFFLINE="1", **serve_settings(tmp_path))
    result = run(env, "-c", SERVE_WITH_RECORDING_CHECK, timeout=300)
    assert "CHECK " not in result.stdout
    assert_names_repo_and_prefetch(result, "HF_HUB_OFFLINE is set")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("zai-org/GLM-5", "zai-org/GLM-5"), ("/models/cfg", None), ("./cfg", None), ("", None),
     ("gpt2", None), ("~/cfg", None), ("a/b/c", None), (None, None)],
)  # fmt: skip
def test_hub_repo_id(value: str | None, expected: str | None) -> None:
    assert hub_files.hub_repo_id(value) == expected


def test_an_existing_folder_is_not_a_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org" / "cfg").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub_files.hub_repo_id("org/cfg") is None


def test_same_repo_for_config_and_tokenizer_is_fetched_once() -> None:
    env = {"SERVE_HF_CONFIG_PATH": GLM, "SERVE_TOKENIZER": GLM}
    (repo,) = hub_files.repos_from_env(env)
    assert repo.names == ("SERVE_HF_CONFIG_PATH", "SERVE_TOKENIZER")
    env["SERVE_TOKENIZER_REVISION"] = "v2"
    assert [r.revision for r in hub_files.repos_from_env(env)] == [None, "v2"]


def test_only_small_files_are_asked_for() -> None:
    from fnmatch import fnmatch

    def wanted(name: str) -> bool:
        return any(fnmatch(name, p) for p in hub_files.SMALL_FILES) and not any(
            fnmatch(name, p) for p in hub_files.WEIGHTS
        )

    assert all(wanted(name) for name in SMALL)
    assert not any(wanted(name) for name in WEIGHTS)
