"""The Triton segdense kernel against a float64 head, in the interpreter (tiny shapes).

Specification: `backends.triton.segdense.segdense` computes leaky_relu(linear) for each linear
layer (0 to 3 layers, odd widths), the classifier and the final activation (log-softmax, sigmoid or
none), fused or in a second pass, within the fp32 tolerance; approvals hold; every candidate runs.
"""
from __future__ import annotations

import pytest
import torch

from rlx_triton.backends.triton import segdense as tk
from rlx_triton.planner import SegdenseVariant
from tests.reference.segdense import (SEGDENSE_DEGENERATE_CASES, check_segdense_degenerate_case, random_head,
                                      segdense_float64)

TOL = 1e-5


def candidate(fused_activation=True, precision="ieee", row_tile=16):
    return tk.make_candidate(row_tile=row_tile, tg_size=128, stages=1, precision=precision,
                             fused_activation=fused_activation)


def max_rel_err(got, ref) -> float:
    return ((got.double() - ref).abs() / ref.abs().clamp_min(1.0)).max().item()


def check(x, head, activation, cand=None, tol=TOL):
    got = tk.segdense(x, *head, activation=activation, candidate=cand or candidate())
    ref = segdense_float64(x, *head, activation)
    assert got.shape == ref.shape and got.dtype == x.dtype
    assert max_rel_err(got, ref) <= tol
    return got


@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "second-pass"])
def test_pyannote_head_shape_with_each_activation(activation, fused):
    x = torch.randn(2, 9, 32)                        # (batch, frames, 2 x lstm hidden)
    check(x, random_head(32, [16, 16], 7), activation, candidate(fused))


@pytest.mark.parametrize("hidden", [[], [7], [33, 5], [16, 24, 8]], ids=["0-linear", "1-linear", "2-linear", "3-linear"])
def test_any_number_of_linear_layers_and_odd_widths(hidden):
    x = torch.randn(37, 19)
    check(x, random_head(19, hidden, 3), "log_softmax")


def test_rows_beyond_one_tile_and_no_biases():
    x = torch.randn(3, 41, 24)
    check(x, random_head(24, [16, 16], 7, bias=False), "sigmoid", candidate(row_tile=16))


def test_log_softmax_rows_sum_to_one():
    out = check(torch.randn(5, 20) * 10, random_head(20, [16], 7), "log_softmax")
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(5), rtol=1e-5, atol=1e-5)


def test_every_approval_holds_when_remeasured():
    by_tag = {v.candidate().tag(): v.candidate() for v in SegdenseVariant}
    assert tk.APPROVALS
    x, head = torch.randn(2, 11, 32), random_head(32, [16, 16], 7)
    ref = segdense_float64(x, *head, "log_softmax")
    for tag, approval in tk.APPROVALS.items():
        got = tk.segdense(x, *head, activation="log_softmax", candidate=by_tag[tag])
        assert max_rel_err(got, ref) <= approval.max_rel_err, tag


def test_sweep_every_candidate_of_the_plan():
    x, head = torch.randn(2, 13, 24), random_head(24, [16, 16], 7)
    for variant in SegdenseVariant:
        cand = variant.candidate()
        tol = TOL if cand.precision == "ieee" else (2e-5 if cand.precision == "tf32x3" else 1e-3)
        check(x, head, "log_softmax", cand, tol=tol)


def test_coverage_refuses_autograd_and_unknown_activations():
    fields = {"rows": 10, "in_features": 32, "hidden": 16, "classes": 7, "tokens": 10}
    ok = {"activation": "log_softmax", "linear_layers": 2, "requires_grad": False}
    assert tk.COVERAGE.check("segdense", "cuda", "float32", fields, ok) is None
    assert tk.COVERAGE.check("segdense", "cuda", "float32", fields, {**ok, "requires_grad": True}) is not None
    assert tk.COVERAGE.check("segdense", "cuda", "float32", fields, {**ok, "activation": "softmax"}) is not None


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "second-pass"])
@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("case", list(SEGDENSE_DEGENERATE_CASES))
def test_degenerate_inputs_match_float64(case, activation, fused):
    """Silence, constant and single frames, NaN/Inf features, a NaN weight: NaN exactly where torch's
    linear, leaky ReLU and activation put it (log-softmax of a NaN frame is NaN in every class)."""
    check_segdense_degenerate_case(
        lambda x, w, b, wc, bc, act: tk.segdense(x, w, b, wc, bc, activation=act, candidate=candidate(fused)),
        case, activation, rtol=TOL)
