# SPDX-License-Identifier: Apache-2.0
"""GGUF tensors as zero-copy views of a memory map, with byte-based load progress.

A view reads nothing when it is made. The weight loader that receives it narrows
it to this rank's rows (or experts) and copies that slice into the parameter, so
the pages a rank faults in are the ones it keeps; a tensor that belongs to
another pipeline stage, or to an expert another rank holds, is never touched.
Quantized blocks run along rows, so a row range is one contiguous byte range.

Each file is mapped once per process, private and copy-on-write: views are
writable tensors for torch, and nothing ever writes back to the file.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import os
import queue
import re
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from .gguf_headers import GGML_QUANT_SIZES, GGMLQuantizationType, TensorInfo, read_header

# Under "vllm." so that vLLM's log handler prints it (plugin loggers have none).
logger = logging.getLogger("vllm.gguf_plugin.load")

_PLAIN_DTYPES = {
    "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
}  # fmt: skip
PLAIN_TYPES = frozenset({"F32", "F16", "BF16"})
_MAPS: dict[str, mmap.mmap] = {}
# (first address, length, map, hinted, path) of every live map, for will_read()
# and for gguf_reads, which reads a view's bytes from the file instead
_SPANS: list[tuple[int, int, mmap.mmap, bool, str]] = []
_HINT_CHUNK = 4 << 20
_BLOCK = re.compile(r"^blk\.(\d+)\.")
# A directory that gets one JSON file per rank (the readiness watcher shows them).
PROGRESS_DIR_ENV = "FRONTIER_LOAD_PROGRESS_DIR"


def _mapping(path: str) -> mmap.mmap:
    mapped = _MAPS.get(path)
    if mapped is None or mapped.closed:
        with open(path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        sharded = _sharded()
        if sharded:
            # No fault-driven readahead: every read is asked for by will_read(), so
            # a rank's faults never pull its neighbours' rows (or tensors) in. A
            # lone rank reads everything: the kernel's readahead streams it faster
            # than hints would (measured 4.0 s against 6.1 s for 3 GiB).
            mapped.madvise(mmap.MADV_RANDOM)
        _MAPS[path] = mapped
        base = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        _SPANS.append((base, len(mapped), mapped, sharded, path))
    return mapped


def will_read(weight: torch.Tensor) -> None:
    """Ask the kernel to read the file bytes that *weight* (a view, maybe narrowed)
    covers, in large requests, before the copy that needs them.

    Only for a rank that loads a share (maps of a sharded load are MADV_RANDOM):
    without a hint, faults alone either read the readahead window around each
    fault (8 MiB here, so a rank keeping 1/8 of a tensor's rows read most of it)
    or, with readahead off, one page at a time. A tensor that is not a view of a
    map is left alone; the hint never changes what is read into the tensor.
    """
    if weight.device.type != "cpu" or weight.numel() == 0:
        return
    start = weight.data_ptr()
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(weight.shape, weight.stride(), strict=True))
    end = start + extent * weight.element_size()
    span = _span_of(start)
    if span is None or not span[3]:
        return
    base, size, mapped = span[:3]
    first = (start - base) & ~(mmap.PAGESIZE - 1)
    last = min(end - base, size)
    # The kernel reads at most one readahead window (a few MiB) per call.
    for offset in range(first, last, _HINT_CHUNK):
        mapped.madvise(mmap.MADV_WILLNEED, offset, min(_HINT_CHUNK, last - offset))


def file_location(weight: torch.Tensor) -> tuple[str, int] | None:
    """(file path, byte offset of the view's first element) where *weight* is a
    view of a live GGUF map (maybe narrowed), else None. Maps start at offset 0."""
    if weight.device.type != "cpu" or weight.numel() == 0:
        return None
    span = _span_of(weight.data_ptr())
    return None if span is None else (span[4], weight.data_ptr() - span[0])


def _span_of(address: int) -> tuple[int, int, mmap.mmap, bool, str] | None:
    """The live map's entry of _SPANS that holds *address*, or None."""
    for span in _SPANS:
        base, size, mapped = span[:3]
        if base <= address < base + size and not mapped.closed:
            return span
    return None


def _sharded() -> bool:
    """Whether this process loads a share of the weights (tensor or expert parallel)."""
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_world_size() > 1
    except (ImportError, AssertionError):
        return False


def row_bytes_shape(info: TensorInfo) -> tuple[int, ...]:
    """The stored shape: numpy order, the last dim in bytes for quantized types."""
    if info.type_name in _PLAIN_DTYPES:
        return info.shape
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(info.type_id)]
    return (*info.shape[:-1], info.shape[-1] // block * size)


def tensor_view(info: TensorInfo) -> torch.Tensor:
    """The tensor as stored, a view of the file's map: plain types as numbers,
    quantized types as uint8 rows of blocks. Reads nothing until used."""
    shape = row_bytes_shape(info)
    dtype = _PLAIN_DTYPES.get(info.type_name, torch.uint8)
    if info.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(_mapping(info.path), dtype=dtype,
                            count=info.nbytes // dtype.itemsize, offset=info.offset)
    return flat.view(shape)


def release_maps() -> None:
    """Forget the maps; each closes once the last view of it is gone."""
    _MAPS.clear()
    _SPANS.clear()


def owned_layers(num_layers: int) -> range | None:
    """The decoder layers this pipeline stage builds, or None without pipeline parallelism."""
    try:
        from vllm.distributed import get_pp_group
        from vllm.distributed.utils import get_pp_indices

        group = get_pp_group()
    except (ImportError, AssertionError):
        return None
    if group.world_size <= 1:
        return None
    start, end = get_pp_indices(num_layers, group.rank_in_group, group.world_size)
    return range(start, end)


def other_stage(name: str, num_layers: int, owned: range | None, draft_blocks: bool) -> bool:
    """A `blk.N.` tensor this process's model does not build.

    Decoder layers (N < *num_layers*) outside *owned* belong to another pipeline
    stage. Blocks at or past *num_layers* are the MTP draft's: the main model
    drops them unread (*draft_blocks* False), so they are skipped before any
    dequantization. Non-block tensors are never skipped here.
    """
    match = _BLOCK.match(name)
    if match is None:
        return False
    block = int(match.group(1))
    if block >= num_layers:
        return not draft_blocks
    return owned is not None and block not in owned


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class LoadProgress:
    """Byte-based progress of one rank's pass over a GGUF set.

    Logs a line at every 10% (and at the end) in a fixed form::

        GGUF weights rank 0: 1.20 GiB of 3.04 GiB (39%), 0.91 GiB/s, 2 s left

    and, where FRONTIER_LOAD_PROGRESS_DIR is set, keeps
    ``<dir>/rank-<r>.json`` current (written atomically, at most every WRITE_EVERY
    seconds between the 10% lines): the readiness watcher ends a start whose bytes
    stop moving, so a slow disk's 10% must not look like a stall.
    """

    STEP = 10
    WRITE_EVERY = 2.0

    def __init__(self, total: int, files: int, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.total, self.files, self.done = max(total, 0), files, 0
        self.clock, self.start = clock, clock()
        self.rank, self.pid = _rank(), os.getpid()
        self._next = self.STEP
        self._written = self.start
        folder = os.environ.get(PROGRESS_DIR_ENV)
        self.file = Path(folder) / f"rank-{self.rank}.json" if folder else None
        logger.info("GGUF weights rank %d: loading %s from %d file(s)",
                    self.rank, _gib(self.total), files)
        self._write(finished=False)

    def percent(self) -> int:
        return 100 if not self.total else min(100, self.done * 100 // self.total)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.percent() >= self._next and self.done < self.total:
            self._next = (self.percent() // self.STEP + 1) * self.STEP
            self._report(finished=False)
        elif self.clock() - self._written >= self.WRITE_EVERY:
            self._write(finished=False)

    def finish(self) -> None:
        self.done = self.total
        self._report(finished=True)

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = self.done / elapsed
        left = (self.total - self.done) / rate if rate else float("inf")
        tail = "done" if self.done >= self.total else f"{left:.0f} s left"
        return (f"GGUF weights rank {self.rank}: {_gib(self.done)} of {_gib(self.total)} "
                f"({self.percent()}%), {rate / 2**30:.2f} GiB/s, {tail}")

    def _report(self, finished: bool) -> None:
        logger.info("%s", self.line())
        self._write(finished)

    def _write(self, finished: bool) -> None:
        if self.file is None:
            return
        self._written = self.clock()
        record = {"rank": self.rank, "pid": self.pid, "done_bytes": self.done,
                  "total_bytes": self.total, "percent": self.percent(), "files": self.files,
                  "elapsed_s": round(self.clock() - self.start, 3), "finished": finished,
                  "updated": time.time()}
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.file.parent, prefix=f".rank-{self.rank}.")
            with os.fdopen(fd, "w") as fh:
                json.dump(record, fh)
            os.replace(tmp, self.file)
        except OSError as exc:  # progress is advice; loading goes on
            logger.warning("GGUF load progress file %s: %s", self.file, exc)


def iter_set(paths: Iterable[str], wanted: dict[str, object] | None = None,
             skip=None) -> Iterator[tuple[TensorInfo, torch.Tensor]]:  # type: ignore[no-untyped-def]
    """(info, view) for the tensors of every file, in file order, with progress.

    *wanted*: when given, only tensors named in it. *skip*: a predicate on the
    name for tensors to leave unread. A tensor's bytes count as loaded once the
    consumer asks for the next one (it has copied its slice by then).
    """
    headers = [read_header(p) for p in paths]
    chosen = [[t for t in h.tensors
               if (wanted is None or t.name in wanted) and not (skip and skip(t.name))]
              for h in headers]
    progress = LoadProgress(sum(t.nbytes for ts in chosen for t in ts), len(headers))
    for infos in chosen:
        for info in infos:
            view = tensor_view(info)
            if info.type_name in _PLAIN_DTYPES:
                # Plain tensors go through vLLM's own loaders, which give no hint:
                # read them whole (norms, biases and routers are whole on every
                # rank anyway; GGUF stores large weights quantized).
                will_read(view)
            yield info, view
            progress.advance(info.nbytes)
    progress.finish()


_END = object()


def ahead(items: Iterator, depth: int = 4, name: str = "gguf-ahead") -> Iterator:
    """Run *items* in a thread, up to *depth* items ahead of the consumer.

    The MLA adapter dequantizes and fuses the kv_b halves in its iterator: CPU
    work that would otherwise wait while the loader copies the previous tensor
    from disk (and the disk would wait while it computes). Views are still read
    only by the consumer. An error in the producer is raised in the consumer;
    a consumer that stops early stops the producer.
    """
    box: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((None, item)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            put((exc, None))
            return
        put((None, _END))

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()
    try:
        while True:
            error, item = box.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        worker.join()
