"""Segdense routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE."""
from __future__ import annotations

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.backends.triton.segdense.kernels import ACTIVATIONS
from rlx_triton.backends.triton.segdense.launch import MAX_CLASSES, MAX_FEATURES
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage(
    ops=frozenset({"segdense"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32"}),
    ranges={"classes": (1, MAX_CLASSES), "in_features": (1, MAX_FEATURES), "hidden": (1, MAX_FEATURES),
            "rows": (0, (1 << 31) - 1)},
    features={
        "activation": frozenset(ACTIVATIONS),
        "linear_layers": frozenset(range(0, 9)),
        "requires_grad": frozenset({False}),   # forward-only kernel: autograd goes to torch
    },
)

_WHERE = "interpreter, tests/triton/test_segdense.py (vs float64)"

# tf32 stays unapproved: no accuracy evidence is kept for it, and TF32 products have been measured to move
# diarization error rates (the diarization kernels default to true fp32)
APPROVALS = approvals_by_precision("segdense", {"ieee": 1e-5, "tf32x3": 2e-5}, _WHERE)
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}
