"""Public 2-D ops of the conv family: validation before launch, routing, BatchNorm folding, and the
inputs users create (zeros, constants, a single pixel or frame, NaN/Inf) on both backends."""
import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from rlx_triton.ops import conv2d as ops
from rlx_triton.ops._checks import InputShapeError
from tests.reference.conv import assert_matches_float64
from tests.reference.conv2d import assert_close_ref, conv2d64, linear64, stats_pool64
from tests.reference.wespeaker_models import StatsPool as PyannoteStatsPool

BACKENDS = ["torch", "triton"]
NON_FINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter


def _conv_args():
    return torch.randn(2, 3, 9, 8), torch.randn(4, 3, 3, 3), torch.randn(4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_conv2d_runs_on_the_chosen_backend(backend):
    x, weight, bias = _conv_args()
    residual = torch.randn(2, 4, 5, 4)
    with rt.use_backend(backend, strict=True):
        y = ops.conv2d(x, weight, bias, stride=2, padding=1, residual=residual, relu=True)
    assert_close_ref(y, conv2d64(x, weight, bias, stride=2, padding=1, residual=residual, relu=True),
                     torch.float32, 27)


def test_conv2d_routes_to_triton_in_the_interpreter_with_a_true_fp32_candidate():
    x, weight, bias = _conv_args()
    route = rt.explain(ops.conv2d, x, weight, bias, padding=1, relu=True)
    assert route.backend == "triton"
    assert route.candidate.precision in ("ieee", "tf32x3")
    assert route.approval is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_image_without_a_batch_dimension_is_taken_like_torch(backend):
    x, weight, bias = _conv_args()
    residual = torch.randn(4, 5, 4)
    with rt.use_backend(backend, strict=True):
        y = ops.conv2d(x[1], weight, bias, stride=2, padding=1, residual=residual, relu=True)
    assert y.shape == (4, 5, 4)
    assert_close_ref(y, conv2d64(x[1:2], weight, bias, stride=2, padding=1, residual=residual[None], relu=True)[0],
                     torch.float32, 27)


def test_float64_falls_back_to_torch_with_a_reason():
    x, weight, bias = (t.double() for t in _conv_args())
    route = rt.explain(ops.conv2d, x, weight, bias, padding=1)
    assert route.backend == "torch"
    assert "float64" in str(route.skipped_reasons["triton"])
    torch.testing.assert_close(ops.conv2d(x, weight, bias, padding=1), conv2d64(x, weight, bias, padding=1))


def test_calls_that_need_gradients_go_to_torch_and_backpropagate():
    x, weight, bias = _conv_args()
    x.requires_grad_()
    assert rt.explain(ops.conv2d, x, weight, bias, padding=1).backend == "torch"
    ops.conv2d(x, weight, bias, padding=1, relu=True).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    with torch.no_grad():
        assert rt.explain(ops.conv2d, x, weight, bias, padding=1).backend == "triton"
    seq = torch.randn(2, 3, 9, requires_grad=True)
    assert rt.explain(ops.stats_pool, seq).backend == "torch"


def test_dilated_or_wide_geometry_outside_coverage_falls_back():
    x = torch.randn(1, 2, 12, 12)
    route = rt.explain(ops.conv2d, x, torch.randn(3, 2, 9, 9), padding=4)
    assert route.backend == "torch"


@pytest.mark.parametrize("call, message", [
    (lambda x, w, b: ops.conv2d(x[0, 0], w, b), "x must be 3-D or 4-D"),
    (lambda x, w, b: ops.conv2d(x, w[:, :2], b), r"expected input\[2, 3, 9, 8\] to have 2 channels"),
    (lambda x, w, b: ops.conv2d(x, w, b[:3]), "bias must have shape"),
    (lambda x, w, b: ops.conv2d(x, w, b, stride=0), "stride must be >= 1"),
    (lambda x, w, b: ops.conv2d(x, w, b, padding=-1), "padding must be >= 0"),
    (lambda x, w, b: ops.conv2d(x, w, b, residual=torch.randn(2, 4, 9, 8)), "residual must have the output's shape"),
    (lambda x, w, b: ops.conv2d(x[:, :, :2, :2], w, b), "smaller than the kernel"),
    (lambda x, w, b: ops.conv2d(x, w, b, stride=(1, 2)), "stride must be one int"),
])
def test_conv2d_errors_name_the_argument(call, message):
    x, weight, bias = _conv_args()
    with pytest.raises(ValueError, match=message):
        call(x, weight, bias)


def test_conv2d_type_errors():
    x, weight, bias = _conv_args()
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ops.conv2d(x.numpy(), weight, bias)
    with pytest.raises(TypeError, match="relu must be a bool"):
        ops.conv2d(x, weight, bias, relu=1)
    with pytest.raises(TypeError, match="x must be float32"):
        ops.conv2d(x.int(), weight, bias)


def test_linear_matches_float64_and_validates():
    x, weight, bias = torch.randn(3, 50), torch.randn(6, 50), torch.randn(6)
    with rt.use_backend("triton", strict=True):
        assert_close_ref(ops.linear(x, weight, bias), linear64(x, weight, bias), torch.float32, 50)
    with pytest.raises(RuntimeError, match="has 50 features, but weight of size \\[6, 7\\] expects in_features=7"):
        ops.linear(x, weight[:, :7])


@pytest.mark.parametrize("weights_shape", [None, (2, 40), (2, 3, 40), (2, 3, 13)])
def test_stats_pool_matches_pyannote_statspool(weights_shape):
    """Weights with another frame count are nearest-interpolated, as pyannote does."""
    x = torch.randn(2, 6, 40)
    weights = None if weights_shape is None else torch.rand(*weights_shape)
    with rt.use_backend("triton", strict=True):
        y = ops.stats_pool(x, weights)
    ref = PyannoteStatsPool()(x.double(), None if weights is None else weights.double())
    assert y.shape == ref.shape
    assert_close_ref(y, ref, torch.float32, 40)


def test_stats_pool_errors_name_the_argument():
    with pytest.raises(ValueError, match="sequences must be 3-D"):
        ops.stats_pool(torch.randn(2, 3))
    with pytest.raises(ValueError, match="weights must have batch=2"):
        ops.stats_pool(torch.randn(2, 3, 5), torch.rand(3, 5))
    with pytest.raises(ValueError, match="weights must be"):
        ops.stats_pool(torch.randn(2, 3, 5), torch.rand(2, 1, 1, 5))


@pytest.mark.parametrize("bn_cls, shape", [(torch.nn.BatchNorm2d, (5, 3, 3, 3)), (torch.nn.BatchNorm1d, (5, 8))])
def test_fold_batchnorm_equals_conv_then_eval_batchnorm(bn_cls, shape):
    bn = bn_cls(5).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(5))
        bn.running_var.copy_(torch.rand(5) + 0.5)
        bn.weight.copy_(torch.rand(5) + 0.5)
        bn.bias.copy_(torch.randn(5))
    weight, bias = torch.randn(*shape), torch.randn(5)
    w, b = ops.fold_batchnorm(weight, bias, bn)
    if len(shape) == 4:
        x = torch.randn(2, 3, 6, 6)
        ref = bn(torch.nn.functional.conv2d(x, weight, bias))
        out = torch.nn.functional.conv2d(x, w, b)
    else:
        x = torch.randn(4, 8)
        ref, out = bn(torch.nn.functional.linear(x, weight, bias)), torch.nn.functional.linear(x, w, b)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bn has 5 features"):
        ops.fold_batchnorm(weight[:4], None, bn)


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_input_channels_raise_torchs_error_type_naming_the_input(backend):
    x, weight, bias = _conv_args()
    with pytest.raises(RuntimeError) as torch_error:
        F.conv2d(x, weight[:, :2], bias)
    with rt.use_backend(backend), pytest.raises(type(torch_error.value)) as ours:
        ops.conv2d(x, weight[:, :2], bias)
    assert isinstance(ours.value, InputShapeError) and str(ours.value) == str(torch_error.value)


