"""Apply a patch series to a tree with zero fuzz, all or nothing.

The touched files are patched in a staging copy first; the tree changes only
after every patch applied cleanly and every new file is known to be new."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .errors import PipelineError
from .series import Series

STAMP_PREFIX = ".frontier-patches-"
_HUNK_FAILED = re.compile(r"Hunk #(\d+) FAILED at (\d+)")
_HUNK_MOVED = re.compile(r"Hunk #(\d+) succeeded at (\d+) (\(offset .*?\)|with fuzz \d+.*)")
_FILE_LINE = re.compile(r"^(?:checking|patching) file '?([^']+?)'?$")


def stamp_path(tree: Path, upstream: str) -> Path:
    return tree / f"{STAMP_PREFIX}{upstream}.json"


def _patch(patch: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "patch",
            "-p1",
            "--fuzz=0",
            "--batch",
            "--forward",
            "--no-backup-if-mismatch",
            "--reject-file=-",
            "-d",
            str(workdir),
            "-i",
            str(patch),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def _explain(patch: Path, output: str) -> str:
    current = "?"
    for line in output.splitlines():
        file_match = _FILE_LINE.match(line.strip())
        if file_match:
            current = file_match.group(1)
        failed = _HUNK_FAILED.search(line)
        if failed:
            hunk, line_no = failed.groups()
            return f"{patch.name}: hunk #{hunk} of {current} does not apply (at line {line_no})"
        moved = _HUNK_MOVED.search(line)
        if moved:
            return (
                f"{patch.name}: hunk #{moved.group(1)} of {current} applies only at line "
                f"{moved.group(2)} {moved.group(3)}; refresh the patch against the pinned source"
            )
        if "Reversed (or previously applied) patch detected" in line:
            return f"{patch.name}: already applied to {current}; the tree is patched already"
        if "can't find file to patch" in line or "No such file" in line:
            return f"{patch.name}: {current}: file to patch is missing from the tree"
    return f"{patch.name}: patch failed:\n{output.strip()}"


def _check_clean(patch: Path, output: str) -> None:
    if _HUNK_MOVED.search(output):
        raise PipelineError(_explain(patch, output))


def apply_series(series: Series, tree: Path) -> str:
    """Patch tree in place. Returns 'applied' or 'already' (same series stamp)."""
    stamp = stamp_path(tree, series.upstream)
    digest = series.digest()
    if stamp.is_file():
        recorded = json.loads(stamp.read_text()).get("series_digest")
        if recorded == digest:
            print(
                f"{series.upstream}: {tree} is already patched with this series "
                f"({digest[:12]}); nothing to do"
            )
            return "already"
        raise PipelineError(
            f"{tree} was patched with another {series.upstream} series ({str(recorded)[:12]}); "
            "start from a fresh tree instead of patching it twice"
        )
    clashes = [rel.as_posix() for rel in series.files if (tree / rel).exists()]
    if clashes:
        raise PipelineError(
            f"{series.upstream}: new file(s) from {series.files_root} would overwrite upstream: "
            + ", ".join(clashes)
        )
    touched = series.touched()
    with tempfile.TemporaryDirectory(prefix="frontier-patch-") as tmp:
        staging = Path(tmp)
        for rel in touched:
            if (tree / rel).is_file():
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(tree / rel, staging / rel)
        for patch in series.patches:
            dry = _patch(patch, staging, "--dry-run")
            if dry.returncode != 0:
                raise PipelineError(_explain(patch, dry.stdout + dry.stderr))
            _check_clean(patch, dry.stdout)
            real = _patch(patch, staging)
            if real.returncode != 0:
                raise PipelineError(_explain(patch, real.stdout + real.stderr))
            print(f"{series.upstream}: applied {patch.name}")
        for rel in touched:
            _install(staging / rel, tree / rel)
    for rel in series.files:
        _install(series.files_root / rel, tree / rel)
        print(f"{series.upstream}: added {rel.as_posix()}")
    _write_atomic(
        stamp,
        json.dumps(
            {
                "upstream": series.upstream,
                "series_digest": digest,
                "patches": [patch.name for patch in series.patches],
                "files": [rel.as_posix() for rel in series.files],
            },
            indent=2,
        )
        + "\n",
    )
    return "applied"


def report_series(series: Series, tree: Path) -> list[tuple[str, str, str]]:
    """Try every patch of a series on tree, going on after a failure, for planning a
    rebase: (item, status, detail) rows, status one of applies / refresh / FAILS.

    A patch that applies only with an offset is applied (so the next ones see it)
    but reported `refresh`: the build itself refuses anything but an exact fit."""
    rows: list[tuple[str, str, str]] = []
    for rel in series.files:
        if (tree / rel).exists():
            rows.append((f"files/{rel.as_posix()}", "FAILS", "upstream now has this file"))
        else:
            rows.append((f"files/{rel.as_posix()}", "applies", "new file"))
    for patch in series.patches:
        dry = _patch(patch, tree, "--dry-run")
        output = dry.stdout + dry.stderr
        if dry.returncode != 0:
            rows.append((patch.name, "FAILS", _explain(patch, output).split(": ", 1)[-1]))
            continue
        moved = _HUNK_MOVED.search(output)
        _patch(patch, tree)
        if moved:
            rows.append((patch.name, "refresh", _explain(patch, output).split(": ", 1)[-1]))
        else:
            rows.append((patch.name, "applies", ""))
    return rows


def _install(src: Path, dest: Path) -> None:
    if not src.exists():
        dest.unlink(missing_ok=True)  # the patch deleted it
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.frontier-tmp")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, 0o755 if os.access(src, os.X_OK) else 0o644)
    os.replace(tmp, dest)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def tree_digest(tree: Path) -> str:
    """sha256 over every file's path, exec bit and bytes; ignores caches and .git."""
    digest = hashlib.sha256()
    for path in sorted(tree.rglob("*")):
        rel = path.relative_to(tree)
        if rel.parts[0] == ".git" or "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            digest.update(
                b"L" + rel.as_posix().encode() + b"\0" + os.readlink(path).encode() + b"\0"
            )
        elif path.is_file():
            mode = b"x" if os.access(path, os.X_OK) else b"-"
            digest.update(mode + rel.as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()
