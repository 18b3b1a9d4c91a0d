"""The shader sources themselves, compiled for the CPU (tests/metal/shader_exec.py: real threads,
barriers and simd_sum), run the launchers and match float64 references: one pass and split-KV
decode, Kaldi fbank, SincNet and Conv1d, LSTM (persistent and stepwise), segdense, in float, half
and bfloat."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rlx_triton.backends.metal import conv as metal_conv
from rlx_triton.backends.metal import fbank as metal_fbank
from rlx_triton.backends.metal import lstm as metal_lstm
from rlx_triton.backends.metal import sdpa_decode as metal_sdpa
from rlx_triton.backends.metal import segdense as metal_segdense
from rlx_triton.backends.metal.candidates import FP32_MAX_REL_ERR
from rlx_triton.backends.torch_ref import fbank as ref_fbank
from rlx_triton.backends.torch_ref import lstm as ref_lstm
from rlx_triton.backends.torch_ref import sdpa_decode as ref_sdpa
from rlx_triton.backends.torch_ref import segdense as ref_segdense

TOLERANCE = {torch.float32: FP32_MAX_REL_ERR, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
ONE_PASS = SimpleNamespace(split_k=1, tg_size=64, partial_reduce=False)
SPLIT_KV = SimpleNamespace(split_k=4, tg_size=64, partial_reduce=True, tile_n=32, tile_k=8, pad_kv=1)


def assert_matches_float64(actual, expected, *, rtol, reduced=1):
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), rtol=rtol,
                               atol=rtol * math.sqrt(reduced))


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("candidate, kernels", [(ONE_PASS, ["sdpa_decode_one_pass"]),
                                                (SPLIT_KV, ["sdpa_decode_split", "sdpa_decode_combine"])],
                         ids=["one-pass", "split-kv"])
def test_decode_shader_matches_float64(executed_metal, dtype, candidate, kernels):
    q = torch.randn(1, 4, 2, 40).to(dtype)
    k, v = torch.randn(1, 2, 150, 40).to(dtype), torch.randn(1, 2, 150, 24).to(dtype)
    keep = torch.rand(1, 4, 2, 150) > 0.2
    keep[0, 1, 1] = False  # one row sees no key
    out, lse = metal_sdpa.sdpa_decode(q, k, v, attn_mask=keep, causal="bottom_right",
                                      cache_seqlens=torch.tensor([120]), candidate=candidate)
    expected, expected_lse = ref_sdpa.sdpa_decode(q.double(), k.double(), v.double(), attn_mask=keep,
                                                  causal="bottom_right", cache_seqlens=torch.tensor([120]))
    suffix = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}[dtype]
    assert executed_metal.names() == [f"{name}_{suffix}" for name in kernels]
    assert torch.all(out[0, 1, 1] == 0) and lse[0, 1, 1] == -math.inf
    assert_matches_float64(out, expected, rtol=TOLERANCE[dtype], reduced=150)
    assert_matches_float64(lse, expected_lse, rtol=TOLERANCE[dtype], reduced=150)


@pytest.mark.parametrize("options", [dict(), dict(num_mel_bins=80, window_type="hamming", snip_edges=False,
                                                  use_energy=True)], ids=["povey-23", "hamming-80-reflect-energy"])
def test_fbank_shader_matches_float64(executed_metal, options):
    options = ref_fbank.FbankOptions(**options)
    wave = torch.randn(1, 2000) * 0.1
    features = metal_fbank.fbank(wave, options, candidate=SimpleNamespace(tg_size=64))
    assert_matches_float64(features, ref_fbank.fbank(wave.double(), options), rtol=1e-4, reduced=400)


def _sincnet_shaders_and_float64(wave):
    """A small SincNet (8 sinc filters, one 8 -> 6 Conv1d block) on the shaders, and its float64 forward."""
    filters = torch.randn(8, 1, 251) * 0.05
    conv_weights, conv_biases = [torch.randn(6, 8, 5) * 0.3], [torch.randn(6) * 0.1]
    norm_weights = [torch.rand(1) + 0.5, torch.rand(8) + 0.5, torch.rand(6) + 0.5]
    norm_biases = [torch.randn(1) * 0.1, torch.randn(8) * 0.1, torch.randn(6) * 0.1]
    out = metal_conv.sincnet(wave, filters, norm_weights[0], norm_biases[0], conv_weights, conv_biases,
                             norm_weights[1:], norm_biases[1:], candidate=SimpleNamespace(tg_size=64))
    h = F.instance_norm(wave.double(), weight=norm_weights[0].double(), bias=norm_biases[0].double())
    h = F.max_pool1d(F.conv1d(h, filters.double(), stride=10).abs(), 3, 3)
    h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[1].double(), bias=norm_biases[1].double()), 0.01)
    h = F.max_pool1d(F.conv1d(h, conv_weights[0].double(), conv_biases[0].double()), 3, 3)
    h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[2].double(), bias=norm_biases[2].double()), 0.01)
    return out, h


def test_sincnet_and_conv1d_shaders_match_float64(executed_metal):
    out, expected = _sincnet_shaders_and_float64(torch.randn(1, 1, 1601))
    assert_matches_float64(out, expected, rtol=1e-4, reduced=251)
    x, w, b = torch.randn(2, 5, 60).half(), torch.randn(7, 5, 4), torch.randn(7)
    epilogue = SimpleNamespace(abs=False, pool=2, negative_slope=0.01)
    plain = metal_conv.conv1d(x, w, b, 2, 3, 2, epilogue=epilogue, candidate=None)
    expected = F.leaky_relu(F.max_pool1d(F.conv1d(x.double(), w.double(), b.double(), 2, 3, 2), 2, 2), 0.01)
    assert_matches_float64(plain, expected, rtol=1e-3, reduced=20)


@pytest.mark.parametrize("value", [0.0, 0.5, -100.0], ids=["zeros", "dc0.5", "dc-100"])
def test_sincnet_shaders_on_constant_waveforms_give_float64s_constant(executed_metal, value):
    """Shifted statistics make a constant row's variance exactly 0 (output beta), and each conv thread
    walks its window in one order, so the constant stays exact through every block."""
    out, expected = _sincnet_shaders_and_float64(torch.full((2, 1, 1601), value))
    assert torch.equal(out.amax(-1), out.amin(-1))
    assert_matches_float64(out, expected, rtol=1e-5)


def test_instance_norm_shader_keeps_the_digits_of_an_offset(executed_metal):
    """Statistics of x - x[0] and the output as (x - x[0]) * scale + shift: a small signal on a large offset
    normalizes to float64's values (x - mean with mean rounded to fp32 would cancel ~4 digits here)."""
    x = 100 + 0.02 * torch.randn(2, 3, 999)
    gamma, beta = torch.rand(3) + 0.5, torch.randn(3)
    out = metal_conv.instance_norm_act(x, gamma, beta, eps=1e-5, candidate=SimpleNamespace(tg_size=64))
    ref = F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5)
    assert_matches_float64(out, ref, rtol=FP32_MAX_REL_ERR, reduced=999)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_instance_norm_shader_gives_nan_rows_where_torch_does(executed_metal):
    x = torch.randn(1, 4, 300)
    x[0, 1, 17] = float("nan")
    x[0, 2, 0] = float("inf")
    x[0, 3, 150] = -float("inf")
    gamma, beta = torch.rand(4) + 0.5, torch.randn(4)
    out = metal_conv.instance_norm_act(x, gamma, beta, eps=1e-5, negative_slope=0.01,
                                       candidate=SimpleNamespace(tg_size=64))
    ref = F.leaky_relu(F.instance_norm(x.double(), weight=gamma.double(), bias=beta.double(), eps=1e-5), 0.01)
    assert ref[0, 1:].isnan().all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_conv_shader_pools_nan_and_inf_like_torch(executed_metal):
    """Metal's max() drops a NaN; torch's max_pool1d keeps it."""
    x = torch.randn(2, 3, 40)
    x[0, 0, 5] = float("nan")
    x[1, 2, 20] = float("inf")
    w, b = torch.randn(4, 3, 3), torch.randn(4)
    epilogue = SimpleNamespace(abs=True, pool=3, negative_slope=0.01)
    out = metal_conv.conv1d(x, w, b, 1, 1, 1, epilogue=epilogue, candidate=None)
    ref = F.leaky_relu(F.max_pool1d(F.conv1d(x.double(), w.double(), b.double(), 1, 1).abs(), 3, 3), 0.01)
    assert ref.isnan().any() and ref.isinf().any()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * math.sqrt(9), equal_nan=True)


