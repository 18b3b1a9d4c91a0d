"""Triton ragged attention: one launch over a batch of packed prefill chunks and decodes, contiguous or paged KV.

The family module the router reads (`backends/triton/varlen_attention`): `kernels.py` holds the @triton.jit
code, `launch.py` the launch record with its byte and FLOP model, `routing.py` the coverage, approvals and
recipes, `audit.py` the audit specs. `flash_attn_varlen_func` (and `varlen_attn`, the same launch) here is what a
routed call runs.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from rlx_triton.backends.torch_ref.flash_attn import masking
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.varlen_attention.audit import AUDIT_KERNELS
from rlx_triton.backends.triton.varlen_attention.launch import launch_count, softmax_scale, varlen_attention_plan
from rlx_triton.backends.triton.varlen_attention.routing import APPROVALS, COVERAGE, RECIPES, SPEED_EVIDENCE

__all__ = ["APPROVALS", "AUDIT_KERNELS", "COVERAGE", "RECIPES", "SPEED_EVIDENCE", "flash_attn_varlen_func",
           "launch_count", "varlen_attention_plan", "varlen_attn"]


def kernel_options(causal: bool, window_size: Tuple[int, int], max_seqlen_q: int, max_seqlen_k: int,
                   alibi_slopes: Optional[torch.Tensor]) -> dict:
    """FlashAttention 2's masking of a varlen call (normalized against max_seqlen_q / max_seqlen_k) as the
    kernel's window (causal is (-1, 0)) and ALiBi form."""
    left, right = window_size
    mask = masking(causal, (int(left), int(right)), max_seqlen_q, max_seqlen_k, alibi_slopes is not None)
    window = (mask.left, mask.right) if mask.is_local or mask.is_causal else (-1, -1)
    alibi = "none" if alibi_slopes is None else ("key_index" if mask.is_causal else "distance")
    return dict(window=window, alibi=alibi)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale_, causal,
                           window_size, softcap, alibi_slopes, block_table, s_aux, dropout_p=0.0, *,
                           seqused_k=None, k_scale=None, v_scale=None, return_probs: bool = False, candidate,
                           route=None):
    """The validated call in one launch: (out (total_q, H, Dv), lse (H, total_q), None). dropout_p is 0 (the
    coverage takes no dropout). k_scale / v_scale: a quantised (fp8 or int8) k/v's float32 scales, one element or
    one per key row and head (the cache's shape without its head dim), dequantised on load."""
    plan, (out, lse) = varlen_attention_plan(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        scale=softmax_scale(softmax_scale_, q.shape[-1]), softcap=float(softcap), alibi_slopes=alibi_slopes,
        block_table=block_table, sinks=None if s_aux is None else s_aux.float().contiguous(), seqused_k=seqused_k,
        k_scale=k_scale, v_scale=v_scale, candidate=candidate, route=route,
        **kernel_options(causal, window_size, max_seqlen_q, max_seqlen_k, alibi_slopes))
    launches.run(plan)
    return out, lse, None


def varlen_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale_, causal, window_size,
                softcap, alibi_slopes, block_table, s_aux, dropout_p=0.0, *, seqused_k=None, num_splits=None,
                return_probs: bool = False, candidate, route=None):
    """torch.nn.attention.varlen.varlen_attn's call (rt.varlen_attn): the same launch. num_splits is a hint to
    FlashAttention; this launch never splits a sequence's keys, so each sequence's result is the same whatever
    else the batch holds (what num_splits=1 asks FlashAttention for)."""
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale_,
                                  causal, window_size, softcap, alibi_slopes, block_table, s_aux, dropout_p,
                                  seqused_k=seqused_k, candidate=candidate, route=route)
