"""check-gguf: preflight a GGUF (set) against an HF config by reading headers only.

It reports GGUF tensors that map to nothing, parameters nothing fills, shape
mismatches and metadata that contradicts the config, plus a histogram of
quant types and bytes. Exit status: 0 when the file would load, 1 on any gap,
2 when the inputs cannot be read at all.

The layout table and the header reader live in the patched vllm-gguf-plugin
(one source of truth with the loader); `entrypoint.start.plugin_files` loads them
without importing the plugin package (vLLM, torch): the check must take seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from entrypoint.errors import GGUF_NO_LAYOUT
from entrypoint.start import plugin_files


def load_hf_config(hf_config: str) -> dict[str, Any]:
    path = Path(hf_config)
    if path.is_dir():
        path = path / "config.json"
    cfg = json.loads(path.read_text())
    return cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg


def _histogram(tensors: list[Any]) -> list[str]:
    counts: dict[str, list[int]] = {}
    for t in tensors:
        entry = counts.setdefault(t.type_name, [0, 0])
        entry[0] += 1
        entry[1] += t.nbytes
    total = sum(b for _, b in counts.values()) or 1
    rows = [f"  {'type':<8}{'tensors':>9}{'GiB':>12}{'share':>8}"]
    for name, (n, nbytes) in sorted(counts.items(), key=lambda kv: -kv[1][1]):
        rows.append(f"  {name:<8}{n:>9}{nbytes / 2**30:>12.3f}{nbytes / total:>8.1%}")
    rows.append(f"  {'total':<8}{len(tensors):>9}{total / 2**30:>12.3f}")
    return rows


# Exit codes: 0 loads, 1 gaps found, 2 inputs unreadable, GGUF_NO_LAYOUT: this
# architecture has no tensor layout here (the serve preflight then skips itself
# unless SERVE_PREFLIGHT_GGUF asked for it explicitly).


def check(path: str, hf_config: str, out: Callable[[str], None] = print) -> int:
    start = time.perf_counter()
    headers_mod, layout_mod = plugin_files.module("headers"), plugin_files.module("layout")
    try:
        cfg = load_hf_config(hf_config)
    except (OSError, ValueError) as exc:
        out(f"check-gguf: cannot read HF config {hf_config}: {exc}")
        return 2
    if cfg.get("model_type") not in layout_mod.MODEL_TYPE_ARCHES:
        out(
            f"check-gguf: model_type {cfg.get('model_type')!r} is not supported; "
            f"known: {sorted(layout_mod.MODEL_TYPE_ARCHES)}"
        )
        return GGUF_NO_LAYOUT
    try:
        headers = headers_mod.read_set(path)
    except headers_mod.GGUFHeaderError as exc:
        out(f"check-gguf: FAIL {exc}")
        return 1
    tensors = [t for h in headers for t in h.tensors]
    present = {t.name: t.shape for t in tensors}
    first = headers[0]
    # Mirror the loader: vocab from the tokenizer table, tying from output.weight.
    cfg = dict(cfg, tie_word_embeddings="output.weight" not in present)
    n_tokens = first.array_lengths.get("tokenizer.ggml.tokens")
    if n_tokens:
        cfg["vocab_size"] = n_tokens
    problems = layout_mod.header_errors(first.fields, cfg, first.path)
    if not problems:
        result = layout_mod.audit(layout_mod.build_layout(cfg), present)
        problems = result.lines() + layout_mod.pairing_errors(
            {t.name: t.type_name for t in tensors}
        )
    where = {t.name: t.path for t in tensors}
    out(
        f"check-gguf: {len(headers)} file(s), {len(tensors)} tensors, "
        f"architecture {first.arch}, config {cfg.get('model_type')}"
    )
    out("\n".join(_histogram(tensors)))
    for line in problems:
        named = next((w for w in line.replace(",", " ").split() if w.rstrip(":") in where), None)
        out(f"  {line}" + (f"  [{where[named.rstrip(':')]}]" if named else ""))
    verdict = "OK" if not problems else f"FAIL ({len(problems)} problem(s))"
    out(f"check-gguf: {verdict} in {time.perf_counter() - start:.2f} s")
    return 0 if not problems else 1


def main(path: str, hf_config: str) -> int:
    """Entry for ``python -m entrypoint check-gguf PATH --hf-config X``."""
    return check(path, hf_config)
