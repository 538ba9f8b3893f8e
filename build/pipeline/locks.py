"""Hash-locked dependency closures, one file per lock, Python and platform (locks/).

`make lock` resolves each [locks.*] entry of build/targets.toml with
`uv pip compile --generate-hashes`: uv resolves for a Python version and
platform other than the one running it (pip-tools resolves only for its own
interpreter), so one host writes the Python 3.11 and 3.12 locks of the images.
Installing needs only pip: `pip install --require-hashes --no-deps -r LOCK`.

Each lock's header records its inputs and their digest (pinned versions and
sha256s, the pinned wheel's Requires-Dist, pyproject's requirements, the
constraint locks), so `make lock-check` knows, offline, when a lock no longer
matches build/pins.toml, build/targets.toml or pyproject.toml."""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from . import fetch, pins, pipconfig, targets
from .errors import PipelineError
from .paths import REPO

LOCKS_DIR = REPO / "locks"
ENTRY_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")
HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
# pip's report of a hash mismatch names each package on a line of its own.
PIP_MISMATCH_RE = re.compile(r"^\s+(\S+==\S+) from ", re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    name: str
    version: str
    hashes: tuple[str, ...]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def path(spec: targets.LockSpec, python: str) -> Path:
    return LOCKS_DIR / f"{spec.name}-py{python}-{spec.platform}.txt"


def checked_python(spec: targets.LockSpec, python: str) -> str:
    if python not in spec.pythons:
        raise PipelineError(
            f"lock {spec.name!r} has no Python {python} (it is made for "
            f"{', '.join(spec.pythons)}); add it to pythons in build/targets.toml "
            "and run `make lock`"
        )
    return python


def python_version(python: str = sys.executable) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise PipelineError(f"{python}: cannot run it to read its version")
    return out.stdout.strip()


# ------------------------------------------------------------------ inputs


def requires_dist(wheel: Path) -> list[str]:
    """A wheel's own requirements (no extras), as pip reads them from its METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise PipelineError(f"{wheel.name}: expected one .dist-info/METADATA")
        message = email.parser.Parser().parsestr(archive.read(metadata[0]).decode())
    return [req for req in message.get_all("Requires-Dist") or [] if "extra ==" not in req]


def project_requirements(extras: tuple[str, ...] = (), pyproject: Path | None = None) -> list[str]:
    """pyproject.toml's [project] dependencies, the named extras, and with "build"
    its [build-system] requires (to install this project without build isolation)."""
    data = tomllib.loads((pyproject or REPO / "pyproject.toml").read_text())
    project = data.get("project", {})
    lines = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra == "build":
            lines += data.get("build-system", {}).get("requires", [])
        elif extra in optional:
            lines += optional[extra]
        else:
            raise PipelineError(f"pyproject.toml has no optional-dependencies {extra!r}")
    return lines


def requirement_lines(text: str) -> list[str]:
    return [
        line.split(" #", 1)[0].strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _sdist_member(sdist: Path, rel: str) -> str:
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.split("/", 1)[-1] == rel:
                handle = archive.extractfile(member)
                assert handle is not None
                return handle.read().decode()
    raise PipelineError(f"{sdist.name} has no {rel}")


def inputs(spec: targets.LockSpec, loaded: pins.Pins) -> list[str]:
    """The requirement lines a lock is resolved from, in a stable order."""
    lines = [f"{loaded.file(key).project}=={loaded.file(key).version}" for key in spec.pins]
    for key in spec.deps_of:
        lines += requires_dist(fetch.fetch_one(loaded.file(key)))
    if spec.sdist_file:
        lines += requirement_lines(
            _sdist_member(fetch.fetch_one(loaded.file("vllm-sdist")), spec.sdist_file)
        )
    lines += spec.requirements
    for rel in spec.requirements_files:
        lines += requirement_lines((REPO / rel).read_text())
    if spec.project is not None:
        lines += project_requirements(spec.project)
    return lines


def input_digest(
    spec: targets.LockSpec,
    python: str,
    lines: list[str],
    loaded: pins.Pins,
    manifest: targets.Manifest,
) -> str:
    """Everything the lock's content follows from; a change means `make lock`."""
    constraint_files = {}
    for other in spec.constraints:
        lock = path(manifest.lock(other), python)
        constraint_files[lock.name] = fetch.sha256_of(lock) if lock.is_file() else "missing"
    material = {
        "lines": lines,
        "pins": {key: loaded.file(key).sha256 for key in spec.pins},
        "exclude": sorted(spec.exclude),
        "python": python,
        "platform": spec.platform,
        "constraints": constraint_files,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ reading


def parse(text: str) -> dict[str, Entry]:
    """name -> Entry for each `name==version --hash=...` requirement of a lock."""
    entries: dict[str, Entry] = {}
    current: list[str] = []

    def close() -> None:
        if current:
            match = ENTRY_RE.match(current[0])
            if not match:
                raise PipelineError(f"lock line not understood: {current[0]!r}")
            hashes = tuple(HASH_RE.findall(" ".join(current)))
            entries[normalize(match.group(1))] = Entry(match.group(1), match.group(2), hashes)
            current.clear()

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            close()
        current.append(line)
    close()
    return entries


def recorded_inputs(text: str, field: str = "input") -> list[str]:
    """The values of a repeated header field: by default the requirement lines a
    lock's header says it was resolved from; `constraint` for its constraint locks."""
    prefix = f"# {field}: "
    return [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)]


def header_value(text: str, key: str) -> str:
    prefix = f"# {key}: "
    for line in text.splitlines():
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
        if line and not line.startswith("#"):
            break
    return ""


# ------------------------------------------------------------------ writing


def _uv(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("UV"), str(REPO / ".work/tools/bin/uv"), "uv"):
        if candidate and shutil.which(candidate):
            return candidate
    raise PipelineError(
        "uv not found: `make lock` installs it with the tools (locks/tools-*.txt); "
        "or pass --uv PATH"
    )


def _index_args(config: pipconfig.PipConfig) -> list[str]:
    # pip's rule: the best version across every index, not the first index that has a name.
    return [*pipconfig.index_args(config), "--index-strategy", "unsafe-best-match"]


def _pin_hashes(body: str, spec: targets.LockSpec, loaded: pins.Pins, lock: Path) -> str:
    """Keep only the pinned sha256 for pinned projects: the lock installs that file."""
    pinned = {normalize(loaded.file(key).project): loaded.file(key) for key in spec.pins}
    out: list[str] = []
    skipping = False
    for line in body.splitlines():
        match = ENTRY_RE.match(line)
        if match:
            skipping = False
            pin = pinned.get(normalize(match.group(1)))
            if pin:
                block = _entry_block(body, line)
                if pin.sha256 not in HASH_RE.findall(block):
                    raise PipelineError(
                        f"{lock.name}: the index serves no file of {pin.project}=={pin.version} "
                        f"with the sha256 build/pins.toml gives ({pin.filename})"
                    )
                out += [f"{match.group(0)} \\", f"    --hash=sha256:{pin.sha256}"]
                skipping = True
                continue
        elif skipping and line.lstrip().startswith("--hash="):
            continue
        elif skipping and not line.startswith("    #"):
            skipping = False
        out.append(line)
    return "\n".join(out) + "\n"


def _entry_block(body: str, first: str) -> str:
    lines = body.splitlines()
    start = lines.index(first)
    block = [first]
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        block.append(line)
    return "\n".join(block)


def compile_lock(
    spec: targets.LockSpec,
    python: str,
    loaded: pins.Pins,
    manifest: targets.Manifest,
    uv: str,
) -> Path:
    """Resolve one lock with uv and write it (atomically) into locks/."""
    lines = inputs(spec, loaded)
    lock = path(spec, python)
    config = pipconfig.read()
    with tempfile.TemporaryDirectory(prefix="frontier-lock-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "requirements.in").write_text("\n".join(lines) + "\n")
        command = [
            uv, "pip", "compile", "requirements.in",
            "--generate-hashes", "--no-header", "--quiet",
            "--python-version", python, "--python-platform", spec.platform,
            *_index_args(config),
            "--output-file", "lock.txt",
        ]  # fmt: skip
        if spec.pins:
            # Only this lock's pinned files: a torch+cpu wheel must not satisfy torch==X.
            links = tmp / "pins"
            links.mkdir()
            for key in spec.pins:
                cached = fetch.fetch_one(loaded.file(key))
                os.symlink(cached, links / cached.name)
            command += ["--find-links", links.name]
        for other in spec.constraints:
            other_lock = path(manifest.lock(other), python)
            if not other_lock.is_file():
                raise PipelineError(
                    f"{lock.name} is constrained by {other_lock.name}: make it first"
                )
            pinned = parse(other_lock.read_text()).values()
            constraint = tmp / f"{other}.constraints.txt"
            constraint.write_text("".join(f"{e.name}=={e.version}\n" for e in pinned))
            command += ["--constraint", constraint.name]
        for name in spec.exclude:
            command += ["--no-emit-package", name]
        env = dict(os.environ)
        if config.cert:
            env["SSL_CERT_FILE"] = config.cert
        print(f"[lock] {lock.name}: resolving {len(lines)} requirement(s)", flush=True)
        # Relative names from tmp: the annotations ("# via -r requirements.in") stay stable.
        result = subprocess.run(command, env=env, cwd=tmp, check=False)
        if result.returncode != 0:
            raise PipelineError(f"uv could not resolve {lock.name} (exit {result.returncode})")
        body = _pin_hashes((tmp / "lock.txt").read_text(), spec, loaded, lock)
        version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip()
    header = [
        f"# Lock {spec.name!r} for CPython {python} on {spec.platform}: {spec.description}.",
        f"# Written by `make lock` ({version}, pip compile --generate-hashes); do not edit.",
        "# Install: pip install --require-hashes --no-deps -r <this file>",
        f"# input-sha256: {input_digest(spec, python, lines, loaded, manifest)}",
        *(f"# input: {line}" for line in lines),
        *(f"# exclude: {name}" for name in spec.exclude),
        *(f"# constraint: {line}" for line in _constraint_lines(spec, python, manifest)),
        "",
    ]
    LOCKS_DIR.mkdir(exist_ok=True)
    staging = lock.with_name(lock.name + ".tmp")
    staging.write_text("\n".join(header) + "\n" + body)
    os.replace(staging, lock)
    print(f"[lock] wrote {lock.relative_to(REPO)} ({len(parse(body))} packages)")
    return lock


def _constraint_lines(spec: targets.LockSpec, python: str, manifest: targets.Manifest) -> list[str]:
    lines = []
    for other in spec.constraints:
        lock = path(manifest.lock(other), python)
        lines.append(f"{lock.name} sha256:{fetch.sha256_of(lock) if lock.is_file() else 'missing'}")
    return lines


def ordered(manifest: targets.Manifest) -> list[targets.LockSpec]:
    """Locks with every constraint lock before the locks it constrains."""
    done: list[targets.LockSpec] = []

    def visit(spec: targets.LockSpec) -> None:
        if spec in done:
            return
        for other in spec.constraints:
            visit(manifest.lock(other))
        done.append(spec)

    for spec in manifest.locks.values():
        visit(spec)
    return done


# ------------------------------------------------------------------ checking


def check(manifest: targets.Manifest, loaded: pins.Pins) -> list[str]:
    """Every way a lock can disagree with its inputs; empty when all match."""
    problems: list[str] = []
    expected = {path(spec, py) for spec in manifest.locks.values() for py in spec.pythons}
    for stray in sorted(set(LOCKS_DIR.glob("*.txt")) - expected):
        problems.append(f"{stray.name}: no [locks.*] entry of build/targets.toml makes it")
    for spec in ordered(manifest):
        lines = inputs(spec, loaded)  # reads the pinned wheel or sdist: once per lock
        for python in spec.pythons:
            lock = path(spec, python)
            if not lock.is_file():
                problems.append(f"{lock.name}: missing (make lock)")
                continue
            text = lock.read_text()
            want = input_digest(spec, python, lines, loaded, manifest)
            if header_value(text, "input-sha256") != want:
                changed = sorted(set(lines) ^ set(recorded_inputs(text)))
                recorded = recorded_inputs(text, "constraint")
                moved = sorted(set(_constraint_lines(spec, python, manifest)) - set(recorded))
                what = (
                    f"inputs changed: {', '.join(changed)}"
                    if changed
                    else f"constraint lock changed: {', '.join(moved)}"
                    if moved
                    else "pins, exclusions or platform changed"
                )
                problems.append(f"{lock.name}: {what} (make lock)")
            entries = parse(text)
            for key in spec.pins:
                pin = loaded.file(key)
                entry = entries.get(normalize(pin.project))
                if entry is None or entry.version != pin.version:
                    problems.append(f"{lock.name}: {pin.project} is not {pin.version} (make lock)")
                elif entry.hashes != (pin.sha256,):
                    problems.append(f"{lock.name}: {pin.project}'s hash is not the pinned one")
            for entry in entries.values():
                if not entry.hashes:
                    problems.append(f"{lock.name}: {entry.name} has no hash")
            for name in spec.exclude:
                if normalize(name) in entries:
                    problems.append(f"{lock.name}: {name} is excluded but locked")
            for other in spec.constraints:
                other_lock = path(manifest.lock(other), python)
                if not other_lock.is_file():
                    continue
                for name, theirs in parse(other_lock.read_text()).items():
                    ours = entries.get(name)
                    if ours and ours.version != theirs.version:
                        problems.append(
                            f"{lock.name}: {theirs.name} {ours.version}, but {other_lock.name} "
                            f"has {theirs.version}"
                        )
    return problems


# ------------------------------------------------------------------ installing


def install(
    python: str,
    lock: Path,
    find_links: list[Path] | tuple[Path, ...] = (),
    pip_options: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
    quiet: bool = True,
) -> None:
    """Exactly the lock's packages, each checked against its hashes, into python's env.

    pip_options go before `install` (--isolated), options after it (indexes)."""
    command = [python, "-m", "pip", *pip_options, "install", "--require-hashes", "--no-deps"]
    command += ["--progress-bar", "off", "--disable-pip-version-check", "--no-input"]
    command += [*options, *(["--quiet"] if quiet else [])]
    for folder in find_links:
        command += ["--find-links", str(folder)]
    command += ["--requirement", str(lock)]
    print(f"[lock] installing {lock.name} (hash-checked) into {python}", flush=True)
    result = subprocess.run(command, stderr=subprocess.PIPE, text=True, check=False)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        bad = PIP_MISMATCH_RE.findall(result.stderr)
        detail = (
            f"these files do not match the lock's hashes: {', '.join(bad)}"
            if bad
            else "see pip's message above"
        )
        raise PipelineError(f"installing {lock.name} failed (exit {result.returncode}): {detail}")


def lock_for(name: str, python_exe: str) -> Path:
    """The lock file of lock `name` for the Python of python_exe."""
    spec = targets.load().lock(name)
    lock = path(spec, checked_python(spec, python_version(python_exe)))
    if not lock.is_file():
        raise PipelineError(f"{lock.relative_to(REPO)} is missing: run `make lock`")
    return lock


# ------------------------------------------------------------------ commands


def _lock(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    manifest = targets.load(loaded_pins=loaded)
    uv = _uv(args.uv)
    chosen = [spec for spec in ordered(manifest) if not args.only or spec.name in args.only]
    if args.only and len(chosen) != len(set(args.only)):
        raise PipelineError(f"--only: unknown lock(s); known: {', '.join(manifest.locks)}")
    for spec in chosen:
        for python in spec.pythons:
            compile_lock(spec, python, loaded, manifest, uv)
    problems = check(manifest, loaded)
    for problem in problems:
        print(f"lock-check: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _lock_check(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    manifest = targets.load(loaded_pins=loaded)
    problems = check(manifest, loaded)
    for problem in problems:
        print(f"lock-check: {problem}", file=sys.stderr)
    if problems:
        print(f"lock-check: {len(problems)} problem(s); `make lock` rewrites the locks")
        return 1
    count = sum(len(spec.pythons) for spec in manifest.locks.values())
    print(f"lock-check: {count} lock files match build/pins.toml, targets.toml and pyproject.toml")
    return 0


def _lock_path(args: argparse.Namespace) -> int:
    print(lock_for(args.name, args.python))
    return 0


def _lock_install(args: argparse.Namespace) -> int:
    install(args.python, lock_for(args.name, args.python), args.find_links)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001
    cmd = sub.add_parser("lock", help="resolve every lock of build/targets.toml into locks/")
    cmd.set_defaults(func=_lock, upstream=[])
    cmd.add_argument("--uv", help="uv executable (default: the tools env's, then PATH)")
    cmd.add_argument("--only", action="append", help="only this lock (repeatable)")
    chk = sub.add_parser("lock-check", help="fail when a lock no longer matches its inputs")
    chk.set_defaults(func=_lock_check, upstream=[])
    where = sub.add_parser("lock-path", help="print the lock file of NAME for a Python")
    where.set_defaults(func=_lock_path, upstream=[])
    where.add_argument("name")
    where.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    inst = sub.add_parser("lock-install", help="pip install one lock, hash-checked, --no-deps")
    inst.set_defaults(func=_lock_install, upstream=[])
    inst.add_argument("name")
    inst.add_argument("--python", default=sys.executable, help="interpreter to install into")
    inst.add_argument("--find-links", type=Path, action="append", default=[])
