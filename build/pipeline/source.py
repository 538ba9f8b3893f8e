"""Make pristine upstream trees: vLLM from the sdist (default) or a pinned git
commit, and the GGUF plugin from its release wheel. Trees appear atomically:
they are built in a temporary folder and renamed into place."""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

from . import fetch
from .errors import PipelineError
from .pins import Pins, checked_git

UPSTREAMS = ("vllm", "vllm-gguf-plugin")


def _replace_dir(staging: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(dest)
    return dest


def _staging(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))


def _checked_members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    """Every member, refused unless it is a plain file, folder or in-tree link.

    The same rules as tarfile's "data" filter, but ours: that filter arrived in
    Python 3.11.4, and Debian bookworm's python3 (the builder image) is 3.11.2."""
    members = []
    for member in tar.getmembers():
        name = member.name
        parts = Path(name).parts
        if Path(name).is_absolute() or ".." in parts:
            raise PipelineError(f"{archive.name}: unsafe path {name!r} (absolute or '..')")
        if member.islnk() or member.issym():
            base = Path(name).parent if member.issym() else Path()
            target = Path(member.linkname)
            if target.is_absolute() or not _inside(base / target):
                raise PipelineError(
                    f"{archive.name}: link {name!r} -> {member.linkname!r} leaves the tree"
                )
        elif not (member.isfile() or member.isdir()):
            raise PipelineError(f"{archive.name}: {name!r} is a device, fifo or other special file")
        member.mode &= 0o755  # no setuid/setgid/sticky, nothing group- or world-writable
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        members.append(member)
    return members


def _inside(relative: Path) -> bool:
    """Does a relative path, '..' resolved lexically, stay inside its root?"""
    depth = 0
    for part in relative.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return False
    return True


def safe_extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        members = _checked_members(tar, archive)
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: its filter as well
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)


def unpack_sdist(archive: Path, dest: Path) -> Path:
    staging = _staging(dest)
    try:
        safe_extract(archive, staging)
        roots = [p for p in staging.iterdir()]
        if len(roots) != 1 or not roots[0].is_dir():
            raise PipelineError(f"{archive.name}: expected one top-level folder in the sdist")
        tree = roots[0]
        tree.rename(staging.with_name(staging.name + ".tree"))
        shutil.rmtree(staging)
        return _replace_dir(staging.with_name(staging.name + ".tree"), dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(staging.with_name(staging.name + ".tree"), ignore_errors=True)
        raise


def unpack_wheel(wheel: Path, dest: Path, package: str | None = None) -> Path:
    """A wheel's files at dest (replacing it); with package, only `package/`
    (a site-packages-shaped tree of that one package)."""
    staging = _staging(dest)
    try:
        with zipfile.ZipFile(wheel) as archive:
            for info in archive.infolist():
                if package and (info.is_dir() or not info.filename.startswith(package + "/")):
                    continue
                target = staging / info.filename
                if not target.resolve().is_relative_to(staging.resolve()):
                    raise PipelineError(f"{wheel.name}: unsafe path {info.filename}")
                archive.extract(info, staging)
                if (info.external_attr >> 16) & 0o111:
                    target.chmod(0o755)
        return _replace_dir(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def sdist_version(tree: Path) -> str:
    info = tree / "PKG-INFO"
    if not info.is_file():
        raise PipelineError(f"{tree}: no PKG-INFO, cannot tell the source version")
    return email.parser.Parser().parsestr(info.read_text())["Version"]


def _git(*args: str, cwd: Path) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PipelineError(f"git {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def clone_git(pins: Pins, dest: Path) -> Path:
    """Fetch the pinned ref and check out the pinned commit, refusing any other."""
    git = checked_git(pins)
    staging = _staging(dest)
    try:
        _git("init", "-q", cwd=staging)
        _git("remote", "add", "origin", git.url, cwd=staging)
        print(f"git fetch {git.url} {git.ref}")
        _git("fetch", "-q", "--tags", "origin", git.ref, cwd=staging)
        fetched = _git("rev-parse", "FETCH_HEAD^{commit}", cwd=staging)
        if fetched != git.commit:
            raise PipelineError(
                f"{git.url} {git.ref} is at commit {fetched}, but {pins.path} pins {git.commit}; "
                "refusing to build an unverified commit"
            )
        _git("-c", "advice.detachedHead=false", "checkout", "-q", git.commit, cwd=staging)
        return _replace_dir(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def git_version(tree: Path) -> str:
    """The release a git checkout is based on (`v0.32.0-5-gabc` -> 0.32.0)."""
    described = _git("describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", cwd=tree)
    match = re.match(r"^v?(\d+\.\d+\.\d+)", described)
    if not match:
        raise PipelineError(f"{tree}: cannot read a release version from tag {described!r}")
    return match.group(1)


def source_version(tree: Path) -> str:
    return git_version(tree) if (tree / ".git").exists() else sdist_version(tree)


def prepare(upstream: str, pins: Pins, dest: Path, vllm_source: str = "sdist") -> Path:
    """A fresh pristine tree of one upstream at dest."""
    if upstream == "vllm":
        if vllm_source == "git":
            return clone_git(pins, dest)
        if vllm_source != "sdist":
            raise PipelineError(f"unknown vLLM source {vllm_source!r} (use sdist or git)")
        pin = pins.file("vllm-sdist")
        tree = unpack_sdist(fetch.fetch_one(pin), dest)
        if sdist_version(tree) != pin.version:
            raise PipelineError(
                f"{pin.filename}: PKG-INFO says {sdist_version(tree)}, pins say {pin.version}"
            )
        return tree
    if upstream == "vllm-gguf-plugin":
        return unpack_wheel(fetch.fetch_one(pins.file("gguf-plugin-wheel")), dest)
    raise PipelineError(f"unknown upstream {upstream!r} (known: {', '.join(UPSTREAMS)})")
