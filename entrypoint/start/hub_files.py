"""Config and tokenizer files of the Hugging Face repos that SERVE_HF_CONFIG_PATH and
SERVE_TOKENIZER name, fetched before the GGUF preflight and before vLLM starts.

`profiles/glm5.env` names zai-org/GLM-5 for both: the preflight needs its config.json,
and a fresh HF cache volume has none. Only small files are fetched, never weights.
huggingface_hub reads HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT and HF_HOME/HF_HUB_CACHE
itself; nothing here passes a token, endpoint or cache folder, so vLLM, started later
from the same environment, finds the same cache.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entrypoint.errors import ConfigError

HF_CONFIG_PATH = "SERVE_HF_CONFIG_PATH"
TOKENIZER = "SERVE_TOKENIZER"
REVISION = "SERVE_REVISION"
TOKENIZER_REVISION = "SERVE_TOKENIZER_REVISION"

# What config and tokenizer loading read (transformers, vLLM, trust_remote_code).
SMALL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer*",  # tokenizer.json, tokenizer_config.json, tokenizer.model
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "tekken.json",
    "chat_template*",
    "preprocessor_config.json",
    "processor_config.json",
    "params.json",
    "*.py",  # configuration_*.py / tokenization_*.py for trust_remote_code
)
# Belt and braces: no pattern above matches these, and none may ever be fetched here.
WEIGHTS = ("*.safetensors", "*.bin", "*.gguf", "*.pt", "*.pth", "*.h5", "*.onnx", "*.msgpack")

# Hub ids are `owner/name`. A single word could be a local folder that is missing, so it
# is left to vLLM, as is anything that looks like a path.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")

Log = Callable[[str], None]


@dataclass(frozen=True)
class HubRepo:
    repo: str
    revision: str | None
    names: tuple[str, ...]  # the settings that named it, for messages

    @property
    def label(self) -> str:
        at = f"@{self.revision}" if self.revision else ""
        return "/".join(self.names) + f"={self.repo}{at}"


def hub_repo_id(value: str | None) -> str | None:
    """`value` when it names a hub repo rather than a local path, else None."""
    value = (value or "").strip()
    if not value or value.startswith(("/", ".", "~")) or os.path.exists(value):
        return None
    return value if _REPO_ID.fullmatch(value) else None


def hub_repos(named: Iterable[tuple[str, str | None, str | None]]) -> list[HubRepo]:
    """(setting, value, revision) triples -> the distinct hub repos among them."""
    found: dict[tuple[str, str | None], list[str]] = {}
    for name, value, revision in named:
        repo = hub_repo_id(value)
        if repo is not None:
            found.setdefault((repo, revision or None), []).append(name)
    return [HubRepo(repo, rev, tuple(names)) for (repo, rev), names in found.items()]


def repos_from_env(env: Mapping[str, str]) -> list[HubRepo]:
    """What `fetch-config` fetches: read from SERVE_* values, without vLLM's parser."""
    return hub_repos(
        [
            (HF_CONFIG_PATH, env.get(HF_CONFIG_PATH), env.get(REVISION)),
            (TOKENIZER, env.get(TOKENIZER), env.get(TOKENIZER_REVISION)),
        ]
    )


def repos_from_namespace(namespace: object) -> list[HubRepo]:
    """What `serve` fetches: vLLM's own reading of the options (SERVE_EXTRA_ARGS included)."""
    config, tokenizer = ("hf_config_path", "revision"), ("tokenizer", "tokenizer_revision")
    return hub_repos(
        (name, getattr(namespace, value, None), getattr(namespace, revision, None))
        for name, (value, revision) in ((HF_CONFIG_PATH, config), (TOKENIZER, tokenizer))
    )


def prefetch_commands(repo: HubRepo) -> list[str]:
    """Commands that put the same files into an HF cache, for a host that can reach the hub."""
    revision = ["--revision", repo.revision] if repo.revision else []
    include = [arg for pattern in SMALL_FILES for arg in ("--include", pattern)]
    hf = shlex.join(["hf", "download", repo.repo, *revision, *include])
    ours = shlex.join(["frontier-serve", "fetch-config", repo.repo, *revision])
    return [ours, hf]


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")  # pragma: no cover


