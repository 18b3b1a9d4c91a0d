"""LSTM audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.lstm.kernels import (_lstm_input_proj_kernel, _lstm_onchip_kernel,
                                                     _lstm_recurrence_kernel)
from rlx_triton.backends.triton.lstm.launch import _onchip_meta, _proj_meta, _rec_meta
from rlx_triton.planner.candidates.lstm import DEFAULT_VARIANT, LstmVariant

AUDIT_HIDDEN = 128   # pyannote's hidden size: the on-chip kernel's BLOCK_K follows the hidden size
_REC_SIGNATURE = {"g_ptr": "*fp32", "whh_ptr": "*fp32", "h0_ptr": "*fp32", "c_ptr": "*fp32", "y_ptr": "*fp32",
                  "hn_ptr": "*fp32", "T": "i32", "B": "i32", "H": "i32", "step_begin": "i32", "step_end": "i32",
                  "stride_gt": "i32", "stride_gb": "i32", "stride_yt": "i32", "stride_yb": "i32"}


def _in_order(kernel, signature: dict) -> dict:
    return {name: signature[name] for name in kernel.arg_names}


def _audit_onchip_meta(candidate, dt: str) -> dict:
    return dict(SYNC=True, **_onchip_meta(candidate, AUDIT_HIDDEN))


def _audit_kernels() -> list:
    cands = tuple(plan_candidates("lstm"))
    onchip = tuple(c for c in cands if c.mode == "onchip")
    streaming = tuple(c for c in cands if c.mode != "onchip")
    constexpr = "constexpr"
    return [
        AuditSpec(
            name="lstm_input_proj", family="lstm", kernel=_lstm_input_proj_kernel,
            signature={"x_ptr": "*{dt}", "w_ptr": "*fp32", "bias_ptr": "*fp32", "g_ptr": "*fp32",
                       "M": "i32", "N": "i32", "K": "i32",
                       "stride_xm": "i32", "stride_wn": "i32", "stride_gm": "i32",
                       "batch_bucket": "i32", "seq_bucket": "i32",
                       "HAS_BIAS": constexpr, "PRECISION": constexpr,
                       "BLOCK_M": constexpr, "BLOCK_N": constexpr, "BLOCK_K": constexpr},
            meta=lambda cand, dt: dict(HAS_BIAS=True, **_proj_meta(cand)),
            candidates=cands, default=DEFAULT_VARIANT.candidate(), dtypes=("fp32",),
            expects_mma=lambda cand, dt: cand.precision != "ieee"),
        AuditSpec(
            name="lstm_recurrence", family="lstm", kernel=_lstm_recurrence_kernel,
            signature={**_REC_SIGNATURE, "BLOCK_B": constexpr, "BLOCK_H": constexpr, "BLOCK_K": constexpr},
            meta=lambda cand, dt: _rec_meta(cand),
            candidates=streaming, default=LstmVariant.PERSISTENT_IEEE.candidate(), dtypes=("fp32",),
            expects_mma=False),
        AuditSpec(
            name="lstm_onchip_recurrence", family="lstm", kernel=_lstm_onchip_kernel,
            signature=_in_order(_lstm_onchip_kernel, {
                **_REC_SIGNATURE, "xchg_ptr": "*i64", "batch_bucket": "i32", "seq_bucket": "i32",
                "BLOCK_B": constexpr, "UNITS": constexpr, "BLOCK_K": constexpr,
                "PRECISION": constexpr, "SYNC": constexpr, "K_SPLIT": constexpr}),
            meta=_audit_onchip_meta, candidates=onchip, default=LstmVariant.ONCHIP_IEEE.candidate(),
            dtypes=("fp32",), expects_mma=lambda cand, dt: cand.precision != "ieee"),
    ]


AUDIT_KERNELS = _audit_kernels()
