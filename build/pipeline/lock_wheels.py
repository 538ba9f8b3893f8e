"""`lock-wheels`: every lock an image installs has its wheels on the image's base.

`lock-check` proves a lock matches its inputs; nothing proved that the 3.12 lock
users' CUDA image installs has, for every locked version, a wheel for CPython 3.12
on Ubuntu 24.04's glibc, whose sha256 the lock lists. This step asks the package
index for each project's files (PEP 691 JSON: names and digests, no wheel is
downloaded) and checks, per lock and Python of build/targets.toml:

- a wheel of exactly the locked version is installable on that CPython and glibc
  (its tags, its Requires-Python, not yanked), and its sha256 is one of the lock's;
- every hash the lock lists belongs to a file of that version (no stray hash).

Pinned files (build/pins.toml) are checked by their own file name and sha256.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    from packaging import tags
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
except ImportError:  # pip always carries it
    from pip._vendor.packaging import tags  # type: ignore[no-redef]
    from pip._vendor.packaging.specifiers import (  # type: ignore[no-redef,assignment]
        InvalidSpecifier,
        SpecifierSet,
    )
    from pip._vendor.packaging.utils import (  # type: ignore[no-redef,assignment]
        InvalidWheelFilename,
        parse_wheel_filename,
    )

from . import locks, net, pins, pipconfig, targets
from .errors import PipelineError
from .fetch import _context

JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
# One index file: (filename, sha256, requires-python or "", yanked)
IndexFile = tuple[str, str, str, bool]


def compatible_tags(python: str, glibc: str) -> set[tags.Tag]:
    """What pip accepts for CPython `python` (X.Y) on x86_64 Linux with glibc `glibc`."""
    major, minor = (int(part) for part in python.split("."))
    glibc_minor = int(glibc.split(".")[1])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    platforms += [name for floor, name in legacy.items() if glibc_minor >= floor]
    platforms.append("linux_x86_64")
    version = (major, minor)
    abi = f"cp{major}{minor}"
    found = set(tags.cpython_tags(version, abis=[abi], platforms=platforms))
    found |= set(tags.compatible_tags(version, interpreter=abi, platforms=platforms))
    return found


def installable(filename: str, python: str, wanted: set[tags.Tag], requires: str) -> bool:
    if not filename.endswith(".whl"):
        return False
    try:
        _, _, _, file_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    if not file_tags & wanted:
        return False
    if not requires:
        return True
    try:
        return SpecifierSet(requires).contains(f"{python}.0", prereleases=True)
    except InvalidSpecifier:
        return False


def index_files(name: str, config: pipconfig.PipConfig) -> list[IndexFile]:
    """Every file the first index that knows `name` lists for it."""
    missing = []
    for index in config.index_urls:
        url = f"{index.rstrip('/')}/{locks.normalize(name)}/"
        request = urllib.request.Request(url, headers={"Accept": JSON_ACCEPT})
        try:
            with net.urlopen(request, context=_context(config), timeout=60) as resp:
                data = json.load(resp)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                missing.append(index)
                continue
            raise PipelineError(f"{url}: HTTP {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise PipelineError(f"{url}: {exc}") from None
        return [
            (f["filename"], f.get("hashes", {}).get("sha256", ""),
             f.get("requires-python") or "", bool(f.get("yanked")))
            for f in data.get("files", [])
        ]  # fmt: skip
    raise PipelineError(f"{name}: not on {', '.join(missing)}")


def entry_problems(
    entry: locks.Entry, files: list[IndexFile], python: str, wanted: set[tags.Tag]
) -> list[str]:
    """Why one locked line would not install from `files`, the index's files of its project."""
    prefix = f"{locks.normalize(entry.name).replace('-', '_')}-{entry.version}"
    own = [f for f in files if _version_of(f[0]) == prefix.lower()]
    if not own:
        return [f"{entry.name}=={entry.version}: no such version on the index"]
    digests = {f[1] for f in own}
    problems = [
        f"{entry.name}=={entry.version}: hash {digest[:12]}… is of no file of that version"
        for digest in entry.hashes
        if digest not in digests
    ]
    usable = [f for f in own if not f[3] and installable(f[0], python, wanted, f[2])]
    if not usable:
        problems.append(f"{entry.name}=={entry.version}: no wheel for this CPython and glibc")
    elif not any(f[1] in entry.hashes for f in usable):
        problems.append(
            f"{entry.name}=={entry.version}: the lock lists the hash of no wheel that "
            f"installs here ({', '.join(f[0] for f in usable[:3])})"
        )
    return problems


