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

Two of the three products meet one operand's hi with the other's lo, which is 0 wherever that operand is
a TF32 value (a nonzero weight such as 0.5 or -0.01806640625 as well as 0): an infinite hi times it is NaN
where the fp32 product is infinite. Two ways keep such products the fp32 product's (infinite, NaN where it is
NaN):
- `dot_split3_parts` keeps the main product (hi hi) and the two small ones apart and `split3_sum` adds them
  except where the main sum is already infinite, which it is wherever a small product met an infinity; an
  operand may then be split without the select (KEEP_INF=False: an infinity's lo is NaN, dropped the same
  way). Costs a second accumulator, for one product or a loop with registers to spare.
- `dot_split3_clamped` gives the small products each hi clamped to the finite range, so an infinity meets a
  zero lo as the largest finite value (product 0) and only the main product carries it: one accumulator, two
  clamps per operand element a step; the operands must be split with the select (an infinity's lo 0).
`dot_split3` itself does neither (the conv trunk's outputs that meet an infinity are non-finite, NaN where it
meets a TF32 weight).
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

TF32_MASK = tl.constexpr(0xFFFFE000)   # sign, exponent and TF32's 10 mantissa bits of an fp32
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)
_HOST_TF32_MASK = -8192                 # the same bits as an int32 (0xFFFFE000)


@triton.jit
def tf32_split(x, KEEP_INF: tl.constexpr = True):
    """(hi, lo), both exactly representable in TF32, x = hi + lo to about 2^-20 |x|; an infinity's lo is 0,
    a NaN's lo is NaN. KEEP_INF=False drops the select that keeps an infinity's lo 0 (its lo is then NaN), for
    tiles whose non-finite values are not carried through (the trunk's Winograd tiles are recomputed) and for
    products summed by `split3_sum`."""
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


@triton.jit
def dot_split3_parts(a_hi, a_lo, b_hi, b_lo, main, small):
    """(main + a_hi @ b_hi, small + a_lo @ b_hi + a_hi @ b_lo) on TF32 tensor cores: `dot_split3`'s products in
    two sums, for `split3_sum` (once, after every K step has added to both)."""
    small = tl.dot(a_lo, b_hi, small, input_precision="tf32")
    small = tl.dot(a_hi, b_lo, small, input_precision="tf32")
    return tl.dot(a_hi, b_hi, main, input_precision="tf32"), small


@triton.jit
def split3_sum(main, small):
    """main + small, except where main is infinite: there an infinity met the other operand's lo (0 for a TF32
    value, NaN for an infinity split without the select), and the fp32 product is main (infinite, or NaN where
    infinities of both signs meet, which main is already)."""
    return tl.where(tl.abs(main) == float("inf"), main, main + small)


@triton.jit
def _finite(hi):
    return tl.minimum(tl.maximum(hi, -FLOAT32_MAX), FLOAT32_MAX)


@triton.jit
def dot_split3_clamped(a_hi, a_lo, b_hi, b_lo, acc):
    """acc + A @ B as `dot_split3`, with each hi clamped to the finite range in the small products (see the module
    docstring): an infinity multiplies through as in fp32 (a NaN's hi is NaN in the main product)."""
    acc = tl.dot(a_lo, _finite(b_hi), acc, input_precision="tf32")
    acc = tl.dot(_finite(a_hi), b_lo, acc, input_precision="tf32")
    return tl.dot(a_hi, b_hi, acc, input_precision="tf32")


def split_tf32(tensor: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The host twin of tf32_split: (hi, lo) float32 tensors of `tensor` (detached, as float32)."""
    x = tensor.detach().float()
    hi = (x.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32)
    rest = torch.where(hi == x, 0.0, x - hi)
    lo = (rest.view(torch.int32) & _HOST_TF32_MASK).view(torch.float32)
    return hi, lo
