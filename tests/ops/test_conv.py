"""The public sincnet/conv1d ops: input validation (errors name the argument, before any launch),
routing (triton when covered, torch for typed refusals and float64) and torch semantics, including
the inputs users create: silence, DC offsets, the shortest valid length, NaN/Inf, inference tensors."""
import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from rlx_triton.ops import conv as ops
from rlx_triton.ops._checks import InputShapeError
from rlx_triton.ops.conv import ConvEpilogue
from tests.reference.conv import (assert_matches_float64, conv1d_float64, degenerate_waveforms, random_sincnet,
                                  sincnet_float64)

BACKENDS = ["torch", "triton"]
NON_FINITE = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter


def _sincnet_args(module, wav):
    fb = module.conv1d[0].filterbank
    convs = list(module.conv1d)[1:]
    return (wav, ops.sinc_filters(fb.low_hz_, fb.band_hz_), module.wav_norm1d.weight, module.wav_norm1d.bias,
            [c.weight for c in convs], [c.bias for c in convs],
            [n.weight for n in module.norm1d], [n.bias for n in module.norm1d])


def test_explain_routes_sincnet_to_triton():
    module = random_sincnet()
    with torch.no_grad():
        r = rt.explain(ops.sincnet, *_sincnet_args(module, torch.randn(2, 1, 3200)))
    assert r.backend == "triton"
    assert r.request.field_map["c_out"] == 80 and r.request.field_map["tokens"] == 9


def test_explain_routes_autograd_to_torch():
    module = random_sincnet()
    r = rt.explain(ops.sincnet, *_sincnet_args(module, torch.randn(1, 1, 3200)))
    assert r.backend == "torch"
    assert "requires_grad" in str(r.skipped_reasons["triton"])


