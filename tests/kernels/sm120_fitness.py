"""Compile the sparse-MLA kernels for SM120 without an SM120 and read their resources.

Run as a script to print a table (config, registers, shared, stack, local);
tests/kernels/test_sm120_fitness.py asserts on the same numbers. Works on a
CPU-only machine with triton 3.9 and on the GPU machine with triton 3.6.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import triton
from kernel_loader import load_kernel_module
from sm120_standin import SM120_MAJOR, SM120_SMEM_PER_BLOCK
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

SM120 = GPUTarget("cuda", 120, 32)
SM120_SMEM_LIMIT = SM120_SMEM_PER_BLOCK  # 99 KiB, the opt-in maximum a block gets on SM120

# Arguments compiled as pointers, and the ones Triton would specialise as
# multiples of 16 for real tensors (aligned bases, 576-element rows).
_POINTERS = {"q_ptr", "kv_ptr", "idx_ptr", "o_ptr", "lse_ptr", "po_ptr", "plse_ptr"}
_FLOATS = {"qk_scale", "v_scale"}
_DIV16 = _POINTERS | {
    "stride_qt",
    "stride_qh",
    "stride_kvb",
    "stride_kvs",
    "stride_ot",
    "stride_oh",
}


@dataclass(frozen=True)
class Resources:
    name: str
    shared: int
    registers: int
    stack: int
    local: int


def _ptr_type(name: str, dtype: str, kv_dtype: str) -> str:
    return {
        "q_ptr": f"*{dtype}",
        "kv_ptr": f"*{kv_dtype}",
        "idx_ptr": "*i32",
        "o_ptr": f"*{dtype}",
    }.get(name, "*fp32")


def _signature(
    fn: triton.JITFunction, constexprs: dict[str, object], dtype: str, kv_dtype: str
) -> tuple[dict, dict]:
    sig: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list] = {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _POINTERS:
            sig[name] = _ptr_type(name, dtype, kv_dtype)
        elif name in _FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
        if name in _DIV16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def cuobjdump_path() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def _res_usage(cubin: bytes) -> dict[str, int]:
    """REG/STACK/SHARED/LOCAL of the one kernel in a cubin, via `cuobjdump -res-usage`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        text = subprocess.run(
            [str(cuobjdump_path()), "-res-usage", str(path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    if "REG" not in fields:
        raise RuntimeError(f"cuobjdump gave no resource line:\n{text}")
    return {k: int(v) for k, v in fields.items()}


def compile_build(
    fn: triton.JITFunction,
    constexprs: dict[str, object],
    options: dict[str, int],
    kv_dtype: str = "bf16",
    target: GPUTarget = SM120,
    source: type = triton.compiler.ASTSource,
) -> tuple[object, dict[str, int]]:
    """Compile one specialisation (q in bf16) for `target`: the compiled kernel and
    cuobjdump's resource fields. A Gluon kernel needs Gluon's source class (it sets
    the module's warps up front)."""
    sig, attrs = _signature(fn, constexprs, "bf16", kv_dtype)
    src = source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    k = triton.compile(src, target=target, options=options)
    return k, _res_usage(k.asm["cubin"])


def compile_resources(
    fn: triton.JITFunction,
    constexprs: dict[str, object],
    name: str,
    options: dict[str, int],
    kv_dtype: str = "bf16",
    target: GPUTarget = SM120,
    source: type = triton.compiler.ASTSource,
) -> Resources:
    """Compile one specialisation (q in bf16) for `target` and read its resources."""
    k, use = compile_build(fn, constexprs, options, kv_dtype, target, source)
    # metadata.shared is what the launch asks for; cuobjdump's SHARED is the static part.
    shared = max(int(k.metadata.shared), use.get("SHARED", 0))
    return Resources(name, shared, use["REG"], use.get("STACK", 0), use.get("LOCAL", 0))


# (name, kernel: "split", "merge" or "gluon120", constexprs, compile options, kv dtype)
Variant = tuple[str, str, dict[str, object], dict[str, int], str]


def sm120_variants(mod: ModuleType) -> list[Variant]:
    """Every kernel build that sparse_mla_fwd can launch on a 99 KiB part:
    (name, kernel, constexprs, compile options, kv dtype)."""
    out: list[Variant] = []
    pdl_modes: set[bool] = set()
    # 188 SMs: an RTX PRO 6000; 132: the H100/H200 the stand-in (sm120_standin.py) runs on.
    parts = [
        mod.DeviceInfo(num_sms=n, smem_bytes=SM120_SMEM_LIMIT, major=SM120_MAJOR)
        for n in (188, 132)
    ]
    for kv_bytes, kv_dtype in ((2, "bf16"), (1, "fp8e4nv")):
        cfgs = {
            c
            for small in parts
            for t in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256, 512, 1024, 4096)
            for h in (1, 8, 16, 20, 32, 48, 64, 128)
            for c in mod.candidate_configs(t, h, small, kv_bytes)
        }
        # per_sm only steers split-K; builds differ by the other fields.
        builds = {dataclasses.replace(c, per_sm=0): None for c in sorted(cfgs, key=repr)}
        for cfg in builds:
            for direct in (True, False):
                mode = "direct" if direct else "partial"
                if not direct:
                    pdl_modes.add(cfg.pdl)
                if cfg.gluon120:  # the SM120 family (Gluon)
                    ce = mod._sm120_constexprs(cfg, direct, cfg.pdl and not direct)
                    shape = f"h{cfg.block_h} n{cfg.block_n} w{cfg.num_warps}+{cfg.producer_warps}"
                    shape += f" s{cfg.num_stages}" + (" q" if cfg.hold_q else "")
                    shape += f" r{cfg.producer_regs}"
                    name = f"gluon120 {shape} {kv_dtype} {mode}"
                    out.append((name, "gluon120", ce, {"num_warps": cfg.num_warps}, kv_dtype))
                    continue
                ce = {
                    "BLOCK_H": cfg.block_h,
                    "BLOCK_N": cfg.block_n,
                    "DV": mod.D_LATENT,
                    "DR": mod.D_ROPE,
                    "DIRECT": direct,
                    "IDX_AHEAD": cfg.idx_ahead,
                    "USE_PDL": cfg.pdl and not direct,
                    "DOT_F32": False,
                    "PDL_WAIT": cfg.pdl,  # launched as a programmatic dependent
                }
                shape = f"h{cfg.block_h} n{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"
                shape += " ahead" if cfg.idx_ahead else ""
                name = f"split {shape} {kv_dtype} {mode}"
                out.append((name, "split", ce, cfg.launch_options(), kv_dtype))
    # The merge waits on the split grid (USE_PDL) exactly when its split config has pdl.
    for splits in (2, 4, 8, 16, 32, 64, 128, 256):
        block_s, block_d, warps = mod.merge_shape(splits)
        for pdl in sorted(pdl_modes):
            ce = {"BLOCK_S": block_s, "BLOCK_D": block_d, "DV": mod.D_LATENT, "USE_PDL": pdl}
            name = f"merge s{block_s} d{block_d} w{warps}" + (" pdl" if pdl else "")
            out.append((name, "merge", ce, {"num_warps": warps}, "bf16"))
    return out


def sm120_table(mod: ModuleType) -> list[Resources]:
    rows = []
    for name, kernel, ce, options, kv_dtype in sm120_variants(mod):
        if kernel == "gluon120":
            fn, source = mod._sparse_mla_split_kernel_sm120, GluonASTSource
        elif kernel == "merge":
            fn, source = mod._sparse_mla_merge_kernel, triton.compiler.ASTSource
        else:
            fn, source = mod._sparse_mla_split_kernel, triton.compiler.ASTSource
        rows.append(compile_resources(fn, ce, name, options, kv_dtype, source=source))
    return rows


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        # The interpreter swaps in its own tl semantics, which cannot compile.
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
    rows = sm120_table(load_kernel_module())
    if "--json" in sys.argv:
        print(json.dumps([dataclasses.asdict(r) for r in rows]))
        return 0
    print(f"{'SM120 build':44s} {'REG':>4s} {'SHARED':>7s} {'STACK':>5s} {'LOCAL':>5s}")
    bad = 0
    for r in rows:
        flag = ""
        if r.shared > SM120_SMEM_LIMIT or r.local or r.stack:
            flag, bad = "  <-- does not fit", bad + 1
        print(f"{r.name:44s} {r.registers:4d} {r.shared:7d} {r.stack:5d} {r.local:5d}{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
