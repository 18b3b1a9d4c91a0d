"""Fbank routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE."""
from __future__ import annotations

from typing import Dict

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.backends.torch_ref import fbank as _ref
from rlx_triton.planner.candidates.fbank import FbankVariant
from rlx_triton.router.coverage import Coverage

MAX_WINDOW = 1024  # largest padded DFT length covered (the cached basis is 4 x window x window / 2 floats)
MAX_BINS = 128  # mel bins (padded to a power of two) accumulated per frame row

COVERAGE = Coverage(
    ops=frozenset({"fbank"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"bins": (4, MAX_BINS), "window": (2, MAX_WINDOW), "samples": (1, 2**31 - 2 * MAX_WINDOW)},
    features=_ref.KERNEL_FEATURES,
    weight_features=frozenset(),
)

# Largest relative error of the features, |out - ref| / max(|ref|, 1), against the float64 reference
# (tests/reference/fbank.py) over the approval option sets (80-bin WeSpeaker with x32768 and CMN and
# 40-bin snip_edges=False with energy, both two-stage DFTs at N = 512; 23 bins at a 134-point dense DFT)
# on speech-like signals, with the interpreter's dots rounded as tensor cores round "tf32x3"
# (tests/reference/tensor_cores.py). tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval
# re-measures it.
APPROVAL_BOUND = {"ieee": 3e-5, "tf32x3": 3e-5}
_WHERE = "interpreter, tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval"

APPROVALS = approvals_by_precision("fbank", APPROVAL_BOUND, _WHERE)
# GPUs with TF32 tensor cores run the two-stage DFT in tf32x3 on 64-frame tiles (no spills on sm_80 or sm_90,
# in either frames kernel)
RECIPES: Dict[str, str] = {"sm80": FbankVariant.TF32X3_F64_Q32.tag(), "sm90": FbankVariant.TF32X3_F64_Q32.tag()}
SPEED_EVIDENCE: Dict[str, str] = {}