@pytest.mark.parametrize("mode", ["persistent", "stepwise"])
def test_lstm_shaders_match_float64(executed_metal, mode):
    module = torch.nn.LSTM(6, 9, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(2, 5, 6)
    hx = (torch.randn(4, 2, 9), torch.randn(4, 2, 9))
    kwargs = dict(has_biases=True, num_layers=2, dropout=0.0, training=False, bidirectional=True, batch_first=True)
    out, (h_n, c_n) = metal_lstm.lstm(x, hx, list(module._flat_weights),
                                      candidate=SimpleNamespace(mode=mode, tg_size=32), **kwargs)
    expected, (expected_h, expected_c) = ref_lstm.lstm(x.double(), tuple(s.double() for s in hx),
                                                       [w.detach().double() for w in module._flat_weights], **kwargs)
    for actual, reference in ((out, expected), (h_n, expected_h), (c_n, expected_c)):
        assert_matches_float64(actual, reference, rtol=FP32_MAX_REL_ERR, reduced=9)


@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid"])
def test_segdense_shader_matches_float64(executed_metal, activation):
    weights = [torch.randn(10, 12) * 0.3, torch.randn(10, 10) * 0.3]
    biases = [torch.randn(10) * 0.1, None]
    classifier_w, classifier_b = torch.randn(7, 10) * 0.3, torch.randn(7) * 0.1
    x = torch.randn(3, 12).to(torch.bfloat16)
    out = metal_segdense.segdense(x, weights, biases, classifier_w, classifier_b, activation=activation,
                                  candidate=SimpleNamespace(tg_size=32))
    expected = ref_segdense.segdense(x.double(), [w.double() for w in weights], [biases[0].double(), None],
                                     classifier_w.double(), classifier_b.double(), activation=activation)
    assert out.dtype == torch.bfloat16
    assert_matches_float64(out, expected, rtol=1.6e-2, reduced=12)
