# SPDX-License-Identifier: Apache-2.0
"""GGML block dequantization in plain torch, for CPU tensors.

The plugin's CUDA and Triton kernels refuse CPU tensors, so on CPU every GGUF
weight goes through `dequantize()` below. Each function takes the raw bytes as
`(n_blocks, type_size)` uint8 and returns `(n_blocks, block_size)` float32. The
arithmetic follows ggml's reference C dequantizers (ggml-quants.c) operation by
operation in float32, so results match llama.cpp and gguf-py bit for bit before
the final cast to the model dtype.

Bit fields wider than a byte are assembled from bytes explicitly (little endian)
in int32/int64, because torch has no general uint16/uint32 arithmetic on CPU.
The only data taken from gguf-py are the published IQ lattice tables
(`grid_hex`); decoding them is done here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

QK_K = 256
# ggml's block_q8_1 is {half d; half s; int8 qs[32]} = 36 bytes; gguf-py's size
# table still says 40 (the old float layout), and the plugin's kernels use 36.
Q8_1_TYPE_SIZE = 36
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 fields (last dim = 2 * count bytes) as float32."""
    return b.contiguous().view(torch.float16).float()


def _u16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint16 fields as int32."""
    b = b.int()
    return b[..., 0::2] | (b[..., 1::2] << 8)


def _u32(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 fields as int64 (no sign trouble with bit 31)."""
    b = b.long()
    return b[..., 0::4] | (b[..., 1::4] << 8) | (b[..., 2::4] << 16) | (b[..., 3::4] << 24)


def _shifts(*values: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32).reshape(shape)


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """ggml nibble order: within each `group` bytes, all low nibbles, then all high."""
    n = qs.shape[0]
    q = qs.int().reshape(n, -1, 1, group) >> _shifts(0, 4, shape=(1, 1, 2, 1))
    return (q & 0x0F).reshape(n, -1)


def _bits(b: torch.Tensor, shape_out: tuple[int, ...]) -> torch.Tensor:
    """Bit j of byte i, for the 8 bits of each byte (LSB first) -> 0/1 int32."""
    q = b.int().unsqueeze(-1) >> torch.arange(8, dtype=torch.int32)
    return (q & 1).reshape(shape_out)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 2:], 16) - 8).float()
    return d * q


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:], 16).float() + m


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    # bit j of the 32-bit qh is the fifth bit of element j
    return ((_u32(qh) >> torch.arange(32, dtype=torch.int64)) & 1).int()


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:], 16) | (_q5_high(b[:, 2:6]) << 4)) - 16
    return d * q.float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:], 16) | (_q5_high(b[:, 4:8]) << 4)
    return d * q.float() + m


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])


def _q8_1(b: torch.Tensor) -> torch.Tensor:
    # s (bytes 2:4) is d * sum(qs), used only by dot products; dequant ignores it
    return b[:, 4:].contiguous().view(torch.int8).float() * _f16(b[:, 0:2])


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 0:16].int()
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    q = (b[:, 16:80].int().reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, shape=(1, 1, 4, 1))) & 3
    return (dl * q.reshape(n, 16, 16).float() - ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, sc, d = b[:, 0:32], b[:, 32:96], b[:, 96:108].int(), _f16(b[:, 108:110])
    low = (sc[:, 0:8].reshape(n, 1, 8) >> _shifts(0, 4, shape=(1, 2, 1))).reshape(n, 16)
    high = (sc[:, 8:12].reshape(n, 1, 4) >> _shifts(0, 2, 4, 6, shape=(1, 4, 1))).reshape(n, 16)
    scales = ((low & 0xF) | ((high & 3) << 4)) - 32
    dl = (d * scales.float()).reshape(n, 16, 1)
    ql = (qs.int().reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, shape=(1, 1, 4, 1))) & 3
    qh = (hmask.int().reshape(n, 1, 1, 32) >> _shifts(*range(8), shape=(1, 1, 8, 1))) & 1
    # a clear hmask bit means "subtract 4"
    q = ql.reshape(n, 16, 16) - ((qh.reshape(n, 16, 16) ^ 1) << 2)
    return (dl * q.float()).reshape(n, QK_K)


