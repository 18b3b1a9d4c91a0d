"""The Metal launchers run against NumPy models of their shaders (fp32, the shaders' algorithms and
grid mappings) and must match float64 references: split-KV partition and combine math, Kaldi fbank,
SincNet conv | abs | pool and Conv1d blocks, the LSTM cell step (persistent and stepwise), segdense.
This checks the algorithms and the launch plumbing (argument names, kinds, order, geometry) on Linux;
the Metal compiler and GPU are exercised by test_mps.py on Apple silicon."""
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
from rlx_triton.backends.metal.candidates import FP32_MAX_REL_ERR, plan_candidates
from rlx_triton.backends.torch_ref import fbank as ref_fbank
from rlx_triton.backends.torch_ref import lstm as ref_lstm
from rlx_triton.backends.torch_ref import sdpa_decode as ref_sdpa
from rlx_triton.backends.torch_ref import segdense as ref_segdense

ONE_PASS = SimpleNamespace(split_k=1, tg_size=64, partial_reduce=False)
SPLIT_KV = SimpleNamespace(split_k=4, tg_size=128, partial_reduce=True, tile_n=32, tile_k=8, pad_kv=1)


def assert_matches_float64(actual, expected, *, rtol=FP32_MAX_REL_ERR, reduced=1):
    """Relative tolerance with an absolute floor scaled by the reduced length (the team's convention)."""
    torch.testing.assert_close(actual.to(torch.float64), expected.to(torch.float64), rtol=rtol,
                               atol=rtol * math.sqrt(reduced), equal_nan=False)


# ------------------------------------------------------------------------------------ sdpa_decode

def _attention_inputs(batch=2, heads=4, kv_heads=2, seq_q=1, seq_kv=37, head_dim=7, head_dim_v=13,
                      dtype=torch.float32):
    q = torch.randn(batch, heads, seq_q, head_dim, dtype=dtype)
    k = torch.randn(batch, kv_heads, seq_kv, head_dim, dtype=dtype)
    v = torch.randn(batch, kv_heads, seq_kv, head_dim_v, dtype=dtype)
    return q, k, v


def _reference(q, k, v, **kwargs):
    return ref_sdpa.sdpa_decode(q.double(), k.double(), v.double(), **kwargs)


@pytest.mark.parametrize("candidate, kernels", [
    (ONE_PASS, ["sdpa_decode_one_pass_float"]),
    (SPLIT_KV, ["sdpa_decode_split_float", "sdpa_decode_combine_float"]),
], ids=["one-pass", "split-kv"])
def test_decode_gqa_with_odd_head_dims_matches_float64(emulated_metal, candidate, kernels):
    q, k, v = _attention_inputs(seq_kv=300)
    out, lse = metal_sdpa.sdpa_decode(q, k, v, candidate=candidate)
    expected_out, expected_lse = _reference(q, k, v)
    assert emulated_metal.names() == kernels
    assert_matches_float64(out, expected_out, reduced=300)
    assert_matches_float64(lse, expected_lse, reduced=300)


@pytest.mark.parametrize("candidate", [ONE_PASS, SPLIT_KV], ids=["one-pass", "split-kv"])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
def test_decode_masks_causal_and_cache_lengths_match_float64(emulated_metal, candidate, causal):
    q, k, v = _attention_inputs(seq_q=3, seq_kv=200)
    cache_seqlens = torch.tensor([5, 200])
    float_mask = torch.randn(1, 4, 3, 200)
    out, lse = metal_sdpa.sdpa_decode(q, k, v, attn_mask=float_mask, causal=causal, cache_seqlens=cache_seqlens,
                                      scale=0.3, candidate=candidate)
    expected_out, expected_lse = _reference(q, k, v, attn_mask=float_mask.double(), causal=causal,
                                            cache_seqlens=cache_seqlens, scale=0.3)
    assert_matches_float64(out, expected_out, reduced=200)
    assert_matches_float64(lse, expected_lse, reduced=200)


@pytest.mark.parametrize("candidate", [ONE_PASS, SPLIT_KV], ids=["one-pass", "split-kv"])
def test_decode_rows_that_see_no_key_give_zero_and_minus_infinite_lse(emulated_metal, candidate):
    q, k, v = _attention_inputs(seq_q=2, seq_kv=100)
    keep = torch.ones(2, 4, 2, 100, dtype=torch.bool)
    keep[1, 3, 0] = False  # one fully masked row
    out, lse = metal_sdpa.sdpa_decode(q, k, v, attn_mask=keep, candidate=candidate)
    expected_out, expected_lse = _reference(q, k, v, attn_mask=keep)
    assert torch.all(out[1, 3, 0] == 0) and lse[1, 3, 0] == -math.inf
    assert_matches_float64(out, expected_out, reduced=100)


