"""Segdense audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.segdense.kernels import ACTIVATIONS, _segdense_kernel
from rlx_triton.backends.triton.segdense.launch import _meta
from rlx_triton.planner.candidates.segdense import DEFAULT_VARIANT


def _audit_kernels() -> list:
    cands = tuple(plan_candidates("segdense"))
    default = DEFAULT_VARIANT.candidate()
    return [AuditSpec(
        name="segdense_head", family="segdense", kernel=_segdense_kernel,
        signature={"x_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "wc_ptr": "*fp32", "bc_ptr": "*fp32", "scratch_ptr": "*fp32", "out_ptr": "*fp32",
                   "R": "i32", "F_IN": "i32", "C": "i32", "D_MAX": "i32",
                   "NUM_LINEAR": "constexpr", "DIMS": "constexpr", "ACTIVATION": "constexpr", "FUSED_ACTIVATION": "constexpr",
                   "PRECISION": "constexpr", "BLOCK_R": "constexpr", "BLOCK_N": "constexpr",
                   "BLOCK_K": "constexpr", "BLOCK_C": "constexpr"},
        meta=lambda cand, dt: dict(NUM_LINEAR=2, DIMS=(128, 128), ACTIVATION=ACTIVATIONS.index("log_softmax"),
                                   **_meta(cand, 7)),
        expects_mma=lambda cand, dt: cand.precision != "ieee",
        candidates=cands, default=default, dtypes=("fp32",))]


AUDIT_KERNELS = _audit_kernels()
