"""The Triton LSTM kernels against a float64 LSTM, in the interpreter (tiny shapes).

Specification: for every covered configuration (layers, direction, layout, given or zero state,
odd hidden sizes and sequence lengths) `backends.triton.lstm.lstm` returns nn.LSTM's
(output, (h_n, c_n)) within the fp32 tolerance; the persistent and stepwise modes agree; every
approval in APPROVALS holds when re-measured; every candidate of the plan runs (one sweep).
"""
from __future__ import annotations

import pytest
import torch

from rlx_triton.backends.triton import lstm as tk
from rlx_triton.planner import LstmVariant
from tests.reference.lstm import LSTM_DEGENERATE_CASES, check_lstm_degenerate_case, lstm_float64

TOL = 1e-5


def candidate(mode="persistent", precision="ieee", batch_tile=16, hidden_tile=32):
    return tk.make_candidate(batch_tile=batch_tile, hidden_tile=hidden_tile, tg_size=128, stages=1, mode=mode,
                             precision=precision)


def run(module: torch.nn.LSTM, x, hx=None, cand=None):
    return tk.lstm(x, hx, module._flat_weights, has_biases=module.bias, num_layers=module.num_layers,
                   dropout=0.0, training=False, bidirectional=module.bidirectional,
                   batch_first=module.batch_first, candidate=cand or candidate())


def max_rel_err(got, ref) -> float:
    """Largest |got - ref| relative to the reference's scale (at least 1: LSTM outputs lie in (-1, 1))."""
    out, (h, c) = got
    ref_out, (ref_h, ref_c) = ref
    err = 0.0
    for a, b in ((out, ref_out), (h, ref_h), (c, ref_c)):
        err = max(err, ((a.double() - b).abs() / b.abs().clamp_min(1.0)).max().item())
    return err


def check(module, x, hx=None, cand=None, tol=TOL):
    got = run(module, x, hx, cand)
    ref = lstm_float64(x, module._flat_weights, num_layers=module.num_layers, bidirectional=module.bidirectional,
                       batch_first=module.batch_first, has_biases=module.bias, hx=hx)
    assert got[0].shape == ref[0].shape and got[1][0].shape == ref[1][0].shape
    assert max_rel_err(got, ref) <= tol
    return got


def make(input_size, hidden, layers=1, bidirectional=False, batch_first=False, bias=True):
    return torch.nn.LSTM(input_size, hidden, layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias)


def inputs(module, batch, seq, with_state):
    shape = (batch, seq, module.input_size) if module.batch_first else (seq, batch, module.input_size)
    x = torch.randn(shape)
    states = module.num_layers * (2 if module.bidirectional else 1)
    hx = (torch.randn(states, batch, module.hidden_size), torch.randn(states, batch, module.hidden_size)) \
        if with_state else None
    return x, hx


@pytest.mark.parametrize("hidden", [7, 16, 33])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)], ids=["1layer-uni", "2layers-bi"])
def test_matches_float64_for_odd_hidden_sizes(hidden, layers, bidirectional):
    module = make(5, hidden, layers, bidirectional)
    x, hx = inputs(module, batch=3, seq=5, with_state=False)
    check(module, x, hx)


@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_layouts_and_initial_state(batch_first, with_state):
    module = make(4, 16, 2, bidirectional=True, batch_first=batch_first)
    x, hx = inputs(module, batch=2, seq=3, with_state=with_state)
    check(module, x, hx)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_stepwise_mode_equals_persistent_mode(bidirectional):
    module = make(3, 16, 1, bidirectional)
    x, hx = inputs(module, batch=2, seq=4, with_state=True)
    persistent = check(module, x, hx, candidate("persistent"))
    stepwise = check(module, x, hx, candidate("stepwise"))
    torch.testing.assert_close(persistent[0], stepwise[0], rtol=0, atol=0)


def test_batch_larger_than_one_tile_and_single_step():
    module = make(6, 16, 1, False)
    x, hx = inputs(module, batch=17, seq=1, with_state=True)
    check(module, x, hx)


def test_hidden_wider_than_one_tile_and_no_biases():
    module = make(2, 40, 1, True, bias=False)
    x, hx = inputs(module, batch=2, seq=3, with_state=False)
    check(module, x, hx, candidate(hidden_tile=16))


@pytest.mark.slow
def test_widest_covered_hidden_size():
    module = make(3, tk.MAX_HIDDEN, 1, False)
    x, hx = inputs(module, batch=2, seq=2, with_state=False)
    check(module, x, hx, tk.make_candidate(batch_tile=16, hidden_tile=128, tg_size=256, mode="persistent"))