def why_unusable(error: BaseException, offline: bool) -> str:
    """One clause saying why the hub gave no files (for error messages and `doctor`)."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    if offline:
        return "HF_HUB_OFFLINE is set, so only the cache is used"
    if isinstance(error, GatedRepoError):
        return "the repo is gated: set HF_TOKEN to a token that was granted access"
    if isinstance(error, RepositoryNotFoundError):
        return "the hub has no such repo, or it is private and HF_TOKEN is missing or wrong"
    cause = error.__cause__ or error
    response = getattr(cause, "response", None)
    if isinstance(cause, HfHubHTTPError) and response is not None:
        hint = ": check HF_TOKEN" if response.status_code in (401, 403) else ""
        return f"the hub answered HTTP {response.status_code}{hint}"
    return f"the hub cannot be reached ({type(cause).__name__}: {str(cause)[:200]})"


def _quiet_tqdm() -> type:
    from huggingface_hub.utils import tqdm

    class Quiet(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    return Quiet


def _snapshot_kwargs(repo: HubRepo) -> dict[str, Any]:
    return {"revision": repo.revision, "allow_patterns": list(SMALL_FILES),
            "ignore_patterns": list(WEIGHTS)}  # fmt: skip


def hub_plan(repo: HubRepo) -> list[Any]:
    """What `fetch_repo` would download (huggingface_hub's dry run: names and sizes, no
    file content). Raises what the hub raised when it cannot be asked."""
    from huggingface_hub import snapshot_download

    return list(
        snapshot_download(repo.repo, dry_run=True, tqdm_class=_quiet_tqdm(),
                          **_snapshot_kwargs(repo))  # fmt: skip
    )


def needed_files(repo: HubRepo) -> list[str]:
    """Files the settings that name `repo` cannot do without (any one of each group)."""
    wanted = []
    if any(name != TOKENIZER for name in repo.names):
        wanted.append("config.json")
    if TOKENIZER in repo.names:
        wanted.append("tokenizer.json or tokenizer_config.json")
    return wanted


def cached_folder(repo: HubRepo) -> tuple[Path | None, list[str]]:
    """(the cached snapshot of `repo`, the needed files it lacks), without the network.

    (None, all needed files) when nothing of the repo is cached at this revision."""
    needed = needed_files(repo)
    try:
        from huggingface_hub import snapshot_download

        folder = Path(
            snapshot_download(repo.repo, local_files_only=True, **_snapshot_kwargs(repo))
        )
    except Exception:  # not installed, nothing cached, a revision never resolved here
        return None, needed
    have = {entry.name for entry in folder.iterdir()} if folder.is_dir() else set()
    missing = [group for group in needed
               if not any(name in have for name in group.split(" or "))]  # fmt: skip
    return folder, missing


def cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cache's whole snapshot folder of a repo (weights included), without the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception:  # not installed, nothing cached, a revision never resolved here
        return None


def fetch_repo(repo: HubRepo, log: Log) -> Path:
    """The local snapshot folder holding `repo`'s small files; fetched when missing.

    Uses the cache alone when HF_HUB_OFFLINE is set or the hub cannot be reached; with
    nothing cached, a ConfigError names the repo and the pre-fetch commands.
    """
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ConfigError(
            f"{repo.label}: huggingface_hub is not installed, so the repo cannot be fetched; "
            "point the setting at a local folder instead"
        ) from None

    offline = bool(constants.HF_HUB_OFFLINE)  # what huggingface_hub read from HF_HUB_OFFLINE
    where = f"{constants.ENDPOINT}/{repo.repo}" + (f"@{repo.revision}" if repo.revision else "")
    kwargs = _snapshot_kwargs(repo)
    if not offline:
        try:  # the plan, one line per file; the download below shows the hub's own bars
            plan = hub_plan(repo)
        except Exception:  # unreachable, unknown repo, old hub: the real call decides
            plan = []
        todo = [f for f in plan if f.will_download]
        for item in sorted(todo, key=lambda f: f.filename):
            log(f"frontier-serve: fetching {where} {item.filename} ({_size(item.file_size)})")
        if plan and not todo:
            log(f"frontier-serve: {where}: all {len(plan)} config/tokenizer files are cached")
    try:
        folder = Path(snapshot_download(repo.repo, **kwargs))
    except Exception as error:  # every failure here means: not usable, and not cached
        commands = prefetch_commands(repo)
        cache = constants.HF_HUB_CACHE
        raise ConfigError(
            [
                f"{repo.label}: its config/tokenizer files are not in the Hugging Face cache "
                f"({cache}) and cannot be fetched from {constants.ENDPOINT}: "
                f"{why_unusable(error, offline)}",
                "pre-fetch them where the hub can be reached, into the volume mounted at "
                f"{constants.HF_HOME} (same HF_HOME): `{commands[0]}` (this image) or "
                f"`{commands[1]}`",
            ]
        ) from None
    log(f"frontier-serve: {repo.label}: config/tokenizer in {folder}")
    return folder


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def fetch_all(repos: Iterable[HubRepo], log: Log = _stderr) -> dict[str, Path]:
    """repo id -> local folder, for every repo; all failures reported together."""
    folders: dict[str, Path] = {}
    problems: list[str] = []
    for repo in repos:
        try:
            folders[repo.repo] = fetch_repo(repo, log)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return folders
