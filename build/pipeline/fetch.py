"""Download each pinned file through pip's configured sources into the cache,
verifying its sha256. A bad download is deleted, never kept."""

from __future__ import annotations

import hashlib
import html.parser
import http.client
import os
import ssl
import sys
import urllib.parse
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import net, pipconfig
from .errors import PipelineError
from .paths import cache_dir
from .pins import PinnedFile, Pins

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cached_path(pin: PinnedFile, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / pin.filename


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def _normalize(project: str) -> str:
    return "-".join(part for part in project.lower().replace("_", "-").replace(".", "-").split("-"))


def _context(config: pipconfig.PipConfig) -> ssl.SSLContext:
    return (
        ssl.create_default_context(cafile=config.cert)
        if config.cert
        else ssl.create_default_context()
    )


def _candidates(pin: PinnedFile, config: pipconfig.PipConfig) -> Iterator[str]:
    """URLs (or local paths) that pip's configuration offers for this exact file."""
    for link in config.find_links:
        local = link[len("file://") :] if link.startswith("file://") else link
        if "://" not in local and (Path(local) / pin.filename).is_file():
            yield str(Path(local) / pin.filename)
    if config.no_index:
        return
    for index in config.index_urls:
        page = index.rstrip("/") + "/" + _normalize(pin.project) + "/"
        if page.startswith("file://"):
            page += "index.html"  # as pip does for a local index folder
        try:
            with net.urlopen(page, context=_context(config), timeout=60) as resp:
                body = resp.read().decode("utf-8", "replace")
                base = resp.geturl()
        except (OSError, ValueError):
            continue  # this index does not have the project (or is unreachable)
        parser = _Anchors()
        parser.feed(body)
        for text, href in parser.links:
            url = urllib.parse.urljoin(base, href)
            if text == pin.filename or urllib.parse.urlparse(url).path.endswith("/" + pin.filename):
                yield url.split("#", 1)[0]


def _progress(name: str, done: int, total: int | None) -> None:
    if total:
        print(f"\r  {name}: {done >> 20}/{total >> 20} MiB", end="", file=sys.stderr, flush=True)


def _download(source: str, dest: Path, pin: PinnedFile, config: pipconfig.PipConfig) -> str:
    """Stream source into dest, hashing on the way; returns the sha256."""
    digest = hashlib.sha256()
    done = 0
    if "://" not in source or source.startswith("file://"):
        local = Path(urllib.parse.urlparse(source).path if "://" in source else source)
        stream = local.open("rb")
        total: int | None = local.stat().st_size
    else:
        stream = net.urlopen(source, context=_context(config), timeout=120)
        length = stream.headers.get("Content-Length")
        total = int(length) if length else None
    with stream, dest.open("wb") as out:
        while chunk := stream.read(CHUNK):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if done % (64 * CHUNK) < CHUNK:
                _progress(pin.filename, done, total)
    _progress(pin.filename, done, total)
    if total:
        print(file=sys.stderr)
    if total is not None and done != total:
        raise PipelineError(
            f"{pin.filename}: truncated download from {source}: got {done} of {total} bytes"
        )
    return digest.hexdigest()


def fetch_one(
    pin: PinnedFile, cache: Path | None = None, config: pipconfig.PipConfig | None = None
) -> Path:
    cache = cache or cache_dir()
    target = cached_path(pin, cache)
    if target.is_file():
        actual = sha256_of(target)
        if actual == pin.sha256:
            print(f"cached   {pin.filename}")
            return target
        print(f"stale    {pin.filename}: cached sha256 {actual} != pinned; downloading again")
        target.unlink()
    config = config or pipconfig.read()
    cache.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    tried: list[str] = []
    for source in _candidates(pin, config):
        tried.append(source)
        print(f"fetch    {pin.filename} <- {source}", file=sys.stderr)
        try:
            actual = _download(source, part, pin, config)
        except (OSError, http.client.HTTPException) as exc:
            part.unlink(missing_ok=True)
            raise PipelineError(f"{pin.filename}: download from {source} failed: {exc!r}") from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        if actual != pin.sha256:
            part.unlink(missing_ok=True)
            raise PipelineError(
                f"sha256 mismatch for {pin.filename} from {source}:\n"
                f"  expected {pin.sha256}\n  actual   {actual}\n"
                "The download was deleted; nothing was kept."
            )
        os.replace(part, target)
        print(f"verified {pin.filename}")
        return target
    where = ", ".join(config.find_links + ([] if config.no_index else config.index_urls))
    raise PipelineError(
        f"{pin.filename} ({pin.project} {pin.version}) not found through pip's configuration "
        f"({where or 'no sources'}); tried {len(tried)} candidate(s)"
    )


def fetch_all(
    pins: Pins, keys: Iterable[str] | None = None, cache: Path | None = None
) -> dict[str, Path]:
    wanted = list(keys) if keys else sorted(k for k, f in pins.files.items() if not f.on_demand)
    selected = [pins.file(key) for key in wanted]
    config: pipconfig.PipConfig | None = None
    paths: dict[str, Path] = {}
    for pin in selected:
        target = cached_path(pin, cache)
        if config is None and not (target.is_file()):
            config = pipconfig.read()  # only pay for pip's startup when something is missing
        paths[pin.key] = fetch_one(pin, cache, config)
    return paths


def verify_all(pins: Pins, cache: Path | None = None) -> list[str]:
    """Re-hash every pinned file in the cache; returns the problems found."""
    problems = []
    for pin in (pins.files[key] for key in sorted(pins.files)):
        target = cached_path(pin, cache)
        if not target.is_file():
            if pin.on_demand:  # fetched by the step that names it, not by `make fetch`
                print(f"absent   {pin.filename} (fetched on demand)")
            else:
                problems.append(f"missing  {pin.filename} (run `make fetch`)")
                print(f"MISSING  {pin.filename}")
            continue
        actual = sha256_of(target)
        if actual == pin.sha256:
            print(f"ok       {pin.sha256}  {pin.filename}")
        else:
            problems.append(f"mismatch {pin.filename}: expected {pin.sha256}, actual {actual}")
            print(f"MISMATCH {pin.filename}\n  expected {pin.sha256}\n  actual   {actual}")
    return problems
