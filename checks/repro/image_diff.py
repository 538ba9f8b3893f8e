"""Compare two images saved by `docker save`: image IDs, layer digests and, where a
layer differs, the files that differ and how (content, mode, owner, time, type).

    python3 checks/repro/image_diff.py A.tar B.tar [--limit N]

Reads the archives' manifest.json (the classic layout and the OCI one both carry it),
so no engine is needed. Exits 0 when both archives hold the same image ID, 1 when
they differ, 2 on an archive it cannot read. `make repro-image` runs it on two
no-cache builds of runtime-cpu; `make e2e` runs it on two small images."""

from __future__ import annotations

import argparse
import hashlib
import json
import stat
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


class ArchiveError(Exception):
    """An archive that is not a readable `docker save` output."""


@dataclass(frozen=True)
class Entry:
    """One member of a layer tar, as far as it decides the layer's bytes."""

    kind: str  # file, dir, symlink, hardlink, char, block, fifo
    mode: int  # permission bits only: Go's tar writer also puts the file type there,
    # Python's does not, and the type flag (kind) is what Docker reads
    owner: tuple[int, int]
    mtime: int
    size: int
    link: str
    digest: str  # sha256 of a regular file's content, else ""
    pax: tuple[tuple[str, str], ...]  # xattrs and other PAX records


@dataclass(frozen=True)
class Image:
    path: Path
    image_id: str
    config: dict
    layers: list[str]  # diff IDs, bottom first
    layer_members: list[str]  # member names of the layer tars in the archive


_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "char",
    tarfile.BLKTYPE: "block",
    tarfile.FIFOTYPE: "fifo",
}


def _read_member(archive: tarfile.TarFile, name: str) -> bytes:
    try:
        f = archive.extractfile(name)
    except KeyError:
        f = None
    if f is None:
        raise ArchiveError(f"{archive.name}: no {name} in the archive")
    return f.read()


def open_image(path: Path) -> Image:
    """The one image a `docker save` archive holds."""
    try:
        with tarfile.open(path) as archive:
            try:
                manifest = json.loads(_read_member(archive, "manifest.json"))
            except json.JSONDecodeError as exc:
                raise ArchiveError(f"{path}: manifest.json is not JSON ({exc})") from exc
            if not isinstance(manifest, list) or len(manifest) != 1:
                n = len(manifest) if isinstance(manifest, list) else "no list"
                raise ArchiveError(f"{path}: expected one image in manifest.json, found {n}")
            entry = manifest[0]
            if not isinstance(entry, dict) or not {"Config", "Layers"} <= entry.keys():
                raise ArchiveError(f"{path}: manifest.json's image names no Config and Layers")
            raw = _read_member(archive, entry["Config"])
    except (OSError, tarfile.TarError) as exc:
        raise ArchiveError(f"{path}: not a readable tar archive ({exc})") from exc
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ArchiveError(f"{path}: {entry['Config']} is not JSON ({exc})") from exc
    return Image(
        path=path,
        image_id="sha256:" + hashlib.sha256(raw).hexdigest(),
        config=config,
        layers=list(config.get("rootfs", {}).get("diff_ids", [])),
        layer_members=list(entry["Layers"]),
    )


def layer_entries(image: Image, index: int) -> dict[str, Entry]:
    """Every member of layer `index` by path, with its content digest."""
    out: dict[str, Entry] = {}
    with tarfile.open(image.path) as archive:
        raw = archive.extractfile(image.layer_members[index])
        if raw is None:
            raise ArchiveError(f"{image.path}: layer {image.layer_members[index]} is missing")
        with tarfile.open(fileobj=raw, mode="r|*") as layer:
            for m in layer:
                digest = ""
                if m.isreg():
                    f = layer.extractfile(m)
                    h = hashlib.sha256()
                    if f is not None:
                        for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                            h.update(chunk)
                    digest = h.hexdigest()
                pax = tuple(sorted((k, v) for k, v in m.pax_headers.items()
                                   if k not in ("path", "linkpath", "mtime", "size")))
                out[m.name.rstrip("/") or "/"] = Entry(
                    kind=_KINDS.get(m.type, f"type {m.type!r}"),
                    mode=stat.S_IMODE(m.mode),  # the type is `kind`; see Entry.mode
                    owner=(m.uid, m.gid),
                    mtime=int(m.mtime),
                    size=m.size,
                    link=m.linkname,
                    digest=digest,
                    pax=pax,
                )
    return out


