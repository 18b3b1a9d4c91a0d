"""Triton split-K flash-decoding attention: a few query tokens (Lq <= 64) against a long KV range, contiguous
or paged, GQA/MQA packed into the dot rows, in one launch whose splits merge inside the kernel; a draft tree's
mask (speculative decoding's verification) over the newest keys.

The family module the router reads (`backends/triton/sdpa_decode`): `kernels.py` holds the @triton.jit code
(the decode kernel, the live-split rule on the device, the in-kernel merge of the partials) and the design
notes of its numerics, `launch.py` the split rule, the candidate's meta-parameters, the launch record with
its byte and FLOP model and the autotune bridge, `routing.py` the coverage, approvals and recipes,
`audit.py` the audit specs. `sdpa_decode`, `scaled_dot_product_attention` and `flash_attn_with_kvcache`
here are what a routed call runs.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from rlx_triton.backends.torch_ref.flash_attn import masking
from rlx_triton.backends.torch_ref.flash_attn import through_decode as kvcache_through_decode
from rlx_triton.backends.torch_ref.sdpa_decode import sdpa_through_decode
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.sdpa_decode.audit import AUDIT_KERNELS
from rlx_triton.backends.triton.sdpa_decode.kernels import (ALIBI_DISTANCE, ALIBI_KEY_INDEX, ALIBI_NONE,
                                                            CAUSAL_BOTTOM_RIGHT, CAUSAL_NONE, CAUSAL_TOP_LEFT,
                                                            MASK_BOOL, MASK_FLOAT, MASK_NONE, MASK_TREE,
                                                            MAX_LIFTED_SPLITS, MAX_MERGE_GROUPS, MERGE_GROUP,
                                                            _sdpa_decode_kernel)
from rlx_triton.backends.triton.sdpa_decode.launch import (LN2, LOG2E, MERGE_CHUNK, MIN_BLOCK_N, MIN_FILL, NUM_STAGES,
                                                           _partials_hold_the_grid, block_n_for_short_kv, kv_bucket,
                                                           kv_splits, last_wave_fill, launch_count, merge_chunk,
                                                           programs_per_sm, sdpa_decode_plan, tuned_kernel)
from rlx_triton.backends.triton.sdpa_decode.routing import (APPROVALS, COVERAGE, MAX_HEAD_DIM, MAX_SEQ_Q, RECIPES,
                                                            SPEED_EVIDENCE)

__all__ = ["ALIBI_DISTANCE", "ALIBI_KEY_INDEX", "ALIBI_NONE", "APPROVALS", "AUDIT_KERNELS", "CAUSAL_BOTTOM_RIGHT",
           "CAUSAL_NONE", "CAUSAL_TOP_LEFT", "COVERAGE", "LN2", "LOG2E", "MASK_BOOL", "MASK_FLOAT", "MASK_NONE",
           "MASK_TREE", "MAX_HEAD_DIM", "MAX_LIFTED_SPLITS", "MAX_MERGE_GROUPS", "MAX_SEQ_Q", "MERGE_CHUNK",
           "MERGE_GROUP", "MIN_BLOCK_N", "MIN_FILL", "NUM_STAGES", "RECIPES", "SPEED_EVIDENCE", "_partials_hold_the_grid",
           "_sdpa_decode_kernel", "block_n_for_short_kv", "flash_attn_with_kvcache", "kv_bucket", "kv_splits",
           "last_wave_fill", "launch_count", "merge_chunk", "programs_per_sm", "scaled_dot_product_attention",
           "sdpa_decode", "sdpa_decode_plan", "tuned_kernel"]


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
                tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                v_scale: Optional[torch.Tensor] = None, candidate, route=None,
                sm_count: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a few query tokens against a KV range; returns (out, lse).

    query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) with Hq % Hkv == 0 (strided views are
    read in place when their last dim is contiguous). attn_mask: bool (True keeps) or float (added),
    broadcastable to (B, Hq, Lq, S). causal: "none", "top_left" (torch SDPA) or "bottom_right" (within each
    sequence's valid length). cache_seqlens: (B,) int valid KV lengths in [1, S] or None (= S).
    block_table: (B, pages) int32/int64 page indices of a paged cache: key (num_pages, Hkv, page_size, D) and
    value (num_pages, Hkv, page_size, Dv), S = pages x page_size (no mask, bottom-right or no causal masking).
    FlashAttention's options, with bottom-right or no causal masking and no mask: softcap > 0 maps each scaled
    score s to softcap * tanh(s / softcap); window (left, right) keeps the keys within left before and right
    after each row's diagonal (-1: unbounded); alibi_slopes (Hq,) or (B, Hq) float32 add slope x key position
    where the causal mask is the only bound (`decode_masking`), -slope x |distance to the diagonal| otherwise;
    cache_batch_idx (B,) reads sequence b from cache row cache_batch_idx[b] (not paged); cache_leftpad (B,)
    makes keys [cache_leftpad[b], L_b) the valid ones, positions counted from the first.
    tree_mask: (Lq, Lq) or (B, Lq, Lq) bool, with causal "none" and no attn_mask: token i of sequence b sees every
    key before L_b - Lq and key L_b - Lq + t iff tree_mask[b, i, t] (speculative decoding's draft trees); a
    hidden key is masked additively (dropped with the softcap, a window or ALiBi, as FlashAttention masks).
    k_scale, v_scale: a quantised cache's float32 scales (key and value of dtype float8_e4m3fn, float8_e5m2 or
    int8): one element, or the cache's shape without its last dimension (a scale per key row and head); the kernel
    converts the stored values exactly to its dot operands and applies the scales to the scores (K) and to the
    probabilities (V) in float32.
    route: the router's decision (then the launch goes through the autotune bridge); sm_count: the SMs
    the split rule fills (default: the device's).
    Returns out (B, Hq, Lq, Dv) in query's dtype and lse (B, Hq, Lq) float32 in natural log (-inf and a
    zero output for rows that see no key). Inputs are assumed validated by the op layer. Runs exactly the
    record of `sdpa_decode_plan`: one launch.
    """
    plan, outputs = sdpa_decode_plan(query, key, value, attn_mask=attn_mask, causal=causal, scale=scale,
                                     cache_seqlens=cache_seqlens, block_table=block_table, softcap=softcap,
                                     window=window, alibi_slopes=alibi_slopes, cache_batch_idx=cache_batch_idx,
                                     cache_leftpad=cache_leftpad, tree_mask=tree_mask, k_scale=k_scale,
                                     v_scale=v_scale, candidate=candidate, route=route, sm_count=sm_count)
    launches.run(plan)
    return outputs