def test_unbatched_input():
    module = make(3, 8, 1, True)
    x = torch.randn(4, 3)
    out, (h, c) = run(module, x)
    ref_out, (ref_h, ref_c) = module(x)
    torch.testing.assert_close(out, ref_out, rtol=TOL, atol=TOL)
    torch.testing.assert_close(h, ref_h, rtol=TOL, atol=TOL)
    assert out.shape == (4, 16) and h.shape == (2, 8)


def test_every_approval_holds_when_remeasured():
    """The claim behind each APPROVALS entry: its candidate's max relative error stays within the bound."""
    by_tag = {v.candidate().tag(): v.candidate() for v in LstmVariant}
    assert tk.APPROVALS, "the Triton LSTM has approved candidates"
    module = make(5, 16, 2, bidirectional=True, batch_first=True)
    x, hx = inputs(module, batch=2, seq=3, with_state=True)
    ref = lstm_float64(x, module._flat_weights, num_layers=2, bidirectional=True, batch_first=True, hx=hx)
    for tag, approval in tk.APPROVALS.items():
        assert max_rel_err(run(module, x, hx, by_tag[tag]), ref) <= approval.max_rel_err, tag


def test_sweep_every_candidate_of_the_plan():
    module = make(5, 16, 1, bidirectional=True)
    x, hx = inputs(module, batch=3, seq=3, with_state=True)
    for variant in LstmVariant:
        cand = variant.candidate()
        tol = TOL if cand.precision == "ieee" else (2e-5 if cand.precision == "tf32x3" else 1e-3)
        check(module, x, hx, cand, tol=tol)


def test_coverage_refuses_what_the_kernel_does_not_implement():
    fields = {"batch": 2, "seq": 3, "input_size": 4, "hidden": 16, "layers": 1, "directions": 2, "tokens": 3}
    ok = {"dropout_active": False, "proj_size": 0, "packed": False, "has_biases": True, "batch_first": True,
          "requires_grad": False}
    assert tk.COVERAGE.check("lstm", "cuda", "float32", fields, ok) is None
    assert tk.COVERAGE.check("lstm", "cuda", "float32", {**fields, "hidden": 513}, ok).field == "hidden"
    for name, value in (("dropout_active", True), ("proj_size", 4), ("packed", True), ("requires_grad", True)):
        assert tk.COVERAGE.check("lstm", "cuda", "float32", fields, {**ok, name: value}) is not None
    assert tk.COVERAGE.check("lstm", "cuda", "float16", fields, ok) is not None


def test_audit_specs_cover_every_candidate():
    names = {spec.name for spec in tk.AUDIT_KERNELS}
    assert names == {"lstm_input_proj", "lstm_recurrence"}
    for spec in tk.AUDIT_KERNELS:
        assert {c.tag() for c in spec.candidates} == {v.candidate().tag() for v in LstmVariant}
        meta = spec.meta(spec.default, "fp32")
        assert all(meta[k] >= 16 for k in meta if k.startswith("BLOCK_"))


@pytest.mark.gpu
def test_pyannote_shape_on_cuda_matches_float64_for_every_approved_candidate():
    """segmentation-3.0's stack (batch 32, 589 steps, input 60, hidden 128, 4 layers, bi) on the GPU."""
    device = torch.device("cuda")
    module = make(60, 128, 4, bidirectional=True, batch_first=True).to(device).eval()
    x = torch.randn(32, 589, 60, device=device)
    with torch.no_grad():
        ref = module.double()(x.double())
        module.float()
        by_tag = {v.candidate().tag(): v.candidate() for v in LstmVariant}
        for tag in tk.APPROVALS:
            out, (h, c) = run(module, x, cand=by_tag[tag])
            torch.cuda.synchronize()
            for got, want in ((out, ref[0]), (h, ref[1][0]), (c, ref[1][1])):
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=tag)


@pytest.mark.parametrize("mode", ["persistent", "stepwise"])
@pytest.mark.parametrize("case", list(LSTM_DEGENERATE_CASES))
def test_degenerate_inputs_match_float64(case, mode):
    """Zeros, constants, one step, NaN/Inf in the input or state: NaN spreads through the recurrence
    exactly as in nn.LSTM, Inf saturates the gates, values match elsewhere."""
    check_lstm_degenerate_case(lambda module, x, hx: run(module, x, hx, candidate(mode=mode)), case, rtol=TOL)
