"""The Triton LSTM kernels against a float64 LSTM, in the interpreter (tiny shapes).

Specification: for every covered configuration (layers, direction, layout, given or zero state,
odd hidden sizes and sequence lengths) `backends.triton.lstm.lstm` returns nn.LSTM's
(output, (h_n, c_n)) within the fp32 tolerance in every mode: the on-chip recurrence (hidden units
split across programs; in the interpreter, whose programs run one after another, one launch per step,
or one launch when a single program holds all units), persistent and stepwise; the modes agree; the
recurrent tf32x3 product stays within its approval over 589 steps without growing, and where its warps split
K; an infinite or NaN input or h0 meets the tf32x3 products as nn.LSTM's fp32 ones; weights are packed once
per version; every approval in APPROVALS holds when re-measured; every candidate of the plan runs (one
sweep). Compiled for sm_80 and sm_90 (no GPU needed): a synchronised step meets two CTA barriers (four where
the product's warps split K) and each thread waits for its own exchange words without one. On a GPU: the exchange protocol itself, and the synchronised
launch against the step launches.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import lstm as tk
from rlx_triton.backends.triton.lstm import kernels as tk_kernels
from rlx_triton.backends.triton.lstm import launch as tk_launch
from rlx_triton.backends.triton.lstm import weights as tk_weights
from rlx_triton.planner import LstmVariant
from tests.reference.lstm import LSTM_DEGENERATE_CASES, check_lstm_degenerate_case, lstm_float64

TOL = 1e-5
MODES = ["onchip", "persistent", "stepwise"]


def candidate(mode="onchip", precision="ieee", batch_tile=16, hidden_tile=None):
    if hidden_tile is None:
        hidden_tile = 8 if mode == "onchip" else 32
    return tk.make_candidate(batch_tile=batch_tile, hidden_tile=hidden_tile, tg_size=128, stages=1, mode=mode,
                             precision=precision)


def run(module: torch.nn.LSTM, x, hx=None, cand=None, **options):
    return tk.lstm(x, hx, module._flat_weights, has_biases=module.bias, num_layers=module.num_layers,
                   dropout=0.0, training=False, bidirectional=module.bidirectional,
                   batch_first=module.batch_first, candidate=cand or candidate(), **options)


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hidden", [7, 16, 33])
@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)], ids=["1layer-uni", "2layers-bi"])
def test_matches_float64_for_odd_hidden_sizes(hidden, layers, bidirectional, mode):
    module = make(5, hidden, layers, bidirectional)
    x, hx = inputs(module, batch=3, seq=5, with_state=False)
    check(module, x, hx, candidate(mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_layouts_and_initial_state(batch_first, with_state, mode):
    module = make(4, 16, 2, bidirectional=True, batch_first=batch_first)
    x, hx = inputs(module, batch=2, seq=3, with_state=with_state)
    check(module, x, hx, candidate(mode))


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_stepwise_mode_equals_persistent_mode(bidirectional):
    module = make(3, 16, 1, bidirectional)
    x, hx = inputs(module, batch=2, seq=4, with_state=True)
    persistent = check(module, x, hx, candidate("persistent"))
    stepwise = check(module, x, hx, candidate("stepwise"))
    torch.testing.assert_close(persistent[0], stepwise[0], rtol=0, atol=0)


@pytest.mark.parametrize("mode", MODES)
def test_batch_larger_than_one_tile_and_single_step(mode):
    module = make(6, 16, 1, False)
    x, hx = inputs(module, batch=17, seq=1, with_state=True)
    check(module, x, hx, candidate(mode))


@pytest.mark.parametrize("mode, hidden_tile", [("onchip", 16), ("persistent", 16), ("stepwise", 16), ("onchip", 4)])
def test_hidden_wider_than_one_tile_and_no_biases(mode, hidden_tile):
    module = make(2, 40, 1, True, bias=False)
    x, hx = inputs(module, batch=2, seq=3, with_state=False)
    check(module, x, hx, candidate(mode, hidden_tile=hidden_tile))


# ------------------------------------------------------------------------ the on-chip recurrence
def _onchip_records(module, x, hx=None, **options):
    with launches.recording() as log:
        got = run(module, x, hx, candidate("onchip"), **options)
    return got, [r for r in log.records if r.name == "_lstm_onchip_kernel"]


@pytest.mark.parametrize("hidden, parts", [(7, 1), (16, 2), (33, 5)])
def test_onchip_programs_split_the_hidden_units_of_each_direction(hidden, parts):
    """8 units per program: a (direction, batch tile) group has cdiv(hidden, 8) programs, each owning its units."""
    module = make(3, hidden, 1, True)
    x, hx = inputs(module, batch=18, seq=4, with_state=True)
    got, records = _onchip_records(module, x, hx)
    assert {r.grid for r in records} == {(2, parts, 2)}                # directions, parts, batch tiles of 16
    ref = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True, batch_first=False, hx=hx)
    assert max_rel_err(got, ref) <= TOL


def _steps(record):
    named = dict(zip(tk_kernels._lstm_onchip_kernel.arg_names, record.args))
    return named["step_begin"], named["step_end"]


def test_onchip_runs_one_launch_per_step_where_programs_run_one_after_another():
    """The interpreter runs programs one after another, so a group of several programs cannot meet at a
    barrier: each step is a launch (no barrier); a group of one program runs all steps in one launch, reading
    each step's h once (the interpreter completes a step's every operation before the next step's)."""
    split, single = make(3, 16, 2, True), make(3, 8, 2, True)
    x, _ = inputs(split, batch=2, seq=5, with_state=False)
    _, records = _onchip_records(split, x)
    assert len(records) == 2 * 5 and not any(r.meta["SYNC"] for r in records)
    assert [_steps(r) for r in records[:5]] == [(s, s + 1) for s in range(5)]
    _, records = _onchip_records(single, x)
    assert len(records) == 2 and not any(r.meta["SYNC"] for r in records)
    assert [_steps(r) for r in records] == [(0, 5), (0, 5)]


