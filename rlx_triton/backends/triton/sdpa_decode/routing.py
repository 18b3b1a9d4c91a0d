"""Split-K decode routing data, read by rlx_triton.router: COVERAGE, APPROVALS, RECIPES, SPEED_EVIDENCE."""
from __future__ import annotations

from typing import Dict

from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeVariant
from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

# query tokens per sequence: their rows (x the query heads of a KV head) are packed into tiles of at most 64
# rows, each reading the KV range once; 64 covers speculative decoding's draft trees
MAX_SEQ_Q = 64
MAX_HEAD_DIM = 256
COVERAGE = Coverage(
    ops=frozenset({"scaled_dot_product_attention", "sdpa_decode", "flash_attn_with_kvcache"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"seq_q": (1, MAX_SEQ_Q), "tokens": (1, MAX_SEQ_Q), "head_dim": (1, MAX_HEAD_DIM),
            "head_dim_v": (1, MAX_HEAD_DIM), "seq_kv": (1, 2**31 - 1),
            "batch": (1, 2**31 - 1), "num_heads": (1, 2**31 - 1)},
    features={
        # float: same dtype as query, added to the scores; tree: sdpa_decode's tree_mask over the newest keys
        "mask": frozenset({"none", "bool", "float", "tree"}),
        "causal": frozenset({"none", "top_left", "bottom_right"}),
        "dropout": frozenset({False}),
        "requires_grad": frozenset({False}),  # forward-only: autograd calls run torch
        # "batched": query, key and value share their leading dims ((N..., H, L, E) or (N, L, E));
        # "broadcast" (leading dims broadcast against each other) and "unbatched" (fewer than 3 dims) go to torch
        "layout": frozenset({"batched"}),
        # a block table (pages of any size >= 1); requests without one carry no paged feature
        "paged": frozenset({True}),
        # FlashAttention's logits softcap, local window, ALiBi slopes, cache rows and left padding (requests
        # without them carry none of these features)
        "softcap": frozenset({True}),
        "window": frozenset({True}),
        "alibi": frozenset({"per_head", "per_batch_head"}),
        "cache_batch_idx": frozenset({True}),
        "cache_leftpad": frozenset({True}),
        # a quantised cache (rlx_triton/kv_quant.py), dequantised on load; requests with a float cache carry neither
        "kv_dtype": frozenset({"float8_e4m3fn", "float8_e5m2", "int8"}),
        "kv_scale": frozenset({"per_tensor", "per_token_head"}),
    },
)

# Largest relative error (max |out - ref| / max |ref|) measured against float64 in the interpreter;
# tests/triton/test_sdpa_decode.py re-measures every entry. The fp32 candidate (fp32 dot operands, ieee)
# is measured on fp32 inputs and approved for every profile; the f16-KV candidates (fp16/bf16 dot
# operands, probabilities rounded to the input dtype before the PV dot) are measured on fp16 inputs and
# not approved for high_fidelity, where the router takes the fp32 candidate instead. On an fp32 request an
# f16-KV candidate keeps fp32 operands (use_f16_kv acts on 16-bit inputs only), so its fp32 bound is the
# fp32 candidate's, measured on fp32 inputs by the same test.
_WHERE = "interpreter, tests/triton/test_sdpa_decode.py::test_approved_candidates_hold_their_error_bound"
_F16_KV_PROFILES = frozenset({"ultra_low_latency", "balanced", "deterministic"})
FP32_MAX_REL_ERR = 1e-5
# A quantised cache is approved per storage dtype, each bound measured against a float64 reference that
# dequantises the same cache (so quantisation's own error is the user's choice, not the kernel's): the stored
# values convert exactly to any dot operand, and the scales multiply in float32, so each candidate keeps its
# float-cache bound (an f16-KV candidate's on fp16 queries, the fp32 candidate's on fp32 queries).
_STORAGES = ("float8_e4m3fn", "float8_e5m2", "int8")
APPROVALS = {
    variant.candidate().tag(): (
        Approval(max_rel_err=1e-3, reference="float64", where=_WHERE, profiles=_F16_KV_PROFILES,
                 dtype_errors=(("float32", FP32_MAX_REL_ERR),),
                 storage_errors=tuple((storage, 1e-3) for storage in _STORAGES))
        if variant.candidate().use_f16_kv
        else Approval(max_rel_err=FP32_MAX_REL_ERR, reference="float64", where=_WHERE,
                      storage_errors=tuple((storage, FP32_MAX_REL_ERR) for storage in _STORAGES)))
    for variant in SdpaDecodeVariant
}

# Built-in recipe per CUDA device class: the candidate with the widest split cap (split_k 16, 16-row tiles),
# since the split count comes from the device and split_k only bounds it: the rule can then fill the
# SMs at small batch and still takes one split where the batch fills them. A guess from `rlx-triton perf`
# (uncalibrated: no GPU run has measured it), labelled as such in SPEED_EVIDENCE; a winner-table entry
# replaces it. The interpreter and the CPU keep the plan's launch rule.
_WIDEST_SPLITS = SdpaDecodeVariant.LONG_KV_SPLIT16_F16_KV.tag()
RECIPES: Dict[str, str] = {"sm90": _WIDEST_SPLITS, "sm80": _WIDEST_SPLITS, "cuda": _WIDEST_SPLITS}
SPEED_EVIDENCE: Dict[str, str] = {_WIDEST_SPLITS: "estimated by rlx-triton perf (uncalibrated), not measured"}
