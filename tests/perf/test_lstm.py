"""The lstm launcher as a launch plan, and the on-chip recurrence as an H200 would run it.

In the interpreter the records are the launches of `reference_launches` below (the kernel calls the
launcher makes, written out by hand) and give the same outputs; `launch_count` states how many there
are. On meta tensors routed as on an H200 the default plan is two launches per layer whose recurrence
spreads each direction over 64 programs, reads W_hh once per layer and compiles without spills; its
estimate is a small fraction of the stepwise recurrence's. On a profile with too few SMs for the
programs to be resident at once the on-chip recurrence is refused with a typed reason and the plan
falls back to the persistent candidate.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import lstm as kernels
from rlx_triton.backends.triton.lstm import kernels as lstm_kernels
from rlx_triton.backends.triton.lstm import launch as lstm_launch
from rlx_triton.backends.triton.lstm import weights as lstm_weights
from rlx_triton.backends.triton.launches import describe_call
from rlx_triton.devices import profile
from rlx_triton.perf import analyse_plan
from rlx_triton.planner import LstmVariant
from rlx_triton.router import Request
from rlx_triton.router.coverage import DEVICE_UNSUPPORTED
from rlx_triton.router.device import device_facts, profile_facts, routing_as

H200 = profile("h200")


def reference_launches(x, flat_weights, *, num_layers, bidirectional, batch_first, candidate):
    """The launcher's kernel calls for a zero initial state, written out (direct calls, no executor)."""
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1]
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    h_n = torch.empty(num_layers * directions, B, hidden)
    c_n = torch.zeros(num_layers * directions, B, hidden)
    h0_all = torch.zeros_like(c_n)
    onchip = candidate.mode == "onchip"
    exchange = lstm_launch.exchange_buffer(h0_all, num_layers, directions, hidden)
    proj = lstm_launch._proj_meta(candidate)
    layer_in = x.float().contiguous()
    for layer in range(num_layers):
        w_ih_cat, w_hh_stack, bias = lstm_weights._layer_weights(flat_weights, True, layer, directions,
                                                                 unit_major=onchip)
        rows, n_cols, in_features = B * T, w_ih_cat.shape[0], layer_in.shape[-1]
        gates = torch.empty(rows, n_cols)
        grid = (triton.cdiv(rows, proj["BLOCK_M"]), triton.cdiv(n_cols, proj["BLOCK_N"]))
        lstm_kernels._lstm_input_proj_kernel[grid](layer_in, w_ih_cat, bias, gates, rows, n_cols, in_features,
                                              in_features, w_ih_cat.stride(0), gates.stride(0),
                                              triton.next_power_of_2(B), triton.next_power_of_2(T),
                                              HAS_BIAS=True, **proj)
        y = torch.empty(*layer_in.shape[:2], directions * hidden)
        strides = (n_cols, T * n_cols, y.stride(1), y.stride(0)) if batch_first else \
            (B * n_cols, n_cols, y.stride(0), y.stride(1))
        sl = slice(layer * directions, (layer + 1) * directions)
        if onchip:   # the interpreter's form: one launch per step, no wait between programs
            meta = lstm_launch._onchip_meta(candidate, hidden)
            rec_grid = (directions, triton.cdiv(hidden, meta["UNITS"]), triton.cdiv(B, meta["BLOCK_B"]))
            for s in range(T):
                lstm_kernels._lstm_onchip_kernel[rec_grid](
                    gates, w_hh_stack, exchange[layer], c_n[sl], y, h_n[sl], T, B, hidden, s, s + 1,
                    *strides, triton.next_power_of_2(B), triton.next_power_of_2(T), SYNC=False, **meta)
        else:
            rec = lstm_launch._rec_meta(candidate)
            rec_grid = (directions, triton.cdiv(B, rec["BLOCK_B"]))
            steps = [(s, s + 1) for s in range(T)] if candidate.mode == "stepwise" else [(0, T)]
            for begin, end in steps:
                lstm_kernels._lstm_recurrence_kernel[rec_grid](gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl], T, B,
                                                          hidden, begin, end, *strides, **rec)
        layer_in = y
    return layer_in, h_n, c_n


def _request(batch, seq, layers, device="cpu", hidden=16):
    fields = {"batch": batch, "seq": seq, "input_size": 3, "hidden": hidden, "layers": layers, "directions": 2,
              "tokens": seq}
    return Request.make("lstm", "lstm", device=device, dtype=torch.float32, fields=fields)


VARIANTS = [LstmVariant.ONCHIP_IEEE, LstmVariant.STEPWISE_IEEE, LstmVariant.PERSISTENT_IEEE]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch-first", "seq-first"])
def test_the_records_are_the_launchers_kernel_calls_and_give_its_outputs(variant, batch_first):
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


def _pyannote_plan(candidate, **options):
    """The 4-layer stack at 32 x 589 frames, planned on meta tensors."""
    module = torch.nn.LSTM(60, 128, 4, bidirectional=True, batch_first=True).to("meta")
    x = torch.empty(32, 589, 60, device="meta")
    return kernels.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=4, dropout=0.0,
                             training=False, bidirectional=True, batch_first=True, candidate=candidate, **options)