def test_decode_half_inputs_accumulate_in_fp32(emulated_metal):
    q, k, v = _attention_inputs(seq_kv=256, head_dim=64, head_dim_v=64, dtype=torch.float16)
    out, _ = metal_sdpa.sdpa_decode(q, k, v, candidate=SPLIT_KV)
    expected, _ = _reference(q, k, v)
    assert out.dtype == torch.float16 and emulated_metal.names()[0] == "sdpa_decode_split_half"
    assert_matches_float64(out, expected, rtol=1e-3)


@pytest.mark.parametrize("shape_q, shape_kv", [((3, 2, 40), (3, 50, 40)), ((2, 3, 4, 2, 16), (2, 3, 4, 70, 16))],
                         ids=["N-L-E", "leading-dims"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_torch_sdpa_entry_point_matches_float64(emulated_metal, shape_q, shape_kv, is_causal):
    q, k, v = torch.randn(shape_q), torch.randn(shape_kv), torch.randn(shape_kv)
    out = metal_sdpa.scaled_dot_product_attention(q, k, v, is_causal=is_causal, candidate=SPLIT_KV)
    expected = ref_sdpa.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal)
    assert out.shape == expected.shape
    assert_matches_float64(out, expected, reduced=shape_kv[-2])


@pytest.mark.parametrize("batch, heads, seq_kv, tile_n, tile_k, split_k, expected", [
    (1, 32, 4096, 128, 64, 64, 4),     # occupancy: ceil(128 / 32) partitions
    (1, 1, 4096, 128, 64, 64, 64),     # keys: 4096 / 64, clamped to 64
    (1, 1, 300, 128, 64, 64, 4),       # keys: 300 // 64
    (1, 1, 300, 128, 64, 2, 2),        # capped by the candidate's split_k
    (64, 32, 100, 1024, 1024, 16, 1),  # never below one
])
def test_split_kv_partitions_follow_rlx_rule(batch, heads, seq_kv, tile_n, tile_k, split_k, expected):
    assert metal_sdpa.split_kv_partitions(batch, heads, seq_kv, tile_n=tile_n, tile_k=tile_k, pad_kv=1,
                                          split_k=split_k) == expected


@pytest.mark.parametrize("seq_kv", [1, 7, 64, 333, 4096])
def test_split_kv_partitions_cover_every_key_once(seq_kv):
    shape = metal_sdpa.launch_shape(SimpleNamespace(split_k=64, partial_reduce=True, tile_n=128, tile_k=64),
                                    batch=1, num_heads=2, seq_kv=seq_kv)
    covered = [key for p in range(shape.partitions)
               for key in range(p * shape.keys_per_partition, min((p + 1) * shape.keys_per_partition, seq_kv))]
    assert covered == list(range(seq_kv))


# ------------------------------------------------------------------------------------------ fbank

FBANK_OPTION_SETS = {
    "povey-23-defaults": dict(),
    "wespeaker-80-hamming": dict(num_mel_bins=80, window_type="hamming", dither=0.0, input_scale=32768.0),
    "reflect-edges-energy": dict(snip_edges=False, use_energy=True, energy_floor=0.0),
    "htk-magnitude-windowed-energy": dict(use_energy=True, htk_compat=True, use_power=False, raw_energy=False),
    "no-log-no-dc-mean": dict(use_log_fbank=False, remove_dc_offset=False, subtract_mean=True, window_type="blackman"),
    "no-pow2-rounding": dict(round_to_power_of_two=False, window_type="rectangular", preemphasis_coefficient=0.0),
}


@pytest.mark.parametrize("option_set", FBANK_OPTION_SETS)
def test_fbank_matches_float64_kaldi(emulated_metal, option_set):
    options = ref_fbank.FbankOptions(**FBANK_OPTION_SETS[option_set])
    waveform = torch.randn(2, 4003) * 0.1
    features = metal_fbank.fbank(waveform, options, candidate=None)
    expected = ref_fbank.fbank(waveform.double(), options)
    assert emulated_metal.names() == ["fbank_frames_float"]
    assert features.shape == expected.shape
    rtol = 1e-4 if options.use_log_fbank else 1e-5  # the log-mel bound; linear mel in fp32
    assert_matches_float64(features, expected, rtol=rtol, reduced=options.window_size)


# ------------------------------------------------------------------------------------------- conv

def _sincnet_reference(wave, filters, conv_weights, conv_biases, norm_weights, norm_biases):
    h = F.instance_norm(wave, weight=norm_weights[0], bias=norm_biases[0], eps=1e-5)
    h = F.max_pool1d(F.conv1d(h, filters, stride=10).abs(), 3, 3)
    h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[1], bias=norm_biases[1], eps=1e-5), 0.01)
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        h = F.max_pool1d(F.conv1d(h, w, b), 3, 3)
        h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[i + 2], bias=norm_biases[i + 2], eps=1e-5), 0.01)
    return h


