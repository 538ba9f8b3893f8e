"""Stand-ins that let vLLM's CUDA-side code import and run on the CPU tier.

Only the child process started by test_vllm_cpu_tier.py uses these: it loads
this module as a pytest plugin (``-p tests.backend.stand_ins``), which enables
the Triton interpreter before any check module imports vLLM; the selection
checks stub the CUDA extensions themselves. The rest of the test session keeps
vllm-cpu exactly as installed.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

# vllm/platforms/cuda.py imports these compiled CUDA extensions at module level;
# vllm-cpu ships none of them. Nothing the checks call needs their symbols.
CUDA_EXTENSIONS = ("vllm._C_stable_libtorch",)


def stub_cuda_extensions() -> list[str]:
    """Register empty modules for CUDA extensions that fail to import."""
    stubbed = []
    for name in CUDA_EXTENSIONS:
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = ModuleType(name)
            stubbed.append(name)
    return stubbed


def enable_triton_interpreter() -> None:
    """Let vLLM's Triton kernels run in Triton's CPU interpreter.

    vllm-cpu swaps Triton for a placeholder unless triton lists a backend named
    "cpu" (triton-cpu). Registering a backend entry whose driver only reports
    itself active makes vllm.triton_utils hand out the real triton; with
    TRITON_INTERPRET=1 every kernel launch is interpreted, so the driver is
    never asked for anything else.
    """
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.backends as tb
    from triton.backends.driver import DriverBase

    class InterpreterOnlyDriver(DriverBase):
        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self) -> None:
            raise RuntimeError("interpreter only")

        def get_active_torch_device(self) -> None:
            raise RuntimeError("interpreter only")

        def get_benchmarker(self) -> None:
            raise RuntimeError("interpreter only")

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise RuntimeError("interpreter only")

    tb.backends.setdefault("cpu", tb.Backend(compiler=None, driver=InterpreterOnlyDriver))  # type: ignore[arg-type]


def pytest_configure(config: object) -> None:
    """Plugin hook: runs before the check modules are imported."""
    if "vllm" in sys.modules:
        raise RuntimeError("the Triton stand-in must be installed before vllm is imported")
    enable_triton_interpreter()
