"""`doctor` rows about what `serve` would start: model files, config and tokenizer, the
GGUF check, the port, the watcher's files and the argv. Each reuses the check `serve`
runs (preflight, hub_files, gguf_hook, gpus), reading only: nothing is fetched or extracted.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import struct
from collections.abc import Mapping
from pathlib import Path

from entrypoint.argv import settings
from entrypoint.doctor.context import FAIL, NOT_RENDERED, OK, SKIP, WARN, Context
from entrypoint.doctor.context import Verdict as V
from entrypoint.doctor.host import size
from entrypoint.errors import GGUF_NO_LAYOUT, ConfigError
from entrypoint.host.hostinfo import existing_ancestor
from entrypoint.start import gguf_config, hub_files, plugin_files
from entrypoint.start.gguf_hook import run_gguf_check
from entrypoint.start.preflight import (
    check_port_free,
    check_writable,
    gguf_check_config,
    layout_required,
    listen_host,
    wants_gguf_check,
)

WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def gguf_config_step(env: Mapping[str, str]) -> tuple[dict[str, str], V | None]:
    """What `serve`'s GGUF config extraction would give, from its cache only.

    (env plus the cached folder's settings, the config row) for a bare .gguf; the env
    unchanged and None when vLLM has a config anyway."""
    path = gguf_config.needs_extraction(env)
    if path is None:
        return dict(env), None
    with_tokenizer = not gguf_config.keeps_tokenizer(env)
    folder = gguf_config.cached_extraction(path, with_tokenizer)
    if folder is not None:
        note = V("hf config", OK, f"no config.json beside {path.name}: read from the GGUF "
                                  f"earlier, cached in {folder}")  # fmt: skip
        return {**env, **gguf_config.extraction_updates(env, folder)}, note
    try:
        gguf_config.check_readable(path)
    except ConfigError as exc:
        return dict(env), V("hf config", FAIL, "; ".join(exc.problems))
    what = "config and tokenizer" if with_tokenizer else "config"
    when = "on its first start (minutes for a large vocabulary; cached after)"
    return dict(env), V("hf config", WARN, f"no config.json beside {path.name}: serve reads "
                                           f"the {what} from the GGUF {when}")  # fmt: skip


def _model(ctx: Context) -> str:
    if ctx.rendered is not None:
        return str(ctx.rendered.namespace.model or "")
    return ctx.env.get(settings.MODEL, "").strip()


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file would not load whole (read from its header), or None."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < length < 2**28:
                return f"{path}: not a safetensors file (header length {length})"
            header = json.loads(fh.read(length))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                  default=0)  # fmt: skip
        have = path.stat().st_size
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"{path}: unreadable safetensors header ({exc})"
    if 8 + length + end > have:
        return (f"{path}: tensors end at byte {8 + length + end} but the file has {have} bytes "
                "(truncated file?)")  # fmt: skip
    return None


def _folder_row(folder: Path) -> V:
    """A local model folder: its weight files are all there and whole."""
    files = sorted(p for pattern in WEIGHT_GLOBS for p in folder.glob(pattern))
    index = folder / SAFETENSORS_INDEX
    problems: list[str] = []
    if index.is_file():
        try:
            listed = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            listed = set()
            problems.append(f"{index}: unreadable ({exc})")
        problems += [f"{folder / name}: listed in {SAFETENSORS_INDEX}, missing"
                     for name in sorted(listed) if not (folder / name).is_file()]  # fmt: skip
    safetensors = [p for p in files if p.suffix == ".safetensors"]
    problems += [p for p in map(safetensors_problem, safetensors) if p]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return V("model files", FAIL, problems[0] + more)
    if not files:
        return V("model files", FAIL, f"{folder}: no weight files ({', '.join(WEIGHT_GLOBS)})")
    total = sum(p.stat().st_size for p in files)
    return V("model files", OK, f"{folder}: {len(files)} weight file(s), {size(total)}, whole")


def _shorter(message: str) -> str:
    """The header reader names every missing part of a split set; a row names the first."""
    head, sep, listed = message.partition("; missing: ")
    parts = listed.split(", ")
    if not sep or len(parts) < 2:
        return message
    return f"{head}; {len(parts)} missing, the first {parts[0]}"


def _hub_model_row(ctx: Context, model: str) -> V:
    """A hub model: its cached weights checked like a folder; none cached is fine only
    while vLLM may download them."""
    from huggingface_hub import constants

    revision = getattr(ctx.rendered.namespace, "revision", None) if ctx.rendered else None
    folder = hub_files.cached_snapshot(model, revision)
    if folder is not None and any(next(folder.glob(g), None) for g in WEIGHT_GLOBS):
        row = _folder_row(folder)
        ctx.model_complete = row.status != FAIL
        return V(row.check, row.status, f"{model} (HF cache) {row.reason}")
    if constants.HF_HUB_OFFLINE:
        ctx.model_complete = False
        fetch = f"`hf download {model}` where the hub is reachable"
        return V("model files", FAIL, f"{model}: no weights in the HF cache "
                                      f"{constants.HF_HUB_CACHE}, and HF_HUB_OFFLINE is set; "
                                      f"{fetch}")  # fmt: skip
    return V("model files", SKIP, f"{model} is a hub repo, not cached: vLLM downloads its "
                                  "weights when it starts")  # fmt: skip


def model_files_row(ctx: Context) -> V:
    model = _model(ctx)
    if not model:
        ctx.model_complete = False
        return V("model files", FAIL, f"{settings.MODEL} is not set")
    if model.lower().endswith(".gguf"):
        headers = plugin_files.module("headers")
        if not Path(model).expanduser().is_file():
            ctx.model_complete = False
            return V("model files", FAIL, f"{settings.MODEL}={model}: no such file (is the "
                                          "model folder mounted there?)")  # fmt: skip
        try:
            parts = headers.read_set(model)
        except headers.GGUFHeaderError as exc:
            ctx.model_complete = False
            return V("model files", FAIL, _shorter(str(exc)))
        total = sum(h.file_size for h in parts)
        tensors = sum(len(h.tensors) for h in parts)
        return V("model files", OK, f"{model}: {len(parts)} file(s), {size(total)}, {tensors} "
                                    "tensors, every tensor's bytes present")  # fmt: skip
    if hub_files.hub_repo_id(model) is not None:
        return _hub_model_row(ctx, model)
    path = Path(model).expanduser()
    if path.is_dir():
        row = _folder_row(path)
        ctx.model_complete = row.status != FAIL
        return row
    ctx.model_complete = False
    return V("model files", FAIL, f"{settings.MODEL}={model}: no such file or folder")


def _repos(ctx: Context) -> list[hub_files.HubRepo]:
    """Hub repos that config and tokenizer come from: what serve fetches, plus a hub
    model itself (vLLM reads its config and tokenizer from it)."""
    if ctx.rendered is None:
        model = (settings.MODEL, ctx.env.get(settings.MODEL), ctx.env.get(hub_files.REVISION))
        named = [(n, ctx.env.get(n), ctx.env.get(r)) for n, r in (
            (hub_files.HF_CONFIG_PATH, hub_files.REVISION),
            (hub_files.TOKENIZER, hub_files.TOKENIZER_REVISION))]  # fmt: skip
    else:
        ns = ctx.rendered.namespace
        revision = getattr(ns, "revision", None)
        model = (settings.MODEL, ns.model, revision)
        tokenizer_revision = getattr(ns, "tokenizer_revision", None)
        named = [(hub_files.HF_CONFIG_PATH, ns.hf_config_path, revision),
                 (hub_files.TOKENIZER, ns.tokenizer, tokenizer_revision)]  # fmt: skip
    if not named[0][1]:  # no --hf-config-path: the model's own config
        named.insert(0, model)
    return hub_files.hub_repos(named)


def _hub_row(repo: hub_files.HubRepo, ctx: Context) -> V:
    from huggingface_hub import constants

    folder, missing = hub_files.cached_folder(repo)
    if folder is not None and not missing:
        ctx.hub_folders[repo.repo] = folder
        return V("hf config", OK, f"{repo.label}: cached in {folder}")
    # A hub model needs its weights too, which fetch-config never takes.
    whole = settings.MODEL in repo.names
    fetch = f"hf download {repo.repo}" if whole else hub_files.prefetch_commands(repo)[0]
    lacking = f" (the cached copy lacks {', '.join(missing)})" if folder is not None else ""
    if constants.HF_HUB_OFFLINE:
        return V("hf config", FAIL, f"{repo.label}: not in the HF cache {constants.HF_HUB_CACHE}"
                                    f"{lacking}, and HF_HUB_OFFLINE is set; pre-fetch where the "
                                    f"hub is reachable: `{fetch}`")  # fmt: skip
    try:
        plan = hub_files.hub_plan(repo)
    except Exception as error:  # any failure means: serve could not fetch it either
        why = hub_files.why_unusable(error, offline=False)
        return V("hf config", FAIL, f"{repo.label}: not cached{lacking}, and {why}; pre-fetch "
                                    f"where the hub is reachable: `{fetch}`")  # fmt: skip
    names = {item.filename for item in plan}
    absent = [g for g in hub_files.needed_files(repo)
              if not any(n in names for n in g.split(" or "))]  # fmt: skip
    if absent:
        return V("hf config", FAIL, f"{repo.label}: the repo has no {', '.join(absent)}")
    todo = [item for item in plan if item.will_download]
    total = sum(item.file_size or 0 for item in todo)
    return V("hf config", OK, f"{repo.label}: not cached{lacking}; {constants.ENDPOINT} answers, "
                              f"serve fetches {len(todo)} file(s), {size(total)}")  # fmt: skip


def _local_config_row(ctx: Context) -> V:
    model = _model(ctx)
    ns = ctx.rendered.namespace if ctx.rendered is not None else None
    configured = getattr(ns, "hf_config_path", None) or ctx.env.get(hub_files.HF_CONFIG_PATH)
    base = Path(configured or model).expanduser()
    folder = base.parent if (not configured and model.lower().endswith(".gguf")) else base
    config = folder if folder.is_file() else folder / "config.json"
    if config.is_file():
        return V("hf config", OK, f"{config}")
    if not configured and not ctx.model_complete:
        return V("hf config", SKIP, f"no model to read {config.name} from (see model files)")
    return V("hf config", FAIL, f"{config}: no such file; vLLM reads the model's config there")


def hf_config_rows(ctx: Context) -> list[V]:
    rows = [_hub_row(repo, ctx) for repo in _repos(ctx)]
    if ctx.config_note is not None:
        rows.insert(0, ctx.config_note)
    return rows or [_local_config_row(ctx)]


def _problems(text: str) -> list[str]:
    """check-gguf's problem lines: after its histogram, or its one-line FAIL."""
    lines = text.splitlines()
    total = next((i for i, line in enumerate(lines) if line.startswith("  total")), None)
    if total is None:
        return [line.removeprefix("check-gguf: ") for line in lines if line.strip()][:1]
    return [line.strip() for line in lines[total + 1:] if line.startswith("  ")]


def gguf_check_row(ctx: Context) -> V:
    model = _model(ctx)
    if not model.lower().endswith(".gguf"):
        return V("gguf check", SKIP, "the model is no .gguf file")
    if ctx.rendered is None:
        return V("gguf check", SKIP, ctx.render_skipped or NOT_RENDERED)
    if not wants_gguf_check(ctx.env, model):
        return V("gguf check", SKIP, f"{settings.PREFLIGHT_GGUF}=false")
    if not ctx.model_complete:
        return V("gguf check", SKIP, "the GGUF files are incomplete (see model files)")
    config = gguf_check_config(ctx.rendered.namespace, ctx.hub_folders)
    config_file = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
    if not config_file.is_file():
        return V("gguf check", SKIP, f"no HF config to check against yet ({config}; see hf "
                                     "config)")  # fmt: skip
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = run_gguf_check(model, config)
    text = captured.getvalue()
    command = shlex.join(["frontier-serve", "check-gguf", model, "--hf-config", config])
    if code == 0:
        return V("gguf check", OK, f"every tensor maps and fits the config ({config_file})")
    if code == GGUF_NO_LAYOUT and not layout_required(ctx.env):
        return V("gguf check", SKIP, "no tensor layout for this model type; serve skips the "
                                     f"preflight too (set {settings.PREFLIGHT_GGUF}=true to "
                                     "require it)")  # fmt: skip
    problems = _problems(text) or [f"exit {code}"]
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return V("gguf check", FAIL, f"{problems[0]}{more}; details: `{command}`")


def port_row(ctx: Context) -> V:
    if ctx.rendered is None:
        return V("port", SKIP, ctx.render_skipped or NOT_RENDERED)
    ns = ctx.rendered.namespace
    if getattr(ns, "uds", None):
        return V("port", SKIP, f"vLLM serves on the unix socket {ns.uds}")
    if not settings.flag(ctx.env, settings.CHECK_PORT, default=True):
        return V("port", SKIP, f"{settings.CHECK_PORT}=false")
    check_port_free(ns.host, ns.port)  # a ConfigError here is the row's FAIL
    return V("port", OK, f"{listen_host(ns.host)}:{ns.port} is free")


def watcher_row(ctx: Context) -> V:
    from entrypoint.start.serve import watch_config

    if ctx.rendered is None:
        return V("ready file", SKIP, ctx.render_skipped or NOT_RENDERED)
    if not settings.flag(ctx.env, settings.WATCHER, default=True):
        return V("ready file", SKIP, f"{settings.WATCHER}=false: no readiness file")
    config = watch_config(ctx.env, ctx.rendered)
    notes = [_writable(config.ready_file, settings.READY_FILE),
             _writable(config.status_file, settings.STATUS_FILE)]  # fmt: skip
    made = "; ".join(sorted({n for n in notes if n}))
    return V("ready file", OK, f"{config.ready_file} and {config.status_file} can be written"
                               + (f" ({made})" if made else ""))  # fmt: skip


def _writable(path: str, name: str) -> str:
    """serve's check where the folder exists; doctor creates no folder of its own, so
    elsewhere the folder that would hold the new one must take it."""
    folder = Path(path).absolute().parent
    if folder.is_dir() or Path(path).is_dir():
        check_writable(path, name)
        return ""
    above = existing_ancestor(folder)
    if not os.access(above, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}={path}: cannot create {folder}: {above} is not writable")
    return f"serve creates {folder}"


def argv_row(ctx: Context) -> V:
    if ctx.rendered is not None:
        rendered = ctx.rendered
        return V("argv", OK, f"{shlex.join(rendered.argv)}  [{rendered.digest}]")
    if ctx.render_skipped:
        return V("argv", SKIP, ctx.render_skipped)
    return V("argv", FAIL, "; ".join(ctx.render_problems))


MODEL_ROWS = (("model files", model_files_row), ("hf config", hf_config_rows),
              ("gguf check", gguf_check_row), ("port", port_row), ("ready file", watcher_row),
              ("argv", argv_row))  # fmt: skip
