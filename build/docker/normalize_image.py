"""Rewrite a built image so that two builds of the same inputs get the same image ID.

    python3 build/docker/normalize_image.py IN.tar OUT.tar --epoch SECONDS [--keep-layers N]

IN.tar is `docker save` output (one image); OUT.tar is the same image for `docker load`,
with every time the engine wrote at build time clamped to SOURCE_DATE_EPOCH, past the
first N layers and N history entries that make a layer (the base image's, an input,
kept byte for byte):
- in each layer, a member's mtime later than the epoch becomes the epoch, and its PAX
  atime/ctime/mtime records go (BuildKit 0.8, in Debian's docker.io 20.10, dates the
  directories it makes for a step's mounts, and their parents, at build time);
- the config's `created` and the `created` of every history entry past the base's
  become the epoch;
- the config's diff IDs follow the rewritten layers.
Everything else (content, permissions, owner, links, xattrs, member order) is copied as
read, and `checks/repro/image_diff.py IN.tar OUT.tar` shows times as the only difference.
(The file-type bits that Go's tar writer also puts in a member's mode field are not
written again: tar's type flag carries the type, and Docker reads the mode's low bits.)
A newer BuildKit does this itself (`rewrite-timestamp`); none is reachable here.
Standard library only: build/docker/build-image.sh runs it on the host."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO

_TIME_RECORDS = ("atime", "ctime", "mtime")


class _Hashing:
    """A write-only file that hashes what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.sha = out, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def rewrite_layer(src: IO[bytes], dst: IO[bytes], epoch: int) -> tuple[str, int]:
    """Copy one layer tar with clamped times; returns the new diff ID and how many
    members were clamped."""
    sink = _Hashing(dst)
    clamped = 0
    with tarfile.open(fileobj=src, mode="r|") as layer, \
            tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:  # type: ignore
        for member in layer:
            late = member.mtime > epoch or any(k in member.pax_headers for k in _TIME_RECORDS)
            if late:
                clamped += 1
                member.mtime = min(int(member.mtime), epoch)
                member.pax_headers = {k: v for k, v in member.pax_headers.items()
                                      if k not in _TIME_RECORDS}
            out.addfile(member, layer.extractfile(member) if member.isreg() else None)
    return "sha256:" + sink.sha.hexdigest(), clamped


def _iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def normalize(src: Path, dst: Path, epoch: int, keep_layers: int = 0) -> str:
    """Write the normalized image archive; returns its image ID."""
    with tarfile.open(src) as archive, tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        manifest = json.loads(archive.extractfile("manifest.json").read())  # type: ignore[union-attr]
        if not isinstance(manifest, list) or len(manifest) != 1:
            raise ValueError(f"{src}: expected one image in manifest.json")
        entry = manifest[0]
        config = json.loads(archive.extractfile(entry["Config"]).read())  # type: ignore[union-attr]
        if keep_layers > len(entry["Layers"]):
            raise ValueError(f"{src}: --keep-layers {keep_layers}, but the image has "
                             f"{len(entry['Layers'])} layers")
        layers, diff_ids = [], []
        for n, name in enumerate(entry["Layers"]):
            part = Path(tmp) / f"{n}.tar"
            t0 = time.monotonic()
            with archive.extractfile(name) as raw, part.open("wb") as out:  # type: ignore[union-attr]
                if n < keep_layers:
                    shutil.copyfileobj(raw, out, 1 << 20)
                    diff_id, clamped = config["rootfs"]["diff_ids"][n], 0
                else:
                    diff_id, clamped = rewrite_layer(raw, out, epoch)
            hexid = diff_id.split(":", 1)[1]
            layers.append((f"{hexid}/layer.tar", part))
            diff_ids.append(diff_id)
            print(f"normalize-image: layer {n + 1}/{len(entry['Layers'])}: {clamped} times "
                  f"clamped, {part.stat().st_size / 2**20:.0f} MiB in "
                  f"{time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        config["created"] = _iso(epoch)
        made = 0  # layers made by the history entries so far
        for step in config.get("history", []):
            if made >= keep_layers and "created" in step:
                step["created"] = _iso(epoch)
            made += not step.get("empty_layer", False)
        config.setdefault("rootfs", {})["diff_ids"] = diff_ids
        raw_config = json.dumps(config, separators=(",", ":")).encode()
        image_id = hashlib.sha256(raw_config).hexdigest()
        new_manifest = [{"Config": f"{image_id}.json", "RepoTags": entry.get("RepoTags") or [],
                         "Layers": [name for name, _ in layers]}]
        part = dst.with_name(dst.name + ".part")
        with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as out:
            for name, path in layers:
                info = out.gettarinfo(str(path), arcname=name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
                with path.open("rb") as f:
                    out.addfile(info, f)
            for name, data in ((f"{image_id}.json", raw_config),
                               ("manifest.json", json.dumps(new_manifest).encode())):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), epoch
                out.addfile(info, io.BytesIO(data))
        os.replace(part, dst)
    return "sha256:" + image_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="normalize_image.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src", type=Path, help="docker save output")
    parser.add_argument("dst", type=Path, help="archive to write, for docker load")
    parser.add_argument("--epoch", type=int, required=True, help="SOURCE_DATE_EPOCH")
    parser.add_argument("--keep-layers", type=int, default=0, metavar="N",
                        help="the base image's layer count: its layers are copied as they are")
    args = parser.parse_args(argv)
    if args.epoch < 0:
        parser.error(f"--epoch {args.epoch}: must be 0 or more seconds")
    if args.keep_layers < 0:
        parser.error(f"--keep-layers {args.keep_layers}: must be 0 or more")
    try:
        print(normalize(args.src, args.dst, args.epoch, args.keep_layers))
    except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
        print(f"normalize-image: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