def test_conv1d_op_matches_torch_on_triton():
    x = torch.randn(2, 7, 33)
    w = torch.randn(5, 7, 3)
    b = torch.randn(5)
    with rt.use_backend("triton", strict=True):
        out = ops.conv1d(x, w, b, stride=2, padding=1, dilation=2)
        unbatched = ops.conv1d(x[0], w, b, padding="same")
    assert torch.allclose(out, F.conv1d(x, w, b, stride=2, padding=1, dilation=2), rtol=1e-5, atol=1e-5)
    assert torch.allclose(unbatched, F.conv1d(x[0], w, b, padding="same"), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_asymmetric_same_padding_falls_back_to_torch():
    x = torch.randn(1, 3, 20)
    w = torch.randn(4, 3, 4)          # even taps: 'same' pads 1 left, 2 right
    r = rt.explain(ops.conv1d, x, w, padding="same")
    assert r.backend == "torch"
    assert torch.equal(ops.conv1d(x, w, padding="same"), F.conv1d(x, w, padding="same"))


@pytest.mark.parametrize("call,error,match", [
    (lambda x, w: ops.conv1d(x.numpy(), w), TypeError, "input"),
    (lambda x, w: ops.conv1d(x[None], w), ValueError, "input"),
    (lambda x, w: ops.conv1d(x.long(), w.long()), TypeError, "input"),
    (lambda x, w: ops.conv1d(x.int(), w), TypeError, "input"),
    (lambda x, w: ops.conv1d(x, w[:, :2]), ValueError, r"expected input\[2, 7, 33\] to have 2 channels"),
    (lambda x, w: ops.conv1d(x, w.double()), TypeError, "weight"),
    (lambda x, w: ops.conv1d(x, w.half()), TypeError, "weight"),
    (lambda x, w: ops.conv1d(x, w, torch.randn(3)), ValueError, "bias"),
    (lambda x, w: ops.conv1d(x, w, stride=0), ValueError, "stride"),
    (lambda x, w: ops.conv1d(x, w, stride=1.5), TypeError, "stride"),
    (lambda x, w: ops.conv1d(x, w, padding=-1), ValueError, "padding"),
    (lambda x, w: ops.conv1d(x, w, padding="full"), ValueError, "padding"),
    (lambda x, w: ops.conv1d(x, w, dilation=(1, 1)), ValueError, "dilation"),
    (lambda x, w: ops.conv1d(x[..., :2], w), ValueError, "input length"),
    (lambda x, w: ops.conv1d(x, w, epilogue=ConvEpilogue(pool=99)), ValueError, "epilogue.pool"),
    (lambda x, w: ops.conv1d(x, w, epilogue="abs"), TypeError, "epilogue"),
    (lambda x, w: ConvEpilogue(pool=0), ValueError, "epilogue.pool"),
])
def test_conv1d_validation_errors_name_the_argument(call, error, match):
    x = torch.randn(2, 7, 33)
    w = torch.randn(5, 7, 3)
    with rt.use_backend("triton", strict=True), pytest.raises(error, match=match):
        call(x, w)


def test_sincnet_validation_errors_name_the_argument():
    module = random_sincnet()
    with torch.no_grad():
        args = list(_sincnet_args(module, torch.randn(1, 1, 3200)))
        for index, bad, error, match in [
            (0, torch.randn(1, 3200), ValueError, "waveforms"),
            (0, torch.randn(1, 2, 3200), ValueError, "expected 1 channel, got 2"),
            (0, torch.randn(1, 1, 600), ValueError, "too short"),
            (0, torch.randn(1, 1, 1260), ValueError, "two output frames"),
            (0, torch.randn(1, 1, 3200).long(), TypeError, "waveforms"),
            (1, torch.randn(80, 251), ValueError, "sinc_filters"),
            (2, torch.randn(2), ValueError, "wav_norm_weight"),
            (4, [torch.randn(60, 70, 5), args[4][1]], ValueError, r"conv_weights\[0\]"),
            (5, [args[5][0]], ValueError, "conv_biases"),
            (7, [torch.randn(80), torch.randn(60), torch.randn(7)], ValueError, r"norm_biases\[2\]"),
        ]:
            broken = list(args)
            broken[index] = bad
            with pytest.raises(error, match=match):
                ops.sincnet(*broken)
        with pytest.raises(ValueError, match="stride"):
            ops.sincnet(*args, stride=0)


def test_wrong_input_channels_raise_torchs_error_type_naming_the_input():
    x, w = torch.randn(2, 7, 33), torch.randn(5, 2, 3)
    with pytest.raises(RuntimeError) as torch_error:
        F.conv1d(x, w)
    for backend in BACKENDS:
        with rt.use_backend(backend), pytest.raises(type(torch_error.value)) as ours:
            ops.conv1d(x, w)
        assert isinstance(ours.value, InputShapeError) and isinstance(ours.value, ValueError)
        assert str(ours.value) == str(torch_error.value)


# ------------------------------------------------------------------------------ degenerate inputs

DEGENERATE = degenerate_waveforms()


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(DEGENERATE))
def test_sincnet_on_degenerate_waveforms_matches_float64(backend, case):
    """Silence and DC give float64's constant frames (not amplified rounding noise), the shortest valid
    waveform works, a NaN/Inf sample gives NaN frames for that waveform only, and a genuine signal on a
    large offset is normalized, not flattened."""
    wav, rtol = DEGENERATE[case]
    module = random_sincnet()
    with torch.no_grad(), rt.use_backend(backend, strict=True):
        out = ops.sincnet(*_sincnet_args(module, wav))
    assert_matches_float64(out, sincnet_float64(module, wav), rtol)


def _conv1d_inputs(case):
    """(x, weight, bias) for Conv1d blocks: 7 -> 5 channels, 5 taps, padding 1."""
    w, b = torch.randn(5, 7, 5) / 6, torch.randn(5)
    x = torch.randn(2, 7, 33)
    if case == "zeros":
        x = torch.zeros(2, 7, 33)
    elif case == "constant":
        x = torch.linspace(-100.0, 100.0, 7).view(1, 7, 1).expand(2, 7, 33).contiguous()
    elif case == "one_output":
        x = torch.randn(2, 7, 3)                    # 3 + 2 * 1 - 5 + 1 = 1 position
    elif case == "nan":
        x[0, 3, 10] = float("nan")
    elif case == "inf":
        x[0, 3, 10] = float("inf")
        x[1, 0, 0] = -float("inf")
    return x, w, b