def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate, lower_right: bool = False, route=None) -> torch.Tensor:
    """torch SDPA (dropout 0) through the decode kernel: (N..., Hq, Lq, D) or (N, Lq, D) inputs.

    Leading dims of query, key and value must match (the op routes batch broadcasting to torch); the
    KV heads divide the query heads (enable_gqa, or a single KV head that torch broadcasts). lower_right:
    causal masking aligned to the last key (torch's lower-right CausalBias).
    """
    return sdpa_through_decode(sdpa_decode, query, key, value, attn_mask, is_causal, scale, candidate,
                               lower_right=lower_right, route=route)


def flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, *, candidate, route=None, k_scale=None, v_scale=None):
    """FlashAttention's kv-cache call ((B, S, H, D) layouts, paged or not) through the decode kernel: the
    appends and rotary in torch, the attention in one launch with the softcap, the local window, ALiBi,
    cache_batch_idx and cache_leftpad in the kernel."""
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    mask = masking(causal, tuple(window_size), q.shape[1], capacity, alibi_slopes is not None)
    # causal is the window (-1, 0) in FlashAttention: keys right of the diagonal are dropped, not masked by -inf
    window = (mask.left, mask.right) if mask.is_local or mask.is_causal else (-1, -1)

    def attention(*args, **options):
        plan, outputs = sdpa_decode_plan(*args, softcap=softcap, window=window, **options)
        launches.run(plan)
        return outputs

    return kvcache_through_decode(attention, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                  cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                                  rotary_interleaved, alibi_slopes, k_scale, v_scale, candidate=candidate, route=route)
