"""backends/triton/_tf32: the TF32 halves of fp32 values, in a kernel (tf32_split, run by the interpreter)
and on the host (split_tf32), bit for bit the same: both halves TF32 values summing to the input within
2^-20 of it; an infinity is all in the high half, a NaN is NaN in the low half, so a product-sum of the
halves is infinite for an infinity and NaN for a NaN."""
from __future__ import annotations

import pytest
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


def _low_payload_nan() -> torch.Tensor:
    """A NaN whose mantissa bits are all in the low 13 bits: its high half is an infinity."""
    return torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)


def test_an_infinity_is_all_in_the_high_half():
    hi, lo = split_tf32(torch.tensor([float("inf"), -float("inf")]))
    assert hi[0] == float("inf") and hi[1] == -float("inf")
    assert torch.equal(lo.view(torch.int32), torch.zeros(2, dtype=torch.int32))


def test_a_nan_has_a_nan_low_half():
    x = torch.cat([torch.tensor([float("nan")]), _low_payload_nan()])
    hi, lo = split_tf32(x)
    assert hi[0].isnan() and hi[1] == float("inf")
    assert lo.isnan().all()


def test_a_product_sum_of_the_halves_is_infinite_for_an_infinity_and_nan_for_a_nan():
    x = torch.cat([torch.tensor([float("inf"), -float("inf"), float("nan")]), _low_payload_nan()])
    hi, lo = split_tf32(x)
    for weight in (0.3, -1.7, 2.5, 1e-30):
        products = hi * weight + lo * weight
        assert torch.equal(products[:2], x[:2] * weight)
        assert products[2:].isnan().all()


@triton.jit
def _split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    in_range = offsets < n
    hi, lo = tf32_split(tl.load(x_ptr + offsets, mask=in_range))
    tl.store(hi_ptr + offsets, hi, mask=in_range)
    tl.store(lo_ptr + offsets, lo, mask=in_range)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter: inf - inf
def test_the_kernels_split_is_the_host_split_bit_for_bit():
    x = torch.cat([_wide_range_values()[:1020], torch.tensor([float("inf"), -float("inf"), float("nan")]),
                   _low_payload_nan()])
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    _split_kernel[(1,)](x, hi, lo, x.numel(), BLOCK=1024)
    want_hi, want_lo = split_tf32(x)
    assert torch.equal(hi.view(torch.int32), want_hi.view(torch.int32))
    assert torch.equal(lo.view(torch.int32), want_lo.view(torch.int32))
