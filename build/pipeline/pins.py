"""Read and validate build/pins.toml, the single source of every version."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PipelineError
from .paths import PINS_FILE

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
REQUIRED = ("project", "version", "filename", "sha256")


@dataclass(frozen=True)
class PinnedFile:
    key: str
    project: str
    version: str
    filename: str
    sha256: str
    role: str = ""
    # Fetched only when a step asks for it by key (the benchmark's peers), never by
    # `make fetch` or the builds.
    on_demand: bool = False


@dataclass(frozen=True)
class GitSource:
    url: str
    ref: str
    commit: str


@dataclass(frozen=True)
class Pins:
    path: Path
    files: dict[str, PinnedFile]
    git: GitSource | None
    # The vLLM these pins build: the default, or a [next-vllm."X.Y.Z"] version.
    vllm: str = ""
    default_vllm: str = ""
    next_vllm: tuple[str, ...] = ()
    # [models.<key>] parts: the pinned files (in order) a model file is assembled from.
    models: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return self.vllm == self.default_vllm

    def model_parts(self, key: str) -> tuple[str, ...]:
        try:
            return self.models[key]
        except KeyError:
            raise PipelineError(
                f"{self.path}: missing pins entry [models.{key}] "
                f"(known: {', '.join(sorted(self.models)) or 'none'})"
            ) from None

    def file(self, key: str) -> PinnedFile:
        try:
            return self.files[key]
        except KeyError:
            raise PipelineError(
                f"{self.path}: missing pins entry [files.{key}] "
                f"(known: {', '.join(sorted(self.files)) or 'none'})"
            ) from None


def _table(path: Path, where: str, value: object) -> dict:
    """A TOML table, or a PipelineError naming where a table was expected."""
    if not isinstance(value, dict):
        raise PipelineError(f"{path}: [{where}] must be a table, got {type(value).__name__}")
    return value


def _strings(path: Path, where: str, table: dict, fields: tuple[str, ...]) -> None:
    """The fields of `table` that are present are strings, or a PipelineError naming them."""
    wrong = [
        f"{field} ({type(table[field]).__name__})"
        for field in fields
        if field in table and not isinstance(table[field], str)
    ]
    if wrong:
        raise PipelineError(f"{path}: [{where}] must give strings; not: {', '.join(wrong)}")


def _file_entry(path: Path, where: str, key: str, entry: object) -> PinnedFile:
    entry = _table(path, where, entry)
    _strings(path, where, entry, (*REQUIRED, "role"))
    missing = [field for field in REQUIRED if not entry.get(field)]
    if missing:
        raise PipelineError(f"{path}: [{where}] lacks {', '.join(missing)}")
    if not SHA256_RE.match(entry["sha256"]):
        raise PipelineError(f"{path}: [{where}] sha256 is not 64 lowercase hex digits")
    if "/" in entry["filename"] or entry["filename"].startswith("."):
        raise PipelineError(f"{path}: [{where}] filename must be a plain file name")
    on_demand = entry.get("on-demand", False)
    if not isinstance(on_demand, bool):
        raise PipelineError(f"{path}: [{where}] on-demand must be true or false")
    fields = {k: entry.get(k, "") for k in (*REQUIRED, "role")}
    return PinnedFile(key=key, on_demand=on_demand, **fields)


def read_toml(path: Path, what: str) -> dict:
    """A TOML file's tables, or a PipelineError naming the file (missing, or where it breaks)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{what} not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PipelineError(f"{path}: invalid TOML: {exc}") from None


def load(path: Path = PINS_FILE, vllm: str = "") -> Pins:
    """The pins; with vllm set to a version of a [next-vllm."X.Y.Z"] table, its
    files replace the default ones of the same keys (the next vLLM, checked early)."""
    data = read_toml(path, "pins file")
    files: dict[str, PinnedFile] = {}
    for key, entry in _table(path, "files", data.get("files", {})).items():
        files[key] = _file_entry(path, f"files.{key}", key, entry)
    if not files:
        # An empty file would otherwise verify as "every pinned file matches".
        raise PipelineError(f"{path}: no [files.<key>] entries: nothing is pinned")
    nexts = _table(path, "next-vllm", data.get("next-vllm", {}))
    default = files["vllm-sdist"].version if "vllm-sdist" in files else ""
    if vllm and vllm != default:
        if vllm not in nexts:
            raise PipelineError(
                f"{path}: no vLLM {vllm} pinned (default {default}; next: "
                f'{", ".join(sorted(nexts)) or "none"}); add a [next-vllm."{vllm}".<key>] table'
            )
        for key, entry in _table(path, f'next-vllm."{vllm}"', nexts[vllm]).items():
            if key not in files:
                raise PipelineError(f'{path}: [next-vllm."{vllm}".{key}] replaces no [files.{key}]')
            pin = _file_entry(path, f'next-vllm."{vllm}".{key}', key, entry)
            if pin.version != vllm:
                raise PipelineError(f'{path}: [next-vllm."{vllm}".{key}] has version {pin.version}')
            files[key] = pin
    models: dict[str, tuple[str, ...]] = {}
    for key, entry in _table(path, "models", data.get("models", {})).items():
        parts = _table(path, f"models.{key}", entry).get("parts")
        if not parts or not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
            raise PipelineError(f"{path}: [models.{key}] parts must list [files.<key>] entries")
        unknown = [p for p in parts if p not in files]
        if unknown:
            raise PipelineError(f"{path}: [models.{key}] parts {', '.join(unknown)} are not pinned")
        models[key] = tuple(parts)
    git = data.get("vllm-git")
    if git is not None:
        git = _table(path, "vllm-git", git)
        _strings(path, "vllm-git", git, ("url", "ref", "commit"))
    return Pins(
        path=path,
        files=files,
        git=GitSource(git.get("url", ""), git.get("ref", ""), git.get("commit", ""))
        if git
        else None,
        vllm=vllm or default,
        default_vllm=default,
        next_vllm=tuple(sorted(nexts)),
        models=models,
    )


def checked_git(pins: Pins) -> GitSource:
    """The git source, refusing an incomplete entry before anything is cloned."""
    git = pins.git
    if git is None or not git.url or not git.ref:
        raise PipelineError(f"{pins.path}: missing pins entry [vllm-git] with url and ref")
    if not COMMIT_RE.match(git.commit):
        raise PipelineError(
            f"{pins.path}: [vllm-git] commit must be the full 40-hex SHA of {git.ref}, "
            f"got {git.commit!r}"
        )
    return git