def _degenerate_conv2d_input(case):
    x = torch.randn(2, 3, 9, 8)
    if case == "zeros":
        x = torch.zeros(2, 3, 9, 8)
    elif case == "constant":
        x = torch.tensor([0.5, -100.0, 1e4]).view(1, 3, 1, 1).expand(2, 3, 9, 8).contiguous()
    elif case == "one_pixel":
        x = torch.randn(2, 3, 1, 1)
    elif case == "nan":
        x[0, 1, 4, 4] = float("nan")
    elif case == "inf":
        x[0, 1, 4, 4] = float("inf")
        x[1, 2, 0, 0] = -float("inf")
    return x


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["zeros", "constant", "one_pixel", "nan", "inf"])
def test_conv2d_on_degenerate_inputs_matches_float64(backend, case):
    """conv + bias + residual + ReLU: zero padding at the borders of a constant image, a 1x1 image
    (only the centre tap), NaN/Inf spreading over their receptive fields (ReLU keeps NaN, as torch's)."""
    x = _degenerate_conv2d_input(case)
    weight, bias = torch.randn(4, 3, 3, 3) / 5, torch.randn(4)
    residual = torch.randn(2, 4, *x.shape[2:])
    with rt.use_backend(backend, strict=True):
        y = ops.conv2d(x, weight, bias, padding=1, residual=residual, relu=True)
    ref = conv2d64(x, weight, bias, padding=1, residual=residual, relu=True)
    assert_matches_float64(y, ref, 1e-5, reduced=27)


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted,case", [
    (False, "constant"), (False, "one_frame"), (False, "nan"), (False, "inf"),
    # weighted, one frame: pyannote's std is sqrt of ~1e-8 terms over v1 - v2 / v1 + 1e-8, a
    # cancellation to ~1e-8 that fp32 cannot resolve (its own fp32 forward gives 0): not a float64 case
    (True, "constant"), (True, "nan"), (True, "inf"),
], ids=lambda v: v if isinstance(v, str) else ("weighted" if v else "unweighted"))
def test_stats_pool_on_degenerate_inputs_matches_float64(backend, weighted, case):
    """Constant frames (std 0, or pyannote's 1e-8 terms weighted), one frame (std 0), NaN/Inf frames:
    NaN/Inf exactly where torch puts them."""
    frames = 1 if case == "one_frame" else 40
    x = torch.randn(2, 5, frames) * 3
    if case == "constant":
        x = torch.tensor([0.0, 0.5, -100.0, 1e4, 3.0]).view(1, 5, 1).expand(2, 5, frames).contiguous()
    elif case == "nan":
        x[0, 1, 7] = float("nan")
    elif case == "inf":
        x[0, 1, 7] = float("inf")
        x[1, 3, 0] = -float("inf")
    weights = torch.rand(2, 3, frames) if weighted else None
    with rt.use_backend(backend, strict=True):
        y = ops.stats_pool(x, weights)
    assert_matches_float64(y, stats_pool64(x, weights), 1e-5, reduced=frames)


def test_fold_batchnorm_keeps_float64_and_divides_a_zero_variance_by_sqrt_eps():
    bn = torch.nn.BatchNorm2d(3).eval().double()
    with torch.no_grad():
        bn.running_var.zero_()
        bn.running_mean.copy_(torch.tensor([0.0, 1.0, -2.0]))
    weight, bias = torch.randn(3, 2, 3, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    w, b = ops.fold_batchnorm(weight, bias, bn)
    assert w.dtype == b.dtype == torch.float64
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    torch.testing.assert_close(F.conv2d(x, w, b), bn(F.conv2d(x, weight, bias)), rtol=1e-12, atol=1e-12)
    w32, _ = ops.fold_batchnorm(weight.float(), bias.float(), bn.float())
    assert w32.dtype == torch.float32
