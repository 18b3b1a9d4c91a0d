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
from typing import List, Optional, Tuple

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


def tree_visibility(tree_mask: torch.Tensor, lengths: torch.Tensor, seq_q: int, seq_kv: int) -> torch.Tensor:
    """(B, Lq, S) bool: the keys token i of sequence b sees under a tree mask ((Lq, Lq) or (B, Lq, Lq) bool): every
    key before L_b - Lq (the prefix) and key L_b - Lq + t iff tree_mask[b, i, t]; none at or past L_b."""
    batch = lengths.shape[0]
    tree = (tree_mask if tree_mask.dim() == 3 else tree_mask[None]).expand(batch, seq_q, seq_q)
    lengths = lengths.to(device=tree.device, dtype=torch.int64)
    column = torch.arange(seq_kv, device=tree.device)[None, :] - (lengths - seq_q)[:, None]   # (B, S): t of each key
    decided = torch.gather(tree, 2, column.clamp(0, seq_q - 1)[:, None, :].expand(batch, seq_q, seq_kv))
    return (column < 0)[:, None, :] | (((column >= 0) & (column < seq_q))[:, None, :] & decided)


def _lengths(batch: int, seq_kv: int, cache_seqlens: Optional[torch.Tensor], device: torch.device) -> torch.Tensor:
    return (torch.full((batch,), seq_kv, dtype=torch.int64, device=device) if cache_seqlens is None
            else cache_seqlens)


def _has_fa_options(softcap: float, window: Tuple[int, int], alibi_slopes: Optional[torch.Tensor]) -> bool:
    return softcap > 0 or tuple(window) != (-1, -1) or alibi_slopes is not None


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                v_scale: Optional[torch.Tensor] = None, candidate=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Hq, Lq, Dv) in query's dtype, lse (B, Hq, Lq) float32); see the Triton launcher (a paged
    cache with block_table is gathered into (B, Hkv, S, D) first). A softcap, a local window or ALiBi slopes
    (with bottom-right or no causal masking, no mask) run FlashAttention's attention step (`with_fa_options`).
    A tree mask (causal "none", no attn_mask) becomes each row's visible keys (`tree_visibility`), masked as a
    bool mask is (dropped with FlashAttention's options). A quantised cache (k_scale, v_scale) is dequantised to
    the query's dtype first (`dequantized`)."""
    key, value = dequantized(query, key, value, k_scale, v_scale)
    if block_table is not None:
        key, value = gathered_pages(key, block_table), gathered_pages(value, block_table)
    keep = None
    if tree_mask is not None:
        if attn_mask is not None or causal != "none":
            raise ValueError("sdpa_decode: a tree_mask replaces attn_mask and causal masking (pass causal='none')")
        keep = tree_visibility(tree_mask, _lengths(query.shape[0], key.shape[2], cache_seqlens, query.device),
                               query.shape[2], key.shape[2])
    if _has_fa_options(softcap, window, alibi_slopes):
        if attn_mask is not None:
            raise ValueError("sdpa_decode: FlashAttention's softcap, window and ALiBi take no attn_mask")
        return with_fa_options(query, key, value, causal, scale, cache_seqlens, softcap, window, alibi_slopes, keep)
    if keep is not None:
        attn_mask = keep[:, None]
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
                    alibi_slopes: Optional[torch.Tensor],
                    keep: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sdpa_decode with FlashAttention's softcap, local window and ALiBi: FA2's own attention step
    (backends/torch_ref/flash_attn.attend) on the (B, S, H, D) views, with sdpa_decode's -inf LSE where a row
    sees no key; keep (B, Lq, S) bool: the keys a tree mask shows each row."""
    from rlx_triton.backends.torch_ref import flash_attn

    if causal not in ("none", "bottom_right"):
        raise ValueError(f"sdpa_decode: FlashAttention's options take bottom-right or no causal masking, got {causal!r}")
    seq_kv = key.shape[2]
    lengths = _lengths(query.shape[0], seq_kv, cache_seqlens, query.device)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    mask = flash_attn.decode_masking(causal, window, seq_kv)
    out, lse = flash_attn.attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), lengths, None,
                                 scale, mask, float(softcap), alibi_slopes, keep)
    return out.transpose(1, 2), torch.where(lse == math.inf, -math.inf, lse)


def sdpa_decode_output(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, causal: str = "none",
                       scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                       block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                       window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                       tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                       v_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The output of `sdpa_decode` alone (a call that returns no LSE). A tree-masked call without FlashAttention's
    options runs torch's own SDPA with the tree's visibility as a bool mask over the (gathered) cache, GQA
    through enable_gqa, which is what `library_kernels` models. Every other call is `sdpa_decode`'s output."""
    if tree_mask is None or _has_fa_options(softcap, window, alibi_slopes):
        return sdpa_decode(query, key, value, causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                           block_table=block_table, softcap=softcap, window=window, alibi_slopes=alibi_slopes,
                           tree_mask=tree_mask, k_scale=k_scale, v_scale=v_scale)[0]
    key, value = dequantized(query, key, value, k_scale, v_scale)
    if causal != "none":
        raise ValueError("sdpa_decode: a tree_mask replaces causal masking (pass causal='none')")
    if block_table is not None:
        key, value = gathered_pages(key, block_table), gathered_pages(value, block_table)
    lengths = _lengths(query.shape[0], key.shape[2], cache_seqlens, query.device)
    keep = tree_visibility(tree_mask, lengths, query.shape[2], key.shape[2])
    # keys and values at or past a sequence's length are zeroed, not read: the mask only adds -inf to their
    # scores, and a NaN stored there would still reach the row (score - inf, 0 x NaN)
    past = torch.arange(key.shape[2], device=key.device)[None, :] >= lengths.to(key.device)[:, None]
    key, value = key.masked_fill(past[:, None, :, None], 0), value.masked_fill(past[:, None, :, None], 0)
    return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask=keep[:, None], scale=scale,
                                                     enable_gqa=key.shape[1] != query.shape[1])


