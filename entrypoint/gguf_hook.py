"""Calls into `entrypoint.gguf_check` (written separately) without importing it eagerly."""

from __future__ import annotations

import importlib
import os

from entrypoint.errors import ConfigError


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


# The check's exit code for an architecture it has no tensor layout for.
GGUF_NO_LAYOUT = 3


def run_gguf_check(path: str, hf_config: str) -> int:
    """Exit code of `entrypoint.gguf_check.main(path, hf_config)`."""
    try:
        module = importlib.import_module("entrypoint.gguf_check")
    except ModuleNotFoundError as exc:
        if exc.name != "entrypoint.gguf_check":
            raise
        raise ConfigError(
            "the GGUF check is not available: module entrypoint.gguf_check is missing"
        ) from None
    return int(module.main(path, hf_config))
