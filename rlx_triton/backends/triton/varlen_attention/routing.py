"""Ragged attention routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE."""
from __future__ import annotations

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

MAX_HEAD_DIM = 256   # the largest head_dim and head_dim_v covered
_INT32 = 2**31 - 1
COVERAGE = Coverage(
    ops=frozenset({"flash_attn_varlen_func", "varlen_attn"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"head_dim": (1, MAX_HEAD_DIM), "head_dim_v": (1, MAX_HEAD_DIM), "tokens": (1, _INT32),
            "batch": (1, _INT32), "num_heads": (1, _INT32), "seq_q": (1, _INT32), "seq_kv": (1, _INT32),
            "page_size": (1, _INT32)},
    features={
        "dropout": frozenset({False}),
        "requires_grad": frozenset({False}),  # forward-only: autograd calls run torch
        # "packed": flash_attn_varlen_func's (total, H, D); "batched": flash_attn_func's (B, S, H, D) as its
        # equal-length varlen call
        "layout": frozenset({"packed", "batched"}),
        "causal": frozenset({"none", "bottom_right"}),
        # FlashAttention's options (requests without them carry none of these features)
        "paged": frozenset({True}),
        "window": frozenset({True}),
        "softcap": frozenset({True}),
        "alibi": frozenset({"per_head", "per_batch_head"}),
        "sinks": frozenset({True}),
        "seqused": frozenset({True}),   # seqused_k: the keys each sequence uses (varlen_attn)
        # a quantised paged cache (rlx_triton/kv_quant.py), dequantised on load; requests with a float cache carry
        # neither
        "kv_dtype": frozenset({"float8_e4m3fn", "float8_e5m2", "int8"}),
        "kv_scale": frozenset({"per_tensor", "per_token_head"}),
    },
)

# Largest relative error against float64 in the interpreter, re-measured by
# tests/triton/test_varlen_attention.py::test_approved_candidates_hold_their_error_bound: the fp32 candidate
# on fp32 inputs (every profile); the 16-bit dot candidates on fp16 inputs, not for high_fidelity, where the
# router takes the fp32 candidate instead.
_WHERE = "interpreter, tests/triton/test_varlen_attention.py::test_approved_candidates_hold_their_error_bound"
_F16_DOT_PROFILES = frozenset({"ultra_low_latency", "balanced", "deterministic"})
# an f16-dot candidate keeps fp32 operands on an fp32 request: its fp32 bound is the fp32 candidate's
FP32_MAX_REL_ERR = 1e-5
F16_DOT_MAX_REL_ERR = 1e-3
# A quantised cache is approved per storage dtype, each bound measured against a float64 reference that
# dequantises the same cache (quantisation's own error is the user's choice, not the kernel's) by
# tests/ops/test_varlen_kv_quant.py::test_approved_candidates_hold_their_bound_for_each_storage: the stored values
# convert exactly to any dot operand and the scales multiply in float32, so each candidate keeps its float-cache
# bound (an f16-dot candidate's on fp16 queries, the fp32 candidate's on fp32 queries).
STORAGES = ("float8_e4m3fn", "float8_e5m2", "int8")
APPROVALS = {
    candidate.tag(): (Approval(max_rel_err=F16_DOT_MAX_REL_ERR, reference="float64", where=_WHERE,
                               profiles=_F16_DOT_PROFILES, dtype_errors=(("float32", FP32_MAX_REL_ERR),),
                               storage_errors=tuple((storage, F16_DOT_MAX_REL_ERR) for storage in STORAGES))
                      if candidate.use_f16_dot
                      else Approval(max_rel_err=FP32_MAX_REL_ERR, reference="float64", where=_WHERE,
                                    storage_errors=tuple((storage, FP32_MAX_REL_ERR) for storage in STORAGES)))
    for candidate in plan_candidates("varlen_attention")
}
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}
