# SPDX-License-Identifier: Apache-2.0
"""Fast GGUF header reading: metadata and tensor infos, never tensor data.

gguf-py's GGUFReader builds numpy views for every field and tensor, which is
slow on large tokenizers and fails obscurely on truncated files. This module
walks the header with ``struct`` over an mmap (only header pages are touched),
finds the parts of a split set, and checks that every tensor lies inside its
file. Large metadata arrays (tokenizer tokens, merges, scores) are skipped on
parse and decoded only on request (``read_array``). A process parses each file
once: ``read_header`` keeps its result per path, size, inode and mtime, so the
name map, the adapter, the unquantized-module list and the tensor iterator
share one parse. It depends on the standard library plus gguf-py's ``constants.py`` so that
the preflight command can load it without importing vLLM, torch or numpy.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType


def _gguf_constants() -> ModuleType:
    """gguf-py's constants module without running gguf/__init__.

    That package import pulls in its vocab helpers (mistral_common, ~2 s);
    constants.py itself is standard-library only.
    """
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("gguf")
    if spec is None or spec.origin is None:
        raise ImportError("gguf (gguf-py) is not installed")
    name = "_gguf_constants_standalone"
    if name not in sys.modules:
        file_spec = importlib.util.spec_from_file_location(
            name, Path(spec.origin).parent / "constants.py"
        )
        assert file_spec is not None and file_spec.loader is not None
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        file_spec.loader.exec_module(module)
    return sys.modules[name]


_C = _gguf_constants()
GGML_QUANT_SIZES, GGMLQuantizationType = _C.GGML_QUANT_SIZES, _C.GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type id -> struct format for fixed-size GGUF scalars
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
            10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# arrays longer than this keep only their length (tokenizer tables)
_KEEP_ARRAY_MAX = 64
_U64 = struct.Struct("<Q")
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class GGUFHeaderError(ValueError):
    """A GGUF file is malformed, truncated or missing; the message names it."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (slowest first); reversed ggml ne
    type_name: str
    type_id: int
    offset: int  # absolute byte offset in the file
    nbytes: int
    path: str


@dataclass
class GGUFHeader:
    """One parsed header. Shared by every caller in the process: do not modify."""

    path: str
    version: int
    fields: dict[str, object] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    # skipped arrays: key -> (element type, count, byte offset of the first element)
    array_spans: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    file_size: int = 0

    @property
    def arch(self) -> str | None:
        value = self.fields.get("general.architecture")
        return value if isinstance(value, str) else None


def tensor_nbytes(type_id: int, shape: tuple[int, ...], name: str, path: str) -> int:
    try:
        qtype = GGMLQuantizationType(type_id)
        block, size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as exc:
        raise GGUFHeaderError(f"{path}: tensor {name} has unknown type {type_id}") from exc
    n = 1
    for dim in shape:
        n *= dim
    row = shape[-1] if shape else 1
    if row % block:
        raise GGUFHeaderError(
            f"{path}: tensor {name} row length {row} is not a multiple of the "
            f"{qtype.name} block size {block}"
        )
    return n // block * size


class _Cursor:
    def __init__(self, buf: mmap.mmap, path: str) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> int | float | bool:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise GGUFHeaderError(f"{self.path}: header ends early (truncated file?)")
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = int(self.take("Q"))
        if self.pos + n > len(self.buf):
            raise GGUFHeaderError(f"{self.path}: header ends early (truncated file?)")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def _skip_strings(self, count: int) -> None:
        unpack, buf, pos, end = _U64.unpack_from, self.buf, self.pos, len(self.buf)
        for _ in range(count):
            if pos + 8 > end:
                break
            pos += 8 + unpack(buf, pos)[0]
        else:
            if pos <= end:
                self.pos = pos
                return
        raise GGUFHeaderError(f"{self.path}: header ends early (truncated file?)")

    def value(self, vtype: int, key: str, hdr: GGUFHeader) -> object:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise GGUFHeaderError(f"{self.path}: key {key} has unknown type {vtype}")
        etype, count = int(self.take("I")), int(self.take("Q"))
        hdr.array_lengths[key] = count
        if count > _KEEP_ARRAY_MAX and etype in (*_SCALARS, _STRING):
            hdr.array_spans[key] = (etype, count, self.pos)
        if count > _KEEP_ARRAY_MAX and etype in _SCALARS:
            self.pos += struct.calcsize("<" + _SCALARS[etype]) * count
            return None
        if count > _KEEP_ARRAY_MAX and etype == _STRING:
            self._skip_strings(count)  # tokenizer tables: lengths only, no decoding
            return None
        items = [self.value(etype, key, hdr) for _ in range(count)]
        return items if count <= _KEEP_ARRAY_MAX else None


