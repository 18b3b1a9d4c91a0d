"""The public sincnet/conv1d ops: input validation (errors name the argument, before any launch),
routing (triton when covered, torch for typed refusals) and torch semantics."""
import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from rlx_triton.ops import conv as ops
from rlx_triton.ops.conv import ConvEpilogue
from tests.reference.conv import random_sincnet


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
    (lambda x, w: ops.conv1d(x, w[:, :2]), ValueError, "weight"),
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
            (0, torch.randn(1, 2, 3200), ValueError, "waveforms"),
            (0, torch.randn(1, 1, 600), ValueError, "too short"),
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
