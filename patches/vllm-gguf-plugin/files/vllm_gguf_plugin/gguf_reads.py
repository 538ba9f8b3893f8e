# SPDX-License-Identifier: Apache-2.0
"""Copies of GGUF tensor slices that read the file straight into their destination.

A weight loader narrows a map view (gguf_tensors) to its rank's share and copies
it. Copied through the map, every page is faulted in and first touched by torch
(818 MiB/s measured on the synthetic GLM-5 set), and a CUDA destination gets a
pageable, single-buffered copy. copy_into() reads instead:

- a contiguous slice (rows, whole experts, whole tensors): pread() in large
  requests, straight into a CPU destination, or into two pinned staging buffers
  in turn whose H2D copies run on a side stream while the next one is read;
- a strided slice (a rank's columns: its super-blocks of every row): gathered
  from the map, after a WILLNEED hint for its span, into the destination or the
  staging buffer. A row's share is often one 144-byte super-block, too small a
  request for a read() each; the page cache is shared by the host's ranks, so
  storage is read once either way.

FRONTIER_GGUF_READS=mmap copies every slice through the map as before (kept for
comparison: bench/gguf/bench_gguf_load.py times both). `STATS` counts the bytes
this process copied out of the files, by path.
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields

import torch

from .gguf_tensors import file_location, will_read

MODE_ENV = "FRONTIER_GGUF_READS"
MODES = ("pread", "mmap")
READERS_ENV = "FRONTIER_GGUF_READERS"
READERS_MAX = 64  # entrypoint/start/preflight.py refuses the same range before the start
PIECE = 8 << 20  # one pread(); a larger range is read as pieces by the reader threads
STAGE = 32 << 20  # one pinned staging buffer (two per device)


@dataclass
class ReadStats:
    """Bytes copied out of GGUF files by this process, by path."""

    pread: int = 0  # contiguous slices read with pread()
    gathered: int = 0  # strided slices gathered from the map
    mapped: int = 0  # every slice in mmap mode, and a row larger than a staging buffer
    staged: int = 0  # of those, bytes that went through pinned staging to a GPU

    def copied(self) -> int:
        return self.pread + self.gathered + self.mapped

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


STATS = ReadStats()
_FDS: dict[str, int] = {}
_STAGERS: dict[int, _Stager] = {}
_POOL: list[ThreadPoolExecutor] = []


def mode() -> str:
    value = os.environ.get(MODE_ENV, "pread").strip().lower() or "pread"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r}: expected one of {', '.join(MODES)}")
    return value


def reads_files() -> bool:
    """Whether slices are read from the files (the default), not copied through the map."""
    return mode() == "pread"


def _fd(path: str) -> int:
    fd = _FDS.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        _FDS[path] = fd
    return fd


def close_files() -> None:
    """Close the descriptors (after a load; the maps are released separately)."""
    for fd in _FDS.values():
        os.close(fd)
    _FDS.clear()


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory."""
    flat = tensor.reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy()).cast("B")


def readers() -> int:
    """Reader threads: first touch of a fresh destination page costs more than the
    copy, so one thread tops out near 2 GB/s where two reach 3 (2-core VM, warm)."""
    value = os.environ.get(READERS_ENV, "").strip()
    if not value:
        return max(1, min(4, os.cpu_count() or 1))
    if not value.isdigit() or not 1 <= int(value) <= READERS_MAX:
        raise ValueError(
            f"{READERS_ENV}={value!r}: expected a whole number from 1 to {READERS_MAX}"
        )
    return int(value)


def _pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(readers(), thread_name_prefix="gguf-read"))
    return _POOL[0]


def _pread_piece(fd: int, path: str, offset: int, out: memoryview) -> None:
    done, size = 0, len(out)
    while done < size:
        got = os.preadv(fd, [out[done:]], offset + done)
        if got <= 0:
            raise OSError(errno.EIO, f"GGUF file ended early: {path} at byte {offset + done}"
                          f" ({size - done} of {size} bytes left to read)")
        done += got