def dequantized(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_scale: Optional[torch.Tensor],
                v_scale: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """A quantised cache's keys and values in the query's dtype (x = q * scale in float32, then rounded), what a
    user without the kernel would do before torch's SDPA; a float cache as it is."""
    from rlx_triton.kv_quant import dequantize

    if k_scale is None:
        return key, value
    return dequantize(key, k_scale).to(query.dtype), dequantize(value, v_scale).to(query.dtype)


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


class _TorchLaunches:
    """The kernels a stretch of eager torch code launches, one record per op, in the order the code runs them:
    `small` for ops on a few elements (their launch latency is their cost), `big` for passes over large tensors,
    `bmm` for torch.matmul / einsum's batched GEMM (cuBLAS)."""

    def __init__(self, profile, size: int, compute: int):
        self.profile, self.size, self.compute = profile, size, compute
        self.kernels: List[LibraryKernel] = []

    def small(self, name: str, count: int = 1) -> None:
        self.kernels.extend(LibraryKernel(name, 0, 0, note="torch op on a few elements") for _ in range(count))

    def big(self, name: str, read: float, written: float, read_size: Optional[int] = None,
            write_size: Optional[int] = None) -> None:
        self.kernels.append(LibraryKernel(name, int(read * (read_size or self.compute)),
                                          int(written * (write_size or self.compute)), note="torch elementwise/reduction"))

    def bmm(self, name: str, batch: int, m: int, n: int, k: int) -> None:
        from rlx_triton.perf.library.attention import batched_matmul

        unit = "fp32_fma"   # fp32 scores (float64 inputs stay float64, priced at the fp32 rate)
        self.kernels.append(batched_matmul(name, batch, m, n, k, self.compute, unit, self.profile))


def _sizes(request) -> Tuple[int, int]:
    """(bytes per input element, bytes per element of the fp32 (fp64) compute)."""
    size = {"float16": 2, "bfloat16": 2, "float64": 8}.get(request.dtype, 4)
    return size, 8 if request.dtype == "float64" else 4


def _softmax_and_pv(run: _TorchLaunches, f: dict, scores: int, einsum: bool) -> None:
    """The tail both fallbacks share (`sdpa_decode` and flash_attn.attend): the NaN-propagating max, exp, sum, P.V,
    the division by the sum and the LSE."""
    b, hq, hkv, lq, s, dv = f["batch"], f["num_heads"], f["num_kv_heads"], f["seq_q"], f["seq_kv"], f["head_dim_v"]
    rows = b * hq * lq
    run.big("amax over the keys", scores, rows)
    run.small("row_max == -inf, where", 2)
    run.big("scores - row_max", scores, scores)
    run.big("exp", scores, scores)
    run.big("sum over the keys", scores, rows)
    run.small("total == 0")
    if einsum:   # einsum permutes V (B, S, Hkv, Dv) to a GEMM operand: a copy
        run.big("einsum: V to (B Hkv, S, Dv)", b * s * hkv * dv, b * s * hkv * dv)
    run.bmm("P.V", b * hkv, (hq // hkv) * lq, dv, s)
    if einsum:
        run.big("einsum: out to (B, Sq, H, Dv)", rows * dv, rows * dv)
    run.small("where(no_keys, 1, total)")
    run.big("out / total", rows * dv, rows * dv)
    run.small("lse: log, +, where", 3)
    if run.size != run.compute:
        run.big("out.to(dtype)", rows * dv, rows * dv, write_size=run.size)


def _modelled(request, profile):
    """(fields, features, storage size, compute size, launches to fill) of a request's torch-path model."""
    size, compute = _sizes(request)
    return request.field_map, request.feature_map, size, compute, _TorchLaunches(profile, size, compute)


def _dims(fields) -> tuple:
    """(batch, query heads, KV heads, query tokens, KV length, head dim, value head dim)."""
    return tuple(fields[k] for k in ("batch", "num_heads", "num_kv_heads", "seq_q", "seq_kv", "head_dim", "head_dim_v"))


def decomposed_decode_kernels(request, profile) -> list:
    """What the torch fallback `sdpa_decode` above launches on a GPU (rt.sdpa_decode's torch route): a paged cache
    gathered (index, then the transposed reshape's copy), the bottom-right mask built, K and V converted to fp32,
    Q.K^T and P.V as fp32 batched GEMMs (cuBLAS; matmul's allow_tf32 is off by default) with every softmax step
    its own pass over the (B, Hq, Lq, S) scores. cache_seqlens is not in the request: modelled without it (its
    value masking adds two passes)."""
    f, feats, size, compute, run = _modelled(request, profile)
    b, hq, hkv, lq, s, d, dv = _dims(f)
    _gathered_pages(run, f, feats, size)
    if feats.get("mask") == "tree":
        _tree_visibility(run, f)
    if feats.get("softcap") or feats.get("window") or feats.get("alibi", "none") != "none":
        run.small("full(lengths)")
        return run.kernels + attend_kernels(request, profile, keys_layout="bhsd")
    scores = b * hq * lq * s
    run.small("arange(S), arange(Lq), full(lengths), tok + lengths - Lq", 5)
    run.big("visible = key_pos <= diagonal", 0, b * lq * s, write_size=1)
    if size != compute:
        run.big("K.to(fp32)", b * hkv * s * d, b * hkv * s * d, read_size=size)
        run.big("V.to(fp32)", b * hkv * s * dv, b * hkv * s * dv, read_size=size)
        run.small("q.to(fp32)")
    run.bmm("Q.K^T", b * hkv, (hq // hkv) * lq, s, d)
    run.big("scores * scale", scores, scores)
    run.big("scores - inf", scores, scores)
    run.big("where(visible, scores, scores - inf)", 2 * scores, scores)
    _softmax_and_pv(run, f, scores, einsum=False)
    return run.kernels


def _gathered_pages(run: _TorchLaunches, f: dict, feats: dict, size: int) -> None:
    """`gathered_pages` of K and V where the request is paged: the table clamped, the pages indexed, then the
    transposed reshape's copy."""
    b, hq, hkv, lq, s, d, dv = _dims(f)
    if feats.get("paged"):
        for cache, width in (("K", d), ("V", dv)):
            run.small(f"block_table.to(int64).clamp for {cache}", 2)
            run.big(f"gather {cache} pages", b * hkv * s * width, b * hkv * s * width, size, size)
            run.big(f"{cache} pages transpose(1, 2).reshape copy", b * hkv * s * width, b * hkv * s * width, size, size)


def _tree_visibility(run: _TorchLaunches, f: dict) -> None:
    """`tree_visibility`: each key's tree column (B, S) int64 and its tests, the tree's rows gathered along the
    keys (B, Lq, S) and combined with the prefix into the bool mask."""
    b, lq, s = f["batch"], f["seq_q"], f["seq_kv"]
    run.small("full(lengths), lengths - Lq", 2)
    run.big("arange(S)", 0, s, write_size=8)
    run.big("column = arange - start", b * s, b * s, 8, 8)
    run.big("column.clamp", b * s, b * s, 8, 8)
    for test in ("column < 0", "column >= 0", "column < Lq"):
        run.big(test, b * s, b * s, 8, 1)
    run.big("in tree: &", 2 * b * s, b * s, 1, 1)
    run.big("gather the tree's rows", b * s * 8, b * lq * s, 1, 1)   # the (B, S) index, broadcast over the rows
    run.big("in tree & gathered", b * s + b * lq * s, b * lq * s, 1, 1)
    run.big("prefix | tree", b * s + b * lq * s, b * lq * s, 1, 1)


def tree_decode_kernels(request, profile) -> list:
    """rt.sdpa_decode(tree_mask=...)'s torch path where it returns the output alone (`sdpa_decode_output`, the
    call a user makes without rlx_triton): a paged cache gathered, the tree's visibility built, the keys and values
    past each length zeroed, then torch's own SDPA with it as a bool mask over the cache (GQA by enable_gqa; torch_sdpa picks the backend and prices its
    conversion of the bool mask). With return_lse the torch path runs the decomposed `sdpa_decode` instead
    (`decomposed_decode_kernels`); the request does not say which, so this models the output alone. With a
    softcap, a window or ALiBi it is the decomposed attention step (`attend_kernels`) after the visibility."""
    from rlx_triton.perf.library.attention import FROM_TORCH_DTYPE, Attention, math_sdpa, torch_sdpa

    f, feats, size, compute, run = _modelled(request, profile)
    if feats.get("softcap") or feats.get("window") or feats.get("alibi", "none") != "none":
        return decomposed_decode_kernels(request, profile)
    b, hq, hkv, lq, s, d, dv = _dims(f)
    _gathered_pages(run, f, feats, size)
    _tree_visibility(run, f)
    run.small("past = arange(S) >= lengths", 2)
    run.big("K.masked_fill(past the length)", b * hkv * s * d, b * hkv * s * d)
    run.big("V.masked_fill(past the length)", b * hkv * s * dv, b * hkv * s * dv)
    shape = Attention(batch=b, heads=hq, kv_heads=hkv, seq_q=lq, seq_kv=s, head_dim=d, head_dim_v=dv, mask="bool")
    dtype = FROM_TORCH_DTYPE.get(request.dtype, request.dtype)
    if dtype not in ("fp16", "bf16", "fp32"):   # float64: math on the fp32 units (no profile states an fp64 rate)
        return run.kernels + math_sdpa(shape, dtype, profile)
    return run.kernels + torch_sdpa(shape, dtype, profile)


def quantised_cache_kernels(request, profile) -> list:
    """The library path of a request on an fp8 / int8 cache, as a user without the kernel runs it: each cache
    dequantised to the query's dtype (a paged cache's pages gathered first, one byte per value), then torch's own
    SDPA on the 16-bit cache (torch_sdpa picks its backend; GQA by enable_gqa; several query tokens under the
    bottom-right causal mask as a bool mask). Each dequantisation is priced as one fused pass (read the bytes and
    the scales, write the 16-bit values): a lower bound on the eager ops, so a kernel that beats this estimate
    beats what the torch path really launches."""
    from rlx_triton.perf.library.attention import FROM_TORCH_DTYPE, Attention, math_sdpa, torch_sdpa

    f, feats, size, compute, run = _modelled(request, profile)
    b, hq, hkv, lq, s, d, dv = _dims(f)
    rows = b * hkv * s
    if feats.get("paged"):
        for cache, width in (("K", d), ("V", dv)):
            run.small(f"block_table.to(int64).clamp for {cache}", 2)
            run.big(f"gather {cache} pages (1-byte values)", rows * width, rows * width, 1, 1)
    scale_bytes = 4 * rows if feats.get("kv_scale") == "per_token_head" else 4
    for cache, width in (("K", d), ("V", dv)):
        run.big(f"{cache} dequantised (x * scale) to the query's dtype", rows * width + scale_bytes, rows * width, 1,
                size)
    causal = feats.get("causal", "none") == "bottom_right" and lq > 1
    shape = Attention(batch=b, heads=hq, kv_heads=hkv, seq_q=lq, seq_kv=s, head_dim=d, head_dim_v=dv,
                      mask="bool" if causal else "none")
    dtype = FROM_TORCH_DTYPE.get(request.dtype, request.dtype)
    if dtype not in ("fp16", "bf16", "fp32"):
        return run.kernels + math_sdpa(shape, dtype, profile)
    return run.kernels + torch_sdpa(shape, dtype, profile)


def attend_kernels(request, profile, *, keys_layout: str = "bshd") -> list:
    """What backends/torch_ref/flash_attn.attend launches (rt.flash_attn_with_kvcache's torch path, and
    sdpa_decode's with a softcap, window or ALiBi): the position masks, V converted and zeroed past each sequence,
    K converted, einsum's Q.K^T (K permuted to a GEMM operand: a copy), the softcap's tanh, ALiBi's bias and the
    mask, then the shared softmax and P.V."""
    f, feats, size, compute, run = _modelled(request, profile)
    b, hq, hkv, lq, s, d, dv = _dims(f)
    scores = b * hq * lq * s
    run.small("start, lengths, arange - start, in_sequence (>=, <, &), diagonal (arange + lengths - Lq)", 9)
    window = 2 if feats.get("window") else 0
    causal = 2 if feats.get("causal") == "bottom_right" else 0
    for _ in range(window + causal):
        run.big("visible &= position bound", b * lq * s, b * lq * s, 1, 1)
    run.big("V.to(compute)", b * s * hkv * dv, b * s * hkv * dv, read_size=size)
    run.big("V.masked_fill(outside the sequence)", b * s * hkv * dv, b * s * hkv * dv)
    if size != compute:
        run.big("K.to(compute)", b * s * hkv * d, b * s * hkv * d, read_size=size)
        run.small("q.to(compute)")
    run.big("einsum: K to (B Hkv, D, S)", b * s * hkv * d, b * s * hkv * d)
    run.bmm("Q.K^T (einsum)", b * hkv, (hq // hkv) * lq, s, d)
    run.big("scores * scale", scores, scores)
    if feats.get("softcap"):
        for step in ("/ softcap", "tanh", "* softcap"):
            run.big(f"softcap {step}", scores, scores)
    if feats.get("alibi", "none") != "none":
        run.small("slopes to, expand", 2)
        run.big("ALiBi distance", b * lq * s, b * lq * s)
        run.big("slopes * distance", b * lq * s, scores)
        run.big("scores + bias", 2 * scores, scores)
    run.big("~visible", b * lq * s, b * lq * s, 1, 1)
    run.big("masked_fill(~visible, -inf)", scores, scores)
    _softmax_and_pv(run, f, scores, einsum=True)
    run.small("lse == inf -> -inf", 2)
    return run.kernels


def kvcache_kernels(request, profile) -> list:
    """rt.flash_attn_with_kvcache's torch path (backends/torch_ref/flash_attn.flash_attn_with_kvcache): the lengths,
    a paged cache's pages (or cache_batch_idx's rows) gathered, then `attend`. The request does not say whether new
    k/v are appended or rotary is given: modelled without them (each would add an index_put per cache and the rotary
    passes over q and the new keys, all small at decode)."""
    f = request.field_map
    feats = request.feature_map
    size, compute = _sizes(request)
    run = _TorchLaunches(profile, size, compute)
    b, hkv, s, d, dv = f["batch"], f["num_kv_heads"], f["seq_kv"], f["head_dim"], f["head_dim_v"]
    run.small("full(cache_seqlens), lengths")
    if feats.get("paged"):
        run.small("pages needed, used, where(used, table, 0)", 4)
    if feats.get("paged") or feats.get("cache_batch_idx"):
        for cache, width in (("K", d), ("V", dv)):
            run.big(f"gather {cache} pages/rows", b * s * hkv * width, b * s * hkv * width, size, size)
    return run.kernels + attend_kernels(request, profile)


def sdpa_shape(request):
    """The Attention shape (rlx_triton.perf.library.attention) of a scaled_dot_product_attention request and the
    dtype in the published format's names: the causal feature, the mask kind, torch's top-left is_causal."""
    from rlx_triton.perf.library.attention import FROM_TORCH_DTYPE, Attention

    f = request.field_map
    feats = request.feature_map
    causal = feats.get("causal", "none")
    mask = feats.get("mask", "none")
    if causal == "bottom_right":   # _torch_sdpa materialises the lower-right causal mask as a bool mask
        mask = "bool"
    shape = Attention(batch=f["batch"], heads=f["num_heads"], kv_heads=f["num_kv_heads"], seq_q=f["seq_q"],
                      seq_kv=f["seq_kv"], head_dim=f["head_dim"], head_dim_v=f["head_dim_v"],
                      causal=causal in ("top_left", "top_left_with_mask"), top_left=True, mask=mask)
    return shape, FROM_TORCH_DTYPE.get(request.dtype, request.dtype)


def library_kernels(request, profile) -> list:
    """The kernels the torch path of a routed sdpa_decode-family request launches on a GPU, as LibraryKernel records
    (the library side of a speed decision and of `rlx-triton perf`), per op:
    - scaled_dot_product_attention: torch's own SDPA (torch._C), the backend its select_sdp_backend picks on this
      GPU and dtype (rlx_triton.perf.library.attention.torch_sdpa: cuDNN first on sm90, then FA2, the cutlass
      memory-efficient kernel, math), after the lower-right causal mask's construction where the call asks for it;
    - sdpa_decode: the decomposed fallback above (it does not call torch's SDPA), a paged cache gathered first;
      with a tree mask, torch's SDPA with the tree's mask over the gathered cache (`tree_decode_kernels`);
    - flash_attn_with_kvcache: backends/torch_ref/flash_attn's decomposed attention, pages gathered first.
    - any of them on an fp8 / int8 cache: the cache dequantised, then torch's SDPA (`quantised_cache_kernels`).
    Pure and cheap: it reads the request's fields and features only."""
    if request.feature_map.get("kv_dtype", "none") != "none":
        return quantised_cache_kernels(request, profile)
    if request.op == "sdpa_decode":
        if request.feature_map.get("mask") == "tree":
            return tree_decode_kernels(request, profile)
        return decomposed_decode_kernels(request, profile)
    if request.op == "flash_attn_with_kvcache":
        return kvcache_kernels(request, profile)
    from rlx_triton.perf.library.attention import elementwise, torch_sdpa

    shape, dtype = sdpa_shape(request)
    feats = request.feature_map
    kernels = []
    if feats.get("causal") == "bottom_right":   # lower_right_mask: ones(L, S), then tril
        kernels += [elementwise("lower_right_mask ones", 0, shape.seq_q * shape.seq_kv, 1),
                    elementwise("lower_right_mask tril", shape.seq_q * shape.seq_kv, shape.seq_q * shape.seq_kv, 1)]
    if dtype not in ("fp16", "bf16", "fp32"):   # float64: math on the fp32 units (no profile states an fp64 rate)
        from rlx_triton.perf.library.attention import math_sdpa

        return kernels + math_sdpa(shape, dtype, profile)
    return kernels + torch_sdpa(shape, dtype, profile, dropout=bool(feats.get("dropout")),
                                layout=feats.get("layout", "batched"))