def test_sincnet_matches_float64(emulated_metal):
    wave = torch.randn(2, 1, 1601)
    filters = torch.randn(8, 1, 251) * 0.05
    conv_weights = [torch.randn(6, 8, 5) * 0.3, torch.randn(6, 6, 5) * 0.3]
    conv_biases = [torch.randn(6) * 0.1, torch.randn(6) * 0.1]
    norm_weights = [torch.rand(1) + 0.5, torch.rand(8) + 0.5, torch.rand(6) + 0.5, torch.rand(6) + 0.5]
    norm_biases = [torch.randn(1) * 0.1, torch.randn(8) * 0.1, torch.randn(6) * 0.1, torch.randn(6) * 0.1]
    out = metal_conv.sincnet(wave, filters, norm_weights[0], norm_biases[0], conv_weights, conv_biases,
                             norm_weights[1:], norm_biases[1:], candidate=None)
    expected = _sincnet_reference(wave.double(), filters.double(), [w.double() for w in conv_weights],
                                  [b.double() for b in conv_biases], [w.double() for w in norm_weights],
                                  [b.double() for b in norm_biases])
    assert emulated_metal.names() == ["instance_norm_act_float", "conv1d_pool_float", "instance_norm_act_float",
                                      "conv1d_pool_float", "instance_norm_act_float", "conv1d_pool_float",
                                      "instance_norm_act_float"]
    assert out.shape == expected.shape == (2, 6, 3)
    assert_matches_float64(out, expected, rtol=1e-4, reduced=251)  # three instance norms amplify fp32 rounding


@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 3, 1), (3, 1, 2)])
@pytest.mark.parametrize("epilogue", [None, SimpleNamespace(abs=True, pool=3, negative_slope=None),
                                      SimpleNamespace(abs=False, pool=2, negative_slope=0.01)],
                         ids=["plain", "abs-pool3", "pool2-leaky"])
def test_conv1d_with_epilogue_matches_float64(emulated_metal, stride, padding, dilation, epilogue):
    x, w, b = torch.randn(2, 5, 80), torch.randn(7, 5, 4), torch.randn(7)
    out = metal_conv.conv1d(x, w, b, stride, padding, dilation, epilogue=epilogue, candidate=None)
    expected = F.conv1d(x.double(), w.double(), b.double(), stride, padding, dilation)
    if epilogue is not None:
        expected = expected.abs() if epilogue.abs else expected
        expected = F.max_pool1d(expected, epilogue.pool, epilogue.pool)
        if epilogue.negative_slope is not None:
            expected = F.leaky_relu(expected, epilogue.negative_slope)
    assert_matches_float64(out, expected, reduced=20)


# ------------------------------------------------------------------------------------------- lstm