def test_the_exchange_starts_with_h0_in_slot_1_padding_tagged_apart():
    """h0's fp32 bits tagged 1 in slot 1, tag 0 in slot 0 (no step reads it), the batch padded to EXCHANGE_ROWS
    rows (0.0, tagged like their slot) and the columns past the hidden size tagged PAD_TAG in both slots."""
    h0 = torch.randn(2 * 2, 3, 5)     # 2 layers x 2 directions, batch 3, hidden 5
    exchange = tk_launch.exchange_buffer(h0, num_layers=2, directions=2, hidden=5)
    assert exchange.shape == (2, 2, 2, tk_kernels.EXCHANGE_ROWS, 16) and exchange.dtype == torch.int64
    tags, bits = exchange >> 32, (exchange & 0xFFFFFFFF).to(torch.int32)
    assert (tags[:, :, 0, :, :5] == 0).all() and (tags[:, :, 1, :, :5] == tk_launch.FIRST_READ_TAG).all()
    assert (tags[..., 5:] == tk_kernels.PAD_TAG).all() and (bits[..., 5:] == 0).all()
    assert torch.equal(bits[:, :, 1, :3, :5].view(torch.float32), h0.reshape(2, 2, 3, 5))
    assert (bits[:, :, 1, 3:, :5] == 0).all() and (bits[:, :, 0] == 0).all()


def test_a_step_launch_reads_a_word_older_than_its_step_as_nan():
    """One launch per step checks the tags too: a word left from an older step (here h0's word of one row,
    tagged 0) makes that row's outputs NaN and leaves the other rows' values as nn.LSTM's."""
    module = make(3, 16, 1, True)
    x, _ = inputs(module, batch=3, seq=4, with_state=False)
    plan, (out, _h, _c) = tk.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=1, dropout=0.0,
                                      training=False, bidirectional=True, batch_first=False,
                                      candidate=candidate("onchip"), step_launches=True)
    named = dict(zip(tk_kernels._lstm_onchip_kernel.arg_names, plan[1].args))
    exchange = named["xchg_ptr"]
    exchange[0, 1, 1, :16] = 0          # forward direction, slot 1, batch row 1: tag 0, not 1
    launches.run(plan)
    ref, _ = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True, batch_first=False)
    assert out[:, 1, :16].isnan().all()                      # forward outputs of row 1, from step 0 on
    rows = [0, 2]
    torch.testing.assert_close(out[:, rows].double(), ref[:, rows], rtol=TOL, atol=TOL)
    torch.testing.assert_close(out[:, 1, 16:].double(), ref[:, 1, 16:], rtol=TOL, atol=TOL)   # its reverse half


