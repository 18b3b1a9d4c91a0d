"""backends/triton/_tf32: the TF32 halves of fp32 values, in a kernel (tf32_split, run by the interpreter)
and on the host (split_tf32), bit for bit the same: both halves TF32 values summing to the input within
2^-20 of it; an infinity is all in the high half, a NaN is NaN in the low half, so a product-sum of the
halves is infinite for an infinity and NaN for a NaN; the three-product forms that keep infinities
(dot_split3_parts with split3_sum, dot_split3_clamped) give the fp32 product's where an infinity meets a TF32
value."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton._tf32 import dot_split3_clamped, dot_split3_parts, split3_sum, split_tf32, tf32_split


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


@triton.jit
def _products_kernel(a_ptr, b_ptr, parts_ptr, clamped_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """A[M, K] @ B[K, N] as tf32x3 both ways: `dot_split3_parts` + `split3_sum` (A split without the select), and
    `dot_split3_clamped` (both split with it)."""
    rows, cols, ks = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
    b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
    out = rows[:, None] * N + cols[None, :]
    b_hi, b_lo = tf32_split(b)
    a_hi, a_lo = tf32_split(a, KEEP_INF=False)
    main, small = dot_split3_parts(a_hi, a_lo, b_hi, b_lo, tl.zeros((M, N), tl.float32), tl.zeros((M, N), tl.float32))
    tl.store(parts_ptr + out, split3_sum(main, small))
    a_hi, a_lo = tf32_split(a)
    tl.store(clamped_ptr + out, dot_split3_clamped(a_hi, a_lo, b_hi, b_lo, tl.zeros((M, N), tl.float32)))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter: inf * 0
def test_an_infinity_meeting_a_tf32_weight_multiplies_through_as_in_fp32():
    """Rows of A with an infinity, a NaN, or both signs of infinity meet columns of B that hold TF32 values
    (0.5, -0.01806640625: a low half of 0), other values and 0: both inf-keeping forms give the fp32 product's
    infinities and NaNs exactly and its finite values within tf32x3's error, where dot_split3's single sum
    would be NaN (inf * 0 in a small product)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)
    b[2, :4] = torch.tensor([0.5, -0.01806640625, 0.0, 3.0])
    assert (split_tf32(b[2, :2])[1] == 0).all()
    a[0, 2] = float("inf")
    a[1, 2] = -float("inf")
    a[2, 2], a[2, 5] = float("inf"), -float("inf")
    a[3, 7] = float("nan")
    want = a.double() @ b.double()
    parts, clamped = torch.empty(16, 16), torch.empty(16, 16)
    _products_kernel[(1,)](a, b, parts, clamped, M=16, N=16, K=16)
    assert want[:2, :2].isinf().all() and want[0, 2].isnan() and want[2].isnan().any() and want[2].isinf().any()
    for got in (parts, clamped):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
        finite = want.isfinite()
        assert torch.equal(got[want.isinf()], want[want.isinf()].float())
        torch.testing.assert_close(got[finite].double(), want[finite], rtol=1e-5, atol=1e-5)
