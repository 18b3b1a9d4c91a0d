"""Decode attention in plain torch: the library fallback of the sdpa_decode family.

Same function and signature as the Triton launcher (`sdpa_decode`, the candidate is ignored): it
computes scores in float32 (float64 inputs stay float64), applies masks, causal alignment and the
per-sequence valid lengths, and returns the output with its natural-log LSE. Rows that see no key
give 0 and LSE = -inf, as the kernel and torch's SDPA do.

Non-finite values reach the output as in torch's math SDPA, over the keys the call reads: keys past
a sequence's valid length (and, under top-left alignment, past the last query token) are never read;
masking any other key adds -inf to its score, so NaN or +inf in a query row, a key or a mask gives a
NaN row, and NaN or Inf in a value gives NaN (0 * NaN). lse is NaN wherever the row's softmax is.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: dict = {}


def _key_masks(batch: int, seq_q: int, seq_kv: int, causal: str, cache_seqlens: Optional[torch.Tensor],
               device: torch.device) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(in_reach (B, S), visible (B, 1, Lq, S)) bool, each None where it keeps every key.

    in_reach: the keys a call reads (those before each sequence's valid length, and before the last
    query token under top-left alignment); visible: the keys each token may see under causal alignment.
    """
    if causal == "none" and cache_seqlens is None:
        return None, None
    key_pos = torch.arange(seq_kv, device=device)
    tok = torch.arange(seq_q, device=device)
    lengths = (torch.full((batch,), seq_kv, device=device) if cache_seqlens is None
               else cache_seqlens.to(device=device, dtype=torch.int64))
    reach = lengths.clamp(max=seq_q) if causal == "top_left" else lengths
    in_reach = key_pos[None, :] < reach[:, None] if cache_seqlens is not None or causal == "top_left" else None
    visible = None
    if causal == "top_left":
        visible = (key_pos[None, :] <= tok[:, None])[None, None]
    elif causal == "bottom_right":
        visible = (key_pos[None, None, :] <= (tok[None, :] + lengths[:, None] - seq_q)[:, :, None])[:, None]
    return in_reach, visible


def _masked(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    # additive, as torch's math SDPA masks: a hidden key's score becomes score - inf, so NaN and +inf
    # scores stay NaN instead of being dropped
    return torch.where(visible, scores, scores - math.inf)


def gathered_pages(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """Pages (num_pages, Hkv, page_size, D) -> (B, Hkv, pages x page_size, D), each sequence's pages in table
    order. Entries outside [0, num_pages) (past a sequence's length, where a table may hold anything) read
    a page in range instead: keys past a sequence's length are never used."""
    pages = cache[block_table.to(torch.int64).clamp(0, cache.shape[0] - 1)]   # (B, pages, Hkv, page_size, D)
    return pages.transpose(1, 2).reshape(block_table.shape[0], cache.shape[1], -1, cache.shape[-1])


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                candidate=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Hq, Lq, Dv) in query's dtype, lse (B, Hq, Lq) float32); see the Triton launcher (a paged
    cache with block_table is gathered into (B, Hkv, S, D) first). A softcap, a local window or ALiBi slopes
    (with bottom-right or no causal masking, no mask) run FlashAttention's attention step (`with_fa_options`)."""
    if block_table is not None:
        key, value = gathered_pages(key, block_table), gathered_pages(value, block_table)
    if softcap > 0 or tuple(window) != (-1, -1) or alibi_slopes is not None:
        if attn_mask is not None:
            raise ValueError("sdpa_decode: FlashAttention's softcap, window and ALiBi take no attn_mask")
        return with_fa_options(query, key, value, causal, scale, cache_seqlens, softcap, window, alibi_slopes)
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv = key.shape[1], key.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32

    in_reach, visible = _key_masks(batch, seq_q, seq_kv, causal, cache_seqlens, query.device)
    key, value = key.to(compute), value.to(compute)
    if in_reach is not None:
        # keys out of reach take no part (a cache's unused tail may hold anything): their scores are
        # replaced below, their values zeroed here, since a 0 weight times NaN would still be NaN
        value = value.masked_fill(~in_reach[:, None, :, None], 0.0)
    q = query.to(compute).reshape(batch, num_kv_heads, group * seq_q, head_dim)
    scores = torch.matmul(q, key.transpose(-1, -2)) * scale
    scores = scores.view(batch, num_heads, seq_q, seq_kv)
    if visible is not None:
        scores = _masked(scores, visible)
    if attn_mask is not None:
        scores = _masked(scores, attn_mask) if attn_mask.dtype == torch.bool else scores + attn_mask.to(compute)
    if in_reach is not None:
        scores = scores.masked_fill(~in_reach[:, None, None, :], -math.inf)
    # softmax with its max taken NaN-propagating (amax), so a NaN or +inf score makes the row NaN; a row
    # whose scores are all -inf sums to 0 and gives 0 with lse = -inf
    row_max = scores.amax(dim=-1)
    row_max = torch.where(row_max == -math.inf, 0.0, row_max)
    probs = torch.exp(scores - row_max[..., None])
    total = probs.sum(dim=-1)
    no_keys = total == 0
    probs = probs.reshape(batch, num_kv_heads, group * seq_q, seq_kv)
    out = torch.matmul(probs, value).view(batch, num_heads, seq_q, value.shape[-1])
    out = out / torch.where(no_keys, 1.0, total)[..., None]
    lse = torch.where(no_keys, -math.inf, row_max + torch.log(total))
    return out.to(query.dtype), lse.to(torch.float32)


