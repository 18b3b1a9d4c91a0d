"""The library fallback of the conv family's 2-D ops against float64 references."""
import pytest
import torch

from rlx_triton.backends.torch_ref import conv2d as R
from tests.reference.conv2d import assert_close_ref, conv2d64, linear64, stats_pool64


def test_fallback_covers_everything_and_approves_nothing():
    assert R.COVERAGE.covers_all
    assert R.APPROVALS == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_conv2d_with_residual_and_relu(dtype):
    x = torch.randn(2, 5, 9, 7).to(dtype)
    weight, bias = torch.randn(6, 5, 3, 3), torch.randn(6)
    residual = torch.randn(2, 6, 5, 4).to(dtype)
    y = R.conv2d(x, weight, bias, stride=2, padding=1, residual=residual, relu=True)
    assert y.dtype == dtype
    assert_close_ref(y, conv2d64(x, weight, bias, stride=2, padding=1, residual=residual, relu=True), dtype, 45)


def test_linear():
    x, weight, bias = torch.randn(3, 333), torch.randn(7, 333), torch.randn(7)
    assert_close_ref(R.linear(x, weight, bias), linear64(x, weight, bias), torch.float32, 333)


@pytest.mark.parametrize("weighted", [False, True])
def test_stats_pool(weighted):
    x = torch.randn(2, 7, 33)
    weights = torch.rand(2, 3, 33) if weighted else None
    assert_close_ref(R.stats_pool(x, weights), stats_pool64(x, weights), torch.float32, 33)


def test_stats_pool_of_one_frame_has_zero_std():
    assert torch.equal(R.stats_pool(torch.randn(2, 4, 1))[:, 4:], torch.zeros(2, 4))
