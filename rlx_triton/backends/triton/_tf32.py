"""Splitting fp32 values into two TF32 halves, in kernels and on the host, for true-fp32 dots on TF32
tensor cores ("tf32x3": hi*lo' + lo*hi' + hi*hi', each product of two TF32 numbers exact in fp32).

`tf32_split` (in a kernel) and `split_tf32` (on the host, for weights split once per weight version) do the
same arithmetic bit for bit: hi keeps the sign, the exponent and TF32's 10 mantissa bits (the low 13 bits
cleared), lo is the rest truncated the same way, so x = hi + lo to within 2^-20 |x|. A non-finite x is all
in hi (lo = 0): an infinity multiplies through as infinity, never as inf - inf, and a NaN stays a NaN.
The interpreter runs the same splitting, so its dots see the operands a GPU's do.
"""
from __future__ import annotations

import torch
import triton  # type: ignore[import-untyped]  # triton ships no type information
import triton.language as tl  # type: ignore[import-untyped]  # triton ships no type information

TF32_MASK = tl.constexpr(0xFFFFE000)   # sign, exponent and TF32's 10 mantissa bits of an fp32
_HOST_TF32_MASK = -8192                 # the same bits as an int32 (0xFFFFE000)


@triton.jit
def tf32_split(x):
    """(hi, lo), both exactly representable in TF32, x = hi + lo to about 2^-20 |x|; non-finite x in hi."""
    hi = (x.to(tl.uint32, bitcast=True) & TF32_MASK).to(tl.float32, bitcast=True)
    finite = tl.abs(x) < float("inf")
    hi = tl.where(finite, hi, x)
    rest = tl.where(finite, x - hi, 0.0)
    lo = (rest.to(tl.uint32, bitcast=True) & TF32_MASK).to(tl.float32, bitcast=True)
    return hi, lo


def split_tf32(tensor: torch.Tensor):
    """The host twin of tf32_split: (hi, lo) float32 tensors of `tensor` (detached, as float32)."""
    x = tensor.detach().float()
    finite = x.isfinite()
    hi = torch.where(finite, (x.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32), x)
    rest = torch.where(finite, x - hi, 0.0)
    lo = (rest.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32)
    return hi, lo