@pytest.mark.parametrize("mode", ["persistent", "stepwise"])
@pytest.mark.parametrize("bidirectional, batch_first, with_state", [(True, True, True), (False, False, False)])
def test_lstm_matches_float64(emulated_metal, mode, bidirectional, batch_first, with_state):
    module = torch.nn.LSTM(6, 9, num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
    directions = 2 if bidirectional else 1
    x = torch.randn(3, 11, 6) if batch_first else torch.randn(11, 3, 6)
    hx = (torch.randn(2 * directions, 3, 9), torch.randn(2 * directions, 3, 9)) if with_state else None
    kwargs = dict(has_biases=True, num_layers=2, dropout=0.0, training=False, bidirectional=bidirectional,
                  batch_first=batch_first)
    out, (h_n, c_n) = metal_lstm.lstm(x, hx, list(module._flat_weights),
                                      candidate=SimpleNamespace(mode=mode, tg_size=64), **kwargs)
    weights64 = [w.detach().double() for w in module._flat_weights]
    hx64 = None if hx is None else tuple(s.double() for s in hx)
    expected, (expected_h, expected_c) = ref_lstm.lstm(x.double(), hx64, weights64, **kwargs)
    per_layer = 2 if mode == "persistent" else 1 + 11
    assert len(emulated_metal) == 2 * per_layer
    for actual, reference in ((out, expected), (h_n, expected_h), (c_n, expected_c)):
        assert_matches_float64(actual, reference, reduced=9)


def test_lstm_unbatched_without_biases_matches_float64(emulated_metal):
    module = torch.nn.LSTM(4, 5, num_layers=1, bias=False)
    x = torch.randn(7, 4)
    kwargs = dict(has_biases=False, num_layers=1, dropout=0.0, training=False, bidirectional=False,
                  batch_first=False)
    out, (h_n, c_n) = metal_lstm.lstm(x, None, list(module._flat_weights), candidate=None, **kwargs)
    expected, (expected_h, _) = ref_lstm.lstm(x.double(), None, [w.detach().double() for w in module._flat_weights],
                                              **kwargs)
    assert out.shape == (7, 5) and h_n.shape == (1, 5)
    assert_matches_float64(out, expected, reduced=5)
    assert_matches_float64(h_n, expected_h, reduced=5)


# --------------------------------------------------------------------------------------- segdense

@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("hidden_layers", [0, 2])
def test_segdense_matches_float64(emulated_metal, activation, hidden_layers):
    widths = [12] + [10] * hidden_layers
    weights = [torch.randn(widths[i + 1], widths[i]) * 0.3 for i in range(hidden_layers)]
    biases = [torch.randn(widths[i + 1]) * 0.1 for i in range(hidden_layers)]
    classifier_w, classifier_b = torch.randn(7, widths[-1]) * 0.3, torch.randn(7) * 0.1
    x = torch.randn(2, 5, 12)
    out = metal_segdense.segdense(x, weights, biases, classifier_w, classifier_b, activation=activation,
                                  candidate=None)
    expected = ref_segdense.segdense(x.double(), [w.double() for w in weights], [b.double() for b in biases],
                                     classifier_w.double(), classifier_b.double(), activation=activation)
    assert emulated_metal.names() == ["segdense_head_float"]
    assert_matches_float64(out, expected, reduced=12)


# ------------------------------------------------------------------------------ candidate sweep

def test_every_plan_candidate_of_every_family_holds_the_approved_bound(emulated_metal):
    """One sweep: every candidate of each family's plan through its launcher, at the approval bound."""
    q, k, v = _attention_inputs(seq_kv=150)
    expected_attention, _ = _reference(q, k, v)
    options = ref_fbank.FbankOptions(num_mel_bins=40)
    wave = torch.randn(1, 1200) * 0.1
    expected_fbank = ref_fbank.fbank(wave.double(), options)
    module = torch.nn.LSTM(5, 6, bidirectional=True)
    lstm_kwargs = dict(has_biases=True, num_layers=1, dropout=0.0, training=False, bidirectional=True,
                       batch_first=False)
    x = torch.randn(4, 2, 5)
    expected_lstm, _ = ref_lstm.lstm(x.double(), None, [w.detach().double() for w in module._flat_weights],
                                     **lstm_kwargs)
    swept = 0
    for candidate in plan_candidates("sdpa_decode"):
        out, _ = metal_sdpa.sdpa_decode(q, k, v, candidate=candidate)
        assert_matches_float64(out, expected_attention, reduced=150)
        swept += 1
    for candidate in plan_candidates("fbank"):
        assert_matches_float64(metal_fbank.fbank(wave, options, candidate=candidate), expected_fbank, rtol=1e-4,
                               reduced=400)
        swept += 1
    for candidate in plan_candidates("lstm"):
        out, _ = metal_lstm.lstm(x, None, list(module._flat_weights), candidate=candidate, **lstm_kwargs)
        assert_matches_float64(out, expected_lstm, reduced=6)
        swept += 1
    signal, taps, conv_bias = torch.randn(1, 3, 50), torch.randn(4, 3, 5), torch.randn(4)
    expected_conv = F.conv1d(signal.double(), taps.double(), conv_bias.double())
    for candidate in plan_candidates("conv"):
        assert_matches_float64(metal_conv.conv1d(signal, taps, conv_bias, candidate=candidate), expected_conv,
                               reduced=15)
        swept += 1
    rows, hidden_w, classifier_w = torch.randn(6, 8), torch.randn(5, 8), torch.randn(3, 5)
    expected_head = ref_segdense.segdense(rows.double(), [hidden_w.double()], [None], classifier_w.double(), None,
                                          activation="log_softmax")
    for candidate in plan_candidates("segdense"):
        head = metal_segdense.segdense(rows, [hidden_w], [None], classifier_w, None, activation="log_softmax",
                                       candidate=candidate)
        assert_matches_float64(head, expected_head, reduced=8)
        swept += 1
    assert swept >= 5, "the planner's candidate modules are missing"
