"""Read a patch series: `patches/<upstream>/series`, its patches and the new
files (`patches/<upstream>/files/`) that are copied into the tree."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import PipelineError
from .paths import PATCHES

_TARGET_RE = re.compile(r"^(---|\+\+\+) (\S+)")
_SKIP_PARTS = {"__pycache__"}


@dataclass(frozen=True)
class Series:
    upstream: str
    root: Path
    patches: list[Path]
    files: list[Path]  # relative to root/"files"

    @property
    def files_root(self) -> Path:
        return self.root / "files"

    def touched(self) -> list[str]:
        """Tree paths the patches change, sorted (new files not included)."""
        return sorted({path for patch in self.patches for path in touched_files(patch)})

    def paths(self) -> list[str]:
        """Every tree path the series changes or adds: what a patched tree differs in."""
        return sorted(set(self.touched()) | {rel.as_posix() for rel in self.files})

    def digest(self) -> str:
        """Names and bytes of every patch and new file, in order."""
        digest = hashlib.sha256()
        for patch in self.patches:
            digest.update(b"patch\0" + patch.name.encode() + b"\0" + patch.read_bytes())
        for rel in self.files:
            digest.update(
                b"file\0" + rel.as_posix().encode() + b"\0" + (self.files_root / rel).read_bytes()
            )
        return digest.hexdigest()


def load(upstream: str, root: Path | None = None) -> Series:
    root = root or PATCHES / upstream
    series_file = root / "series"
    if not series_file.is_file():
        raise PipelineError(f"no series file for {upstream}: {series_file}")
    patches: list[Path] = []
    for number, raw in enumerate(series_file.read_text().splitlines(), start=1):
        name = raw.split("#", 1)[0].strip()
        if not name:
            continue
        patch = root / name
        if not patch.is_file():
            raise PipelineError(f"{series_file}:{number}: patch {name} does not exist")
        if patch in patches:
            raise PipelineError(f"{series_file}:{number}: patch {name} is listed twice")
        patches.append(patch)
    files_root = root / "files"
    files = (
        sorted(
            path.relative_to(files_root)
            for path in files_root.rglob("*")
            if path.is_file() and not _SKIP_PARTS & set(path.parts) and path.suffix != ".pyc"
        )
        if files_root.is_dir()
        else []
    )
    return Series(upstream, root, patches, files)


def touched_files(patch: Path) -> list[str]:
    """Tree-relative paths (-p1) that a unified diff reads or writes."""
    paths: list[str] = []
    for line in patch.read_text(errors="replace").splitlines():
        match = _TARGET_RE.match(line)
        if not match or match.group(2) == "/dev/null":
            continue
        path = match.group(2).split("/", 1)[1] if "/" in match.group(2) else match.group(2)
        if path not in paths:
            paths.append(path)
    if not paths:
        raise PipelineError(f"{patch.name}: no file headers found; is it a unified diff?")
    return paths
