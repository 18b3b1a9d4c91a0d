"""FlashAttention 2's `flash_attn_with_kvcache` in plain torch: the library path of rt.flash_attn_with_kvcache.

One implementation of the semantics, in three steps the kernel path (`through_decode`, a backend's
sdpa_decode for the attention) shares (`rotate_and_append`, `rotated_query`) or replaces (`attend`):
- new keys and values are written into the cache in place at each sequence's `cache_seqlens`, through
  the block table when the cache is paged, after rotary embedding of the new keys;
- the query gets rotary embedding at the positions FA2 gives it: one position per token under causal or
  local attention, every token at `cache_seqlens` otherwise; rotary positions are absolute cache slots
  (new key t at `cache_seqlens + t`), left padding included, as FA2's kernel reads its cos/sin rows;
- attention of the query against keys [cache_leftpad, cache_seqlens + new) of each sequence, with FA2's
  bottom-right causal and local-window masks, tanh softcap, ALiBi and its LSE (+inf for a row that sees
  no key, whose output is 0).
Scores are computed in float32 (float64 inputs stay float64), so float64 inputs give the float64 reference
the tests compare every path with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from rlx_triton.kv_quant import dequantize, is_quantised, quantize, token_head_scales


@dataclass(frozen=True)
class Masking:
    """FA2's masking after it normalizes the arguments: window sides (-1 = unbounded) and its two modes."""

    left: int
    right: int
    is_causal: bool   # window (-1, 0): ALiBi then adds slope * key index, the same bias for every row
    is_local: bool    # any other bounded window: ALiBi adds -slope * |distance to the diagonal|


def masking(causal: bool, window_size: Tuple[int, int], seqlen_q: int, cache_capacity: int,
            has_alibi: bool) -> Masking:
    """FA2's rules: causal means right = 0 (a no-op for one query token without ALiBi), and a side at least
    as long as the cache capacity is unbounded."""
    if seqlen_q == 1 and not has_alibi:
        causal = False
    return window_masking(causal, window_size, cache_capacity)


def window_masking(causal: bool, window_size: Tuple[int, int], cache_capacity: int) -> Masking:
    """FA2's masking once causal is decided: causal means right = 0, and a side at least as long as the cache
    capacity is unbounded."""
    left, right = window_size
    if causal:
        right = 0
    if left >= cache_capacity:
        left = -1
    if right >= cache_capacity:
        right = -1
    is_causal = left < 0 and right == 0
    return Masking(left, right, is_causal, (left >= 0 or right >= 0) and not is_causal)


def decode_masking(causal: str, window: Tuple[int, int], cache_capacity: int) -> Masking:
    """The Masking of a decode-layout call (a backend's sdpa_decode): causal "bottom_right" or "none" and a
    window (left, right), as `through_decode` hands them on. It decides ALiBi's form: slope x key position where
    the causal mask is the only bound, -slope x |distance| otherwise."""
    left, right = window
    return window_masking(causal == "bottom_right", (left, right), cache_capacity)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rotary embedding of x (B, S, H, D) with cos/sin (B, S, rotary_dim / 2): the first rotary_dim channels
    rotate in pairs (2i, 2i+1) when interleaved, (i, i + rotary_dim / 2) otherwise; the rest pass through."""
    half = cos.shape[-1]
    rotary_dim = 2 * half
    cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    rotated = x[..., :rotary_dim]
    if interleaved:
        even, odd = rotated[..., 0::2], rotated[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    else:
        first, second = rotated[..., :half], rotated[..., half:]
        rotated = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _rotary_at(x: torch.Tensor, positions: torch.Tensor, rotary_cos, rotary_sin, interleaved: bool) -> torch.Tensor:
    """x (B, S, H, D) rotated at positions (B, S), computed in float32 (float64 stays) and rounded to x's dtype."""
    compute = _compute_dtype(x.dtype)
    cos, sin = rotary_cos[positions].to(compute), rotary_sin[positions].to(compute)
    return apply_rotary(x.to(compute), cos, sin, interleaved).to(x.dtype)