# (path, device, inode, size, mtime_ns) -> parsed header; a rewritten file parses again
_PARSED: dict[tuple[str, int, int, int, int], GGUFHeader] = {}


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Parse one GGUF file's header (once per process); raise GGUFHeaderError naming it."""
    path = str(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below, mmap outlives `with`
    except OSError as exc:
        raise GGUFHeaderError(f"{path}: cannot open ({exc.strerror})") from exc
    with fh:
        st = os.fstat(fh.fileno())
        key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = _PARSED.get(key)
        if cached is not None:
            return cached
        size = st.st_size
        if size < 24:
            raise GGUFHeaderError(f"{path}: too short to be a GGUF file ({size} bytes)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            header = _parse(buf, path, size)
    _PARSED[key] = header
    return header


def read_array(header: GGUFHeader, key: str) -> list[object]:
    """A metadata array the parse skipped (or kept), decoded from the file now."""
    if key not in header.array_spans:
        value = header.fields.get(key)
        if isinstance(value, list):
            return value
        raise KeyError(f"{header.path}: no array {key}")
    etype, count, pos = header.array_spans[key]
    with open(header.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if etype in _SCALARS:
            fmt = "<%d%s" % (count, _SCALARS[etype])  # noqa: UP031 - struct format
            if pos + struct.calcsize(fmt) > len(buf):
                raise GGUFHeaderError(f"{header.path}: header ends early (truncated file?)")
            return list(struct.unpack_from(fmt, buf, pos))
        cur = _Cursor(buf, header.path)
        cur.pos = pos
        return [cur.string() for _ in range(count)]


def _parse(buf: mmap.mmap, path: str, size: int) -> GGUFHeader:
    if buf[:4] != MAGIC:
        raise GGUFHeaderError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
    cur = _Cursor(buf, path)
    cur.pos = 4
    version = int(cur.take("I"))
    if version not in (2, 3):
        raise GGUFHeaderError(f"{path}: unsupported GGUF version {version} "
                              "(big-endian files are not supported)")
    n_tensors, n_kv = int(cur.take("Q")), int(cur.take("Q"))
    hdr = GGUFHeader(path=path, version=version, file_size=size)
    for _ in range(n_kv):
        key = cur.string()
        hdr.fields[key] = cur.value(int(cur.take("I")), key, hdr)
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        ndim = int(cur.take("I"))
        ne = tuple(int(cur.take("Q")) for _ in range(ndim))
        raw.append((name, tuple(reversed(ne)), int(cur.take("I")), int(cur.take("Q"))))
    align = hdr.fields.get("general.alignment", DEFAULT_ALIGNMENT)
    align = int(align) if isinstance(align, int) and align > 0 else DEFAULT_ALIGNMENT
    data_start = -(-cur.pos // align) * align
    for name, shape, type_id, rel in raw:
        nbytes = tensor_nbytes(type_id, shape, name, path)
        start = data_start + rel
        if start + nbytes > size:
            raise GGUFHeaderError(
                f"{path}: tensor {name} ends at byte {start + nbytes} but the file "
                f"has {size} bytes (truncated file?)"
            )
        type_name = GGMLQuantizationType(type_id).name
        hdr.tensors.append(TensorInfo(name, shape, type_name, type_id, start, nbytes, path))
    return hdr


def split_parts(path: str | os.PathLike[str]) -> list[str]:
    """All files of the set that *path* belongs to, in order.

    A plain file is its own set. For ``X-0000k-of-0000N.gguf`` every part must
    exist; a missing one is an error that names it.
    """
    path = str(path)
    match = _SPLIT_RE.search(path)
    if not match:
        if not Path(path).is_file():
            raise GGUFHeaderError(f"{path}: no such GGUF file")
        return [path]
    total = int(match.group(2))
    prefix = path[: match.start()]
    parts = [f"{prefix}-{i:05d}-of-{total:05d}.gguf" for i in range(1, total + 1)]
    missing = [p for p in parts if not Path(p).is_file()]
    if missing:
        raise GGUFHeaderError(
            f"{path}: split set of {total} parts is incomplete; missing: "
            + ", ".join(missing)
        )
    return parts


def read_set(path: str | os.PathLike[str]) -> list[GGUFHeader]:
    """Headers of every part of the set; duplicate tensor names are errors."""
    headers = [read_header(p) for p in split_parts(path)]
    seen: dict[str, str] = {}
    for hdr in headers:
        for t in hdr.tensors:
            if t.name in seen:
                raise GGUFHeaderError(
                    f"{hdr.path}: tensor {t.name} also appears in {seen[t.name]}"
                )
            seen[t.name] = hdr.path
    declared = headers[0].fields.get("split.count")
    if isinstance(declared, int) and declared != len(headers):
        raise GGUFHeaderError(
            f"{headers[0].path}: split.count says {declared} parts, found {len(headers)}"
        )
    return headers