def _version_of(filename: str) -> str:
    """name-version of a wheel or sdist file name, normalised to compare with a lock's."""
    stem = filename.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    name, _, rest = stem.partition("-")
    version = rest.split("-")[0]
    return f"{locks.normalize(name).replace('-', '_')}-{version}".lower()


def check_lock(
    text: str,
    python: str,
    glibc: str,
    pinned: dict[str, pins.PinnedFile],
    files_of: Callable[[str], list[IndexFile]],
) -> list[str]:
    """Problems of one lock's text for CPython `python` on glibc `glibc`."""
    wanted = compatible_tags(python, glibc)
    entries = list(locks.parse(text).values())
    problems: list[str] = []
    from_index = [e for e in entries if locks.normalize(e.name) not in pinned]
    with ThreadPoolExecutor(max_workers=16) as pool:
        listed = pool.map(lambda e: files_of(e.name), from_index)
        fetched = dict(zip((e.name for e in from_index), listed, strict=True))
    for entry in entries:
        pin = pinned.get(locks.normalize(entry.name))
        if pin is None:
            problems += entry_problems(entry, fetched[entry.name], python, wanted)
        elif not installable(pin.filename, python, wanted, ""):
            problems.append(f"{entry.name}: the pinned {pin.filename} does not install here")
    return problems


def check(manifest: targets.Manifest, loaded: pins.Pins, only: Iterable[str] = ()) -> list[str]:
    config = pipconfig.read()
    cache: dict[str, list[IndexFile]] = {}

    def files_of(name: str) -> list[IndexFile]:
        key = locks.normalize(name)
        if key not in cache:
            cache[key] = index_files(name, config)
        return cache[key]

    problems: list[str] = []
    wanted = set(only)
    in_images = {target.lock for target in manifest.targets.values()}
    for spec in manifest.locks.values():
        # The tools and test-tier locks install on the host, whose glibc is the user's.
        if spec.name not in in_images or (wanted and spec.name not in wanted):
            continue
        pinned = {locks.normalize(loaded.file(k).project): loaded.file(k) for k in spec.pins}
        for python in spec.pythons:
            lock = locks.path(spec, python)
            glibc = manifest.install_glibc[python]
            found = check_lock(lock.read_text(), python, glibc, pinned, files_of)
            problems += [f"{lock.name} (CPython {python}, glibc {glibc}): {p}" for p in found]
    return problems


def _lock_wheels(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    manifest = targets.load(loaded_pins=loaded)
    if args.lock_file:
        if not args.python or not args.glibc:
            raise PipelineError("--lock-file needs --python X.Y and --glibc 2.NN")
        text = args.lock_file.read_text()
        config = pipconfig.read()
        problems = check_lock(text, args.python, args.glibc, {},
                              lambda name: index_files(name, config))  # fmt: skip
        problems = [f"{args.lock_file}: {p}" for p in problems]
    else:
        problems = check(manifest, loaded, args.only or ())
    for problem in problems:
        print(f"lock-wheels: {problem}", file=sys.stderr)
    if problems:
        print(f"lock-wheels: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("lock-wheels: every locked version has a wheel for its CPython and glibc, "
          "hash-listed")  # fmt: skip
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001
    cmd = sub.add_parser(
        "lock-wheels", help="check each lock installs on its images' CPython and glibc"
    )
    cmd.set_defaults(func=_lock_wheels, upstream=[])
    cmd.add_argument("--only", action="append", help="only this lock (repeatable)")
    cmd.add_argument("--lock-file", type=Path,
                     help="check this file instead (with --python and --glibc)")  # fmt: skip
    cmd.add_argument("--python", help="X.Y, with --lock-file")
    cmd.add_argument("--glibc", help="2.NN, with --lock-file")
