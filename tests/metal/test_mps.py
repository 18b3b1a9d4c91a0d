"""Execution of every Metal shader family on an Apple GPU, against float64 references on the CPU.

These run unchanged wherever torch sees an MPS device (tests/conftest.py skips them elsewhere with
"needs an Apple GPU"). They are what re-measures the Metal approvals: fp32 at the fp32 bound,
half and bfloat at theirs.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rlx_triton.backends.metal import conv as metal_conv
from rlx_triton.backends.metal import fbank as metal_fbank
from rlx_triton.backends.metal import library
from rlx_triton.backends.metal import lstm as metal_lstm
from rlx_triton.backends.metal import sdpa_decode as metal_sdpa
from rlx_triton.backends.metal import segdense as metal_segdense
from rlx_triton.backends.metal.candidates import FP32_MAX_REL_ERR
from rlx_triton.backends.torch_ref import fbank as ref_fbank
from rlx_triton.backends.torch_ref import lstm as ref_lstm
from rlx_triton.backends.torch_ref import sdpa_decode as ref_sdpa
from rlx_triton.backends.torch_ref import segdense as ref_segdense
from rlx_triton.router import Request, clear_route_cache, route, use_backend

pytestmark = pytest.mark.mps

MPS = torch.device("mps")
TOLERANCE = {torch.float32: FP32_MAX_REL_ERR, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
DTYPES = list(TOLERANCE)
ONE_PASS = SimpleNamespace(split_k=1, tg_size=128, partial_reduce=False)
SPLIT_KV = SimpleNamespace(split_k=8, tg_size=256, partial_reduce=True, tile_n=32, tile_k=64, pad_kv=1)


def assert_matches_float64(actual, expected, *, rtol, reduced=1):
    torch.testing.assert_close(actual.cpu().to(torch.float64), expected.to(torch.float64), rtol=rtol,
                               atol=rtol * math.sqrt(reduced))


def test_smoke_test_passes_and_metal_runs_here():
    assert library.smoke_test() is None


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("candidate", [ONE_PASS, SPLIT_KV], ids=["one-pass", "split-kv"])
def test_sdpa_decode_on_mps(dtype, candidate):
    q = torch.randn(2, 8, 3, 128, dtype=dtype)
    k = torch.randn(2, 2, 777, 128, dtype=dtype)
    v = torch.randn(2, 2, 777, 96, dtype=dtype)
    cache_seqlens = torch.tensor([100, 777])
    out, lse = metal_sdpa.sdpa_decode(q.to(MPS), k.to(MPS), v.to(MPS), causal="bottom_right",
                                      cache_seqlens=cache_seqlens.to(MPS), candidate=candidate)
    expected, expected_lse = ref_sdpa.sdpa_decode(q.double(), k.double(), v.double(), causal="bottom_right",
                                                  cache_seqlens=cache_seqlens)
    assert out.dtype == dtype
    assert_matches_float64(out, expected, rtol=TOLERANCE[dtype], reduced=777)
    assert_matches_float64(lse, expected_lse, rtol=TOLERANCE[dtype], reduced=777)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fbank_on_mps(dtype):
    options = ref_fbank.FbankOptions(num_mel_bins=80, window_type="hamming", snip_edges=False, use_energy=True)
    wave = (torch.randn(3, 16000) * 0.1).to(dtype)
    features = metal_fbank.fbank(wave.to(MPS), options, candidate=None)
    expected = ref_fbank.fbank(wave.double(), options)
    assert_matches_float64(features, expected, rtol=max(TOLERANCE[dtype], 1e-4), reduced=400)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sincnet_and_conv1d_on_mps(dtype):
    wave = torch.randn(2, 1, 16000).to(dtype)
    filters = torch.randn(80, 1, 251) * 0.05
    conv_weights = [torch.randn(60, 80, 5) * 0.1, torch.randn(60, 60, 5) * 0.1]
    conv_biases = [torch.randn(60) * 0.1, torch.randn(60) * 0.1]
    norm_weights = [torch.rand(1) + 0.5, torch.rand(80) + 0.5, torch.rand(60) + 0.5, torch.rand(60) + 0.5]
    norm_biases = [torch.randn(1) * 0.1, torch.randn(80) * 0.1, torch.randn(60) * 0.1, torch.randn(60) * 0.1]
    on = lambda tensors: [t.to(MPS) for t in tensors]  # noqa: E731
    out = metal_conv.sincnet(wave.to(MPS), filters.to(MPS), norm_weights[0].to(MPS), norm_biases[0].to(MPS),
                             on(conv_weights), on(conv_biases), on(norm_weights[1:]), on(norm_biases[1:]),
                             candidate=None)
    h = F.instance_norm(wave.double(), weight=norm_weights[0].double(), bias=norm_biases[0].double())
    h = F.max_pool1d(F.conv1d(h, filters.double(), stride=10).abs(), 3, 3)
    h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[1].double(), bias=norm_biases[1].double()), 0.01)
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        h = F.max_pool1d(F.conv1d(h, w.double(), b.double()), 3, 3)
        h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[i + 2].double(), bias=norm_biases[i + 2].double()),
                         0.01)
    assert out.shape == h.shape
    assert_matches_float64(out, h, rtol=max(TOLERANCE[dtype], 1e-4), reduced=251)
    x, w, b = torch.randn(2, 5, 333).to(dtype), torch.randn(7, 5, 4), torch.randn(7)
    plain = metal_conv.conv1d(x.to(MPS), w.to(MPS), b.to(MPS), 2, 1, 1, candidate=None)
    assert_matches_float64(plain, F.conv1d(x.double(), w.double(), b.double(), 2, 1, 1), rtol=TOLERANCE[dtype],
                           reduced=20)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["persistent", "stepwise"])
def test_lstm_on_mps(dtype, mode):
    module = torch.nn.LSTM(60, 128, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(4, 50, 60).to(dtype)
    kwargs = dict(has_biases=True, num_layers=2, dropout=0.0, training=False, bidirectional=True, batch_first=True)
    out, (h_n, c_n) = metal_lstm.lstm(x.to(MPS), None, [w.to(MPS) for w in module._flat_weights],
                                      candidate=SimpleNamespace(mode=mode, tg_size=128), **kwargs)
    expected, (expected_h, expected_c) = ref_lstm.lstm(x.double(), None,
                                                       [w.detach().double() for w in module._flat_weights], **kwargs)
    for actual, reference in ((out, expected), (h_n, expected_h), (c_n, expected_c)):
        assert_matches_float64(actual, reference, rtol=TOLERANCE[dtype], reduced=128)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid"])
def test_segdense_on_mps(dtype, activation):
    weights = [torch.randn(128, 256) * 0.1, torch.randn(128, 128) * 0.1]
    biases = [torch.randn(128) * 0.1, torch.randn(128) * 0.1]
    classifier_w, classifier_b = torch.randn(7, 128) * 0.1, torch.randn(7) * 0.1
    x = torch.randn(4, 589, 256).to(dtype)
    out = metal_segdense.segdense(x.to(MPS), [w.to(MPS) for w in weights], [b.to(MPS) for b in biases],
                                  classifier_w.to(MPS), classifier_b.to(MPS), activation=activation, candidate=None)
    expected = ref_segdense.segdense(x.double(), [w.double() for w in weights], [b.double() for b in biases],
                                     classifier_w.double(), classifier_b.double(), activation=activation)
    assert_matches_float64(out, expected, rtol=TOLERANCE[dtype], reduced=256)


def test_router_sends_covered_mps_requests_to_metal_in_strict_mode():
    clear_route_cache()
    request = Request.make("segdense", "segdense", device=MPS, dtype=torch.float32,
                           fields={"rows": 589, "in_features": 256, "hidden": 128, "classes": 7, "tokens": 589},
                           features={"activation": "log_softmax", "linear_layers": 2, "requires_grad": False})
    with use_backend("metal", strict=True):
        chosen = route(request)
    assert chosen.backend == "metal" and chosen.module is metal_segdense
