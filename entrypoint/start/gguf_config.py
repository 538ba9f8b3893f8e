"""Config and tokenizer from the GGUF file itself, when no HF config sits beside it.

vLLM cannot parse the config of a bare `.gguf` path: it needs `--hf-config-path`
and `--tokenizer`. transformers can build both from the GGUF metadata
(`from_pretrained(folder, gguf_file=name)`), for the architectures it knows. We do
that once per file into a cache folder and point vLLM at it.

Rules (see `gguf_config_env`):
- only for a local `.gguf` file with no `config.json` in its folder;
- an explicit `SERVE_HF_CONFIG_PATH` always wins: nothing is extracted;
- an explicit `SERVE_TOKENIZER` is kept; only the config is extracted then;
- an architecture transformers cannot read fails before vLLM starts, naming it.

The cache key is the file's real path, size and mtime plus the transformers
version, so an edited file or a new transformers is extracted again. Hashing a
multi-hundred-GB GGUF on every start would cost minutes; this costs a stat.
Extraction of a 262k-token tokenizer takes minutes on a small CPU; the smoke image
warms the cache at build time with `python -m entrypoint.start.gguf_config MODEL.gguf`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from entrypoint.argv.settings import MODEL
from entrypoint.errors import ConfigError
from entrypoint.host.cachedir import frontier_cache
from entrypoint.start import plugin_files

HF_CONFIG_PATH = "SERVE_HF_CONFIG_PATH"
TOKENIZER = "SERVE_TOKENIZER"
DONE = ".frontier-gguf-config.json"  # written last: a folder without it is incomplete
FORMAT = 2  # part of the cache key: bump when the extraction changes


def cache_root() -> Path:
    return frontier_cache() / "gguf-config"


def needs_extraction(env: Mapping[str, str]) -> Path | None:
    """The GGUF file to read config from, or None when vLLM already has what it needs."""
    model = env.get(MODEL, "").strip()
    if not model.lower().endswith(".gguf") or env.get(HF_CONFIG_PATH, "").strip():
        return None
    path = Path(model).expanduser()
    if not path.is_file() or (path.parent / "config.json").is_file():
        return None
    return path.resolve()


def gguf_header_fields(path: Path, wanted: set[str]) -> dict[str, object]:
    """Scalar and string metadata of a GGUF header, for the keys in `wanted`.

    Read with the patched plugin's header reader (bounds-checked; tokenizer
    tables are skipped, not decoded): gguf-py's GGUFReader parses every field,
    which for a 262k-token vocabulary takes a minute of pure Python."""
    headers = plugin_files.module("headers")
    try:
        fields = headers.read_header(path).fields
    except headers.GGUFHeaderError as exc:
        raise ConfigError(str(exc)) from None
    return {key: fields[key] for key in wanted if fields.get(key) is not None}


def gguf_architecture(path: Path) -> str:
    arch = gguf_header_fields(path, {"general.architecture"}).get("general.architecture")
    return str(arch) if arch is not None else "unknown"


def mark_special_tokens(path: Path, folder: Path) -> None:
    """Carry the GGUF's add_bos/add_eos flags into the saved tokenizer.

    transformers' GGUF tokenizer conversion drops them, so a Gemma tokenizer would
    encode text prompts without <bos>, on which the model degenerates. Reloading
    the saved tokenizer with the flags rebuilds its post-processor; saving it
    again persists that in tokenizer.json.
    """
    from transformers import AutoTokenizer

    keys = {f"tokenizer.ggml.add_{t}_token": f"add_{t}_token" for t in ("bos", "eos")}
    flags = {keys[k]: bool(v) for k, v in gguf_header_fields(path, set(keys)).items()}
    if flags:
        AutoTokenizer.from_pretrained(folder, **flags).save_pretrained(folder)


def check_readable(path: Path) -> None:
    """Fail fast, by name, for an architecture transformers has no GGUF mapping for."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(path)
    # transformers also renames a few (e.g. qwen3moe -> qwen3_moe) before it checks
    known = {a.replace("_", "").replace("-", "") for a in GGUF_SUPPORTED_ARCHITECTURES}
    if arch.replace("_", "").replace("-", "") not in known:
        raise ConfigError(
            f"{path.name}: transformers {transformers.__version__} cannot read the config of "
            f"GGUF architecture {arch!r}; put a config.json beside the file or set "
            f"{HF_CONFIG_PATH} (and {TOKENIZER}) to a folder that has one"
        )


