"""The GLM-5 GGUF writer (fixtures/glm5_gguf.py) on a real transformers GLM-5 checkpoint.

The checkpoint is a seeded tiny `GlmMoeDsaForCausalLM` saved by transformers
(fixtures/tiny_glm5_hf.py). gguf-py's GGUFReader reads the files back; the
round trip must give every HF tensor back, as exactly as its storage type allows.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
import torch
from gguf import GGMLQuantizationType as T

from fixtures import glm5_gguf, tiny_glm5_hf

# Relative RMS error a storage type may add (exact types are checked exactly).
LOSSY = {T.Q8_0: 0.01, T.Q4_0: 0.12, T.Q4_K: 0.12}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_glm5_hf.save(tiny_glm5_hf.build(seed=0), tmp_path_factory.mktemp("hf"))


def _write(checkpoint: Path, out: Path, types: str) -> tuple[dict, dict, dict, dict]:
    cfg, sd = glm5_gguf.load_hf(checkpoint)
    mtp = glm5_gguf.mtp_block(cfg, seed=1)
    stored = glm5_gguf.write(cfg, sd, out, types, mtp)
    return cfg, {**sd, **mtp}, stored, glm5_gguf.read_back(out, cfg)


@pytest.mark.parametrize("types", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "mixed"])
def test_every_tensor_comes_back_as_its_type_stores_it(checkpoint: Path, tmp_path: Path,
                                                       types: str) -> None:
    cfg, source, stored, back = _write(checkpoint, tmp_path / "tiny.gguf", types)
    assert set(back) == set(source)
    kinds = {}
    for name, value in source.items():
        got = back[name]
        assert got.shape == value.shape, name
        gguf_name = glm5_gguf.gguf_name(cfg, name)
        kind = stored[gguf_name]
        if gguf_name.endswith("attn_k_b.weight"):  # kv_b: two tensors, maybe two types
            v_kind = stored[gguf_name.replace("attn_k_b", "attn_v_b")]
            kind = kind if kind == v_kind else max((kind, v_kind), key=lambda t: LOSSY.get(t, 0))
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == T.F32:
            assert torch.equal(got, value.float()), name
        elif kind == T.F16:
            assert torch.equal(got, value.half().float()), name
        elif kind == T.BF16:
            assert torch.equal(got, value.bfloat16().float()), name
        else:
            err = (got - value).pow(2).mean().sqrt() / value.std()
            assert err < LOSSY[kind], (name, kind.name, float(err))
    if types != "mixed":
        assert T[types] in kinds, kinds  # the type asked for was really used
    else:
        assert {T.Q4_K, T.Q4_0, T.Q8_0, T.BF16, T.F16, T.F32} <= set(kinds)


def test_layout_is_llama_cpp_s(checkpoint: Path, tmp_path: Path) -> None:
    cfg, _, stored, _ = _write(checkpoint, tmp_path / "tiny.gguf", "F32")
    reader = gguf.GGUFReader(tmp_path / "tiny.gguf")
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape.tolist())) for t in reader.tensors}
    heads, lora = cfg["num_attention_heads"], cfg["kv_lora_rank"]
    nope, v = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    assert shapes["blk.0.attn_k_b.weight"] == (heads, lora, nope)  # split and transposed
    assert shapes["blk.0.attn_v_b.weight"] == (heads, v, lora)
    assert "blk.0.attn_kv_b.weight" not in shapes
    experts = cfg["n_routed_experts"]
    assert shapes["blk.1.ffn_gate_exps.weight"][0] == experts  # stacked
    for name in ("indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer.k_norm"):
        assert f"blk.1.{name}.weight" in shapes
    mtp = cfg["num_hidden_layers"]
    assert {f"blk.{mtp}.nextn.{x}.weight" for x in ("eh_proj", "enorm", "hnorm")} <= set(shapes)
    fields = reader.fields
    want = {"glm-dsa.attention.indexer.head_count": cfg["index_n_heads"],
            "glm-dsa.attention.indexer.key_length": cfg["index_head_dim"],
            "glm-dsa.attention.indexer.top_k": cfg["index_topk"],
            "glm-dsa.attention.kv_lora_rank": lora,
            "glm-dsa.attention.key_length_mla": nope + cfg["qk_rope_head_dim"],
            "glm-dsa.rope.dimension_count": cfg["qk_rope_head_dim"],
            "glm-dsa.nextn_predict_layers": 1, "glm-dsa.block_count": mtp + 1,
            "glm-dsa.expert_count": experts, "glm-dsa.leading_dense_block_count": 1}
    for key, value in want.items():
        assert fields[key].contents() == value, key
    assert len(stored) == len(shapes)


def test_rows_a_type_cannot_hold_fall_back_to_smaller_blocks(checkpoint: Path,
                                                             tmp_path: Path) -> None:
    cfg, _, stored, _ = _write(checkpoint, tmp_path / "tiny.gguf", "Q4_K")
    # attn_k_b rows are qk_nope_head_dim (64) long: no 256-value K-quant block fits
    assert cfg["qk_nope_head_dim"] % 256 and stored["blk.0.attn_k_b.weight"] == T.Q8_0
    assert stored["blk.0.attn_q_a.weight"] == T.Q4_K  # hidden 256: one block per row
    assert stored["blk.1.ffn_gate_inp.weight"] == T.F32  # the router stays exact


def test_the_written_pair_passes_check_gguf(checkpoint: Path, tmp_path: Path) -> None:
    from entrypoint.start import gguf_check

    out = tmp_path / "tiny.gguf"
    assert glm5_gguf.main([str(checkpoint), str(out), "--types", "mixed", "--mtp-seed", "1"]) == 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["indexer_rope_interleave"] is True and config["num_nextn_predict_layers"] == 1
    assert gguf_check.check(str(out), str(tmp_path / "config.json"), out=lambda _: None) == 0


def test_an_unknown_type_is_refused_by_name(checkpoint: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        glm5_gguf.main([str(checkpoint), str(tmp_path / "x.gguf"), "--types", "Q3_K"])
    assert exc.value.code == 2
    assert "--types 'Q3_K'" in capsys.readouterr().err
