"""Ragged attention audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

import torch

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.varlen_attention.kernels import ALIBI_DISTANCE, ALIBI_NONE, _varlen_attention_kernel
from rlx_triton.backends.triton.varlen_attention.launch import kernel_meta
from rlx_triton.planner.candidates.varlen_attention import DEFAULT_VARIANT

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_CONSTEXPRS = ("BLOCK_M", "BLOCK_Q", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "DOT_LOWP", "PAGED", "WINDOW", "SOFTCAP",
               "ALIBI", "SINKS", "SEQUSED", "KV_QUANT", "KV_E4M3_BITS")
_SIGNATURE = {name: ("constexpr" if name in _CONSTEXPRS else "i32") for name in _varlen_attention_kernel.arg_names}
_SIGNATURE.update({"q_ptr": "*{dt}", "k_ptr": "*{dt}", "v_ptr": "*{dt}", "o_ptr": "*{dt}", "lse_ptr": "*fp32",
                   "cu_seqlens_q_ptr": "*i32", "cu_seqlens_k_ptr": "*i32", "block_table_ptr": "*i32",
                   "alibi_ptr": "*fp32", "sinks_ptr": "*fp32", "seqused_k_ptr": "*i32", "qk_scale": "fp32",
                   "softcap": "fp32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"})
# what the JIT sees as multiples of 16 at Llama-3-8B's shapes: pointers, row and head strides, head dims
_DIVISIBLE = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "cu_seqlens_q_ptr", "cu_seqlens_k_ptr",
              "block_table_ptr", "seqused_k_ptr", "stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kp",
              "stride_kt", "stride_kh", "stride_vp", "stride_vt", "stride_vh", "head_dim", "head_dim_v")


def _meta(group: int, head_dim: int, **options):
    def meta(candidate, dt: str) -> dict:
        m = kernel_meta(candidate, group=group, head_dim=head_dim, head_dim_v=head_dim, dtype=_DTYPES[dt])
        m.update(PAGED=False, WINDOW=True, SOFTCAP=False, ALIBI=ALIBI_NONE, SINKS=False, SEQUSED=False, KV_QUANT=0,
                 KV_E4M3_BITS=False)
        m.update(options)
        return m
    return meta


_CANDIDATES = tuple(plan_candidates("varlen_attention"))
_DEFAULT = DEFAULT_VARIANT.candidate()
AUDIT_KERNELS = [
    # Llama-3-8B: 4 query heads per KV head, head dim 128, causal (the window (-1, 0))
    AuditSpec(name="varlen_attention_d128", family="varlen_attention", kernel=_varlen_attention_kernel,
              signature=_SIGNATURE, meta=_meta(group=4, head_dim=128), candidates=_CANDIDATES, default=_DEFAULT,
              dtypes=("fp32", "fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_dot) and dt != "fp32"),
] + [
    # each option once, on the default candidate in fp16 at the Llama-3-8B shape
    AuditSpec(name=f"varlen_attention_d128_{name}", family="varlen_attention", kernel=_varlen_attention_kernel,
              signature=_SIGNATURE, meta=_meta(group=4, head_dim=128, **options), candidates=(_DEFAULT,),
              default=_DEFAULT, dtypes=("fp16",), divisible=_DIVISIBLE, expects_mma=lambda cand, dt: True)
    for name, options in (
        ("paged", dict(PAGED=True)),
        ("paged_seqused", dict(PAGED=True, SEQUSED=True)),
        ("softcap_sinks", dict(SOFTCAP=True, SINKS=True)),
        ("alibi", dict(ALIBI=ALIBI_DISTANCE)),
    )
] + [
    # head dim 256 (Gemma-2) with 2 query heads per KV head
    AuditSpec(name="varlen_attention_d256", family="varlen_attention", kernel=_varlen_attention_kernel,
              signature=_SIGNATURE, meta=_meta(group=2, head_dim=256, SOFTCAP=True), candidates=(_DEFAULT,),
              default=_DEFAULT, dtypes=("fp16", "bf16"), divisible=_DIVISIBLE, expects_mma=lambda cand, dt: True),
] + [
    # a quantised paged cache (fp8 e4m3 / e5m2, int8) read as stored, with per-token-head scales (and per-tensor
    # ones for e4m3), fp16 queries on the default candidate at the Llama-3-8B shape: the stored values convert to
    # fp16 dot operands (MMA)
    AuditSpec(name=f"varlen_attention_d128_paged_kv_{storage}_{'per_tensor' if quant == 1 else 'per_token_head'}",
              family="varlen_attention", kernel=_varlen_attention_kernel,
              signature={**_SIGNATURE, "k_ptr": f"*{storage}", "v_ptr": f"*{storage}"},
              meta=_meta(group=4, head_dim=128, PAGED=True, KV_QUANT=quant, KV_E4M3_BITS=storage == "u8"),
              candidates=(_DEFAULT,), default=_DEFAULT, dtypes=("fp16",), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: True, min_arch=89 if storage == "fp8e4nv" else 0)
    # e4m3 from sm_89 on; before it (no fp8e4nv conversion) the same cache as bytes ("u8"), decoded by hand
    for storage, quant in (("fp8e4nv", 2), ("fp8e4nv", 1), ("u8", 2), ("fp8e5", 2), ("i8", 2))
]
