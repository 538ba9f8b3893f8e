"""Fill vLLM's model-info cache ($VLLM_CACHE_ROOT/modelinfos) for every architecture
of the installed vLLM's registry, in this one process.

On a cache miss vLLM inspects a model class in a fresh interpreter that imports vLLM
and the model's module: 8 s of every container start on two cores, since a new
container's cache is empty. The cache key is a hash of the module's file, so the
entries written here are the ones vLLM looks up, and a changed file misses as before.
Run as the user that serves, after the last file of vLLM is in place.

    python model_infos.py [--only ARCH,...]

Prints a count; an architecture whose module cannot be imported here (an optional
dependency this image lacks) is listed and skipped, as vLLM would fail on it too.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated architectures")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from vllm.model_executor.models import registry
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # models a plugin registers are looked up the same way

    wanted = [a for a in args.only.split(",") if a]
    models = registry.ModelRegistry.models
    unknown = [a for a in wanted if a not in models]
    if unknown:
        print(f"model_infos: error: not in vLLM's registry: {', '.join(unknown)}", file=sys.stderr)
        return 2
    start = time.monotonic()
    written, skipped = 0, []
    for arch in wanted or sorted(models):
        model = models[arch]
        if not isinstance(model, registry._LazyRegisteredModel):
            continue
        try:
            spec = importlib.util.find_spec(model.module_name)
            if spec is None or spec.origin is None:
                raise ModuleNotFoundError(model.module_name)
            spec_file = Path(spec.origin)
            module_hash = model._get_modelinfo_module_hash(spec_file)
            if model._load_modelinfo_from_cache(module_hash) is None:
                info = registry._ModelInfo.from_model_cls(model.load_model_cls())
                model._save_modelinfo_to_cache(info, module_hash)
            if model._load_modelinfo_from_cache(module_hash) is None:
                raise RuntimeError("the entry written is not read back")
            written += 1
        except Exception as exc:  # an import this image cannot do: vLLM fails it too
            skipped.append(f"{arch} ({type(exc).__name__}: {str(exc)[:80]})")
    cache = registry._LazyRegisteredModel._get_cache_dir()
    print(f"model_infos: {written} architectures cached in {cache} "
          f"({time.monotonic() - start:.0f} s); {len(skipped)} skipped")
    for line in skipped:
        print(f"  skipped {line}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
