"""Build the CPU test tier twice from empty caches and compare the results.

    python3 checks/repro/check_cpu_tier_twice.py [--keep DIR]     (make repro-cpu-tier)

Each build gets its own empty download cache (FRONTIER_CACHE), work folder and
pip cache, so every file comes from the indexes again. Then, for the two venvs:
  - `pip freeze --all` must be equal;
  - every installed distribution's RECORD (the sha256 of each file pip wrote)
    must be equal, apart from the lines that name the venv's own path;
  - the patched trees (vllm/ with our series, the patched plugin) must have the
    same digest.
Prints a table and exits 1 on any difference. Needs the package index."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "build"))

from pipeline import patcher  # noqa: E402

# The patched packages whose digests the images' labels carry.
TREES = ("vllm", "vllm_gguf_plugin")


def build(root: Path) -> tuple[Path, float]:
    venv = root / "venv"
    env = {
        **os.environ,
        "FRONTIER_CACHE": str(root / "cache"),
        "FRONTIER_WORK": str(root / "work"),
        "PIP_CACHE_DIR": str(root / "pip-cache"),
        "UV_CACHE_DIR": str(root / "uv-cache"),
    }
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pipeline", "venv", "--venv", str(venv), "--fresh"],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO / "build")},
        check=True,
    )
    return venv, time.monotonic() - started


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def freeze(venv: Path) -> list[str]:
    """`pip freeze --all`, with the build's own folder replaced: the pinned wheels
    are installed from its download cache, so their lines name that folder (next
    to the file's sha256, which must match)."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.replace(str(venv.parent), "<build>").splitlines()


def records(venv: Path) -> dict[str, str]:
    """distribution -> sha256 over every file its RECORD lists (path and bytes).

    Bytes are compared with the build's folder replaced: console scripts carry
    the venv's path in their first line, and direct_url.json the folder a pinned
    wheel was installed from; the two builds lie in different folders. Bytecode
    (.pyc) is left out: pip compiles it at install time, stamped with the
    install time, and Python rewrites it when stale."""
    site = site_packages(venv)
    root = str(venv.parent).encode()
    out = {}
    for record in sorted(site.glob("*.dist-info/RECORD")):
        digest = hashlib.sha256()
        for line in sorted(record.read_text().splitlines()):
            rel = line.rsplit(",", 2)[0]
            path = (site / rel).resolve()
            if rel.endswith(".pyc") or path == record.resolve() or not path.is_file():
                continue
            digest.update(rel.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes().replace(root, b"<build>")).digest())
        out[record.parent.name] = digest.hexdigest()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--keep", type=Path, help="build under DIR and keep it (default: a temp dir)"
    )
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="frontier-repro-"))
    results = []
    for name in ("a", "b"):
        root = base / name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        print(f"== build {name} in {root} (empty caches)", flush=True)
        results.append(build(root))
    (venv_a, secs_a), (venv_b, secs_b) = results
    freeze_a, freeze_b = freeze(venv_a), freeze(venv_b)
    rec_a, rec_b = records(venv_a), records(venv_b)
    trees = {
        tree: (
            patcher.tree_digest(site_packages(venv_a) / tree),
            patcher.tree_digest(site_packages(venv_b) / tree),
        )
        for tree in TREES
    }
    rows = [
        ("build time (s)", f"{secs_a:.0f}", f"{secs_b:.0f}", True),
        (
            "pip freeze --all (packages)",
            str(len(freeze_a)),
            str(len(freeze_b)),
            freeze_a == freeze_b,
        ),
        ("installed RECORDs (file hashes)", str(len(rec_a)), str(len(rec_b)), rec_a == rec_b),
        *((f"tree digest {tree}", a[:16], b[:16], a == b) for tree, (a, b) in trees.items()),
    ]
    print(f"\n{'':34} {'build a':18} {'build b':18} same")
    for label, a, b, same in rows:
        print(f"{label:34} {a:18} {b:18} {'yes' if same else 'NO'}")
    for line in sorted(set(freeze_a) ^ set(freeze_b)):
        print(f"  freeze differs: {line}")
    for dist in sorted(set(rec_a) | set(rec_b)):
        if rec_a.get(dist) != rec_b.get(dist):
            print(f"  RECORD differs: {dist}")
    if not args.keep and not args.compare:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if all(same for *_, same in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
