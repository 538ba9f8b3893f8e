"""bench/kernels/kernel_variants.py and phase_stamps.py: every patch finds its anchors in
today's kernel, the stamps decode to phases, and bad input is refused by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kernels"
sys.path.insert(0, str(BENCH))
import kernel_variants  # noqa: E402
import phase_stamps  # noqa: E402


@pytest.mark.parametrize(
    "name", [*kernel_variants.VARIANTS, "stamps+bf16x", "stamps+noxfer"]
)
def test_variant_patches_apply_and_parse(name: str) -> None:
    base = kernel_variants.source("base")
    src = kernel_variants.source(name)
    assert src != base
    for text in kernel_variants.files(src).values():
        ast.parse(text)


def test_stamps_write_every_slot_once() -> None:
    src = kernel_variants.source("stamps")
    per_half = kernel_variants._PER_HALF
    for slot, k in kernel_variants.SLOTS.items():
        if slot in per_half:  # in _sm90_kv1_finish, which both warpgroups run
            assert src.count(f"_stamp(po_ptr, t, sp, {k} + 8 * HALF)") == 1, slot
        elif slot[0] == "o" and slot.replace("o_", "s_", 1) in per_half:
            continue  # the second warpgroup's copy of a per-HALF slot
        else:
            assert src.count(f"_stamp(po_ptr, t, sp, {k})") == 1, slot


def test_unknown_variant_and_moved_anchor_are_named() -> None:
    with pytest.raises(KeyError, match="unknown kernel variant 'nope'"):
        kernel_variants.source("stamps+nope")
    with pytest.raises(KeyError, match="found 0 times"):
        kernel_variants._sub("def f(x):\n    return x\n", None, "return y", "return x")


def test_phases_from_stamps() -> None:
    # Two tokens in clusters, 16 tiles a CTA: every CTA starts at 1000 ns + 100 ns a row,
    # scores tile 0 at +5 us and then one tile every 2 us.
    s = kernel_variants.SLOTS
    words = np.zeros((4, kernel_variants.STAMP_WORDS), dtype=np.int64)
    for row in range(4):
        t0 = 1000 + 100 * row
        words[row, s["s_start"]] = t0
        words[row, s["s_q"]] = t0 + 1500
        words[row, s["s_tile0"]] = t0 + 5000
        words[row, s["s_p0"]] = t0 + 5600
        words[row, s["s_tile1"]] = t0 + 6200
        words[row, s["s_tile2"]] = t0 + 8000
        words[row, s["s_last_top"]] = t0 + 5000 + 14 * 2000
        words[row, s["s_last_scored"]] = t0 + 5000 + 15 * 2000
        words[row, s["s_loop"]] = words[row, s["s_last_scored"]] + 900
        for wg in ("s", "o"):
            words[row, s[f"{wg}_loop"]] = words[row, s["s_loop"]]
            words[row, s[f"{wg}_xchg"]] = words[row, s["s_loop"]] + 2500
            words[row, s[f"{wg}_put"]] = words[row, s["s_loop"]] + 800
            words[row, s[f"{wg}_sent"]] = words[row, s["s_loop"]] + 1900
            words[row, s[f"{wg}_merged"]] = words[row, s[f"{wg}_xchg"]] + 800
            words[row, s[f"{wg}_end"]] = words[row, s[f"{wg}_merged"]] + 400
        words[row, s["s_stats"]] = words[row, s["s_loop"]] + 1200
        words[row, s["o_pf"]] = words[row, s["s_loop"]] + 1500
    words = (words % 2**32).astype(np.uint32).view(np.int32)  # as the kernel writes them
    rows = dict(phase_stamps.phases(words, cluster=True, n_tiles=16))
    assert np.allclose(rows["start"], [0.0, 0.1, 0.2, 0.3])
    assert np.allclose(rows["per tile, tile 0 .. last scored"], 2.0)
    assert np.allclose(rows["last tile: softmax .. p.v"], 0.9)
    assert np.allclose(rows["tile 0: scored -> p handed over"], 0.6)
    assert np.allclose(rows["tile 0 scored -> tile 1 scored"], 1.2)
    assert np.allclose(rows["tile 1 scored -> tile 2 scored"], 1.8)
    for keeper in ("split 0 keeper", "split 1 keeper"):
        merged = rows[f"{keeper}: in -> merged"]
        assert np.allclose(merged, 0.8) and len(merged) == 2
        assert np.allclose(rows[f"{keeper}: loop end -> partner's half in"], 2.5)
    for k, v in (("split 1, first wg: loop end -> o sent", 0.8),
                 ("split 1, first wg: o sent -> lse, 1/l computed", 0.4),
                 ("split 0, second wg: loop end -> signalled", 1.9),
                 ("split 1, second wg: loop end -> 1/l in", 1.5)):  # fmt: skip
        assert np.allclose(rows[k], v) and len(rows[k]) == 2, k
    assert np.allclose(rows["pair: the later loop end -> the later end"], 3.7)
    assert np.allclose(rows["pair's loop ends apart"], 0.1)
    one = dict(phase_stamps.phases(words, cluster=False, n_tiles=16))
    assert len(one["start"]) == 2 and "pair's loop ends apart" not in one


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / "phase_stamps.py"), *args], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "args,message",
    [
        (["--cells", "32x64", "--variants", "nope"], "unknown variant(s) ['nope']"),
        (["--cells", "64x64"], "cell(s) ['64x64']: these tools cover the KV-major s_by_one"),
        (["--cells", "32x1"], "cell(s) ['32x1']: these tools cover"),
        (["--cells", "8x0"], "cell '8x0': heads and tokens must be >= 1"),
        (["--cells", "8x64", "--rounds", "0"], "--rounds must be >= 1"),
    ],
)
def test_phase_stamps_refuses_bad_input_by_name(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_sm90_resources_refuses_an_unknown_variant_and_another_triton() -> None:
    import sm90_resources

    proc = subprocess.run(
        [sys.executable, str(BENCH / "sm90_resources.py"), "base", "nope"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown kernel variant 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sm90_resources.version_error("3.6.0") is None
    assert "this is triton 3.9.0: put a triton 3.6.x first" in sm90_resources.version_error("3.9.0")