def cache_dir_for(path: Path, with_tokenizer: bool) -> Path:
    import transformers

    path = path.resolve()
    stat = path.stat()
    key = json.dumps(
        [FORMAT, str(path), stat.st_size, stat.st_mtime_ns, transformers.__version__,
         with_tokenizer]  # fmt: skip
    )
    return cache_root() / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def cached_extraction(path: Path, with_tokenizer: bool) -> Path | None:
    """The folder an earlier extraction of this very file left, or None."""
    target = cache_dir_for(path, with_tokenizer)
    return target if (target / DONE).is_file() else None


def extraction_updates(env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The SERVE_* values that point vLLM at an extracted `folder`."""
    updates = {HF_CONFIG_PATH: str(folder)}
    if not keeps_tokenizer(env):
        updates[TOKENIZER] = str(folder)
    return updates


def keeps_tokenizer(env: Mapping[str, str]) -> bool:
    """An explicit SERVE_TOKENIZER is kept: only the config comes from the GGUF then."""
    return bool(env.get(TOKENIZER, "").strip())


def extract(path: Path, with_tokenizer: bool = True, log=print) -> tuple[Path, bool]:  # type: ignore[no-untyped-def]
    """(folder with config.json [+ tokenizer], True when it was already cached)."""
    target = cache_dir_for(path, with_tokenizer)
    if cached_extraction(path, with_tokenizer) is not None:
        return target, True
    check_readable(path)
    from transformers import AutoConfig, AutoTokenizer

    log(f"frontier-serve: reading config{' and tokenizer' if with_tokenizer else ''} "
        f"from {path.name} into {target} (once per file)")  # fmt: skip
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        raise ConfigError(
            f"FRONTIER_CACHE: cannot write the GGUF config cache {target.parent} "
            f"({exc.strerror or exc}); point FRONTIER_CACHE at a writable folder, or put a "
            f"config.json beside {path.name}"
        ) from None
    try:
        try:
            AutoConfig.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(work)
            if with_tokenizer:
                tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
                tokenizer.save_pretrained(work)
                mark_special_tokens(path, work)
        except (ValueError, KeyError, OSError) as error:
            raise ConfigError(
                f"{path.name}: transformers could not read config/tokenizer from the GGUF "
                f"({error}); set {HF_CONFIG_PATH} and {TOKENIZER} to a folder with them"
            ) from None
        (work / DONE).write_text(json.dumps({"gguf": str(path)}))
        try:
            work.rename(target)  # atomic; a racing extractor that won leaves its copy
        except OSError:
            if not (target / DONE).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target, False


def gguf_config_env(env: Mapping[str, str], log=print) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The SERVE_* values to add so vLLM gets config and tokenizer of a bare GGUF.

    Empty when nothing is needed. Says on stderr what it did.
    """
    path = needs_extraction(env)
    if path is None:
        return {}
    keep_tokenizer = keeps_tokenizer(env)
    folder, cached = extract(path, with_tokenizer=not keep_tokenizer, log=log)
    updates = extraction_updates(env, folder)
    what = "config" if keep_tokenizer else "config and tokenizer"
    log(f"frontier-serve: no config.json beside {path.name}: {what} from the GGUF file "
        f"({'cached' if cached else 'extracted'}) in {folder}; "
        + ", ".join(f"{k}={v}" for k, v in updates.items()))  # fmt: skip
    return updates


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def with_gguf_config(env: Mapping[str, str]) -> dict[str, str]:
    """`env` plus what `gguf_config_env` adds: the one call `serve` makes."""
    return {**env, **gguf_config_env(env, log=_stderr)}


def main(argv: list[str] | None = None) -> int:
    """`python -m entrypoint.start.gguf_config MODEL.gguf`: warm the cache, print the folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        _stderr("usage: python -m entrypoint.start.gguf_config MODEL.gguf")
        return 2
    try:
        updates = gguf_config_env({MODEL: args[0]}, log=_stderr)
    except ConfigError as error:
        for problem in error.problems:
            _stderr(f"frontier-serve: error: {problem}")
        return 1
    print(updates.get(HF_CONFIG_PATH, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
