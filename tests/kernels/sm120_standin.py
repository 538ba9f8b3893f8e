"""The sparse-MLA kernel run on an H100/H200 the way an SM120 part runs it (issue 43).

There is no SM120 (RTX PRO 6000 Blackwell) to test on. What this stand-in keeps of it:

- the instructions: Triton lowers ``tl.dot`` to ``mma.sync`` on 12.x; ``DISABLE_MMA_V3=1``
  makes it do the same here instead of emitting wgmma. It is one of Triton's
  cache-invalidating variables, so the on-disk cache keeps the two kinds of build apart;
  this module is a second instance of the kernel module, so its in-memory caches are
  apart too, and the native module can run beside it in one process;
- the choice: ``sparse_mla_fwd`` sees a 99 KiB, compute-capability-12 part (the small-part
  config table, no Gluon, no clusters), on this machine's own SM count;
- the residency: each split build's shared memory is padded so that this GPU holds no more
  of its programs per SM than SM120's 100 KiB (and 1,536 threads) a SM would.

What it cannot keep: SM120's bandwidth per SM (about 9.5 GB/s against about 23 on an H100),
its clocks, its L2 and its 188 SMs. docs/sm120-features.md says which Hopper features SM120
has; the kernel's small-part path uses none that it lacks (PDL it has).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from triton.runtime.errors import OutOfResources

try:  # on the tests' path (pytest) or as the package (bench)
    from kernel_loader import PUBLIC, forget_package, load_package
except ImportError:
    from tests.kernels.kernel_loader import PUBLIC, forget_package, load_package

PACKAGE = "frontier_triton_sparse_mla_sm120"


SM120_SMEM_PER_BLOCK = 101376  # opt-in maximum a block gets
SM120_SMEM_PER_SM = 102400
SM120_THREADS_PER_SM = 1536
SM120_MAJOR = 12
RESERVED_SMEM_PER_BLOCK = 1024  # what the hardware keeps for each resident block
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def sm120_blocks_per_sm(shared: int, threads: int) -> int:
    """Programs of a build that one SM120 SM holds, by shared memory and threads."""
    by_smem = SM120_SMEM_PER_SM // (shared + RESERVED_SMEM_PER_BLOCK)
    return max(0, min(by_smem, SM120_THREADS_PER_SM // threads))


def padded_shared(shared: int, blocks: int, host_smem_per_sm: int) -> int:
    """The least shared memory >= `shared` a block can ask for so that the host's SM holds
    at most `blocks` of them (it may hold fewer by registers or threads anyway)."""
    if host_smem_per_sm // (shared + RESERVED_SMEM_PER_BLOCK) <= blocks:
        return shared
    return host_smem_per_sm // (blocks + 1) - RESERVED_SMEM_PER_BLOCK + 1


@contextlib.contextmanager
def mma_sync_only() -> Iterator[None]:
    """Compile with DISABLE_MMA_V3=1 (mma.sync, as on SM120) inside this block."""
    old = os.environ.get("DISABLE_MMA_V3")
    os.environ["DISABLE_MMA_V3"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DISABLE_MMA_V3", None)
        else:
            os.environ["DISABLE_MMA_V3"] = old


@functools.lru_cache(maxsize=1)
def _libcuda() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def pad_residency(kernel: object, host_smem_per_sm: int) -> int:
    """Make a compiled split build ask for enough shared memory that this GPU keeps as
    few of its programs per SM as SM120 would. Returns the shared memory a launch asks for.

    Triton launches with the compiled kernel's packed (warps, CTAs, shared) metadata; the
    function's dynamic shared-memory limit is raised to match."""
    meta = kernel.packed_metadata
    if not (isinstance(meta, tuple) and len(meta) == 3):
        raise RuntimeError(f"this Triton's launch metadata is not (warps, ctas, shared): {meta}")
    shared = int(kernel.metadata.shared)
    blocks = sm120_blocks_per_sm(shared, 32 * int(kernel.metadata.num_warps))
    if blocks < 1:  # what Triton raises on SM120 itself, so sparse_mla_fwd falls back alike
        raise OutOfResources(shared, SM120_SMEM_PER_BLOCK, "shared memory")
    pad = padded_shared(shared, blocks, host_smem_per_sm)
    if meta[2] == pad:
        return pad
    if hasattr(kernel, "_init_handles"):
        kernel._init_handles()
    rc = _libcuda().cuFuncSetAttribute(
        ctypes.c_void_p(kernel.function),
        _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        ctypes.c_int(pad),
    )
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared {pad}) failed: CUresult {rc}")
    kernel.packed_metadata = (meta[0], meta[1], pad)
    return pad


class _StandInLaunch:
    """The split kernel as the stand-in launches it: compiled under mma_sync_only, its
    residency padded to SM120's, then launched. Everything else is the JIT function's."""

    def __init__(self, fn: object, host_smem_per_sm: int) -> None:
        self.fn = fn
        self.host_smem_per_sm = host_smem_per_sm

    def __getattr__(self, name: str) -> object:
        return getattr(self.fn, name)

    def __getitem__(self, grid: tuple[int, ...]) -> object:
        def launch(*args: object, **kw: object) -> object:
            with mma_sync_only():
                kernel = self.fn.warmup(*args, grid=grid, **kw)
                pad_residency(kernel, self.host_smem_per_sm)
                return self.fn[grid](*args, **kw)

        return launch


def _install(mod: ModuleType) -> ModuleType:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("the SM120 stand-in times and tests on a CUDA GPU (H100/H200)")
    props = torch.cuda.get_device_properties(0)
    host_smem = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 233472)
    info = mod.DeviceInfo(
        num_sms=props.multi_processor_count, smem_bytes=SM120_SMEM_PER_BLOCK, major=SM120_MAJOR
    )
    mod._device_info = lambda device: info
    mod._sparse_mla_split_kernel = _StandInLaunch(mod._sparse_mla_split_kernel, host_smem)
    if hasattr(mod, "_sparse_mla_split_kernel_sm120"):  # the SM120 Gluon family
        mod._sparse_mla_split_kernel_sm120 = _StandInLaunch(
            mod._sparse_mla_split_kernel_sm120, host_smem
        )
    mod.STANDIN = "sm120"
    return mod


def load_standin() -> ModuleType:
    """A second instance of the kernel modules that runs as SM120 does (see the module doc)."""
    name = f"{PACKAGE}.{PUBLIC}"
    if name in sys.modules:
        return sys.modules[name]
    mod = load_package(PACKAGE)
    try:
        return _install(mod)
    except BaseException:
        forget_package(PACKAGE)
        raise