def _pread_into(path: str, offset: int, out: memoryview) -> None:
    """Fill *out* from *path* at *offset*; pieces run in parallel (pread drops the GIL)."""
    fd = _fd(path)
    if len(out) <= PIECE:
        _pread_piece(fd, path, offset, out)
        return
    pieces = [_pool().submit(_pread_piece, fd, path, offset + start, out[start:start + PIECE])
              for start in range(0, len(out), PIECE)]
    for piece in pieces:
        piece.result()


def copy_into(dest: torch.Tensor, src: torch.Tensor) -> None:
    """dest.copy_(src) for *src* a (narrowed) GGUF map view; anything else is copied as is."""
    where = file_location(src) if src.numel() else None
    nbytes = src.numel() * src.element_size()
    if (where is None or dest.shape != src.shape or dest.dtype != src.dtype
            or mode() == "mmap"):
        if where is not None:
            will_read(src)
            STATS.mapped += nbytes
            if dest.device.type == "cuda":
                STATS.staged += nbytes
        dest.copy_(src)
        return
    path, offset = where
    if dest.device.type == "cuda":
        _stager(dest.device).copy(dest, src, path, offset)
        return
    if src.is_contiguous() and dest.is_contiguous():
        _pread_into(path, offset, _bytes_of(dest))
        STATS.pread += nbytes
        return
    will_read(src)
    dest.copy_(src)
    STATS.gathered += nbytes


def _stager(device: torch.device) -> _Stager:
    index = device.index if device.index is not None else torch.cuda.current_device()
    stager = _STAGERS.get(index)
    if stager is None:
        stager = _STAGERS[index] = _Stager(torch.device("cuda", index))
    return stager


class _Stager:
    """Two pinned buffers per GPU: one is read into while the other's H2D runs."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.buffers = [torch.empty(STAGE, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.done: list[torch.cuda.Event | None] = [None, None]
        self.turn = 0

    def _buffer(self) -> tuple[int, torch.Tensor]:
        index, self.turn = self.turn, self.turn ^ 1
        event = self.done[index]
        if event is not None:
            event.synchronize()  # its last H2D has finished: it may be overwritten
        return index, self.buffers[index]

    def _send(self, index: int, dest: torch.Tensor, staged: torch.Tensor) -> None:
        with torch.cuda.stream(self.stream):
            dest.copy_(staged, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.done[index] = event

    def copy(self, dest: torch.Tensor, src: torch.Tensor, path: str, offset: int) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # dest may reuse memory freed on the current stream
        try:
            if src.is_contiguous() and dest.is_contiguous():
                self._contiguous(dest, path, offset)
            else:
                self._by_rows(dest, src)
        finally:
            current.wait_stream(self.stream)  # whoever uses dest next sees the copy

    def _contiguous(self, dest: torch.Tensor, path: str, offset: int) -> None:
        out = dest.reshape(-1).view(torch.uint8)
        for start in range(0, out.numel(), STAGE):
            size = min(STAGE, out.numel() - start)
            index, buffer = self._buffer()
            _pread_into(path, offset + start, _bytes_of(buffer[:size]))
            self._send(index, out[start:start + size], buffer[:size])
            STATS.pread += size
            STATS.staged += size

    def _by_rows(self, dest: torch.Tensor, src: torch.Tensor) -> None:
        """Chunks along dim 0: each chunk read (contiguous) or gathered, then sent."""
        if src.dim() == 0:
            src, dest = src.reshape(1), dest.reshape(1)
        row = src[0].numel() * src.element_size()
        step = STAGE // max(row, 1)
        if step == 0:  # one row is larger than a buffer: rare, left to torch
            will_read(src)
            dest.copy_(src)
            STATS.mapped += src.numel() * src.element_size()
            return
        will_read(src)
        for first in range(0, src.shape[0], step):
            part = src[first:first + step]
            size = part.numel() * part.element_size()
            index, buffer = self._buffer()
            staged = buffer[:size].view(src.dtype).view(part.shape)
            if part.is_contiguous():
                where = file_location(part)
                assert where is not None
                _pread_into(where[0], where[1], _bytes_of(buffer[:size]))
                STATS.pread += size
            else:
                staged.copy_(part)
                STATS.gathered += size
            self._send(index, dest[first:first + step], staged)
            STATS.staged += size
