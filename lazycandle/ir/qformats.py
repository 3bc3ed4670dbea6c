"""GGML's block formats (the quantized weights llama.cpp, candle and GGUF files use): pure data.

Each format stores a row as consecutive blocks of `block` values in `nbytes` bytes (little-endian;
"f16" = IEEE half).  Layouts (offsets in bytes, from ggml-common.h's block_* structs):

  q8_0  block 32, 34 B:  d f16 | qs int8[32]                 x = d * q
  q4_0  block 32, 18 B:  d f16 | qs u8[16] (two nibbles)      x = d * (q - 8); value j in the low
                         nibble of qs[j], value j + 16 in the high nibble
  q4_1  block 32, 20 B:  d f16 | m f16 | qs u8[16]            x = d * q + m
  q5_0  block 32, 22 B:  d f16 | qh u32 | qs u8[16]           x = d * (q - 16), bit 4 of value j
                         is bit j of qh
  q4_k  block 256, 144 B: d f16 | dmin f16 | scales u8[12] | qs u8[128]: 8 sub-blocks of 32 with
                         6-bit scale sc and min m (packed as get_scale_min_k4);
                         x = d * sc * q - dmin * m; qs[32p + l] holds value 64p + l (low nibble)
                         and 64p + 32 + l (high nibble)
  q6_k  block 256, 210 B: ql u8[128] | qh u8[64] | scales int8[16] | d f16: 16 sub-blocks of 16;
                         x = d * sc * (q - 32), q = 4 low bits from ql, 2 high bits from qh

`ggml_type` is the type id GGUF files record (enum ggml_type)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QFormat:
    name: str
    block: int          # values per block
    nbytes: int         # bytes per block
    ggml_type: int
    chunks: int         # 32-value chunks per block (the unit the kernels unpack)


FORMATS = {f.name: f for f in (
    QFormat("q8_0", 32, 34, 8, 1),
    QFormat("q4_0", 32, 18, 2, 1),
    QFormat("q4_1", 32, 20, 3, 1),
    QFormat("q5_0", 32, 22, 6, 1),
    QFormat("q4_k", 256, 144, 12, 8),
    QFormat("q6_k", 256, 210, 14, 8),
)}

BY_GGML_TYPE = {f.ggml_type: f for f in FORMATS.values()}


def row_bytes(fmt: QFormat, n: int) -> int:
    """Bytes of a row of n values (n a multiple of fmt.block)."""
    return n // fmt.block * fmt.nbytes