def test_the_synchronised_launch_is_cooperative_where_programs_wait_for_each_other():
    """A barrier between programs needs them all resident: that launch asks the driver for a cooperative
    grid; step launches and groups of one program wait for no other program and launch plainly."""
    split, single = make(3, 16, 2, True), make(3, 8, 2, True)
    x, _ = inputs(split, batch=2, seq=5, with_state=False)

    def plan(module, **options):
        return tk.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=2, dropout=0.0,
                            training=False, bidirectional=True, batch_first=False, candidate=candidate("onchip"),
                            **options)[0]

    synchronised = plan(split, step_launches=False)
    assert [r.cooperative for r in synchronised] == [False, True, False, True]     # projection, recurrence
    assert not any(r.cooperative for r in plan(split))                      # the interpreter's step launches
    assert not any(r.cooperative for r in plan(single, step_launches=False))


def _tiny_gpu():
    """An H200 profile with one SM: 24 programs that must wait for each other cannot all be resident."""
    import dataclasses

    from rlx_triton.devices import profile
    from rlx_triton.router.device import profile_facts

    return profile_facts(dataclasses.replace(profile("h200"), key="h200-1sm", name="NVIDIA H200 (1 SM enabled)",
                                             sm_count=1))


def _meta_call():
    """A bidirectional layer of 32 units (4 programs of 8) at batch 48 (3 batch tiles): 24 programs, on meta
    tensors (planned as on a GPU profile, nothing runs)."""
    module = make(3, 32, 1, True, batch_first=True).to("meta").requires_grad_(False)
    options = dict(has_biases=True, num_layers=1, dropout=0.0, training=False, bidirectional=True, batch_first=True)
    return torch.empty(48, 5, 3, device="meta"), module._flat_weights, options


def _compiled_like_an_h200(monkeypatch):
    """The compiled kernel's resources as an H200 compile of this configuration reports them (what the
    co-residency check reads; compiling it here would take half a minute)."""
    monkeypatch.setattr(tk_launch, "_compiled_resources", lambda record, facts: (128, 0, 4))


def test_a_refused_onchip_recurrence_warns_once_and_explain_says_which_path_runs_and_why(monkeypatch):
    from rlx_triton.ops import lstm as lstm_op
    from rlx_triton.router import explain
    from rlx_triton.router.device import routing_as

    monkeypatch.setattr(tk_launch, "_WARNED", set())
    _compiled_like_an_h200(monkeypatch)
    x, weights, options = _meta_call()
    with routing_as(_tiny_gpu()), launches.recording(execute=False) as log:
        with pytest.warns(RuntimeWarning, match=r"cannot run synchronised on NVIDIA H200 \(1 SM enabled\): 24 "
                                                r"programs") as caught:
            for _ in range(2):
                tk.lstm(x, None, weights, candidate=candidate("onchip"), **options)
        route = explain(lstm_op.lstm, x, None, weights, **options)
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1
    assert [r.name for r in log.records] == ["_lstm_input_proj_kernel", "_lstm_recurrence_kernel"] * 2
    # explain plans the routed candidate (the recipe's 4 units per program: twice the programs of the 8-unit call)
    assert route.execution.startswith("persistent fallback") and "48 programs" in route.execution
    assert "runs       persistent fallback" in str(route)