def with_fa_options(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: str, scale: Optional[float],
                    cache_seqlens: Optional[torch.Tensor], softcap: float, window: Tuple[int, int],
                    alibi_slopes: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """sdpa_decode with FlashAttention's softcap, local window and ALiBi: FA2's own attention step
    (backends/torch_ref/flash_attn.attend) on the (B, S, H, D) views, with sdpa_decode's -inf LSE where a row
    sees no key."""
    from rlx_triton.backends.torch_ref import flash_attn

    if causal not in ("none", "bottom_right"):
        raise ValueError(f"sdpa_decode: FlashAttention's options take bottom-right or no causal masking, got {causal!r}")
    batch, seq_kv = query.shape[0], key.shape[2]
    lengths = (torch.full((batch,), seq_kv, dtype=torch.int64, device=query.device) if cache_seqlens is None
               else cache_seqlens)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    mask = flash_attn.decode_masking(causal, window, seq_kv)
    out, lse = flash_attn.attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), lengths, None,
                                 scale, mask, float(softcap), alibi_slopes)
    return out.transpose(1, 2), torch.where(lse == math.inf, -math.inf, lse)


def sdpa_through_decode(sdpa_decode_fn, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attn_mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                        candidate, *, lower_right: bool = False, **options) -> torch.Tensor:
    """torch SDPA (dropout 0) through a backend's `sdpa_decode`: (N..., Hq, Lq, D) or (N, Lq, D) inputs
    with the same leading dims are viewed as (B, H, L, D), and the output is given back their layout.
    lower_right: causal masking aligned to the last key (a lower-right CausalBias) instead of is_causal's
    top-left. The Triton and Metal `scaled_dot_product_attention` launchers are this with their own
    `sdpa_decode` (`options`, e.g. the Triton launcher's route, are passed on to it)."""
    seq_q, seq_kv = query.shape[-2], key.shape[-2]
    if query.dim() == 3:  # (N, L, E): N sequences of one head each
        q4, k4, v4 = query[None], key[None], value[None]
    else:
        q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (query, key, value))
    mask4 = None
    if attn_mask is not None:
        mask4 = attn_mask.expand(*query.shape[:-1], seq_kv).reshape(q4.shape[0], q4.shape[1], seq_q, seq_kv)
    causal = "bottom_right" if lower_right else "top_left" if is_causal else "none"
    out, _ = sdpa_decode_fn(q4, k4, v4, attn_mask=mask4, causal=causal, scale=scale, candidate=candidate, **options)
    return out.reshape(*query.shape[:-3], *out.shape[1:]) if query.dim() > 3 else out[0]


def lower_right_mask(seq_q: int, seq_kv: int, device) -> torch.Tensor:
    """The bool (Lq, S) mask of causal masking aligned to the last key (torch's lower-right CausalBias)."""
    return torch.ones(seq_q, seq_kv, dtype=torch.bool, device=device).tril(seq_kv - seq_q)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate=None, lower_right: bool = False, route=None) -> torch.Tensor:
    """torch's own SDPA (dropout 0), called through torch._C so that rt.patch_sdpa() never recurses;
    lower_right runs it with the lower-right causal mask materialized, as torch does off its fused kernels."""
    if lower_right:
        attn_mask, is_causal = lower_right_mask(query.shape[-2], key.shape[-2], query.device), False
    return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=0.0,
                                                     is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def library_kernels(request) -> list:
    """The kernel torch's SDPA runs on a GPU for a routed decode request, for the library path estimate
    (rlx_triton.backends.torch_ref.library_kernel.LibraryKernel): one fused attention kernel (FlashAttention-2 / memory-efficient)
    reading q, K and V once and writing the output, with the two products on the tensor cores for fp16/bf16
    (fp32: the FMA units). Its grid is not stated (every SM busy), so the estimate bounds the library from below."""
    fields = request.field_map
    batch, heads, kv_heads = fields["batch"], fields["num_heads"], fields["num_kv_heads"]
    seq_q, seq_kv, dim, dim_v = fields["seq_q"], fields["seq_kv"], fields["head_dim"], fields["head_dim_v"]
    size = {"float16": 2, "bfloat16": 2, "float64": 8}.get(request.dtype, 4)
    unit = {"float16": "fp16_mma", "bfloat16": "bf16_mma"}.get(request.dtype, "fp32_fma")
    read = (batch * heads * seq_q * dim + batch * kv_heads * seq_kv * (dim + dim_v)) * size
    written = batch * heads * seq_q * dim_v * size
    return [LibraryKernel("fused attention (torch SDPA)", read, written,
                          2 * batch * heads * seq_q * seq_kv * (dim + dim_v), unit)]