def _k_scale_min(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte packed 6-bit scales and mins of Q4_K/Q5_K, 8 of each."""
    s = sc.int().reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scale.float(), mins.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    scale, mins = _k_scale_min(b[:, 4:16])
    dl, ml = (d * scale).reshape(n, 8, 1), (dmin * mins).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    scale, mins = _k_scale_min(b[:, 4:16])
    dl, ml = (d * scale).reshape(n, 8, 1), (dmin * mins).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    qh = (b[:, 16:48].int().reshape(n, 1, 32) >> _shifts(*range(8), shape=(1, 8, 1))) & 1
    q = (ql | (qh << 4)).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    dl = (_f16(b[:, 208:210]) * scales).reshape(n, 16, 1)
    ql = _nibbles(b[:, 0:128], 64).reshape(n, 8, 32)
    qh = (b[:, 128:192].int().reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6, shape=(1, 1, 4, 1))) & 3
    q = (ql | (qh.reshape(n, 8, 32) << 4)) - 32
    return (dl * q.reshape(n, 16, 16).float()).reshape(n, QK_K)


@cache
def _ksigns() -> torch.Tensor:
    # 7 stored sign bits; the 8th makes the count of negative signs even
    i = torch.arange(128, dtype=torch.int32)
    parity = torch.zeros_like(i)
    for bit in range(7):
        parity ^= (i >> bit) & 1
    return i | (parity << 7)


@cache
def _grid(name: str) -> torch.Tensor:
    """Decode one IQ lattice from gguf-py's published hex table to (entries, 8|4) float32."""
    from gguf import quants

    table = getattr(quants, name)
    values = torch.tensor(table.grid_map, dtype=torch.float32)
    bits = max(1, (len(values) - 1).bit_length())
    per_byte = 8 // bits
    hexchars = torch.frombuffer(bytearray(table.grid_hex), dtype=torch.uint8).int()
    nib = torch.where(hexchars > 0x40, hexchars + 9, hexchars) & 0x0F
    packed = (nib[0::2] << 4) | nib[1::2]
    idx = (packed.unsqueeze(-1) >> torch.arange(0, 8, 8 // per_byte, dtype=torch.int32)) & (
        (1 << bits) - 1
    )
    return values[idx.reshape(-1).long()].reshape(table.grid_shape)


def _signs_from_ksigns(codes: torch.Tensor, shape_out: tuple[int, ...]) -> torch.Tensor:
    byte = _ksigns()[codes.long()]
    return 1.0 - 2.0 * _bits(byte, shape_out).float()


def _iq2_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    words = _u32(b[:, 2:66]).reshape(n, 8, 2)
    aux = words[..., 1]
    db = (d * (0.5 + (aux >> 28).float()) * 0.25).reshape(n, 8, 1, 1)
    codes = (aux.unsqueeze(-1) >> torch.tensor([0, 7, 14, 21])) & 0x7F
    signs = _signs_from_ksigns(codes, (n, 8, 4, 8))
    idx = b[:, 2:66].reshape(n, 8, 8)[:, :, 0:4].long()  # grid bytes of the first word
    grid = _grid("IQ2_XXS")[idx]
    return (db * grid * signs).reshape(n, QK_K)


def _iq2_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    qs = _u16(b[:, 2:66])
    sc = (b[:, 66:74].int().reshape(n, 8, 1) >> _shifts(0, 4, shape=(1, 1, 2))) & 0x0F
    db = (d * (0.5 + sc.reshape(n, 16).float()) * 0.25).reshape(n, 16, 1, 1)
    signs = _signs_from_ksigns(qs >> 9, (n, 16, 2, 8))
    grid = _grid("IQ2_XS")[(qs & 511).long()].reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, QK_K)


def _iq2_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    qs, sign_bytes, qh, scb = b[:, 2:34], b[:, 34:66], b[:, 66:74], b[:, 74:82]
    sc = (scb.int().reshape(n, 8, 1) >> _shifts(0, 4, shape=(1, 1, 2))) & 0x0F
    db = (d * (0.5 + sc.reshape(n, 16).float()) * 0.25).reshape(n, 16, 1, 1)
    signs = 1.0 - 2.0 * _bits(sign_bytes, (n, 16, 2, 8)).float()
    high = (qh.int().reshape(n, 8, 1) >> _shifts(0, 2, 4, 6, shape=(1, 1, 4))) & 3
    idx = qs.int() | (high.reshape(n, 32) << 8)
    grid = _grid("IQ2_S")[idx.long()].reshape(n, 16, 2, 8)
    return (db * grid * signs).reshape(n, QK_K)


def _iq3_xxs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    aux = _u32(b[:, 66:98])
    db = (d * (0.5 + (aux >> 28).float()) * 0.5).reshape(n, 8, 1, 1)
    codes = (aux.unsqueeze(-1) >> torch.tensor([0, 7, 14, 21])) & 0x7F
    signs = _signs_from_ksigns(codes, (n, 8, 4, 8))
    grid = _grid("IQ3_XXS")[b[:, 2:66].long()].reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, QK_K)


def _iq3_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    qs, qh, sign_bytes, scb = b[:, 2:66], b[:, 66:74], b[:, 74:106], b[:, 106:110]
    sc = (scb.int().reshape(n, 4, 1) >> _shifts(0, 4, shape=(1, 1, 2))) & 0x0F
    db = (d * (1 + 2 * sc.reshape(n, 8)).float()).reshape(n, 8, 1, 1)
    signs = 1.0 - 2.0 * _bits(sign_bytes, (n, 8, 4, 8)).float()
    idx = qs.int() | (_bits(qh, (n, 64)) << 8)
    grid = _grid("IQ3_S")[idx.long()].reshape(n, 8, 4, 8)
    return (db * grid * signs).reshape(n, QK_K)


