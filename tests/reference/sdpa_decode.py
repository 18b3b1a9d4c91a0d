"""Float64 reference for decode attention: softmax(q k^T * scale + mask) v, with LSE, on CPU."""
from __future__ import annotations

import math
from typing import Optional

import torch


def attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                        attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                        scale: Optional[float] = None,
                        cache_seqlens: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64 for query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv).

    causal: "none", "top_left" (key j visible to token i iff j <= i) or "bottom_right" (iff
    j <= i + L_b - Lq, L_b the valid length of sequence b). Rows that see no key give 0 and lse = -inf.
    """
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (query, key, value))
    batch, num_heads, seq_q, head_dim = q.shape
    num_kv_heads, seq_kv = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale

    keep = torch.ones(batch, num_heads, seq_q, seq_kv, dtype=torch.bool)
    lengths = (torch.full((batch,), seq_kv) if cache_seqlens is None else cache_seqlens.cpu().long())
    key_pos = torch.arange(seq_kv)
    tok = torch.arange(seq_q)
    keep &= (key_pos[None, :] < lengths[:, None])[:, None, None, :]
    if causal == "top_left":
        keep &= (key_pos[None, :] <= tok[:, None])[None, None]
    elif causal == "bottom_right":
        limit = tok[None, :] + lengths[:, None] - seq_q  # (B, Lq)
        keep &= (key_pos[None, None, :] <= limit[:, :, None])[:, None]
    if attn_mask is not None:
        mask = attn_mask.detach().cpu()
        if mask.dtype == torch.bool:
            keep &= mask.expand_as(keep)
        else:
            scores = scores + mask.to(torch.float64).expand_as(scores)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    visible = torch.isfinite(lse)
    probs = torch.where(visible[..., None], torch.exp(scores - torch.where(visible, lse, 0.0)[..., None]), 0.0)
    out = torch.matmul(probs, v)
    return out, lse
