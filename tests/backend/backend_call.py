"""The backend's kernel call, importable on a machine without vLLM.

TRITON_MLA_SPARSE's forward_mqa hands its work to one module-level function of
the backend file, ``sparse_mla_topk_attention``: flat row view of the paged
cache, vLLM's ``triton_convert_req_index_to_global_index``, then the Triton
kernel. The GPU machine has no vLLM, so this module builds that function from
source instead of importing it:

- ``sparse_mla_topk_attention`` itself, verbatim from our backend file;
- ``flat_kv_row_view`` and the remap kernel ``sparse_mla_index_remap_kernel``,
  verbatim from vLLM's sparse_utils.py (the pinned sdist's copy that
  `make kernel-upstream` writes to .work/kernel-upstream/, sha256-checked);
- the remap launcher, which in vLLM runs through its JIT-warmup machinery, is
  re-stated below for the only mode the backend uses (no valid counts, no
  prefill workspace, no DCP): one program per (token, 128 columns), 4 warps;
- ``sparse_mla_fwd`` from the kernel file (tests/kernels/kernel_loader.py).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

REPO = Path(__file__).resolve().parents[2]
BACKEND_FILE = REPO / "patches/vllm/files/vllm/v1/attention/backends/mla/triton_mla_sparse.py"
MODULE_NAME = "frontier_triton_mla_sparse_call"


def find_sparse_utils() -> Path:
    """vLLM's sparse_utils.py as pinned: the extracted copy, sha256-checked
    (tests/backend/pinned_upstream.py; `make kernel-upstream` writes it)."""
    from tests.backend.pinned_upstream import pinned_sparse_utils

    return pinned_sparse_utils()


def _source(tree_src: str, name: str, cls: str | None = None, drop: str = "") -> str:
    """Source of a function (or a method of cls) with its decorators, minus `drop`."""
    body = ast.parse(tree_src).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    lines = tree_src.splitlines()
    decorators = [d for d in node.decorator_list if ast.unparse(d) != drop]
    start = min([d.lineno for d in decorators] + [node.lineno]) - 1
    text = "\n".join(lines[start : node.end_lineno])
    if drop:
        text = "\n".join(ln for ln in text.splitlines() if ln.strip() != f"@{drop}")
    return textwrap.dedent(text)


def load_backend_call(kernel_module: ModuleType, sparse_utils: Path) -> Callable[..., torch.Tensor]:
    """Build ``sparse_mla_topk_attention`` wired to upstream's remap and our kernel."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME].sparse_mla_topk_attention
    utils_src = sparse_utils.read_text()
    parts = [
        "from __future__ import annotations",
        "import torch",
        "import triton",
        "import triton.language as tl",
        _source(utils_src, "flat_kv_row_view"),
        _source(
            utils_src,
            "sparse_mla_index_remap_kernel",
            cls="ConvertReqIndexToGlobalIndexKernel",
            drop="staticmethod",
        ),
        _source(BACKEND_FILE.read_text(), "sparse_mla_topk_attention"),
    ]
    # Triton reads kernel source through inspect, so it must live in a real file.
    path = Path(tempfile.mkdtemp(prefix="frontier-backend-call-")) / f"{MODULE_NAME}.py"
    path.write_text("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = mod
    spec.loader.exec_module(mod)
    mod.sparse_mla_fwd = kernel_module.sparse_mla_fwd
    kernel = mod.sparse_mla_index_remap_kernel

    def triton_convert_req_index_to_global_index(
        req_id: torch.Tensor,
        block_table: torch.Tensor,
        token_indices: torch.Tensor,
        BLOCK_SIZE: int,  # noqa: N803 (vLLM's keyword names)
        BLOCK_STRIDE_ROWS: int,  # noqa: N803
        NUM_TOPK_TOKENS: int,  # noqa: N803
    ) -> torch.Tensor:
        assert req_id.shape[0] == token_indices.shape[0]
        assert token_indices.shape[1] == NUM_TOPK_TOKENS and NUM_TOPK_TOKENS % 128 == 0
        block_table = block_table.contiguous()
        token_indices = token_indices.contiguous()
        out = torch.empty_like(token_indices)
        kernel[(req_id.shape[0], NUM_TOPK_TOKENS // 128)](
            req_id_ptr=req_id.contiguous(),
            block_table_ptr=block_table,
            token_indices_ptr=token_indices,
            out_ptr=out,
            valid_count_ptr=None,
            prefill_request_id_ptr=None,
            workspace_starts_ptr=None,
            workspace_rank_stride=0,
            max_num_blocks_per_req=block_table.shape[1],
            BLOCK_SIZE=BLOCK_SIZE,
            BLOCK_STRIDE_ROWS=BLOCK_STRIDE_ROWS,
            BLOCK_N=128,
            NUM_TOPK_TOKENS=NUM_TOPK_TOKENS,
            HAS_PREFILL=False,
            COUNT_VALID=False,
            SINGLE_TILE=False,
            COMPACT_TO_FRONT=False,
            DCP_SIZE=1,
            DCP_RANK=0,
            DCP_INTERLEAVE=1,
            bt_stride0=block_table.stride(0),
            bt_stride1=block_table.stride(1),
            ti_stride0=token_indices.stride(0),
            ti_stride1=token_indices.stride(1),
            out_stride0=out.stride(0),
            out_stride1=out.stride(1),
            num_warps=4,
        )
        return out

    mod.triton_convert_req_index_to_global_index = triton_convert_req_index_to_global_index
    return mod.sparse_mla_topk_attention
