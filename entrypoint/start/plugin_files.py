"""The patched vllm-gguf-plugin's standard-library modules, as the entrypoint uses them.

check-gguf and the GGUF config extraction read GGUF headers with the plugin's
own reader (`gguf_headers`: bounds-checked, one copy) and map tensors with its
layout table (`weights_adapter/mla_layout`), so the preflight and the loader
can never disagree. They must not import the plugin package, which imports
vLLM and torch (seconds to minutes), so each module is loaded from its file:
from the installed plugin, or, where it is not installed (the image stage that
extracts the Gemma config), from this repository's overlay
`patches/vllm-gguf-plugin/files/vllm_gguf_plugin/`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PLUGIN = "vllm_gguf_plugin"
MODULES = {"headers": "gguf_headers.py", "layout": "weights_adapter/mla_layout.py"}
OVERLAY = Path(__file__).resolve().parents[2] / "patches" / "vllm-gguf-plugin" / "files" / PLUGIN


def plugin_root() -> Path:
    """The installed plugin's package folder, else the repository's overlay."""
    spec = importlib.util.find_spec(PLUGIN)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if (OVERLAY / MODULES["headers"]).is_file():
        return OVERLAY
    raise RuntimeError(
        f"{PLUGIN} is not installed and {OVERLAY} is missing: the GGUF checks read "
        "headers with the patched plugin's gguf_headers module"
    )


def module(key: str) -> ModuleType:
    """`headers` (gguf_headers) or `layout` (weights_adapter/mla_layout), loaded once."""
    name = f"_frontier_plugin_{key}"
    if name in sys.modules:
        return sys.modules[name]
    path = plugin_root() / MODULES[key]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # dataclasses look their module up by name
    spec.loader.exec_module(loaded)
    return loaded
