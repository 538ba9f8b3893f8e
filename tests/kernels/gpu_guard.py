"""pytest hooks for the kernel tiers: GPU tests skip on CPU, never on a GPU.

On a machine without a GPU every `gpu`-marked test is skipped with a reason.
On a machine with one, a `gpu`-marked test that skips anyway (a missing
input, a skipif that fired) is reported as a failure: `make test-kernels`
on a GPU machine must run everything it collects.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest


def gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this is the CPU tier)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    skipped = report.skipped and not hasattr(report, "wasxfail")
    if skipped and "gpu" in item.keywords and gpu_present():
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"gpu-marked test skipped on a machine with a GPU: {reason}"
