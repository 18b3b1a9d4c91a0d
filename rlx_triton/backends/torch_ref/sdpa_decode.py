"""Decode attention in plain torch: the library fallback of the sdpa_decode family.

Same function and signature as the Triton launcher (`sdpa_decode`, the candidate is ignored): it
computes scores in float32 (float64 inputs stay float64), applies masks, causal alignment and the
per-sequence valid lengths, and returns the output with its natural-log LSE. Rows that see no key
give 0 and LSE = -inf, as the kernel and torch's SDPA do.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: dict = {}


def _visible_keys(batch: int, seq_q: int, seq_kv: int, causal: str, cache_seqlens: Optional[torch.Tensor],
                  device: torch.device) -> Optional[torch.Tensor]:
    """(B, 1, Lq, S) bool of keys each token may see from lengths and causal alignment, or None (all)."""
    if causal == "none" and cache_seqlens is None:
        return None
    key_pos = torch.arange(seq_kv, device=device)
    tok = torch.arange(seq_q, device=device)
    lengths = (torch.full((batch,), seq_kv, device=device) if cache_seqlens is None
               else cache_seqlens.to(device=device, dtype=torch.int64))
    keep = (key_pos[None, None, :] < lengths[:, None, None]).expand(batch, seq_q, seq_kv)
    if causal == "top_left":
        keep = keep & (key_pos[None, None, :] <= tok[None, :, None])
    elif causal == "bottom_right":
        keep = keep & (key_pos[None, None, :] <= (tok[None, :] + lengths[:, None] - seq_q)[:, :, None])
    return keep[:, None]


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                candidate=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Hq, Lq, Dv) in query's dtype, lse (B, Hq, Lq) float32); see the Triton launcher."""
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32

    q = query.to(compute).reshape(batch, num_kv_heads, group * seq_q, head_dim)
    scores = torch.matmul(q, key.to(compute).transpose(-1, -2)) * scale
    scores = scores.view(batch, num_heads, seq_q, seq_kv)
    keep = _visible_keys(batch, seq_q, seq_kv, causal, cache_seqlens, query.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask if keep is None else keep & attn_mask
        else:
            scores = scores + attn_mask.to(compute)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    visible = torch.isfinite(lse)
    probs = torch.exp(scores - torch.where(visible, lse, torch.zeros_like(lse))[..., None])
    probs = probs.masked_fill(~visible[..., None], 0.0)
    probs = probs.reshape(batch, num_kv_heads, group * seq_q, seq_kv)
    out = torch.matmul(probs, value.to(compute)).view(batch, num_heads, seq_q, value.shape[-1])
    return out.to(query.dtype), lse.to(torch.float32)


def sdpa_through_decode(sdpa_decode_fn, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                        candidate) -> torch.Tensor:
    """torch SDPA (dropout 0) through a backend's `sdpa_decode`: (N..., Hq, Lq, D) or (N, Lq, D) inputs
    with the same leading dims are viewed as (B, H, L, D), and the output is given back their layout.
    The Triton and Metal `scaled_dot_product_attention` launchers are this with their own `sdpa_decode`."""
    seq_q, seq_kv = query.shape[-2], key.shape[-2]
    if query.dim() == 3:  # (N, L, E): N sequences of one head each
        q4, k4, v4 = query[None], key[None], value[None]
    else:
        q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (query, key, value))
    mask4 = None
    if attn_mask is not None:
        mask4 = attn_mask.expand(*query.shape[:-1], seq_kv).reshape(q4.shape[0], q4.shape[1], seq_q, seq_kv)
    out, _ = sdpa_decode_fn(q4, k4, v4, attn_mask=mask4, causal="top_left" if is_causal else "none", scale=scale,
                            candidate=candidate)
    return out.reshape(*query.shape[:-3], *out.shape[1:]) if query.dim() > 3 else out[0]


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate=None) -> torch.Tensor:
    """torch's own SDPA (dropout 0), called through torch._C so that rt.patch_sdpa() never recurses."""
    return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                                                     is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
