"""Split-K decode audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

import torch

from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.sdpa_decode.kernels import (ALIBI_DISTANCE, ALIBI_KEY_INDEX, ALIBI_NONE,
                                                            CAUSAL_BOTTOM_RIGHT, CAUSAL_NONE, MASK_BOOL, MASK_NONE,
                                                            MASK_TREE, _sdpa_decode_kernel)
from rlx_triton.backends.triton.sdpa_decode.launch import _meta
from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeVariant

_AUDIT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "MAX_SPLITS", "MASK_KIND", "CAUSAL", "HAS_SEQLENS",
               "DOT_LOWP", "PAGED", "SOFTCAP", "WINDOW", "ALIBI", "BATCH_IDX", "LEFTPAD", "MERGE_CHUNK", "FIXED_SPLITS",
               "KV_QUANT", "KV_E4M3_BITS")
_SIGNATURE = {name: ("constexpr" if name in _CONSTEXPRS else "i32") for name in _sdpa_decode_kernel.arg_names}
_SIGNATURE.update({"q_ptr": "*{dt}", "k_ptr": "*{dt}", "v_ptr": "*{dt}", "mask_ptr": "*u8", "seqlens_ptr": "*i32",
                   "block_table_ptr": "*i32", "alibi_ptr": "*fp32", "batch_idx_ptr": "*i32", "leftpad_ptr": "*i32",
                   "o_ptr": "*{dt}", "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
                   "tickets_ptr": "*i32", "qk_scale": "fp32", "softcap": "fp32", "k_scale_ptr": "*fp32",
                   "v_scale_ptr": "*fp32"})


def _audit_meta(rows: int, head_dim: int, **options):
    """Constexprs of an audited variant: a bool mask, bottom-right causal masking and cache lengths, with
    `options` (FlashAttention's, which come without a mask) turning features on."""
    def meta(candidate, dt: str) -> dict:
        m = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim, dtype=_AUDIT_DTYPES[dt])
        m.update(MASK_KIND=MASK_NONE if options else MASK_BOOL, CAUSAL=CAUSAL_BOTTOM_RIGHT, HAS_SEQLENS=True,
                 PAGED=False, SOFTCAP=False, WINDOW=False, ALIBI=ALIBI_NONE, BATCH_IDX=False, LEFTPAD=False,
                 FIXED_SPLITS=False, KV_QUANT=0, KV_E4M3_BITS=False, stride_mn=1)
        m.update(options)
        return m
    return meta


# what the JIT sees as multiples of 16 in a decode call with head dims of 16 or more: every pointer, the
# strides of q/k/v rows and heads, the head dims; the mask's key stride is 1 (a constexpr to the JIT)
_DIVISIBLE = ("q_ptr", "k_ptr", "v_ptr", "mask_ptr", "seqlens_ptr", "block_table_ptr", "o_ptr", "lse_ptr", "part_o_ptr", "part_lse_ptr",
              "tickets_ptr", "stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_kn", "stride_vb",
              "stride_vh", "stride_vn", "stride_mb", "stride_mh", "stride_ml", "head_dim", "head_dim_v")
_SIGNATURE["stride_mn"] = "constexpr"
_CANDIDATES = tuple(variant.candidate() for variant in SdpaDecodeVariant)
_DEFAULT = SdpaDecodeVariant.DEFAULT.candidate()
AUDIT_KERNELS = [
    # Llama-3-8B decode: 4 query heads per KV head, one token, head dim 128, mask + bottom-right causal
    AuditSpec(name="sdpa_decode_d128", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=4, head_dim=128),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp32", "fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv) and dt != "fp32"),
    # head dim 256 with 16 packed rows (e.g. 8 heads per KV head x 2 tokens)
    AuditSpec(name="sdpa_decode_d256", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=16, head_dim=256),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv)),
] + [
    # each option of the paged / FlashAttention path compiled once, on the default candidate in fp16 at the
    # Llama-3-8B decode shape: a variant that adds registers or spills shows here
    AuditSpec(name=f"sdpa_decode_d128_{name}", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=4, head_dim=128, **options),
              candidates=(_DEFAULT,), default=_DEFAULT, dtypes=("fp16",), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv))
    for name, options in (
        ("paged", dict(PAGED=True)),
        ("window", dict(WINDOW=True)),
        ("softcap", dict(SOFTCAP=True)),
        ("alibi", dict(ALIBI=ALIBI_DISTANCE)),
        ("leftpad_batch_idx", dict(LEFTPAD=True, BATCH_IDX=True, ALIBI=ALIBI_KEY_INDEX)),
        ("fixed_splits", dict(FIXED_SPLITS=True)),   # the deterministic profile's split boundaries
    )
] + [
    # speculative decoding's verification: a draft tree of 8 or 16 tokens x 4 query heads per KV head (32 and 64
    # packed rows) and 64 tokens (four tiles of 64 rows), every candidate
    AuditSpec(name=f"sdpa_decode_d128_tree{tokens}", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=4 * tokens, head_dim=128, MASK_KIND=MASK_TREE,
                                                     CAUSAL=CAUSAL_NONE),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv))
    for tokens in (8, 16, 64)
] + [
    # a quantised cache (fp8 e4m3 / e5m2, int8) read as stored, with per-token-head scales (and per-tensor ones for
    # e4m3), fp16 queries on the default candidate at the Llama-3-8B decode shape
    AuditSpec(name=f"sdpa_decode_d128_kv_{storage}_{'per_tensor' if quant == 1 else 'per_token_head'}",
              family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature={**_SIGNATURE, "k_ptr": f"*{storage}", "v_ptr": f"*{storage}"},
              meta=_audit_meta(rows=4, head_dim=128, KV_QUANT=quant, KV_E4M3_BITS=storage == "u8"),
              candidates=(_DEFAULT,), default=_DEFAULT, dtypes=("fp16",), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv), min_arch=89 if storage == "fp8e4nv" else 0)
    # e4m3 from sm_89 on; before it (no fp8e4nv conversion) the same cache as bytes ("u8"), decoded by hand
    for storage, quant in (("fp8e4nv", 2), ("fp8e4nv", 1), ("u8", 2), ("fp8e5", 2), ("i8", 2))
]
