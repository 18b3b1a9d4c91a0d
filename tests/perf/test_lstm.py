"""The lstm launcher as a launch plan: its records are the launches the launcher made before it had a
plan (the kernels, grids, specialisation and options of `reference_launches` below), running them gives
the same outputs, and `launch_count` states how many there are."""
from __future__ import annotations

import pytest
import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import lstm as kernels
from rlx_triton.backends.triton.launches import describe_call
from rlx_triton.planner import LstmVariant
from rlx_triton.router import Request


def reference_launches(x, flat_weights, *, num_layers, bidirectional, batch_first, candidate):
    """The launches of the launcher as it was written before launch plans (direct kernel calls, zero state)."""
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1]
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    h_n = torch.empty(num_layers * directions, B, hidden)
    c_n = torch.zeros(num_layers * directions, B, hidden)
    h0_all = torch.zeros_like(c_n)
    proj, rec = kernels._proj_meta(candidate), kernels._rec_meta(candidate)
    layer_in = x.float().contiguous()
    for layer in range(num_layers):
        w_ih_cat, w_hh_stack, bias = kernels._layer_weights(flat_weights, True, layer, directions)
        rows, n_cols, in_features = B * T, w_ih_cat.shape[0], layer_in.shape[-1]
        gates = torch.empty(rows, n_cols)
        grid = (triton.cdiv(rows, proj["BLOCK_M"]), triton.cdiv(n_cols, proj["BLOCK_N"]))
        kernels._lstm_input_proj_kernel[grid](layer_in, w_ih_cat, bias, gates, rows, n_cols, in_features,
                                              in_features, w_ih_cat.stride(0), gates.stride(0), HAS_BIAS=True, **proj)
        y = torch.empty(*layer_in.shape[:2], directions * hidden)
        strides = (n_cols, T * n_cols, y.stride(1), y.stride(0)) if batch_first else \
            (B * n_cols, n_cols, y.stride(0), y.stride(1))
        sl = slice(layer * directions, (layer + 1) * directions)
        args = (gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl], T, B, hidden)
        rec_grid = (directions, triton.cdiv(B, rec["BLOCK_B"]))
        steps = [(s, s + 1) for s in range(T)] if candidate.mode == "stepwise" else [(0, T)]
        for begin, end in steps:
            kernels._lstm_recurrence_kernel[rec_grid](*args, begin, end, *strides, **rec)
        layer_in = y
    return layer_in, h_n, c_n


def _request(batch, seq, layers):
    fields = {"batch": batch, "seq": seq, "input_size": 3, "hidden": 16, "layers": layers, "directions": 2,
              "tokens": seq}
    return Request.make("lstm", "lstm", device="cpu", dtype=torch.float32, fields=fields)


@pytest.mark.parametrize("variant", [LstmVariant.STEPWISE_IEEE, LstmVariant.PERSISTENT_IEEE], ids=lambda v: v.name)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "seq-first"])
def test_the_records_are_the_launches_the_launcher_made_and_give_its_outputs(variant, batch_first):
    candidate = variant.candidate()
    module = torch.nn.LSTM(3, 16, 2, bidirectional=True, batch_first=batch_first)
    x = torch.randn((2, 3, 3) if batch_first else (3, 2, 3))
    with launches.recording() as before:
        expected = reference_launches(x, module._flat_weights, num_layers=2, bidirectional=True,
                                      batch_first=batch_first, candidate=candidate)
    with launches.recording() as planned:
        out, (h_n, c_n) = kernels.lstm(x, None, module._flat_weights, has_biases=True, num_layers=2, dropout=0.0,
                                       training=False, bidirectional=True, batch_first=batch_first,
                                       candidate=candidate)
    assert planned.outside == [] and len(planned.records) == len(before.bypassing_calls)
    assert [r.describe() for r in planned.records] == [describe_call(*call) for call in before.bypassing_calls]
    for got, want in ((out, expected[0]), (h_n, expected[1]), (c_n, expected[2])):
        assert torch.equal(got, want)
    assert kernels.launch_count(_request(2, 3, 2), candidate) == len(planned.records)


@pytest.mark.parametrize("variant", [LstmVariant.STEPWISE_IEEE, LstmVariant.PERSISTENT_IEEE], ids=lambda v: v.name)
def test_a_plan_builds_from_meta_tensors_at_the_pyannote_shape(variant):
    """32 x 589 frames, 4 bidirectional layers of 128: nothing is allocated; bytes and FLOPs by hand."""
    candidate = variant.candidate()
    module = torch.nn.LSTM(60, 128, 4, bidirectional=True, batch_first=True).to("meta")
    x = torch.empty(32, 589, 60, device="meta")
    plan, (y, h_n, c_n) = kernels.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=4,
                                            dropout=0.0, training=False, bidirectional=True, batch_first=True,
                                            candidate=candidate)
    assert y.shape == (32, 589, 256) and y.device.type == "meta" and h_n.shape == c_n.shape == (8, 32, 128)
    assert len(plan) == kernels.launch_count(_request(32, 589, 4), candidate)
    proj = plan[0]
    rows = 32 * 589
    assert proj.flops == 2 * rows * 1024 * 60 and proj.bytes_written == rows * 1024 * 4
    recurrences = [r for r in plan if r.name == "_lstm_recurrence_kernel"]
    assert sum(r.flops for r in recurrences) == 4 * 2 * 32 * 589 * 2 * 512 * 128
    assert all(r.grid == (2, 2) for r in recurrences)          # 2 directions x 2 batch tiles of 16
    assert all(r.bytes_read >= 2 * 512 * 128 * 4 for r in recurrences)   # every launch reads both W_hh


def test_launch_count_of_each_mode():
    stepwise, persistent = LstmVariant.STEPWISE_IEEE.candidate(), LstmVariant.PERSISTENT_IEEE.candidate()
    assert kernels.launch_count(_request(32, 589, 4), stepwise) == 4 * (1 + 589)
    assert kernels.launch_count(_request(32, 589, 4), persistent) == 4 * 2