def test_a_cooperative_launch_the_driver_refuses_falls_back_with_one_warning_and_is_not_retried(monkeypatch):
    from rlx_triton.devices import profile
    from rlx_triton.router.device import routing_as

    monkeypatch.setattr(tk_launch, "_WARNED", set())
    monkeypatch.setattr(tk_launch, "_REFUSED_LAUNCHES", {})

    def driver(record):   # a GPU whose SMs are partly taken (another stream, MPS, a green context)
        if record.cooperative:
            raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")

    monkeypatch.setattr(launches, "_launch", driver)
    _compiled_like_an_h200(monkeypatch)
    x, weights, options = _meta_call()
    with routing_as(profile("h200")), launches.recording() as log:
        with pytest.warns(RuntimeWarning, match="driver refused the cooperative launch of 24 programs") as caught:
            for _ in range(2):
                tk.lstm(x, None, weights, candidate=candidate("onchip"), **options)
    assert len([w for w in caught if w.category is RuntimeWarning]) == 1
    assert [r.name for r in log.records] == ["_lstm_input_proj_kernel", "_lstm_onchip_kernel"] + \
        ["_lstm_input_proj_kernel", "_lstm_recurrence_kernel"] * 2


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
def test_onchip_one_synchronised_launch_equals_the_step_launches(with_state):
    """The same arithmetic either way: one launch over every step (barrier each step) and one launch per
    step (the cell state and W_hh reloaded per launch) give identical bits."""
    module = make(4, 8, 2, True, batch_first=True)
    x, hx = inputs(module, batch=3, seq=6, with_state=with_state)
    synchronised = run(module, x, hx, candidate("onchip"), step_launches=False)
    stepped = run(module, x, hx, candidate("onchip"), step_launches=True)
    for a, b in ((synchronised[0], stepped[0]), (synchronised[1][0], stepped[1][0]), (synchronised[1][1], stepped[1][1])):
        assert torch.equal(a, b)


def test_onchip_equals_the_persistent_recurrence():
    module = make(5, 16, 2, True, batch_first=True)
    x, hx = inputs(module, batch=2, seq=4, with_state=True)
    onchip = check(module, x, hx, candidate("onchip"))
    persistent = check(module, x, hx, candidate("persistent"))
    torch.testing.assert_close(onchip[0], persistent[0], rtol=2e-6, atol=2e-6)


def test_recurrent_tf32x3_product_stays_within_its_approval_over_589_steps():
    """pyannote's sequence length: the error of the tf32x3 candidate against float64, step by step, stays
    within the approved bound and does not grow from the first quarter of the sequence to the last.
    (tf32x3 is written out as tf32 products of the operands' tf32 parts, so the interpreter rounds as the
    GPU does; one program holds all 32 units: one launch over the 589 steps.)"""
    approved = tk.APPROVALS[LstmVariant.ONCHIP_TF32X3.candidate().tag()].max_rel_err
    module = make(8, 32, 1, False, batch_first=True)
    x, _ = inputs(module, batch=4, seq=589, with_state=False)
    out, (h, c) = run(module, x, cand=candidate("onchip", "tf32x3", hidden_tile=32))
    ref_out, (_, ref_c) = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=False, batch_first=True)
    per_step = (out.double() - ref_out).abs().amax(dim=(0, 2))     # outputs lie in (-1, 1): absolute = relative
    quarter = 589 // 4
    assert per_step.max() <= approved and (c.double() - ref_c).abs().max() <= approved
    assert per_step[-quarter:].max() <= 2 * per_step[:quarter].max() + 1e-7


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "given-state"])
@pytest.mark.parametrize("hidden", [80, 128])
def test_the_routed_tensor_core_product_splits_k_within_its_approval(hidden, with_state):
    """The routed candidate (16 gate columns a program, eight warps) at a hidden size past FMA_PRODUCT_MAX_K:
    its tf32x3 recurrent product splits K in four slices across the warps; with and without a state (the split
    of h that keeps infinities, and the one that need not), within the approved bound of float64."""
    cand = LstmVariant.ONCHIP_TF32X3.candidate()
    assert _splits_k(cand.tg_size // 32, hidden)
    module = make(6, hidden, 1, bidirectional=True, batch_first=True)
    x, hx = inputs(module, batch=3, seq=3, with_state=with_state)
    ref = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True, batch_first=True, hx=hx)
    assert max_rel_err(run(module, x, hx, cand), ref) <= tk.APPROVALS[cand.tag()].max_rel_err


