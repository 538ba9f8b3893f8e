"""bench/kernels/ab_sparse_mla.py: its inputs are checked before anything touches a GPU."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "kernels" / "ab_sparse_mla.py"
sys.path.insert(0, str(SCRIPT.parent))
import ab_sparse_mla  # noqa: E402


def test_cell_parses() -> None:
    assert ab_sparse_mla.parse_cell("128x1024") == (128, 1024)
    assert ab_sparse_mla.parse_cell("8X64") == (8, 64)


@pytest.mark.parametrize("text", ["128", "x", "128x", "0x64", "8x-1", "8x64x2"])
def test_bad_cell_is_named(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"cell {text!r}"):
        ab_sparse_mla.parse_cell(text)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def test_unknown_config_is_refused_by_name() -> None:
    proc = run("--configs", "ours", "no_such_cfg", "--cells", "8x64")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "unknown config(s) ['no_such_cfg']" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_or_ablation_kernel_variant_is_refused_by_name() -> None:
    proc = run("--configs", "ours", "--cells", "8x64", "--kernel-variants", "nope")
    assert proc.returncode == 2 and "unknown kernel variant(s) ['nope']" in proc.stderr
    proc = run("--configs", "ours", "--cells", "8x64", "--kernel-variants", "stamps+noq")
    assert proc.returncode == 2 and "['noq'] give wrong results by design" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rounds_must_be_positive() -> None:
    proc = run("--configs", "ours", "--cells", "8x64", "--rounds", "0")
    assert proc.returncode == 2 and "--rounds must be >= 1" in proc.stderr, proc.stderr[-2000:]


def test_tile_cost_refuses_a_bad_cell_by_name() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "tile_cost.py"), "--cells", "8x0"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cell '8x0': heads and tokens must be >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_flashmla_must_be_prepared_unless_left_out(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(ab_sparse_mla.bench, "PEERS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["ab_sparse_mla.py", "--configs", "ours", "--cells", "8x64"])
    with pytest.raises(SystemExit) as exc:
        ab_sparse_mla.main()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "FlashMLA is not prepared: flashmla (" in err and "--no-flashmla" in err


def test_no_gpu_is_one_error(monkeypatch, capsys) -> None:
    monkeypatch.setattr(ab_sparse_mla.torch.cuda, "is_available", lambda: False)
    argv = ["ab_sparse_mla.py", "--configs", "ours", "--cells", "8x64", "--no-flashmla"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        ab_sparse_mla.main()
    assert exc.value.code == 2
    assert "error: no CUDA GPU here" in capsys.readouterr().err
