"""`doctor` rows about the machine: GPUs, driver, shared memory, locked memory, disk."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from entrypoint.doctor.context import CPU_BUILD, FAIL, NOT_RENDERED, OK, SKIP, WARN, Context
from entrypoint.doctor.context import Verdict as V
from entrypoint.errors import ConfigError
from entrypoint.host import gpus, hostinfo
from entrypoint.host.cachedir import frontier_cache

GIB = 2**30
SHM_MIN = 1 * GIB  # below this NCCL's shared-memory transport fails between ranks
DISK_FAIL = 2 * GIB  # JIT kernels, compile caches and config files no longer fit
DISK_WARN = 10 * GIB
VLLM_MIN_CAPABILITY = (7, 0)  # vLLM's own floor for CUDA GPUs
QUANTIZED_KV = ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")


def size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _capability_note(ctx: Context, caps: set[tuple[int, int]]) -> tuple[str, str]:
    """(status, what the compute capability means for attention)."""
    low = min(caps)
    shown = ", ".join(f"{a}.{b}" for a, b in sorted(caps))
    if low < VLLM_MIN_CAPABILITY:
        return FAIL, f"compute capability {shown}: vLLM needs 7.0 or newer"
    if len(caps) > 1:
        return WARN, f"mixed compute capabilities {shown}: one model runs on one kind of GPU"
    if low[0] == 12:
        kv = getattr(ctx.rendered.namespace, "kv_cache_dtype", "auto") if ctx.rendered else "auto"
        if kv in QUANTIZED_KV:
            return OK, (f"compute capability {shown}: with --kv-cache-dtype {kv} sparse MLA "
                        "stays on FLASHINFER_MLA_SPARSE_SM120 (TRITON_MLA_SPARSE takes a "
                        "bf16/fp16 cache)")  # fmt: skip
        return OK, f"compute capability {shown}: sparse MLA (GLM-5) runs on TRITON_MLA_SPARSE"
    return OK, f"compute capability {shown}: vLLM's own attention backend order"


def gpus_row(ctx: Context) -> V:
    if not ctx.cuda_build:
        return V("gpus", SKIP, CPU_BUILD)
    view = gpus.gpu_view(dict(ctx.env))
    if view.count == 0:
        return V("gpus", FAIL, "; ".join(gpus.no_gpu_problems(view.detail, ctx.env)))
    info, why = ctx.driver()
    if info is None or not info.gpus:
        return V("gpus", WARN, f"{view.count} visible ({view.detail}); compute capability "
                               f"unknown: {why}")  # fmt: skip
    kinds = Counter((g.name, g.capability) for g in info.gpus)
    models = ", ".join(f"{n} × {name} ({a}.{b})" for (name, (a, b)), n in kinds.items())
    status, note = _capability_note(ctx, {g.capability for g in info.gpus})
    return V("gpus", status, f"{view.count} visible ({view.detail}): {models}; {note}")


def cuda_driver_row(ctx: Context) -> V:
    if not ctx.cuda_build:
        return V("cuda driver", SKIP, CPU_BUILD)
    image, source = hostinfo.image_cuda()
    if image is None:
        return V("cuda driver", FAIL, f"vLLM is the CUDA build, but the image's torch has no "
                                      f"CUDA ({source})")  # fmt: skip
    info, why = ctx.driver()
    if info is None:
        return V("cuda driver", SKIP, f"no driver to ask: {why}")
    need = f"{image[0]}.{image[1]}"
    if info.cuda is None:
        return V("cuda driver", WARN, f"driver {info.version} does not say which CUDA it runs; "
                                      f"the image needs CUDA {need} ({source})")  # fmt: skip
    has = f"{info.cuda[0]}.{info.cuda[1]}"
    said = f"driver {info.version} runs CUDA up to {has}; the image is built for {need} ({source})"
    if info.cuda[0] < image[0]:
        return V("cuda driver", FAIL, f"{said}: install an NVIDIA driver for CUDA {need} or "
                                      "newer on the host")  # fmt: skip
    if info.cuda < image:
        why = "runs by minor-version compatibility, but PTX built at run time may need more"
        return V("cuda driver", WARN, f"{said}: {why}")
    return V("cuda driver", OK, said)


def gpu_count_row(ctx: Context) -> V:
    if not ctx.cuda_build:
        return V("gpu count", SKIP, CPU_BUILD)
    if ctx.rendered is None:
        return V("gpu count", SKIP, ctx.render_skipped or NOT_RENDERED)
    needed, product = gpus.gpus_needed(ctx.rendered.namespace)
    try:
        gpus.require_enough_gpus(ctx.rendered.namespace, dict(ctx.env))
    except ConfigError as exc:
        return V("gpu count", FAIL, "; ".join(exc.problems))
    visible = gpus.gpu_view(dict(ctx.env)).count
    return V("gpu count", OK, f"{product} needs {needed}; {visible} visible")


def shm_row(ctx: Context) -> V:
    ranks = ctx.ranks()
    users = f"NCCL between {ranks} GPU ranks" if ranks > 1 else "vLLM's shared-memory queues"
    fix = ("docker run --ipc=host (or --shm-size=16g), compose `ipc: host` or `shm_size`, "
           "Kubernetes an emptyDir {medium: Memory} mounted at /dev/shm")  # fmt: skip
    found = hostinfo.shm_bytes()
    blocker = FAIL if ranks > 1 else WARN
    if found is None:
        return V("/dev/shm", blocker, f"{hostinfo.SHM} is missing; {users} need it: {fix}")
    if found < SHM_MIN:
        return V("/dev/shm", blocker, f"{size(found)}, less than the {size(SHM_MIN)} {users} "
                                      f"need: {fix}")  # fmt: skip
    return V("/dev/shm", OK, f"{size(found)} for {users}")


def memlock_row(ctx: Context) -> V:
    if not ctx.cuda_build:
        return V("ulimit -l", SKIP, CPU_BUILD)
    limit = hostinfo.memlock_limit()
    if limit is None:
        return V("ulimit -l", OK, "unlimited (NCCL and CUDA pin host memory)")
    return V("ulimit -l", WARN, f"{size(limit)} of locked memory: NCCL and CUDA pin host "
             "memory; `docker run --ulimit memlock=-1`, compose `ulimits: {memlock: -1}` (the "
             "GPU services set it)")  # fmt: skip


def cache_folders(env: dict[str, str]) -> list[tuple[str, Path]]:
    """The caches a start writes to, each where its own library puts it."""
    home = Path.home()
    try:
        from huggingface_hub import constants

        hf = Path(constants.HF_HUB_CACHE)
    except ImportError:
        hf = Path(env.get("HF_HOME") or home / ".cache" / "huggingface") / "hub"
    try:
        import vllm.envs

        vllm_cache = Path(env.get("VLLM_CACHE_ROOT") or vllm.envs.VLLM_CACHE_ROOT)
    except ImportError:
        vllm_cache = Path(env.get("VLLM_CACHE_ROOT") or home / ".cache" / "vllm")
    triton_home = Path(env.get("TRITON_HOME") or home)
    triton = Path(env.get("TRITON_CACHE_DIR") or triton_home / ".triton" / "cache")
    return [("HF cache", hf), ("vLLM cache", vllm_cache), ("Triton cache", triton),
            ("frontier-serve cache", frontier_cache())]  # fmt: skip


def disk_row(ctx: Context) -> V:
    """Free space where the caches live, one clause per filesystem."""
    by_device: dict[int, tuple[list[str], hostinfo.Space]] = {}
    unwritable: list[str] = []
    for label, path in cache_folders(dict(ctx.env)):
        space = hostinfo.space_for(path)
        by_device.setdefault(space.device, ([], space))[0].append(f"{label} {path}")
        if not space.writable:
            unwritable.append(f"{label} ({space.where} is not writable)")
    clauses = [f"{size(space.free)} free for {', '.join(labels)}"
               for labels, space in by_device.values()]  # fmt: skip
    least = min(space.free for _, space in by_device.values())
    reason = "; ".join(clauses + unwritable)
    if least < DISK_FAIL:
        return V("disk", FAIL, f"{reason}: JIT kernels and compile caches need more than "
                               f"{size(DISK_FAIL)}")  # fmt: skip
    if least < DISK_WARN or unwritable:
        return V("disk", WARN, reason)
    return V("disk", OK, reason)


# (row name, check): the name also labels the row when its check raises
HOST_ROWS = (("gpus", gpus_row), ("cuda driver", cuda_driver_row), ("gpu count", gpu_count_row),
             ("/dev/shm", shm_row), ("ulimit -l", memlock_row), ("disk", disk_row))  # fmt: skip
