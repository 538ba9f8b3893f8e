"""bench/kernels/exchange_precision.py, the CPU model of the cluster exchange's precision:
its encoders do what the variants' PTX does, and on the GPU test's own inputs it
separates the formats the test refuses from those it passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
import exchange_precision as ep  # noqa: E402


def test_round_mantissa_is_fp16_and_bf16_rounding() -> None:
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ep.round_mantissa(x, 7), x.bfloat16().float())
    normal = x[x.abs() > 2.0**-14]  # fp16's own range; the model's formats have none
    assert torch.equal(ep.round_mantissa(normal, 10), normal.half().float())


def test_pair_scale_keeps_each_value_where_a_pack_scale_loses_the_small_ones() -> None:
    # One token, 8 heads: a value 2^-37 of its 16-register pack's largest falls deep into
    # fp16's subnormals under the pack's scale (at 8 heads a pack is 8 latent columns of
    # 2 heads); its register pair (heads 2i, 2i + 1 at one column) holds nothing larger,
    # so there it keeps fp16's 11 bits.
    x = torch.full((1, 256, 8), 2.0**-37)
    x[0, 0, 0], x[0, 8, 0] = 2.0**-37 * 1.2345, 1.0  # one pack, two pairs
    pack = ep.encode_decode(x, ep.pack_groups(8))
    pair = ep.encode_decode(x, ep.pair_groups(8))
    assert ep.pack_groups(8)[0, 0] == ep.pack_groups(8)[8, 0]
    assert ep.pair_groups(8)[0, 0] != ep.pair_groups(8)[8, 0]
    assert (pack[0, 0, 0] - x[0, 0, 0]).abs() > 2.0**-4 * x[0, 0, 0]
    assert ((pair - x).abs() <= 2.0**-11 * x.abs()).all()


def test_model_refuses_fp16_and_passes_wide_mantissas_on_the_gpu_tests_inputs() -> None:
    q, rows, idx = ep.test_inputs(8, 11)
    halves = ep.split_halves(q, rows, idx, 8, 0.05)
    ref = ep.merged(halves, None)
    assert ep.worst(ep.merged(halves, None), ref, q.shape[1])[0] == 0.0
    fp16, _ = ep.worst(ep.merged(halves, ep.pair_groups(8)), ref, q.shape[1])
    wide, _ = ep.worst(ep.merged(halves, 18), ref, q.shape[1])
    assert fp16 > 4 * ep.BOUND and wide <= ep.BOUND
    # Against float64 (before the output's rounding), fp16 adds a visible share to the
    # worst column's error and 17 bits next to none.
    ref64, _ = ep.mod.reference_sparse_mla(q, rows, idx, 0.05)
    worst16, median16 = ep.column_error_growth(halves, ep.pair_groups(8), ref64, q.shape[1])
    worst17, _ = ep.column_error_growth(halves, 17, ref64, q.shape[1])
    assert worst16 > 1.05 and median16 >= 1.0 and worst17 < 1.01


def test_seeds_below_one_are_refused_by_name(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["exchange_precision.py", "--seeds", "0"])
    with pytest.raises(SystemExit) as exc:
        ep.main()
    assert exc.value.code == 2
    assert "--seeds must be >= 1, not 0" in capsys.readouterr().err
