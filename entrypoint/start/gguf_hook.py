"""Calls into `entrypoint.start.gguf_check` without importing it (and the plugin's GGUF
reader) until a preflight runs."""

from __future__ import annotations

import importlib
import os

from entrypoint.errors import GGUF_NO_LAYOUT


def resolve_hf_config(value: str) -> str:
    """A local path as given; a Hugging Face id mapped to its cached config.json if present.

    `--hf-config-path zai-org/GLM-5` names a repo, while the check wants a folder or
    file; the offline cache lookup makes the profile value usable as is.
    """
    if not value or os.path.exists(value):
        return value
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return value
    try:
        cached = try_to_load_from_cache(value, "config.json")
    except Exception:  # an odd id must fall through to the check, not crash serve
        return value
    return cached if isinstance(cached, str) else value


__all__ = ["GGUF_NO_LAYOUT", "resolve_hf_config", "run_gguf_check"]


def run_gguf_check(path: str, hf_config: str) -> int:
    """Exit code of `entrypoint.start.gguf_check.main(path, hf_config)`."""
    # Through sys.modules (not the package attribute), so tests can put a stand-in there.
    gguf_check = importlib.import_module("entrypoint.start.gguf_check")
    return int(gguf_check.main(path, hf_config))
