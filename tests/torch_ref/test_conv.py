"""The torch fallback of the 1-D conv family equals pyannote's module sequence and F.conv1d."""
import torch
import torch.nn.functional as F

from rlx_triton.backends.torch_ref import conv as ref_conv
from rlx_triton.ops.conv import ConvEpilogue, sinc_filters
from tests.reference.conv import conv1d_float64, random_sincnet


def test_coverage_is_everything():
    assert ref_conv.COVERAGE.covers_all


def test_sincnet_fallback_is_the_pyannote_forward_bit_for_bit():
    module = random_sincnet()
    wav = torch.randn(2, 1, 4000)
    fb = module.conv1d[0].filterbank
    convs = list(module.conv1d)[1:]
    with torch.no_grad():
        out = ref_conv.sincnet(wav, sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_),
                               module.wav_norm1d.weight, module.wav_norm1d.bias,
                               [c.weight for c in convs], [c.bias for c in convs],
                               [n.weight for n in module.norm1d], [n.bias for n in module.norm1d])
        ref = module(wav)
    assert torch.equal(out, ref)


def test_sinc_filters_equal_asteroid_filters_and_are_cached_per_version():
    module = random_sincnet()
    fb = module.conv1d[0].filterbank
    with torch.no_grad():
        first = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
        assert torch.equal(first, fb.filters())
        assert sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_) is first
        fb.low_hz_.add_(10.0)          # an in-place update bumps _version: filters are rebuilt
        second = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
    assert second is not first
    assert torch.equal(second, fb.filters())


def test_sinc_filters_without_buffers_match_the_asteroid_window_and_time_axis():
    fb = random_sincnet().conv1d[0].filterbank
    with torch.no_grad():
        assert torch.allclose(sinc_filters(fb.low_hz_, fb.band_hz_), fb.filters(), rtol=1e-6, atol=1e-7)


def test_sinc_filters_keep_the_autograd_graph_when_needed():
    fb = random_sincnet().conv1d[0].filterbank
    filters = sinc_filters(fb.low_hz_, fb.band_hz_, window_=fb.window_, n_=fb.n_)
    filters.sum().backward()
    assert fb.low_hz_.grad is not None


def test_conv1d_fallback_applies_the_epilogue_in_order():
    x = torch.randn(2, 7, 80)
    w = torch.randn(9, 7, 5)
    b = torch.randn(9)
    epilogue = ConvEpilogue(abs=True, pool=3, negative_slope=0.01)
    out = ref_conv.conv1d(x, w, b, 2, 1, 1, epilogue=epilogue)
    ref = conv1d_float64(x, w, b, 2, 1, 1, abs_=True, pool=3, negative_slope=0.01)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(ref_conv.conv1d(x, w, b, 1, "same", 2), F.conv1d(x, w, b, 1, "same", 2))
