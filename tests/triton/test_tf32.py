"""backends/triton/_tf32: the TF32 halves of fp32 values, in a kernel (tf32_split, run by the interpreter)
and on the host (split_tf32), bit for bit the same: both halves TF32 values summing to the input within
2^-20 of it, a non-finite input all in the high half."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton._tf32 import split_tf32, tf32_split


def _wide_range_values() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    scales = 10.0 ** torch.randint(-30, 30, (4096,), generator=gen)
    return torch.cat([torch.randn(4096, generator=gen) * scales, torch.tensor([0.0, -0.0, 1.0])])


def test_the_halves_are_tf32_values_that_sum_to_the_input():
    x = _wide_range_values()
    hi, lo = split_tf32(x)
    for half in (hi, lo):
        assert torch.equal(half.view(torch.int32) & 0x1FFF, torch.zeros_like(half, dtype=torch.int32))
    assert ((hi.double() + lo.double() - x.double()).abs() <= 2.0 ** -20 * x.double().abs()).all()


def test_a_non_finite_value_is_all_in_the_high_half():
    hi, lo = split_tf32(torch.tensor([float("inf"), -float("inf"), float("nan")]))
    assert hi[0] == float("inf") and hi[1] == -float("inf") and hi[2].isnan()
    assert torch.equal(lo, torch.zeros(3))


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    in_range = offsets < n
    hi, lo = tf32_split(tl.load(x_ptr + offsets, mask=in_range))
    tl.store(hi_ptr + offsets, hi, mask=in_range)
    tl.store(lo_ptr + offsets, lo, mask=in_range)


def test_the_kernels_split_is_the_host_split_bit_for_bit():
    x = torch.cat([_wide_range_values()[:1021], torch.tensor([float("inf"), -float("inf"), float("nan")])])
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    _split_kernel[(1,)](x, hi, lo, x.numel(), BLOCK=1024)
    want_hi, want_lo = split_tf32(x)
    assert torch.equal(hi.view(torch.int32), want_hi.view(torch.int32))
    assert torch.equal(lo.view(torch.int32), want_lo.view(torch.int32))