@NON_FINITE
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("epilogue", [None, ConvEpilogue(abs=True, pool=3, negative_slope=0.01)],
                         ids=["plain", "abs_pool_leaky"])
@pytest.mark.parametrize("case", ["zeros", "constant", "one_output", "nan", "inf"])
def test_conv1d_on_degenerate_inputs_matches_float64(backend, epilogue, case):
    x, w, b = _conv1d_inputs(case)
    if case == "one_output" and epilogue is not None:
        epilogue = ConvEpilogue(abs=True, pool=1, negative_slope=0.01)
    with rt.use_backend(backend, strict=True):
        out = ops.conv1d(x, w, b, padding=1, epilogue=epilogue)
    ref = conv1d_float64(x, w, b, 1, 1, 1, abs_=bool(epilogue and epilogue.abs),
                         pool=1 if epilogue is None else epilogue.pool,
                         negative_slope=None if epilogue is None else epilogue.negative_slope)
    assert out.shape == ref.shape
    assert_matches_float64(out, ref, 1e-5, reduced=35)


# ------------------------------------------------------------------------------ float64

def test_float64_runs_torch_with_a_reason_and_gives_float64_values():
    module = random_sincnet().double()
    wav = torch.randn(1, 1, 2000, dtype=torch.float64)
    args = _sincnet_args(module, wav)
    with torch.no_grad():
        route = rt.explain(ops.sincnet, *args)
        out = ops.sincnet(*args)
        ref = module(wav)
    assert route.backend == "torch" and "float64" in str(route.skipped_reasons["triton"])
    assert out.dtype == torch.float64 and torch.equal(out, ref)
    x, w = torch.randn(2, 7, 33, dtype=torch.float64), torch.randn(5, 7, 3, dtype=torch.float64)
    assert torch.equal(ops.conv1d(x, w, padding=1), F.conv1d(x, w, padding=1))


# ------------------------------------------------------------------------------ inference tensors

def test_sinc_filters_of_inference_tensors_are_rebuilt_and_follow_in_place_edits():
    """Parameters created in inference mode have no version counter (keying a cache on it raises);
    they can still be edited in place inside inference mode, so their filters are rebuilt every call."""
    with torch.inference_mode():
        fb = random_sincnet().conv1d[0].filterbank
        first = ops.sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
        assert torch.equal(first, fb.filters())
        fb.band_hz_.mul_(1.5)
        second = ops.sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
        assert torch.equal(second, fb.filters()) and not torch.equal(first, second)


def test_sinc_filters_cached_inside_inference_mode_are_normal_tensors():
    """Filters of normal parameters are cached even when first built inside inference mode, as normal
    tensors: a later call outside it can hand them to autograd."""
    fb = random_sincnet().conv1d[0].filterbank
    fb.requires_grad_(False)
    with torch.inference_mode():
        cached = ops.sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
    assert not cached.is_inference()
    assert ops.sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_) is cached
    wav = torch.randn(1, 1, 600, requires_grad=True)
    F.conv1d(wav, cached, stride=10).sum().backward()
    assert wav.grad is not None


@pytest.mark.parametrize("backend", BACKENDS)
def test_sincnet_runs_on_inference_tensor_parameters(backend):
    with torch.inference_mode():
        module = random_sincnet()
        wav = torch.randn(1, 1, 2000)
        with rt.use_backend(backend, strict=True):
            out = ops.sincnet(*_sincnet_args(module, wav))
    assert_matches_float64(out, sincnet_float64(module, wav), 1e-4)
