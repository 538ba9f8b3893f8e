"""Ranges of the options we render, checked before anything starts.

vLLM's parser checks only types: `--port 70000`, `--tensor-parallel-size 0` or
`--gpu-memory-utilization 1.5` parse, and fail 25 s later inside vLLM (or never).
The bounds come from two places:
- vLLM's own: its config dataclasses declare them (`Field(ge=1)`, `Field(gt=0, le=1)`),
  and vLLM names each argparse group after the config class its options belong to,
  so the group title finds the class and the option's dest finds the field;
- OURS, below, for options vLLM leaves unbounded on the command line.

Non-finite numbers (`inf`, `nan`) are refused for every float option we render.
JSON shapes are checked where the JSON is parsed (`vllm_options.json_shapes`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from entrypoint.argv.mapping import env_name_for
from entrypoint.argv.vllm_options import OptionTable


@dataclass(frozen=True)
class Bound:
    low: float | None = None
    low_open: bool = False  # True: value > low; False: value >= low
    high: float | None = None
    high_open: bool = False
    why: str = ""
    excluded: tuple[float, ...] = ()  # values inside the range that are still refused

    def words(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        parts.extend(f"not {value:g}" for value in self.excluded)
        return " and ".join(parts)

    def admits(self, value: float) -> bool:
        if value in self.excluded:
            return False
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def merged(self, other: Bound) -> Bound:
        """The tighter of both bounds on each side."""
        low, low_open = self.low, self.low_open
        if other.low is not None and (low is None or other.low > low):
            low, low_open = other.low, other.low_open
        high, high_open = self.high, self.high_open
        if other.high is not None and (high is None or other.high < high):
            high, high_open = other.high, other.high_open
        excluded = tuple(sorted({*self.excluded, *other.excluded}))
        return Bound(low, low_open, high, high_open, self.why or other.why, excluded)


# A GPU count no deployment reaches; past it a value is a typo (10**20 overflows later).
_MAX_RANKS = 4096.0

# dest -> bound, where vLLM's CLI accepts values its engine cannot use.
OURS: dict[str, Bound] = {
    "port": Bound(1, high=65535, why="0 makes vLLM pick a random port the watcher cannot find"),
    "tensor_parallel_size": Bound(1, high=_MAX_RANKS),
    "pipeline_parallel_size": Bound(1, high=_MAX_RANKS),
    "data_parallel_size": Bound(1, high=_MAX_RANKS),
    "max_num_seqs": Bound(1),
    "max_num_batched_tokens": Bound(1),
    # vLLM declares >= -1, then refuses 0 once its engine config is built.
    "max_model_len": Bound(-1, excluded=(0,), why="-1 fits the longest context the KV "
                           "cache holds; 0 is no length"),
    "data_parallel_rpc_port": Bound(1, high=65535),
    "data_parallel_supervisor_port": Bound(1, high=65535),
}


def _bound_of_metadata(metadata: list[Any]) -> Bound | None:
    """A Bound from pydantic/annotated_types Gt/Ge/Lt/Le objects, None without any."""
    bound, found = Bound(), False
    for item in metadata:
        for attr, side in (("gt", "low_open"), ("ge", "low"), ("lt", "high_open"), ("le", "high")):
            value = getattr(item, attr, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found = True
                if side in ("low", "low_open"):
                    bound = bound.merged(Bound(float(value), side == "low_open"))
                else:
                    bound = bound.merged(Bound(high=float(value), high_open=side == "high_open"))
    return bound if found else None


def vllm_bounds(parser: argparse.ArgumentParser) -> dict[str, Bound]:
    """dest -> the bound vLLM's config dataclass declares for it."""
    import vllm.config as config_module

    bounds: dict[str, Bound] = {}
    for group in parser._action_groups:  # argparse keeps groups only here
        cls = getattr(config_module, group.title or "", None)
        fields = getattr(cls, "__pydantic_fields__", None)
        if not isinstance(fields, dict):
            continue
        for action in group._group_actions:
            info = fields.get(action.dest)
            bound = _bound_of_metadata(list(getattr(info, "metadata", None) or []))
            if bound is not None:
                bounds[action.dest] = bound
    return bounds


def all_bounds(parser: argparse.ArgumentParser) -> dict[str, Bound]:
    bounds = vllm_bounds(parser)
    for dest, bound in OURS.items():
        bounds[dest] = bounds[dest].merged(bound) if dest in bounds else bound
    return bounds


def check_namespace(
    namespace: argparse.Namespace,
    options: list[str],
    table: OptionTable,
    bounds: dict[str, Bound],
) -> list[str]:
    """Problems with the values vLLM read for the options we rendered (not its defaults)."""
    problems: list[str] = []
    seen: set[str] = set()
    for option, action in table.given(options):
        if action.dest in seen:
            continue
        seen.add(action.dest)
        value = getattr(namespace, action.dest, None)
        name = env_name_for(option)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, float) and not math.isfinite(item):
                problems.append(f"{name}: {option} must be a finite number, got {item}")
                break
            bound = bounds.get(action.dest)
            if (
                bound is not None
                and isinstance(item, int | float)
                and not isinstance(item, bool)
                and not bound.admits(item)
            ):
                why = f" ({bound.why})" if bound.why else ""
                problems.append(f"{name}={item!r}: {option} must be {bound.words()}{why}")
                break
    return problems


def combination_problems(namespace: argparse.Namespace) -> list[str]:
    """Options that each pass but that vLLM 0.32 cannot run together.

    Speculative decoding under pipeline parallelism, measured on the CPU twin of
    profiles/glm5-2node.env (docs/internals.md, "Multi-node"): the V1 model runner
    fails at start on every stage but the last (it builds the drafter there only, then
    asks every stage for it), and the V2 runner, vLLM's default on GPUs, fails its first
    request that carries drafts. Refused here instead of after a model load."""
    spec = getattr(namespace, "speculative_config", None)
    stages = getattr(namespace, "pipeline_parallel_size", 1) or 1
    if not spec or stages <= 1:
        return []
    method = spec.get("method", "?") if isinstance(spec, dict) else "?"
    return [
        f"SERVE_SPECULATIVE_CONFIG (method {method}) with SERVE_PIPELINE_PARALLEL_SIZE="
        f"{stages}: vLLM 0.32 cannot run speculative decoding under pipeline parallelism "
        "(the V1 model runner fails at start, the V2 runner at the first drafted step); "
        "leave SERVE_SPECULATIVE_CONFIG empty, or split the model with "
        "SERVE_TENSOR_PARALLEL_SIZE only"
    ]