def _iq1_s(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    qs, qh = b[:, 2:34], _u16(b[:, 34:50])
    dl = (d * (2 * ((qh >> 12) & 7) + 1).float()).reshape(n, 8, 1, 1)
    delta = torch.where((qh & 0x8000) == 0, 0.125, -0.125).reshape(n, 8, 1, 1)
    high = (qh.unsqueeze(-1) >> _shifts(0, 3, 6, 9, shape=(1, 1, 4))) & 7
    idx = qs.int() | (high.reshape(n, 32) << 8)
    grid = _grid("IQ1_S")[idx.long()].reshape(n, 8, 4, 8)
    return (dl * (grid + delta)).reshape(n, QK_K)


def _iq1_m(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    qs, qh, sc = b[:, 0:32], b[:, 32:48], _u16(b[:, 48:56])
    # the fp16 super-scale is spread over the top nibble of the four scale words
    dbits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00)
    dbits = dbits | (sc[:, 3] & 0xF000)
    dbits = torch.where(dbits >= 0x8000, dbits - 0x10000, dbits)  # reinterpret as int16
    d = dbits.to(torch.int16).view(torch.float16).float().reshape(n, 1)
    s = (sc.unsqueeze(-1) >> _shifts(0, 3, 6, 9, shape=(1, 1, 4))) & 7
    dl = (d * (2 * s.reshape(n, 16) + 1).float()).reshape(n, 8, 2, 1, 1)
    h = qh.int().unsqueeze(-1) >> _shifts(0, 4, shape=(1, 1, 2))
    h = h.reshape(n, 32)
    idx = qs.int() | ((h & 7) << 8)
    delta = torch.where((h & 8) == 0, 0.125, -0.125).reshape(n, 8, 2, 2, 1)
    grid = _grid("IQ1_M")[idx.long()].reshape(n, 8, 2, 2, 8)
    return (dl * (grid + delta)).reshape(n, QK_K)


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    values = torch.tensor(IQ4_NL_VALUES, dtype=torch.float32)
    return _f16(b[:, 0:2]) * values[_nibbles(b[:, 2:], 16).long()]


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _f16(b[:, 0:2])
    high = (_u16(b[:, 2:4]) >> (2 * torch.arange(8, dtype=torch.int32))) & 3
    low = ((b[:, 4:8].int().reshape(n, 4, 1) >> _shifts(0, 4, shape=(1, 1, 2))) & 0xF).reshape(n, 8)
    dl = (d * ((low | (high << 4)) - 32).float()).reshape(n, 8, 1)
    values = torch.tensor(IQ4_NL_VALUES, dtype=torch.float32)
    q = values[_nibbles(b[:, 8:], 16).long()].reshape(n, 8, 32)
    return (dl * q).reshape(n, QK_K)


_KERNELS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1,
    T.Q8_0: _q8_0, T.Q8_1: _q8_1,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
    T.IQ1_S: _iq1_s, T.IQ1_M: _iq1_m, T.IQ2_XXS: _iq2_xxs, T.IQ2_XS: _iq2_xs,
    T.IQ2_S: _iq2_s, T.IQ3_XXS: _iq3_xxs, T.IQ3_S: _iq3_s,
    T.IQ4_NL: _iq4_nl, T.IQ4_XS: _iq4_xs,
}  # fmt: skip
SUPPORTED_TYPES = frozenset(_KERNELS) | {T.F32, T.F16, T.BF16}


def block_sizes(quant_type: int) -> tuple[int, int]:
    """(elements, bytes) of one block."""
    if quant_type == T.Q8_1:
        return 32, Q8_1_TYPE_SIZE
    return GGML_QUANT_SIZES[T(quant_type)]


# Rows of output per chunk: bounds the float32 temporaries of one call (~64 MiB).
_CHUNK_ELEMENTS = 1 << 24


def dequantize(
    W: torch.Tensor, quant_type: int, m: int, n: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Dequantize the GGML bytes in `W` (in order) to an `(m, n)` tensor of `dtype`.

    Same contract as the plugin's `ops.ggml_dequantize`: the `m * n` values of the
    blocks in `W`, row-major; `dtype` None means float16.
    """
    dtype = dtype or torch.float16
    qt = int(quant_type)
    if qt in (T.F32, T.F16, T.BF16):
        return W.reshape(m, n).to(dtype)
    kernel = _KERNELS.get(qt)
    if kernel is None:
        raise NotImplementedError(f"no CPU dequantization for GGML type {T(qt).name}")
    block, size = block_sizes(qt)
    raw = W.reshape(-1)
    if raw.dtype != torch.uint8:
        raw = raw.view(torch.uint8)
    n_blocks = m * n // block
    if raw.numel() != n_blocks * size or m * n % block:
        raise ValueError(
            f"{T(qt).name}: {raw.numel()} bytes cannot hold {m}x{n} values "
            f"({block} values per {size}-byte block)"
        )
    raw = raw.reshape(n_blocks, size)
    out = torch.empty(n_blocks, block, dtype=dtype)
    step = max(1, _CHUNK_ELEMENTS // block)
    for start in range(0, n_blocks, step):
        out[start : start + step] = kernel(raw[start : start + step])
    return out.reshape(m, n)