@pytest.mark.parametrize("signal", ["silence", "constant"])
def test_the_split_product_on_inference_tensors_with_silence_or_constant_input_matches_float64(signal):
    """pyannote's conditions on the split tensor-core product: weights built inside torch.inference_mode (inference
    tensors), the call inside it too, an input of zeros or of one constant, against float64."""
    cand = LstmVariant.ONCHIP_TF32X3.candidate()
    with torch.inference_mode():
        module = make(6, 80, 1, bidirectional=True, batch_first=True)
        x = torch.zeros(2, 4, 6) if signal == "silence" else torch.full((2, 4, 6), 0.75)
        out, (h_n, c_n) = run(module, x, None, cand)
    ref_out, (ref_h, ref_c) = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True,
                                           batch_first=True)
    tol = tk.APPROVALS[cand.tag()].max_rel_err
    for got, want in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", ["ONCHIP_TF32X3", "ONCHIP_TF32X3_WIDE"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "neg_inf", "nan"])
def test_a_non_finite_h0_under_the_tensor_core_product_matches_float64(variant, value):
    """An infinite h0 saturates the first step's gates and a NaN spreads, as in nn.LSTM, through the tf32x3
    products (split K, and the wide candidate's): the h split that keeps an infinity's low part 0 runs where
    the call passes a state."""
    cand = getattr(LstmVariant, variant).candidate()
    module = make(6, 80, 1, bidirectional=True, batch_first=True)
    x, (h0, c0) = inputs(module, batch=2, seq=3, with_state=True)
    h0[1, 0, 5] = value
    out, (h_n, c_n) = run(module, x, (h0, c0), cand)
    ref_out, (ref_h, ref_c) = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True,
                                           batch_first=True, hx=(h0, c0))
    tol = tk.APPROVALS[cand.tag()].max_rel_err
    for got, want in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=3 * tol, equal_nan=True)
    assert out.isnan().any() == (value != value)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # numpy, interpreter: inf - inf
@pytest.mark.parametrize("value", [float("inf"), float("-inf")], ids=["inf", "neg_inf"])
def test_an_infinite_input_meeting_tf32_weights_saturates_the_gates_as_in_float64(value):
    """The tf32x3 input projection of an infinite feature that meets weights which are TF32 values (a low half
    of 0): its gates are infinite, as in fp32, not NaN, so they saturate and the outputs match float64."""
    module = make(6, 80, 1, bidirectional=True, batch_first=True)
    with torch.no_grad():
        module.weight_ih_l0[::3, 4] = 0.5
        module.weight_ih_l0_reverse[1::5, 4] = -0.01806640625
    x, _ = inputs(module, batch=2, seq=3, with_state=False)
    x[1, 1, 4] = value
    cand = LstmVariant.ONCHIP_TF32X3.candidate()
    out, (h_n, c_n) = run(module, x, None, cand)
    ref_out, (ref_h, ref_c) = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True,
                                           batch_first=True)
    tol = tk.APPROVALS[cand.tag()].max_rel_err
    assert ref_out.isfinite().all()
    for got, want in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=3 * tol)


def test_weights_are_packed_once_per_version():
    """An inference loop packs each layer once; an in-place update repacks; inference tensors (no version
    counter) are packed on every call."""
    module = make(3, 8, 1, True)
    first = tk_weights._layer_weights(module._flat_weights, True, 0, 2, unit_major=True)
    assert tk_weights._layer_weights(module._flat_weights, True, 0, 2, unit_major=True) is first
    with torch.no_grad():
        module.weight_hh_l0.add_(0.5)
    repacked = tk_weights._layer_weights(module._flat_weights, True, 0, 2, unit_major=True)
    unit_major = module.weight_hh_l0.detach().reshape(4, 8, 8).transpose(0, 1).reshape(32, 8)
    assert repacked is not first and torch.equal(repacked[1][0][:, :8], unit_major)   # rows unit*4 + gate
    assert repacked[1].shape == (2, 32, 16) and torch.all(repacked[1][..., 8:] == 0)  # padded to BLOCK_K
    with torch.inference_mode():
        frozen = make(3, 8, 1, True)
        packs = [tk_weights._layer_weights(frozen._flat_weights, True, 0, 2) for _ in range(2)]
    assert packs[0] is not packs[1] and torch.equal(packs[0][0], packs[1][0])


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
    specs = {spec.name: spec for spec in tk.AUDIT_KERNELS}
    assert set(specs) == {"lstm_input_proj", "lstm_recurrence", "lstm_onchip_recurrence"}
    every = {v.candidate().tag() for v in LstmVariant}
    assert {c.tag() for c in specs["lstm_input_proj"].candidates} == every
    onchip = {c.tag() for c in specs["lstm_onchip_recurrence"].candidates}
    assert onchip | {c.tag() for c in specs["lstm_recurrence"].candidates} == every
    assert all(tag.endswith(("onchip_ieee", "onchip_tf32x3")) for tag in onchip)
    for spec in specs.values():
        meta = spec.meta(spec.default, "fp32")
        assert spec.default in spec.candidates and all(meta[k] >= 16 for k in meta if k.startswith("BLOCK_"))


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(LSTM_DEGENERATE_CASES))
def test_degenerate_inputs_match_float64(case, mode):
    """Zeros, constants, one step, NaN/Inf in the input or state: NaN spreads through the recurrence
    exactly as in nn.LSTM, Inf saturates the gates, values match elsewhere."""
    check_lstm_degenerate_case(lambda module, x, hx: run(module, x, hx, candidate(mode=mode)), case, rtol=TOL)


