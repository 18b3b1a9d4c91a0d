"""LSTM routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE.

Refused to the torch op (typed, via COVERAGE features): training with dropout > 0, proj_size > 0, packed
sequences, autograd, hidden > MAX_HIDDEN, dtypes other than float32.
"""
from __future__ import annotations

from typing import Dict

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.planner.candidates.lstm import LstmVariant
from rlx_triton.router.coverage import Coverage

MAX_HIDDEN = 512

COVERAGE = Coverage(
    ops=frozenset({"lstm"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32"}),
    ranges={"hidden": (1, MAX_HIDDEN), "layers": (1, 64), "directions": (1, 2), "input_size": (1, 1 << 16),
            "seq": (1, 1 << 20), "batch": (1, 1 << 16)},
    features={
        "dropout_active": frozenset({False}),   # training with dropout > 0 goes to torch
        "proj_size": frozenset({0}),
        "packed": frozenset({False}),
        "has_biases": frozenset({True, False}),
        "batch_first": frozenset({True, False}),
        "requires_grad": frozenset({False}),    # forward-only kernels: autograd goes to torch
    },
)

_WHERE = ("interpreter, tests/triton/test_lstm.py (1-2 layers, bi, hidden 7..33, vs float64; the recurrent "
          "tf32x3 product over 589 steps)")

# tf32 stays unapproved: no accuracy evidence is kept for it, and TF32 products have been measured to move
# diarization error rates (the diarization kernels default to true fp32)
APPROVALS = approvals_by_precision("lstm", {"ieee": 1e-5, "tf32x3": 2e-5}, _WHERE)
# the on-chip recurrence where it is co-resident (the launcher falls back to the persistent candidate
# where it is not), with the tf32x3 projection and recurrent product (its eight warps split the hidden size in
# four, launch.py `_k_split`); by the model it is the faster of the two approved on-chip candidates (2.3 vs 3.0 ms
# for pyannote's LSTM on an H200, the projections 0.29 vs 0.66 ms); no device run has measured them yet
RECIPES = {"sm80": LstmVariant.ONCHIP_TF32X3.candidate().tag(), "sm90": LstmVariant.ONCHIP_TF32X3.candidate().tag()}
SPEED_EVIDENCE: Dict[str, str] = {}