def entry_differences(a: Entry, b: Entry) -> list[str]:
    """What differs between two members of the same path, as short phrases."""
    out = []
    if a.kind != b.kind:
        out.append(f"type {a.kind} vs {b.kind}")
    if a.digest != b.digest:
        out.append(f"content ({a.size} B {a.digest[:12]} vs {b.size} B {b.digest[:12]})")
    if a.mode != b.mode:
        out.append(f"mode {a.mode:o} vs {b.mode:o}")
    if a.owner != b.owner:
        out.append(f"owner {a.owner[0]}:{a.owner[1]} vs {b.owner[0]}:{b.owner[1]}")
    if a.link != b.link:
        out.append(f"link {a.link!r} vs {b.link!r}")
    if a.pax != b.pax:
        out.append("pax records (xattrs)")
    if a.mtime != b.mtime:
        out.append(f"time {a.mtime} vs {b.mtime}")
    return out


def _cause(phrases: list[str]) -> str:
    return "+".join(p.split(" ")[0] for p in phrases)


def diff_layer(a: Image, b: Image, index: int, limit: int) -> list[str]:
    """Report lines for one differing layer: each differing path and a tally by cause."""
    ea, eb = layer_entries(a, index), layer_entries(b, index)
    found = []
    for path in sorted(ea.keys() | eb.keys()):
        if path not in eb:
            what = ["only in A"]
        elif path not in ea:
            what = ["only in B"]
        else:
            what = entry_differences(ea[path], eb[path])
            if not what:
                continue
        found.append((path, what))
    causes = Counter(_cause(what) for _, what in found)
    # Paths that differ in more than their time first: they are the rarer, telling ones.
    found.sort(key=lambda item: _cause(item[1]) == "time")
    lines = [f"    /{path.lstrip('/')}: {'; '.join(what)}" for path, what in found[:limit]]
    n = len(found)
    if n == 0:  # same members, different bytes: member order or tar headers
        order = "member order" if list(ea) != list(eb) else "tar headers only"
        return [f"    no file differs: {order}"]
    if n > limit:
        lines.append(f"    ... {n - limit} more")
    tally = ", ".join(f"{cause}: {count}" for cause, count in causes.most_common())
    verb = "path differs" if n == 1 else "paths differ"
    return [f"    {n} {verb} ({tally})", *lines]


def config_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Keys of the two configs (less rootfs) whose values differ."""
    out = []
    for key in sorted(a.keys() | b.keys()):
        if not prefix and key == "rootfs":
            continue
        va, vb = a.get(key), b.get(key)
        name = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, name + ".")
        elif isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            for i, (x, y) in enumerate(zip(va, vb, strict=True)):
                if isinstance(x, dict) and isinstance(y, dict):
                    out += config_differences(x, y, f"{name}[{i}].")
                elif x != y:
                    out.append(f"{name}[{i}]: {x!r} vs {y!r}")
        elif va != vb:
            out.append(f"{name}: {va!r} vs {vb!r}")
    return out


def report(a: Image, b: Image, limit: int) -> tuple[bool, list[str]]:
    same = a.image_id == b.image_id
    lines = [
        f"A {a.path}: image {a.image_id}",
        f"B {b.path}: image {b.image_id}",
        f"image IDs: {'the same' if same else 'DIFFER'}",
    ]
    n = max(len(a.layers), len(b.layers))
    for i in range(n):
        la = a.layers[i] if i < len(a.layers) else "(none)"
        lb = b.layers[i] if i < len(b.layers) else "(none)"
        hist = _layer_command(a.config, i)
        if la == lb:
            lines.append(f"layer {i + 1:2d} same    {la}  {hist}")
            continue
        lines.append(f"layer {i + 1:2d} DIFFERS A {la}  {hist}")
        lines.append(f"{'':17s}B {lb}")
        if i < len(a.layers) and i < len(b.layers):
            lines += diff_layer(a, b, i, limit)
    conf = config_differences(a.config, b.config)
    lines.append("config: " + ("the same apart from the layers" if not conf else "differs in"))
    lines += [f"    {c}" for c in conf[:limit]]
    return same, lines


def _layer_command(config: dict, index: int) -> str:
    """The history entry that made layer `index` (empty-layer entries skipped), short."""
    made = [h for h in config.get("history", []) if not h.get("empty_layer")]
    if index >= len(made):
        return ""
    cmd = " ".join(str(made[index].get("created_by", "")).split())
    return cmd if len(cmd) <= 70 else cmd[:67] + "..."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--limit", type=int, default=40, help="paths listed per layer")
    args = ap.parse_args(argv)
    try:
        same, lines = report(open_image(args.a), open_image(args.b), args.limit)
    except ArchiveError as exc:
        print(f"image-diff: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