@pytest.mark.parametrize("variant", [LstmVariant.STEPWISE_IEEE, LstmVariant.PERSISTENT_IEEE], ids=lambda v: v.name)
def test_a_plan_builds_from_meta_tensors_at_the_pyannote_shape(variant):
    """Nothing is allocated; bytes and FLOPs by hand."""
    candidate = variant.candidate()
    plan, (y, h_n, c_n) = _pyannote_plan(candidate)
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
    onchip = LstmVariant.ONCHIP_IEEE.candidate()
    assert kernels.launch_count(_request(32, 589, 4), stepwise) == 4 * (1 + 589)
    assert kernels.launch_count(_request(32, 589, 4), persistent) == 4 * 2
    # the interpreter runs a group of several programs one launch per step, a single program in one launch
    assert kernels.launch_count(_request(32, 589, 4, hidden=128), onchip) == 4 * (1 + 589)
    assert kernels.launch_count(_request(32, 589, 4, hidden=4), onchip) == 4 * 2
    with routing_as(H200):     # a CUDA device: one synchronised launch per layer
        assert kernels.launch_count(_request(32, 589, 4, device="meta", hidden=128), onchip) == 4 * 2


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("perf-cache"))


@pytest.fixture(scope="module")
def h200_default_plan():
    with routing_as(H200):
        plan, _ = _pyannote_plan(LstmVariant.ONCHIP_IEEE.candidate())
    return plan


def test_as_on_an_h200_the_default_is_two_launches_per_layer(h200_default_plan):
    names = [r.name for r in h200_default_plan]
    assert names == ["_lstm_input_proj_kernel", "_lstm_onchip_kernel"] * 4
    recurrence = h200_default_plan[1]
    named = dict(zip(lstm_kernels._lstm_onchip_kernel.arg_names, recurrence.args))
    assert recurrence.meta["SYNC"] and (named["step_begin"], named["step_end"]) == (0, 589)
    # 2 directions x 32 programs of 4 hidden units x 2 batch tiles: 64 programs per direction
    assert recurrence.grid == (2, 32, 2) and recurrence.ctas == 128
    w_hh = 2 * 512 * 128 * 4
    assert w_hh <= recurrence.bytes_read < 2 * w_hh + 589 * 32 * 1024 * 4 + 4 * 32 * 128 * 4 * 2


def test_the_recurrence_compiles_without_spills_and_estimates_under_a_third_of_stepwise(h200_default_plan,
                                                                                           cache_dir):
    onchip = analyse_plan(h200_default_plan[1:2], H200, cache_dir=cache_dir)[0]
    assert onchip.spills == 0 and onchip.ctas == 128 and onchip.ctas_per_sm >= 1
    with routing_as(H200):
        stepwise_plan, _ = _pyannote_plan(LstmVariant.STEPWISE_IEEE.candidate())
    one_layer = [r for r in stepwise_plan if r.name == "_lstm_recurrence_kernel"][:589]
    stepwise_us = sum(k.est_us for k in analyse_plan(one_layer, H200, cache_dir=cache_dir))
    assert onchip.est_us <= stepwise_us / 3


def test_a_device_with_too_few_sms_refuses_the_onchip_recurrence_and_runs_persistent():
    """A profile with 4 SMs holds at most a few dozen of the 128 programs: a program could wait for the h of one
    that cannot start, so the launcher refuses it (typed) and plans the persistent candidate."""
    tiny = dataclasses.replace(H200, key="h200-4sm", name="NVIDIA H200 (4 SMs enabled)", sm_count=4)
    facts = profile_facts(tiny)
    with routing_as(H200):
        plan, _ = _pyannote_plan(LstmVariant.ONCHIP_IEEE.candidate())
        assert kernels.co_residency_refusal(plan[1], device_facts("meta")) is None
    with routing_as(facts):
        refusal = kernels.co_residency_refusal(plan[1], device_facts("meta"))
        fallback, _ = _pyannote_plan(LstmVariant.ONCHIP_IEEE.candidate())
        stated = kernels.launch_count(_request(32, 589, 4, device="meta", hidden=128),
                                      LstmVariant.ONCHIP_IEEE.candidate())
    assert refusal is not None and refusal.kind == DEVICE_UNSUPPORTED
    assert "128 programs" in refusal.reason and "4 SMs" in refusal.reason
    assert [r.name for r in fallback] == ["_lstm_input_proj_kernel", "_lstm_recurrence_kernel"] * 4
    assert kernels.fallback_candidate(LstmVariant.ONCHIP_IEEE.candidate()) == LstmVariant.PERSISTENT_IEEE.candidate()
    assert stated == len(fallback)


def test_tuning_benchmarks_only_the_configurations_whose_programs_can_all_be_resident():
    """The autotuner's prune: on an H200 every on-chip configuration is kept, on 4 SMs none is (the
    routed candidate was refused before any launch, so the tuner is never asked there)."""
    tuned = kernels.tuned_kernels()["recurrence"]
    with routing_as(H200):
        plan, _ = _pyannote_plan(LstmVariant.ONCHIP_IEEE.candidate())
    record = plan[1]
    named = dict(zip(lstm_kernels._lstm_onchip_kernel.arg_names, record.args))
    flags = {key: record.meta[key] for key in ("BLOCK_K", "SYNC")}
    with routing_as(H200):
        assert lstm_launch._resident_configs(tuned.configs, named, **flags) == tuned.configs
    tiny = dataclasses.replace(H200, key="h200-4sm", name="NVIDIA H200 (4 SMs enabled)", sm_count=4)
    with routing_as(profile_facts(tiny)):
        assert lstm_launch._resident_configs(tuned.configs, named, **flags) == []
