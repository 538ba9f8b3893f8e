# SPDX-License-Identifier: Apache-2.0
"""GGUF adapter for MLA models: GLM-5 (``glm-dsa``) and DeepSeek V2/V3 (``deepseek2``).

Beyond name mapping it handles what the generic path gets wrong for these
files: the split ``attn_k_b``/``attn_v_b`` form is fused back into
``kv_b_proj`` (dequantized, exact inverse, loaded unquantized), and tensors
that vLLM builds without a quantized parameter (indexer wk/weights_proj,
router, norms, MTP eh_proj) are dequantized to the model dtype instead of
being handed over as a ``qweight`` with nowhere to land.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger

from ..gguf_headers import GGUFHeaderError, TensorInfo, read_set
from ..gguf_tensors import ahead, iter_set, other_stage, owned_layers, will_read
from .base import GGUFLoadSpec
from .default import GGUFWeightsAdapter
from .mla_layout import (
    MODEL_TYPE_ARCHES,
    Slot,
    audit,
    build_layout,
    header_errors,
    module_names,
    pairing_errors,
    spec_layer_base,
)
from .mla_tensors import PLAIN_TYPES, dequantized, fuse_kv_b

if TYPE_CHECKING:
    from transformers import PretrainedConfig
    from vllm.config import ModelConfig

logger = init_logger(__name__)

# Fused vLLM modules whose shards must share one precision (is_layer_skipped_gguf).
_FUSED_PARTNERS = {
    ".self_attn.q_a_proj.weight": ".self_attn.kv_a_proj_with_mqa.weight",
    ".mlp.gate_proj.weight": ".mlp.up_proj.weight",
    ".mlp.shared_experts.gate_proj.weight": ".mlp.shared_experts.up_proj.weight",
}
# Built with quant_config=None; listing the router would also match gate_up_proj
# prefixes by substring in is_layer_skipped_gguf.
_NO_QUANT_CONFIG = (".mlp.gate.weight", ".indexer.wk.weight",
                    ".indexer.weights_proj.weight", ".eh_proj.weight")


class GGUFLoadError(RuntimeError):
    """A GGUF set cannot fill this model; the message names file and tensor."""


class MLAGGUFAdapter(GGUFWeightsAdapter):
    """Loads glm-dsa and deepseek2 GGUF files into vLLM's DeepSeek/GLM-5 models."""

    @classmethod
    def matches(cls, config: PretrainedConfig) -> bool:
        return getattr(config, "model_type", None) in MODEL_TYPE_ARCHES

    def patch_hf_config(self, model_path: str, hf_config: PretrainedConfig) -> PretrainedConfig:
        """Vocab size from the tokenizer table, tying from output.weight in any part.

        gguf_utils does the same with two GGUFReader passes over the first part
        (many seconds on a 155k-token vocabulary) and misses an output.weight
        stored in a later part of a split set.
        """
        headers = self._headers(model_path)
        text_config = hf_config.get_text_config()
        n_tokens = headers[0].array_lengths.get("tokenizer.ggml.tokens")
        if n_tokens:
            for config in {id(hf_config): hf_config, id(text_config): text_config}.values():
                config.update({"vocab_size": n_tokens})
        has_output = any(t.name == "output.weight" for h in headers for t in h.tensors)
        text_config.update({"tie_word_embeddings": not has_output})
        return hf_config

    @staticmethod
    def _headers(model_path: str) -> list:
        try:
            return read_set(model_path)
        except GGUFHeaderError as exc:
            raise GGUFLoadError(str(exc)) from exc

    def prepare_loading(self, model_path: str, model_config: ModelConfig) -> GGUFLoadSpec:
        headers = self._headers(model_path)
        hf_config = self.patch_hf_config(model_path, model_config.hf_config)
        model_config.hf_config = hf_config
        cfg = hf_config.get_text_config()
        errors = header_errors(headers[0].fields, cfg, headers[0].path)
        if errors:
            raise GGUFLoadError("; ".join(errors))
        spec_only = cfg.model_type == "deepseek_mtp"
        self.spec_only, self.num_layers = spec_only, int(cfg.num_hidden_layers)
        located = {t.name: t for h in headers for t in h.tensors}
        self.layout = build_layout(cfg, spec_only=spec_only)
        self._check(located, spec_only)
        self.dtype = model_config.dtype
        self.dequant = self._dequant_names(located)
        unquantized = self._unquantized_modules(located, spec_layer_base(cfg), spec_only)
        self.load_spec = GGUFLoadSpec(
            weights_source=[h.path for h in headers],
            unquantized_modules=unquantized,
            gguf_to_hf_name_map={n: s.hf_name for n, s in self.layout.items()},
        )
        return self.load_spec

    def _check(self, located: dict, spec_only: bool) -> None:
        present = {n: t.shape for n, t in located.items()}
        result = audit(self.layout, present, report_unmapped=not spec_only)
        paired = pairing_errors({n: t.type_name for n, t in located.items()})
        if result.ok and not paired:
            return

        def where(line: str) -> str:
            # Prefix the file that holds the first tensor the line names.
            for word in line.replace(",", " ").replace(":", " ").replace("(", " ").split():
                if word in located:
                    return f"{located[word].path}: {line}"
            return line

        lines = [where(line) for line in result.lines() + paired]
        raise GGUFLoadError(
            f"GGUF set {next(iter(located.values())).path} does not fit "
            f"{len(lines)} way(s): " + "; ".join(lines)
        )

    def _dequant_names(self, located: dict) -> set[str]:
        """GGUF tensors to hand over as plain values in the model dtype."""
        names = {n for n, s in self.layout.items() if s.unquantized and n in located}
        by_hf = {s.hf_name: n for n, s in self.layout.items() if n in located}
        for left, right in _FUSED_PARTNERS.items():
            for hf_name, name in by_hf.items():
                if not hf_name.endswith(left):
                    continue
                other = by_hf.get(hf_name[: -len(left)] + right)
                kinds = {located[n].type_name in PLAIN_TYPES for n in (name, other) if n}
                if len(kinds) == 2:  # one plain, one quantized: both go plain
                    names.update(n for n in (name, other) if n)
        return names

    def _unquantized_modules(self, located: dict, spec_base: int, draft: bool) -> list[str]:
        modules: list[str] = []
        for name, slot in self.layout.items():
            if name not in located or len(slot.shape) != 2:
                continue
            if slot.hf_name.endswith(_NO_QUANT_CONFIG) or ".experts." in slot.hf_name:
                continue
            if name in self.dequant or located[name].type_name in PLAIN_TYPES:
                modules.extend(module_names(slot.hf_name, spec_base, draft))
        # Fused from the split form: always plain.
        modules.extend(
            m
            for n, s in self.layout.items()
            if s.kv_part == "k" and n in located
            for m in module_names(s.hf_name, spec_base, draft)
        )
        return sorted(set(modules))

    def prepare_weights(self, model_config: ModelConfig) -> Iterable[tuple[str, torch.Tensor]]:
        del model_config
        # The kv_b dequantization runs ahead, overlapping the loader's copies.
        yield from self.map_weights(ahead(self._iter_tensors()))

    def _iter_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        pending: dict[str, dict[str, torch.Tensor]] = {}
        origin: dict[str, str] = {}
        # Never read what this model does not build: another pipeline stage's
        # layers, and in the main model the MTP blocks (the draft loads them).
        # Their kv_b halves would otherwise be dequantized for nothing.
        owned = None if self.spec_only else owned_layers(self.num_layers)

        def elsewhere(name: str) -> bool:
            return other_stage(name, self.num_layers, owned, draft_blocks=self.spec_only)

        for info, stored in iter_set(self.load_spec.weights_source, self.layout, elsewhere):
            slot = self.layout[info.name]
            if slot.kv_part or info.name in self.dequant:
                will_read(stored)  # read whole by every rank: ask for all of it at once
            if slot.kv_part:
                parts = pending.setdefault(slot.hf_name, {})
                parts[slot.kv_part] = dequantized(info, stored, torch.float32)
                origin[slot.hf_name] = f"{info.path}: {info.name}"
                if len(parts) == 2:
                    del pending[slot.hf_name]
                    fused = fuse_kv_b(parts["k"], parts["v"]).to(self.dtype)
                    yield slot.hf_name, fused
                continue
            yield from self._convert(info, stored, slot)
        if pending:
            raise GGUFLoadError(
                "split kv_b incomplete: "
                + "; ".join(f"{origin[n]} has no partner" for n in sorted(pending))
            )

    def _convert(
        self, info: TensorInfo, stored: torch.Tensor, slot: Slot
    ) -> Iterator[tuple[str, torch.Tensor]]:
        if info.type_name in PLAIN_TYPES:
            yield slot.hf_name, stored
        elif info.name in self.dequant:
            yield slot.hf_name, dequantized(info, stored, self.dtype)
        else:
            # Only the trailing ".weight" is renamed (indexer.weights_proj!).
            base = slot.hf_name.removesuffix(".weight")
            yield f"{base}.qweight_type", torch.tensor(info.type_id)
            yield f"{base}.qweight", stored