# ------------------------------------------------------------------------ the autotune bridge
def _routed(module, x):
    import rlx_triton as rt
    from rlx_triton.nn import LSTM

    fast = LSTM.from_torch(module)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        route = fast.explain(x)
        return route, fast(x)


def test_a_routed_call_runs_the_onchip_kernels_through_the_autotune_bridge_keyed_on_buckets():
    module = make(5, 16, 1, True, batch_first=True)
    x = torch.randn(3, 6, 5)
    kernels = tk.tuned_kernels()
    kernels["recurrence"].autotuner.cache.clear()
    kernels["projection"].autotuner.cache.clear()
    route, (out, _) = _routed(module, x)
    assert route.candidate.mode == "onchip"
    # batch 3 -> bucket 4, 6 steps -> bucket 8, hidden 16; the routed candidate was injected, not tuned
    recurrence_key = next(iter(kernels["recurrence"].autotuner.cache))
    assert recurrence_key[:3] == (4, 8, 16) and kernels["recurrence"].winner(recurrence_key) == route.candidate_tag
    assert next(iter(kernels["projection"].autotuner.cache))[:4] == (4, 8, 2 * 4 * 16, 5)
    ref = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True, batch_first=True)
    torch.testing.assert_close(out.double(), ref[0], rtol=TOL, atol=TOL)


def test_a_cold_bucket_is_tuned_over_the_approved_onchip_candidates(tmp_path):
    """Tuning runs every approved on-chip candidate on the same buffers: the benchmark restores the cell
    state and the exchange (h0 in slot 1), so the call's own result is still nn.LSTM's."""
    from rlx_triton.config import override_settings

    module = make(4, 16, 1, True, batch_first=True)
    x = torch.randn(2, 5, 4)
    kernels = tk.tuned_kernels()
    kernels["recurrence"].autotuner.cache.clear()
    with override_settings(tune=True, tune_cache_path=str(tmp_path / "t.tsv"), tune_cache_persist=False):
        _route, (out, (h, c)) = _routed(module, x)
    ref_out, (ref_h, ref_c) = lstm_float64(x, module._flat_weights, num_layers=1, bidirectional=True,
                                           batch_first=True)
    for got, want in ((out, ref_out), (h, ref_h), (c, ref_c)):
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5)


# ------------------------------------------------------------------------ compiled for sm_90 (no GPU)
# (warps, hidden): the routed candidate's 8 warps at hidden sizes whose h rows give each thread 1 to 16 exchange
# words (BLOCK_K 16 to 256), and 16 warps on a tile with fewer words than threads (one word a thread, replicated)
SYNCHRONISED_SHAPES = [(8, 16), (8, 33), (8, 64), (8, 128), (8, 200), (16, 16)]


@pytest.fixture(scope="module")
def synchronised_compiles(tmp_path_factory):
    """The synchronised on-chip recurrence (4 units a program, batch tile 16) compiled for sm_80 and sm_90 at
    SYNCHRONISED_SHAPES, bidirectional, batch 32."""
    from rlx_triton.perf.compiled import CompileJob, compile_all

    jobs = {}
    for warps, hidden in SYNCHRONISED_SHAPES:
        cand = tk.make_candidate(batch_tile=16, hidden_tile=4, tg_size=32 * warps, stages=2, mode="onchip",
                                 precision="tf32x3")
        record = tk_launch.synchronised_onchip_record(cand, batch=32, seq=7, hidden=hidden, directions=2,
                                                      batch_first=True)
        for arch in (80, 90):
            jobs[arch, warps, hidden] = CompileJob.of(record, arch)
    compiled = compile_all(jobs.values(), cache_dir=str(tmp_path_factory.mktemp("lstm-sync")), workers=2)
    return {key: compiled[job] for key, job in jobs.items()}