def _rotary_start(cache_seqlens: torch.Tensor) -> torch.Tensor:
    """The rotary position of each sequence's first new token: its cache slot, cache_seqlens. Positions are
    absolute slots, left padding included, as FA2's kernel reads its cos/sin rows (`row_offset_cossin` starts
    at leftpad_k + seqlen_k_cache, where seqlen_k_cache = cache_seqlens - leftpad_k)."""
    return cache_seqlens.to(torch.int64)


def rotated_query(q: torch.Tensor, rotary_cos, rotary_sin, cache_seqlens: torch.Tensor, interleaved: bool,
                  mask: Masking) -> torch.Tensor:
    """q (B, Sq, H, D) with FA2's rotary: token t at position cache_seqlens + t under causal or local masking,
    every token at cache_seqlens otherwise. q itself when no rotary is given."""
    if rotary_cos is None:
        return q
    start = _rotary_start(cache_seqlens)
    steps = torch.arange(q.shape[1], device=q.device) if (mask.is_causal or mask.is_local) \
        else torch.zeros(q.shape[1], dtype=torch.int64, device=q.device)
    return _rotary_at(q, start[:, None] + steps[None, :], rotary_cos, rotary_sin, interleaved)


def _cache_slots(cache_seqlens: torch.Tensor, seqlen_new: int, cache_batch_idx: Optional[torch.Tensor],
                 block_table: Optional[torch.Tensor], page_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(row, slot) indices (B, seqlen_new) of the cache entries the new tokens are written to."""
    device = cache_seqlens.device
    positions = cache_seqlens.to(torch.int64)[:, None] + torch.arange(seqlen_new, device=device)[None, :]
    if block_table is not None:
        pages = torch.gather(block_table.to(torch.int64), 1, positions // page_size)
        return pages, positions % page_size
    batch = cache_seqlens.shape[0]
    rows = torch.arange(batch, device=device) if cache_batch_idx is None else cache_batch_idx.to(torch.int64)
    return rows[:, None].expand(batch, seqlen_new), positions


def rotate_and_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                      v: Optional[torch.Tensor], rotary_cos, rotary_sin, cache_seqlens: torch.Tensor,
                      cache_batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                      interleaved: bool, k_scale: Optional[torch.Tensor] = None,
                      v_scale: Optional[torch.Tensor] = None) -> None:
    """Writes k (rotated when rotary is given, new token t at position cache_seqlens + t) and v into the caches
    in place at cache_seqlens. A quantised cache stores them quantised (round to nearest, saturating): with the
    per-tensor scale as given, or, with per-token-head scales, each new token and head at the scale that holds
    its largest value, written into k_scale / v_scale at its slot."""
    if k is None:
        return
    assert v is not None, "k and v come together (the op checks it)"
    seqlen_new = k.shape[1]
    if rotary_cos is not None:
        start = _rotary_start(cache_seqlens)
        positions = start[:, None] + torch.arange(seqlen_new, device=k.device)[None, :]
        k = _rotary_at(k, positions, rotary_cos, rotary_sin, interleaved)
    rows, slots = _cache_slots(cache_seqlens, seqlen_new, cache_batch_idx, block_table, k_cache.shape[1])
    for cache, new, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        if not is_quantised(cache):
            cache[rows, slots] = new.to(cache.dtype)
            continue
        assert scale is not None, "a quantised cache comes with its scales (the op checks it)"
        if scale.numel() != 1:   # (rows, slots, Hkv): FlashAttention's layout of the cache without D
            scale[rows, slots] = token_head_scales(new, cache.dtype)
            cache[rows, slots] = quantize(new, scale[rows, slots], cache.dtype)
        else:
            cache[rows, slots] = quantize(new, scale, cache.dtype)


def sequence_view(cache: torch.Tensor, lengths: torch.Tensor, cache_batch_idx: Optional[torch.Tensor],
                  block_table: Optional[torch.Tensor]) -> torch.Tensor:
    """Each sequence's cache as (B, S_cap, Hkv, D): the rows it uses, or its pages gathered in order (pages
    past a sequence's length may hold any index: page 0 is read in their place and masked)."""
    if block_table is not None:
        page_size = cache.shape[1]
        needed = (lengths.to(torch.int64) + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < needed[:, None]
        pages = torch.where(used, block_table.to(torch.int64), 0)
        gathered = cache[pages]  # (B, pages, page_size, Hkv, D)
        return gathered.reshape(pages.shape[0], -1, *cache.shape[2:])
    if cache_batch_idx is not None:
        return cache[cache_batch_idx.to(torch.int64)]
    return cache


def _dequantized_view(cache: torch.Tensor, scale: Optional[torch.Tensor], lengths: torch.Tensor,
                      cache_batch_idx: Optional[torch.Tensor], block_table: Optional[torch.Tensor]) -> torch.Tensor:
    """`sequence_view` of a cache, dequantised (float32) when it is quantised; its per-token-head scales are
    gathered alike (they have the cache's layout without D)."""
    view = sequence_view(cache, lengths, cache_batch_idx, block_table)
    if scale is None:
        return view
    if scale.numel() != 1:
        scale = sequence_view(scale, lengths, cache_batch_idx, block_table)
    return dequantize(view, scale)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
           cache_leftpad: Optional[torch.Tensor], scale: float, mask: Masking, softcap: float,
           alibi_slopes: Optional[torch.Tensor], keep: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Sq, H, Dv) in q's dtype, lse (B, H, Sq) float32) of q (B, Sq, H, D) against keys/values
    (B, S, Hkv, D/Dv), sequence b reading positions [cache_leftpad[b], lengths[b]). keep: (B, Sq, S) bool, the
    keys each row may see besides the window's bound (sdpa_decode's tree mask), the others dropped like it."""
    batch, seqlen_q, num_heads, _ = q.shape
    seq_kv, num_kv_heads = keys.shape[1], keys.shape[2]
    out_dtype = q.dtype
    group = num_heads // num_kv_heads
    compute = _compute_dtype(q.dtype)
    device = q.device

    start = (torch.zeros(batch, dtype=torch.int64, device=device) if cache_leftpad is None
             else cache_leftpad.to(device=device, dtype=torch.int64))
    lengths = lengths.to(device=device, dtype=torch.int64)
    key_pos = torch.arange(seq_kv, device=device)[None, None, :] - start[:, None, None]      # (B, 1, S), from leftpad
    in_sequence = (key_pos >= 0) & (key_pos < (lengths - start)[:, None, None])               # (B, 1, S)
    diagonal = (torch.arange(seqlen_q, device=device)[None, :, None]
                + (lengths - start)[:, None, None] - seqlen_q)                                # (B, Sq, 1)
    visible = in_sequence
    if mask.left >= 0:
        visible = visible & (key_pos >= diagonal - mask.left)
    if mask.right >= 0:
        visible = visible & (key_pos <= diagonal + mask.right)
    if keep is not None:
        visible = visible & keep.to(device)

    # keys outside a sequence take no part (an unused cache tail may hold anything): zeroed values
    values = values.to(compute).masked_fill(~in_sequence[:, 0, :, None, None], 0.0)
    keys = keys.to(compute)
    q = q.to(compute).reshape(batch, seqlen_q, num_kv_heads, group, q.shape[-1])
    scores = torch.einsum("bqkgd,bskd->bkgqs", q, keys).reshape(batch, num_heads, seqlen_q, seq_kv) * scale
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=device, dtype=compute)
        slopes = slopes.expand(batch, num_heads) if slopes.dim() == 1 else slopes
        distance = key_pos if mask.is_causal else -(diagonal - key_pos).abs()                 # (B, Sq|1, S)
        scores = scores + slopes[:, :, None, None] * distance[:, None].to(compute)
    scores = scores.masked_fill(~visible[:, None], -math.inf)

    row_max = scores.amax(dim=-1)
    row_max = torch.where(row_max == -math.inf, 0.0, row_max)
    probs = torch.exp(scores - row_max[..., None])
    total = probs.sum(dim=-1)
    no_keys = total == 0
    probs = probs.reshape(batch, num_kv_heads, group, seqlen_q, seq_kv)
    out = torch.einsum("bkgqs,bskd->bqkgd", probs, values).reshape(batch, seqlen_q, num_heads, -1)
    out = out / torch.where(no_keys, 1.0, total).transpose(1, 2)[..., None]
    lse = torch.where(no_keys, math.inf, row_max + torch.log(total))
    return out.to(out_dtype), lse.to(torch.float32)


def flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, k_scale=None,
                            v_scale=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The whole op on validated arguments (cache_seqlens a (B,) tensor or None): appends, then attends (a
    quantised cache dequantised to float32 as it is gathered)."""
    batch, seqlen_q = q.shape[0], q.shape[1]
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    mask = masking(causal, window_size, seqlen_q, capacity, alibi_slopes is not None)
    if cache_seqlens is None:
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int64, device=q.device)
    rotate_and_append(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, block_table,
                      rotary_interleaved, k_scale, v_scale)
    q = rotated_query(q, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved, mask)
    lengths = cache_seqlens.to(torch.int64) + (0 if k is None else k.shape[1])
    keys, values = (_dequantized_view(cache, scale, lengths, cache_batch_idx, block_table)
                    for cache, scale in ((k_cache, k_scale), (v_cache, v_scale)))
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return attend(q, keys, values, lengths, cache_leftpad, scale, mask, softcap, alibi_slopes)


