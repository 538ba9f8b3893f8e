"""check-gguf on the tiny GLM-5 GGUF: passes when intact, names every gap otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint.start import gguf_check
from fixtures.tiny_glm5_gguf import Tiny, write_gguf

ROOT = Path(__file__).resolve().parents[2]


def run_check(path: Path, config_dir: Path) -> tuple[int, str]:
    lines: list[str] = []
    rc = gguf_check.check(str(path), str(config_dir), out=lines.append)
    return rc, "\n".join(lines)


def test_passes_on_the_intact_file(tiny_gguf: Path) -> None:
    rc, text = run_check(tiny_gguf, tiny_gguf.parent)
    assert rc == 0, text
    assert "check-gguf: OK" in text
    # histogram rows: every type the generator used, with counts
    for qtype in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K"):
        assert f"\n  {qtype} " in text, qtype


def test_main_accepts_config_file_and_reads_headers_only(tiny_gguf: Path) -> None:
    code = (
        "import sys; from entrypoint.start import gguf_check as g;"
        f"rc = g.main({str(tiny_gguf)!r}, {str(tiny_gguf.parent / 'config.json')!r});"
        "heavy = [m for m in ('vllm', 'torch') if m in sys.modules];"
        "sys.exit(rc or (3 if heavy else 0))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("dropped", ["blk.2.attn_v_b.weight", "blk.1.indexer.proj.weight",
                                     "blk.3.indexer.k_norm.bias"])
def test_fails_naming_a_removed_tensor(tiny: Tiny, tiny_dir: Path, tmp_path: Path,
                                       dropped: str) -> None:
    path = write_gguf(tmp_path / "gap.gguf", tiny, drop=[dropped])[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1, text
    assert dropped in text
    assert "unfilled parameter" in text


def test_fails_on_a_wrong_shape(tiny: Tiny, tiny_dir: Path, tmp_path: Path) -> None:
    # Same element count, rows and columns swapped: only a shape check sees it.
    path = write_gguf(tmp_path / "shape.gguf", tiny,
                      reshape={"blk.1.indexer.attn_k.weight": (768, 64)})[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1, text
    assert "shape mismatch: blk.1.indexer.attn_k.weight: file [768, 64], expected [64, 768]" in text


def test_fails_on_an_unmapped_tensor(tiny: Tiny, tiny_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "extra.gguf", tiny, extra=["blk.1.attn_kv_b_scale.weight"])[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1
    assert "unmapped GGUF tensor: blk.1.attn_kv_b_scale.weight" in text


def test_fails_when_the_config_disagrees_on_blocks(tiny_gguf: Path, tmp_path: Path) -> None:
    cfg = json.loads((tiny_gguf.parent / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, text = run_check(tiny_gguf, tmp_path)
    assert rc == 1
    assert "glm-dsa.block_count is 4, the config says 3" in text


def test_split_set_passes_and_missing_part_fails(tiny: Tiny, tiny_dir: Path,
                                                 tmp_path: Path) -> None:
    parts = write_gguf(tmp_path / "s.gguf", tiny, parts=3)
    rc, text = run_check(parts[0], tiny_dir)
    assert rc == 0, text
    assert "3 file(s)" in text
    parts[2].unlink()
    rc, text = run_check(parts[0], tiny_dir)
    assert rc == 1
    assert str(parts[2]) in text and "missing" in text


def test_fails_on_other_architecture(tiny: Tiny, tiny_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "llama.gguf", tiny, arch="llama")[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1
    assert str(path) in text and "'llama'" in text


def test_fails_on_truncated_file(tiny_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    path.write_bytes(data[:-1])
    rc, text = run_check(path, tiny_gguf.parent)
    assert rc == 1
    assert str(path) in text and "truncated" in text


def test_fails_on_head_count_mismatch(tiny: Tiny, tiny_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "heads.gguf", tiny, head_count=8)[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1
    assert "glm-dsa.attention.head_count is 8, the config says 4" in text


def test_fails_on_k_b_without_v_b(tiny: Tiny, tiny_dir: Path, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "nov.gguf", tiny, drop=["blk.0.attn_v_b.weight"])[0]
    rc, text = run_check(path, tiny_dir)
    assert rc == 1
    assert "blk.0.attn_k_b.weight present without blk.0.attn_v_b.weight" in text


def test_unsupported_model_type_has_its_own_exit_code(tiny_gguf: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    rc, text = run_check(tiny_gguf, tmp_path)
    assert rc == 3
    assert "'llama'" in text