def _splits_k(warps: int, hidden: int) -> bool:
    """Whether the tf32x3 recurrent product of a SYNCHRONISED_SHAPES compile splits K across its warps."""
    cand = tk.make_candidate(batch_tile=16, hidden_tile=4, tg_size=32 * warps, stages=2, mode="onchip",
                             precision="tf32x3")
    meta = tk_launch._onchip_meta(cand, hidden)
    product = tk_kernels._product_precision(meta["PRECISION"], tk_kernels.GATES * meta["UNITS"], meta["BLOCK_K"])
    return tk_kernels._product_splits(product, meta["K_SPLIT"], meta["BLOCK_K"]) > 1


def test_the_product_splits_k_only_where_the_fma_product_would_issue_more():
    """16 gate columns: fp32 FMAs up to a reduction width of 64, the split tensor-core product past it."""
    assert [_splits_k(warps, hidden) for warps, hidden in SYNCHRONISED_SHAPES] == [False, False, False, True, True,
                                                                                   False]


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("warps, hidden", SYNCHRONISED_SHAPES)
def test_a_synchronised_step_meets_two_cta_barriers_and_waits_without_one(synchronised_compiles, arch, warps,
                                                                          hidden):
    """Each thread polls its own exchange words: the wait is a spin loop with no CTA barrier, and the one time
    loop has the two barriers of the h tile's pass into shared memory (none for the wait or the cell's
    exchanges between a unit's gate columns), two more where the product's warps split K and pass their slices
    through shared memory, without local-memory spills."""
    compiled = synchronised_compiles[arch, warps, hidden]
    assert compiled.ok, compiled.error
    steps = [loop for loop in compiled.loops if not loop["spin"]]
    waits = [loop for loop in compiled.loops if loop["spin"]]
    assert len(steps) == 1 and steps[0]["bar"] == (4 if _splits_k(warps, hidden) else 2) and compiled.spills == 0
    assert waits and all(loop["bar"] == 0 for loop in waits)


