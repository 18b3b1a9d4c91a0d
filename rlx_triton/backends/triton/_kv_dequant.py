"""How both attention kernels (sdpa_decode/kernels.py and varlen_attention/kernels.py) turn a loaded tile of a
quantised KV cache (fp8 e4m3 / e5m2, int8; KV_QUANT 1 per tensor, 2 per token and head) into a dot operand.

fp8 and int8 values are exact in fp16, bf16 and fp32, so K converts exactly to the query's dtype and its
per-key scales multiply the scores of their columns after the dot, in float32. V's rows are dequantised in
float32 before they are rounded to the operand, as a 16-bit cache would hold them: scaling the probabilities
instead would push p x scale (an e5m2 scale is ~1e-4) into fp16's subnormals. A per-tensor pair is applied
once per program by the kernels themselves: K's in the score scale, V's on the output.

KV_E4M3_BITS: an e4m3 cache handed over as its bytes (CUDA before sm_89 converts no fp8e4nv), decoded by
`e4m3fn_to_f32`.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e4m3fn_to_f32(raw):
    """float8_e4m3fn values, given as their bytes, in float32, exactly: sign, 4 exponent bits (bias 7) and 3
    mantissa bits become float32's fields; exponent 0 is subnormal (m x 2^-9), and exponent 15 with mantissa 7 is
    the format's only NaN (it has no infinity)."""
    bits = raw.to(tl.int32) & 255
    sign = bits >> 7
    exponent = (bits >> 3) & 15
    mantissa = bits & 7
    normal = ((sign << 31) | ((exponent + 120) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    subnormal = mantissa.to(tl.float32) * 0.001953125
    subnormal = tl.where(sign != 0, -subnormal, subnormal)
    value = tl.where(exponent == 0, subnormal, normal)
    return tl.where((exponent == 15) & (mantissa == 7), float("nan"), value)


@triton.jit
def stored_as_operand(tile, like, KV_QUANT: tl.constexpr, KV_E4M3_BITS: tl.constexpr):
    """A loaded tile's stored values, exactly, in `like`'s dtype (a float cache's tile as it is)."""
    if KV_E4M3_BITS:
        tile = e4m3fn_to_f32(tile)
    if KV_QUANT != 0:
        tile = tile.to(like.dtype)
    return tile


@triton.jit
def dequantized_rows(tile, row_scales, like, KV_E4M3_BITS: tl.constexpr):
    """A loaded tile of a per-token-head cache, each row times its scale in float32, then in `like`'s dtype."""
    if KV_E4M3_BITS:
        tile = e4m3fn_to_f32(tile)
    return (tile.to(tl.float32) * row_scales[:, None]).to(like.dtype)
