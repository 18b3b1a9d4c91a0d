"""A naive float64 reading of FlashAttention 2's flash_attn_with_kvcache, one sequence and one query row at a
time, written from FA2's documented semantics independently of the library's vectorized torch path:
rotary embedding as a complex rotation, paged caches flattened page by page, masks from explicit loops."""
from __future__ import annotations

import math

import torch


def rotate(x: torch.Tensor, positions, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x (S, H, D) float64 rotated at positions[s]: channel pairs as complex numbers times e^(i * angle)."""
    half = cos.shape[1]
    out = x.clone()
    for s, position in enumerate(positions):
        turn = torch.complex(cos[position].double(), sin[position].double())    # (half,)
        part = x[s, :, :2 * half]
        pairs = (torch.complex(part[..., 0::2], part[..., 1::2]) if interleaved
                 else torch.complex(part[..., :half], part[..., half:]))
        turned = pairs * turn
        if interleaved:
            out[s, :, 0:2 * half:2], out[s, :, 1:2 * half:2] = turned.real, turned.imag
        else:
            out[s, :, :half], out[s, :, half:2 * half] = turned.real, turned.imag
    return out


def naive_flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                  cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                  softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                  rotary_interleaved=True, alibi_slopes=None):
    """(out (B, Sq, H, Dv), lse (B, H, Sq), k_cache, v_cache) in float64; the caches are updated copies."""
    k_cache, v_cache = k_cache.double().clone(), v_cache.double().clone()
    batch, seqlen_q, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    page = k_cache.shape[1]
    capacity = page * (block_table.shape[1] if block_table is not None else 1)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens)
    seqlen_new = 0 if k is None else k.shape[1]
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    # FA2 normalizes the window against the cache capacity; causal is the window (-1, 0)
    if causal and not (seqlen_q == 1 and alibi_slopes is None):
        right = 0
    left = -1 if left >= capacity else left
    right = -1 if right >= capacity else right
    is_causal = left < 0 and right == 0
    is_local = (left >= 0 or right >= 0) and not is_causal

    def slot(b, position):  # (row, index) of sequence b's position in the cache
        if block_table is not None:
            return int(block_table[b, position // page]), position % page
        return (b if cache_batch_idx is None else int(cache_batch_idx[b])), position

    out = torch.zeros(batch, seqlen_q, num_heads, v_cache.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, num_heads, seqlen_q), math.inf, dtype=torch.float64)
    for b in range(batch):
        length = capacity if cache_seqlens is None else int(cache_seqlens[b])
        start = 0 if cache_leftpad is None else int(cache_leftpad[b])
        query = q[b].double()
        if rotary_cos is not None:
            # FA2's rule: cos/sin rows are absolute cache slots, left padding included (its test reference
            # rotates with seqlen_offsets=cache_seqlens)
            query = rotate(query, [length + t if (is_causal or is_local) else length for t in range(seqlen_q)],
                           rotary_cos, rotary_sin, rotary_interleaved)
        if k is not None:
            new_k = k[b].double()
            if rotary_cos is not None:
                new_k = rotate(new_k, [length + t for t in range(seqlen_new)], rotary_cos, rotary_sin,
                               rotary_interleaved)
            for t in range(seqlen_new):
                row, index = slot(b, length + t)
                k_cache[row, index] = new_k[t].to(k.dtype).double()
                v_cache[row, index] = v[b, t].double()
        total = length + seqlen_new
        keys = torch.stack([k_cache[slot(b, j)] for j in range(start, total)]) if total > start else None
        values = torch.stack([v_cache[slot(b, j)] for j in range(start, total)]) if total > start else None
        seqlen_k = total - start
        query = query.to(q.dtype).double()   # the rotated query is rounded to q's dtype, as FA2 stores it
        for h in range(num_heads):
            slope = None
            if alibi_slopes is not None:
                slope = float(alibi_slopes[h] if alibi_slopes.dim() == 1 else alibi_slopes[b, h])
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                logits, kept = [], []
                for j in range(seqlen_k):
                    if (left >= 0 and j < diagonal - left) or (right >= 0 and j > diagonal + right):
                        continue
                    s = float(query[i, h] @ keys[j, h // group]) * scale
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    if slope is not None:
                        s += slope * j if is_causal else -slope * abs(diagonal - j)
                    logits.append(s)
                    kept.append(j)
                if not kept:
                    continue
                weights = torch.tensor(logits, dtype=torch.float64)
                top = weights.max()
                probs = torch.exp(weights - top)
                out[b, i, h] = (probs[:, None] * values[kept, h // group]).sum(0) / probs.sum()
                lse[b, h, i] = top + torch.log(probs.sum())
    return out, lse, k_cache, v_cache