def through_decode(sdpa_decode_fn, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                   cache_leftpad, block_table, softmax_scale, causal, window_size, rotary_interleaved, alibi_slopes,
                   k_scale=None, v_scale=None, **options) -> Tuple[torch.Tensor, torch.Tensor]:
    """flash_attn_with_kvcache through a backend's `sdpa_decode` (rt's (B, H, S, D) layout, bottom-right causal):
    the appends and the rotary embedding here, the attention there, on strided views of the caches (a paged
    cache's (num_pages, page_size, Hkv, D) viewed as (num_pages, Hkv, page_size, D)). Empty sequences and rows
    that see no key give 0 and FA2's LSE (+inf) where sdpa_decode's convention is -inf. The softcap and the
    window go to sdpa_decode_fn in `options` (its own form of them); cache_batch_idx, cache_leftpad and
    alibi_slopes are handed on where given, and a quantised cache's scales, per-token-head ones viewed as
    (rows, Hkv, slots) like the caches."""
    mask = masking(causal, tuple(window_size), q.shape[1], k_cache.shape[1] * (
        block_table.shape[1] if block_table is not None else 1), alibi_slopes is not None)
    if cache_seqlens is not None:
        rotate_and_append(k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                          block_table, rotary_interleaved, k_scale, v_scale)
        q = rotated_query(q, rotary_cos, rotary_sin, cache_seqlens, rotary_interleaved, mask)
    lengths = None if cache_seqlens is None else cache_seqlens.to(torch.int64) + (0 if k is None else k.shape[1])
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    for name, given in (("block_table", block_table), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("alibi_slopes", alibi_slopes)):
        if given is not None:
            options[name] = given
    for name, kv_scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if kv_scale is not None:
            options[name] = kv_scale if kv_scale.numel() == 1 else kv_scale.transpose(1, 2)
    out, lse = sdpa_decode_fn(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                              causal="bottom_right" if mask.is_causal else "none", scale=float(scale),
                              cache_seqlens=None if lengths is None else lengths.clamp(min=1), **options)
    out, no_keys = out.transpose(1, 2), lse == -math.inf
    if lengths is not None:
        empty = lengths == 0
        out = out.masked_fill(empty[:, None, None, None], 0.0)
        no_keys = no_keys | empty[:, None, None]
    return out.contiguous(), torch.where(no_keys, math.inf, lse).contiguous()
