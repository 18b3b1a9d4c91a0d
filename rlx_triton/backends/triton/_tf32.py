"""Splitting fp32 values into two TF32 halves, in kernels and on the host, for true-fp32 dots on TF32
tensor cores ("tf32x3": lo*hi' + hi*lo' + hi*hi', each product of two TF32 numbers exact in fp32, `dot_split3`).

`tf32_split` (in a kernel) and `split_tf32` (on the host, for weights split once per weight version) do the
same arithmetic: hi keeps the sign, the exponent and TF32's 10 mantissa bits (the low 13 bits cleared), lo
is the rest truncated the same way, so x = hi + lo to within 2^-20 |x|. The rest is x - hi except where hi
is x (one select): an infinity is its own hi, so its lo is 0 and it multiplies through as infinity, never
as inf - inf. A NaN's hi is a NaN (or an infinity, for a NaN whose payload is all in the low 13 bits) and
its rest and lo are NaN, so a product-sum of the halves is NaN, as the fp32 product is. Finite values and
infinities split bit for bit the same in both; NaNs are NaN in both (their payloads follow the hardware).
The interpreter runs the same splitting, so its dots see the operands a GPU's do.
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

TF32_MASK = tl.constexpr(0xFFFFE000)   # sign, exponent and TF32's 10 mantissa bits of an fp32
_HOST_TF32_MASK = -8192                 # the same bits as an int32 (0xFFFFE000)


@triton.jit
def tf32_split(x, KEEP_INF: tl.constexpr = True):
    """(hi, lo), both exactly representable in TF32, x = hi + lo to about 2^-20 |x|; an infinity's lo is 0,
    a NaN's lo is NaN. KEEP_INF=False drops the select that keeps an infinity's lo 0 (its lo is then NaN), for
    tiles whose non-finite values are not carried through (the trunk's Winograd tiles are recomputed)."""
    hi = (x.to(tl.uint32, bitcast=True) & TF32_MASK).to(tl.float32, bitcast=True)
    rest = tl.where(hi == x, 0.0, x - hi) if KEEP_INF else x - hi
    lo = (rest.to(tl.uint32, bitcast=True) & TF32_MASK).to(tl.float32, bitcast=True)
    return hi, lo


@triton.jit
def dot_split3(a_hi, a_lo, b_hi, b_lo, acc):
    """acc + A @ B in true fp32 on TF32 tensor cores, from both operands' TF32 halves: three TF32 dots, small
    terms first (a_lo b_hi, a_hi b_lo, a_hi b_hi). The fourth product, a_lo b_lo, is below fp32's rounding of the
    sum (both lows are under 2^-10 of their values) and is not computed. Every product of two TF32 numbers is
    exact in fp32, so the CPU interpreter, whose dots are fp32 whatever the precision, reproduces a GPU's
    rounding up to summation order."""
    acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
    acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


def split_tf32(tensor: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The host twin of tf32_split: (hi, lo) float32 tensors of `tensor` (detached, as float32)."""
    x = tensor.detach().float()
    hi = (x.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32)
    rest = torch.where(hi == x, 0.0, x - hi)
    lo = (rest.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32)
    return hi, lo