# ------------------------------------------------------------------------ on a GPU
@triton.jit
def _exchange_probe_kernel(exchange_ptr, errors_ptr, STEPS: tl.constexpr, PROGRAMS: tl.constexpr,
                           BLOCK: tl.constexpr, WAIT: tl.constexpr):
    """The recurrence's exchange protocol alone: at step s every program waits for the whole slot (s + 1) % 2
    tagged s + 1 (WAIT; without it, the interpreter's one program reads it once), checks that each word holds
    the value its writer published the step before, then publishes its own word (value s * PROGRAMS + pid) in
    slot s % 2 tagged s + 2 (with WAIT, by the strong store the recurrence publishes with). A word read early,
    late or torn, or a slot rewritten before every program read it, is a wrong value."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    in_group = offs < PROGRAMS
    for s in range(STEPS):
        seen = tk_kernels._read_exchange(exchange_ptr + ((s + 1) % 2) * BLOCK + offs, s + 1, WAIT)
        wrong = tl.sum(tl.where(in_group & (seen != ((s - 1) * PROGRAMS + offs).to(tl.float32)), 1, 0))
        tl.atomic_add(errors_ptr, wrong)
        word = tk_kernels._tagged_bits(((s * PROGRAMS + pid) + offs * 0).to(tl.float32), tl.cast(s + 2, tl.int64) << 32)
        tk_kernels._publish(exchange_ptr + (s % 2) * BLOCK + pid + offs * 0, word, offs == 0, WAIT)


def _probe_exchange(programs: int, block: int, device: str) -> torch.Tensor:
    """Two slots as the launcher leaves them: slot 0 tag 0, slot 1 the values of "step -1" tagged 1, the words
    past the group tagged PAD_TAG in both."""
    index = torch.arange(block, device=device)
    pad = (index >= programs).to(torch.int64) * tk_kernels.PAD_TAG
    first = (index - programs).to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.stack([pad << 32, first | (torch.maximum(pad, torch.ones_like(pad)) << 32)])


def test_one_program_reads_back_what_it_published_the_step_before():
    """The protocol's slots, tags and values, in the interpreter (one program, whose every step completes before
    the next: it reads once)."""
    exchange, errors = _probe_exchange(1, 16, "cpu"), torch.zeros(1, dtype=torch.int32)
    _exchange_probe_kernel[(1,)](exchange, errors, STEPS=9, PROGRAMS=1, BLOCK=16, WAIT=False)
    assert errors.item() == 0
    assert (exchange[0, 0] >> 32).item() == 8 + 2 and (exchange[1, 0] >> 32).item() == 7 + 2   # steps 8 and 7
    assert exchange[0, 0].to(torch.int32).view(torch.float32).item() == 8.0


@pytest.mark.gpu
def test_the_exchange_hands_every_program_the_words_of_the_step_before():
    programs = torch.cuda.get_device_properties(0).multi_processor_count   # one small program per SM
    block = triton.next_power_of_2(programs)
    exchange, errors = _probe_exchange(programs, block, "cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    _exchange_probe_kernel[(programs,)](exchange, errors, STEPS=2000, PROGRAMS=programs, BLOCK=block, WAIT=True,
                                        num_warps=4, launch_cooperative_grid=True)
    torch.cuda.synchronize()
    assert errors.item() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [LstmVariant.ONCHIP_IEEE, LstmVariant.ONCHIP_TF32X3, LstmVariant.ONCHIP_TF32X3_WIDE],
                         ids=lambda v: v.name)
def test_the_synchronised_onchip_launch_equals_its_step_launches_on_cuda(variant):
    """pyannote's stack: one launch per layer whose programs (64 per direction on the 4-unit candidates, 16 on the
    wide one, whose recurrent product runs on tensor cores) wait for each other's h through the exchange each
    step gives the values of one launch per step (the launch boundary as the wait)."""
    module = make(60, 128, 4, bidirectional=True, batch_first=True).cuda().eval()
    x = torch.randn(32, 589, 60, device="cuda")
    with torch.no_grad(), launches.recording() as log:
        synchronised = run(module, x, cand=variant.candidate())
    assert [r.name for r in log.records].count("_lstm_onchip_kernel") == 4      # co-resident on this GPU
    with torch.no_grad():
        stepped = run(module, x, cand=variant.candidate(), step_launches=True)
    torch.cuda.synchronize()
    for a, b in ((synchronised[0], stepped[0]), (synchronised[1][0], stepped[1][0]), (synchronised[1][1], stepped[1][1])):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# the two-streams check: each batch size's 4-layer BiLSTM forward on two streams at once, against cuDNN
_TWO_STREAMS = """
import sys, torch, rlx_triton as rt
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
for batch in (128, 512):
    stock = torch.nn.LSTM(60, 128, 4, bidirectional=True, batch_first=True).cuda().eval()
    module = rt.nn.LSTM.from_torch(stock)
    inputs = [torch.randn(batch, 589, 60, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    with torch.no_grad():
        module(inputs[0])                       # warm-up: compile, route, pack, the co-residency check
        torch.cuda.synchronize()
        outputs = [None, None]
        for _ in range(2):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    outputs[i] = module(inputs[i])[0]
        torch.cuda.synchronize()
        for x, out in zip(inputs, outputs):
            torch.testing.assert_close(out, stock(x)[0], rtol=1e-4, atol=1e-4)
    print("finished batch", batch, flush=True)
"""


@pytest.mark.gpu
def test_two_streams_of_lstm_forwards_at_batch_128_and_512_finish_or_refuse_never_hang():
    """Two forwards whose on-chip programs could not all be resident together (B=128: 512 programs each on the
    4-unit recipe; B=512: 2048) run on two streams at once in a subprocess: the plan refuses a grid that cannot
    be resident and the cooperative launch runs each grid whole or refuses it, so both finish with cuDNN's
    values; a hang is a timeout here."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _TWO_STREAMS], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "finished batch 512" in done.stdout

