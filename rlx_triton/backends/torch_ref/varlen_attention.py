"""FlashAttention 2's `flash_attn_varlen_func` in plain torch: the library path of rt.flash_attn_varlen_func
and rt.flash_attn_func.

One sequence at a time (the offsets are read on the host): q rows [cu_seqlens_q[s], cu_seqlens_q[s + 1])
attend to keys [cu_seqlens_k[s], cu_seqlens_k[s + 1]) of a contiguous k/v, or to the first
cu_seqlens_k[s + 1] - cu_seqlens_k[s] keys of sequence s's pages (block_table) of a paged cache, with
FA2's masking (bottom-right causal, local windows, `torch_ref.flash_attn.masking`), tanh softcap, ALiBi,
attention sinks (per-head logits joining the softmax's denominator, transformers' s_aux) and dropout on
the probabilities (scaled by 1 / (1 - p), FA's rule; torch's random numbers, not FA's). Scores are
computed in float32 (float64 inputs stay float64); every op is differentiable, so autograd calls run here.
Rows that see no key give 0 and LSE +inf (with sinks, the sink's logit).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

from rlx_triton.backends.torch_ref.flash_attn import Masking, masking
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: dict = {}
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def sequence_keys(cache: torch.Tensor, start: int, length: int, sequence: int,
                  block_table: Optional[torch.Tensor]) -> torch.Tensor:
    """Sequence `sequence`'s keys (length, Hkv, D): rows start.. of a contiguous buffer, or its pages in order."""
    if block_table is None:
        return cache[start:start + length]
    page_size = cache.shape[1]
    pages = block_table[sequence, :(length + page_size - 1) // page_size].to(torch.int64)
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, mask: Masking,
               softcap: float, slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor], dropout_p: float
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (Lq, H, Dv), lse (H, Lq), probabilities (H, Lq, Lk) with dropped ones negated) of one sequence."""
    seqlen_q, num_heads, _ = q.shape
    seqlen_k, num_kv_heads = keys.shape[0], keys.shape[1]
    group = num_heads // num_kv_heads
    compute = _compute_dtype(q.dtype)
    device = q.device
    keys = keys.to(compute).repeat_interleave(group, dim=1)
    values = values.to(compute).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute), keys) * scale
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    key_pos = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q        # (Lq, 1)
    if slopes is not None:
        distance = key_pos.expand(seqlen_q, seqlen_k) if mask.is_causal else -(diagonal - key_pos).abs()
        scores = scores + slopes.to(compute)[:, None, None] * distance.to(compute)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if mask.left >= 0:
        visible = visible & (key_pos >= diagonal - mask.left)
    if mask.right >= 0:
        visible = visible & (key_pos <= diagonal + mask.right)
    scores = scores.masked_fill(~visible, -math.inf)
    if sinks is not None:
        scores = torch.cat((scores, sinks.to(compute)[:, None, None].expand(num_heads, seqlen_q, 1)), dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True) if scores.shape[-1] else scores.new_zeros(num_heads, seqlen_q, 1)
    row_max = torch.where(row_max == -math.inf, 0.0, row_max)
    exps = torch.exp(scores - row_max)
    total = exps.sum(dim=-1, keepdim=True)
    no_keys = total == 0
    probs = (exps / torch.where(no_keys, 1.0, total))[..., :seqlen_k]
    lse = torch.where(no_keys, math.inf, row_max + torch.log(total))[..., 0]
    shown = probs
    if dropout_p > 0.0:
        kept = torch.rand(probs.shape, device=device) >= dropout_p
        probs = probs * kept / (1.0 - dropout_p)
        shown = torch.where(kept, shown, -shown)
    out = torch.einsum("hqk,khd->qhd", probs, values)
    return out.to(q.dtype), lse.to(torch.float32), shown


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, block_table, s_aux, dropout_p=0.0, *,
                           return_probs: bool = False, candidate=None, route=None):
    """(out (total_q, H, Dv), lse (H, total_q) float32, S_dmask or None) on validated arguments. S_dmask (when
    return_probs and dropout_p > 0, as in FA2): (num_seqs, H, max_seqlen_q, max_seqlen_k) probabilities,
    the dropped ones negated."""
    mask = masking(causal, tuple(window_size), max_seqlen_q, max_seqlen_k, alibi_slopes is not None)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    starts_q = cu_seqlens_q.tolist()
    starts_k = cu_seqlens_k.tolist()
    num_seqs = len(starts_q) - 1
    outs: List[torch.Tensor] = []
    lses: List[torch.Tensor] = []
    s_dmask = None
    if return_probs and dropout_p > 0.0:
        s_dmask = q.new_zeros((num_seqs, q.shape[1], max_seqlen_q, max_seqlen_k), dtype=torch.float32)
    for s in range(num_seqs):
        length_q, length_k = starts_q[s + 1] - starts_q[s], starts_k[s + 1] - starts_k[s]
        keys = sequence_keys(k, starts_k[s], length_k, s, block_table)
        values = sequence_keys(v, starts_k[s], length_k, s, block_table)
        slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[s])
        out, lse, probs = attend_one(q[starts_q[s]:starts_q[s + 1]], keys, values, scale, mask, float(softcap),
                                     slopes, s_aux, float(dropout_p))
        outs.append(out)
        lses.append(lse)
        if s_dmask is not None:
            s_dmask[s, :, :length_q, :length_k] = probs.detach().float()
    # rows past cu_seqlens_q[-1] (a batch padded to a fixed token count) belong to no sequence: 0, LSE +inf
    spare = q.shape[0] - starts_q[-1]
    outs.append(q.new_zeros((spare, q.shape[1], v.shape[-1])))
    lses.append(torch.full((q.shape[1], spare), math.inf, device=q.device))
    return torch.cat(outs), torch.cat(lses, dim=1), s_dmask
