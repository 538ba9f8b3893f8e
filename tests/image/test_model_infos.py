"""build/docker/model_infos.py fills the cache vLLM reads instead of inspecting a model
class in a subprocess (8 s of each new CPU container's start)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "build" / "docker" / "model_infos.py"

pytestmark = pytest.mark.vllm

# vLLM's lookup, in a fresh interpreter whose subprocess inspection is a tripwire:
# only a cache entry vLLM itself accepts can answer.
LOOKUP = """
import sys
from vllm.model_executor.models import registry
def tripwire(fn):
    raise SystemExit("vLLM inspected the class in a subprocess: cache miss")
registry._run_in_subprocess = tripwire
for arch in sys.argv[1:]:
    info = registry._try_inspect_model_cls(arch, registry.ModelRegistry.models[arch])
    assert info is not None and info.is_text_generation_model, arch
print("ok")
"""


def run(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache)}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip


def test_vllm_finds_the_entries_without_a_subprocess(tmp_path: Path) -> None:
    archs = ["Gemma3ForCausalLM", "Qwen3ForCausalLM"]
    missed = run(["-c", LOOKUP, *archs], tmp_path)
    assert missed.returncode != 0 and "cache miss" in missed.stderr  # the tripwire works
    filled = run([str(SCRIPT), "--only", ",".join(archs)], tmp_path)
    assert filled.returncode == 0, filled.stderr
    assert "model_infos: 2 architectures cached" in filled.stdout
    found = run(["-c", LOOKUP, *archs], tmp_path)
    assert found.returncode == 0 and found.stdout.strip().endswith("ok"), found.stderr


def test_an_unknown_architecture_is_named(tmp_path: Path) -> None:
    result = run([str(SCRIPT), "--only", "NoSuchForCausalLM"], tmp_path)
    assert result.returncode == 2
    assert "model_infos: error: not in vLLM's registry: NoSuchForCausalLM" in result.stderr
