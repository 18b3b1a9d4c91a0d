"""rt.sdpa_decode: attention of a few new query tokens against a KV cache (contiguous or paged), one valid
length per sequence, with FlashAttention's local window, softcap and ALiBi options.

A call is validated first (errors name the argument), reduced to a routing Request from the shapes, and
runs as the torch.library custom op `rlx_triton::sdpa_decode` with a fake implementation, so
`torch.compile(fullgraph=True)` sees one opaque node per call. In eager mode the wrapper routes once and
hands its decision to the custom op (ops/_decisions.py); under torch.compile the op routes when it runs. A
call with the signature of an earlier one reuses its decision and checks only the values that change
between decode steps (cache lengths, the block table), where RLX_TRITON_CHECK_VALUES lets it read them.

rt.scaled_dot_product_attention and rt.patch_sdpa live in ops/sdpa.py; they are importable from this module
as well.
"""
from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Tuple, Union, overload

import torch

from rlx_triton.kv_quant import KV_DTYPES, KV_SCALES, check_kv_scales, is_quantised, kv_features
from rlx_triton.ops import _decisions
from rlx_triton.ops._attention_options import (ATTENTION_GIVEN, TOKENS, AttentionInputError,
                                               attention_option_features, check_attention_options,
                                               check_same_dtype_and_device, check_scale, heads_divide, is_fake,
                                               scale_value, values_readable)
from rlx_triton.ops._checks import attention_layout_hint, check_is_tensor, needs_grad
from rlx_triton.ops._request_spec import Derived, Feature, RequestSpec, flag
from rlx_triton.ops.sdpa import patch_sdpa, scaled_dot_product_attention
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.route import Route, exact_route, planning_route, remember_exact_route

__all__ = ["sdpa_decode", "scaled_dot_product_attention", "patch_sdpa", "AttentionInputError"]


# what a decode call sends the router (ops/_request_spec.py), read by `_decode_request` and by `rlx-triton explain`
SDPA_DECODE_REQUEST = RequestSpec(
    KernelFamily.SDPA_DECODE.value, "sdpa_decode", ATTENTION_GIVEN,
    (Derived("m", lambda f, o: f["seq_q"] * (f["num_heads"] // f["num_kv_heads"]), "seq_q x num_heads / num_kv_heads",
             ("seq_q", "num_heads", "num_kv_heads"), "query rows per KV head"), TOKENS),
    # mask "tree": a tree_mask decides the Lq newest keys (the prefix before them is seen by every token)
    {"mask": Feature("none", ("none", "tree")), "causal": Feature("bottom_right", ("bottom_right",)),
     "dropout": Feature(False, (False,)), "layout": Feature("batched", ("batched",)),
     "requires_grad": flag(False),
     # FlashAttention's options, named only when in use (a backend's coverage must name each one it takes)
     "paged": flag(False, sent_at_default=False), "window": flag(False, sent_at_default=False),
     "softcap": flag(False, sent_at_default=False),
     "alibi": Feature("none", ("none", "per_head", "per_batch_head"), sent_at_default=False),
     # a quantised cache: its storage dtype and its scales' layout (rlx_triton/kv_quant.py)
     "kv_dtype": Feature("none", KV_DTYPES, sent_at_default=False),
     "kv_scale": Feature("none", KV_SCALES, sent_at_default=False)},
    (heads_divide,),
)


def _decode_window(window_size, s_max: int, tree: bool = False) -> Tuple[int, int]:
    """The local window sdpa_decode hands a backend, normalized as FlashAttention normalizes a causal call's
    (backends/torch_ref/flash_attn.window_masking): the causal mask bounds the right side (right = 0), and a
    left side reaching the whole cache is unbounded. (left, 0) where it bounds the keys beyond the causal
    mask, (-1, -1) where the causal mask alone does. Under a tree mask, which decides the newest keys in place
    of the causal mask, the right side is unbounded: (left, -1). Plain arithmetic: the wrapper runs it under
    torch.compile."""
    left = window_size[0]
    return (left, -1 if tree else 0) if 0 <= left < s_max else (-1, -1)


def _decode_options(window: Tuple[int, int], softcap: float, alibi_slopes: Optional[torch.Tensor]) -> Dict[str, Any]:
    """The FlashAttention options of a decode call in a backend's keywords, only those in use (a backend whose
    coverage does not name them is never handed them)."""
    options: Dict[str, Any] = {}
    if window != (-1, -1):
        options["window"] = window
    if softcap > 0:
        options["softcap"] = float(softcap)
    if alibi_slopes is not None:
        options["alibi_slopes"] = alibi_slopes
    return options


def _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table=None, window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, tree_mask=None, k_scale=None, v_scale=None) -> None:
    op = "sdpa_decode"
    paged = block_table is not None
    for name, tensor in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_is_tensor(name, tensor, op=op)
        if tensor.dim() != 4:
            cache = "(num_pages, Hkv, page_size, {})" if paged else "(B, Hkv, S_max, {})"
            layout = "(B, Hq, Lq, D)" if name == "query" else cache.format("D" if name == "k_cache" else "Dv")
            raise AttentionInputError(f"{op}: {name} must be 4-D {layout}, got shape {tuple(tensor.shape)}")
    check_scale(scale, op)
    if is_quantised(k_cache) or is_quantised(v_cache):   # fp8/int8 caches beside a floating-point query
        check_same_dtype_and_device(op, query=query)
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.device != query.device:
                raise AttentionInputError(f"{op}: {name} must be on {query.device}, got {cache.device}")
    else:
        check_same_dtype_and_device(op, query=query, k_cache=k_cache, v_cache=v_cache)
    check_kv_scales(op, AttentionInputError, k_cache, v_cache, k_scale, v_scale)
    batch, heads, seq_q, head_dim = query.shape
    if paged:
        check_is_tensor("block_table", block_table, op=op)
        if block_table.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: block_table must be int32 or int64, got {block_table.dtype}")
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
            raise AttentionInputError(f"{op}: block_table must have shape (B, pages) = ({batch}, >= 1), got "
                                      f"{tuple(block_table.shape)}")
        if block_table.device != query.device:
            raise AttentionInputError(f"{op}: block_table must be on {query.device}, got {block_table.device}")
        if k_cache.shape[0] == 0 or k_cache.shape[3] != head_dim:
            raise AttentionInputError(f"{op}: a paged k_cache must be (num_pages >= 1, Hkv, page_size, D = "
                                      f"{head_dim}), got {tuple(k_cache.shape)}")
    elif k_cache.shape[0] != batch or k_cache.shape[3] != head_dim:
        raise AttentionInputError(f"{op}: k_cache must be (B, Hkv, S_max, D) = ({batch}, Hkv, S_max, {head_dim}), "
                                  f"got {tuple(k_cache.shape)}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise AttentionInputError(f"{op}: v_cache must be {tuple(k_cache.shape[:3])} + (Dv,) like k_cache, "
                                  f"got {tuple(v_cache.shape)}")
    kv_heads, s_max = k_cache.shape[1], _decode_capacity(k_cache, block_table)
    if kv_heads == 0 or heads % kv_heads != 0:
        raise AttentionInputError(f"{op}: the KV heads of k_cache ({kv_heads}) must divide the query heads ({heads})"
                                  + attention_layout_hint(op, query, k_cache))
    if s_max == 0 or seq_q == 0:
        raise AttentionInputError(f"{op}: query tokens and k_cache length must be >= 1, got Lq={seq_q}, S_max={s_max}")
    if cache_seqlens is not None:
        _check_decode_lengths(cache_seqlens, batch, s_max, query.device)
    if paged:
        _check_pages(block_table, cache_seqlens, k_cache)
    check_attention_options(op, AttentionInputError, window_size=window_size, softcap=softcap,
                            alibi_slopes=alibi_slopes, batch=batch, num_heads=heads, device=query.device)
    if tree_mask is not None:
        _check_tree_mask(tree_mask, batch, seq_q, query.device)


def _check_tree_mask(tree_mask, batch: int, seq_q: int, device: torch.device) -> None:
    """A bool (Lq, Lq) or (B, Lq, Lq) tensor on the query's device; any other dtype or shape is a ValueError (an
    int8 or float mask would read as a different mask), as the issue's contract for tree_mask says."""
    op = "sdpa_decode"
    check_is_tensor("tree_mask", tree_mask, op=op)
    if tree_mask.dtype != torch.bool:
        raise AttentionInputError(f"{op}: tree_mask must be a bool tensor (True: the token sees that draft "
                                  f"position), got {tree_mask.dtype}")
    if tuple(tree_mask.shape) not in ((seq_q, seq_q), (batch, seq_q, seq_q)):
        raise AttentionInputError(f"{op}: tree_mask must have shape (Lq, Lq) = ({seq_q}, {seq_q}) or (B, Lq, Lq) = "
                                  f"({batch}, {seq_q}, {seq_q}), got {tuple(tree_mask.shape)}")
    if tree_mask.device != device:
        raise AttentionInputError(f"{op}: tree_mask must be on {device}, got {tree_mask.device}")


def _check_decode_lengths(cache_seqlens, batch: int, s_max: int, device: torch.device) -> None:
    op = "sdpa_decode"
    check_is_tensor("cache_seqlens", cache_seqlens, op=op)
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if cache_seqlens.shape != (batch,):
        raise AttentionInputError(f"{op}: cache_seqlens must have shape (B,) = ({batch},), "
                                  f"got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != device:
        raise AttentionInputError(f"{op}: cache_seqlens must be on {device}, got {cache_seqlens.device}")
    _check_cache_lengths(cache_seqlens, s_max)


def _decode_capacity(k_cache: torch.Tensor, block_table: Optional[torch.Tensor]) -> int:
    """S_max: the cache length, or a paged sequence's pages x page size."""
    return k_cache.shape[2] if block_table is None else block_table.shape[1] * k_cache.shape[2]


def _check_pages(block_table: torch.Tensor, cache_seqlens: Optional[torch.Tensor], k_cache: torch.Tensor) -> None:
    """The pages each sequence reads (those its length reaches) index k_cache. It reads device data: skipped
    while compiling, tracing fakes or capturing a CUDA graph."""
    if not values_readable(block_table):
        return
    page_size, num_pages = k_cache.shape[2], k_cache.shape[0]
    used = torch.ones_like(block_table, dtype=torch.bool)
    if cache_seqlens is not None and not is_fake(cache_seqlens):
        needed = (cache_seqlens.to(torch.int64) + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < needed[:, None]
    pages = block_table[used]
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_pages):
        raise AttentionInputError(f"sdpa_decode: the block_table entries a sequence reads must be in "
                                  f"[0, {num_pages}) (k_cache's pages), got values in [{int(pages.min())}, "
                                  f"{int(pages.max())}]")


def _check_cache_lengths(cache_seqlens: torch.Tensor, s_max: int) -> None:
    """Every length in [1, S_max]. It reads device data: skipped while compiling, tracing fakes or capturing a
    CUDA graph."""
    if not values_readable(cache_seqlens):
        return
    low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
    if low < 1 or high > s_max:
        raise AttentionInputError(f"sdpa_decode: every cache_seqlens entry must be in [1, S_max={s_max}], "
                                  f"got values in [{low}, {high}]")


def _decode_request(query, k_cache, v_cache, cache_seqlens=None, *, scale=None, return_lse=False,
                    block_table=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, tree_mask=None,
                    k_scale=None, v_scale=None, _validate=True) -> Request:
    """Validates an sdpa_decode call and reduces it to a routing Request (what explain() shows); a paged
    cache, a local window, a softcap and ALiBi slopes are the features paged, window, softcap and alibi, which
    a backend's coverage must name; a tree mask is mask "tree"."""
    if _validate:
        _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                         alibi_slopes, tree_mask, k_scale, v_scale)
    batch, heads, seq_q, head_dim = query.shape
    kv_heads, s_max = k_cache.shape[1], _decode_capacity(k_cache, block_table)
    tree = tree_mask is not None
    features = {"mask": "tree" if tree else "none", "causal": "bottom_right", "dropout": False,
                "layout": "batched", "requires_grad": needs_grad(query, k_cache, v_cache)}
    features.update(attention_option_features(paged=block_table is not None,
                                              local_window=_decode_window(window_size, s_max, tree) != (-1, -1),
                                              softcap=softcap, alibi_slopes=alibi_slopes))
    features.update(kv_features(k_cache, k_scale))
    return SDPA_DECODE_REQUEST.make(
        {"batch": batch, "num_heads": heads, "head_dim": head_dim, "seq_q": seq_q, "seq_kv": s_max,
         "num_kv_heads": kv_heads, "head_dim_v": v_cache.shape[-1]}, features, tensor=query)


@torch.library.custom_op("rlx_triton::sdpa_decode", mutates_args=())
def _sdpa_decode_op(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: Optional[torch.Tensor], scale: Optional[float],
                    block_table: Optional[torch.Tensor] = None, window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                    tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                    v_scale: Optional[torch.Tensor] = None,
                    decision: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    window = (window_left, window_right)   # already normalized by the wrapper (`_decode_window`)
    chosen = _decisions.received(decision)
    if chosen is None:  # under torch.compile (or a forgotten decision): route now
        chosen = route(_decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, block_table=block_table,
                                       window_size=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                       tree_mask=tree_mask, k_scale=k_scale, v_scale=v_scale, _validate=False))
    out, lse = _run_decode(chosen, query, k_cache, v_cache, cache_seqlens, scale, block_table, window, softcap,
                           alibi_slopes, tree_mask, k_scale, v_scale)
    return out.contiguous(), lse.contiguous()


def _run_decode(chosen: Route, query, k_cache, v_cache, cache_seqlens, scale, block_table, window, softcap,
                alibi_slopes, tree_mask, k_scale=None, v_scale=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a decode call on its route's backend (what the custom op runs)."""
    options: Dict[str, Any] = {"route": chosen} if chosen.backend == "triton" else {}
    options.update(_backend_options(block_table, window, softcap, alibi_slopes, tree_mask, k_scale, v_scale))
    backend = chosen.module
    assert backend is not None, "route() names the module that runs the call"
    return backend.sdpa_decode(query, k_cache, v_cache, scale=scale, cache_seqlens=cache_seqlens,
                               candidate=chosen.candidate, **options)


def _backend_options(block_table, window, softcap, alibi_slopes, tree_mask, k_scale=None,
                     v_scale=None) -> Dict[str, Any]:
    """A backend's keywords for a decode call: its causal alignment (bottom-right, or none under a tree mask,
    which decides the newest keys instead), the block table, the tree mask and a quantised cache's scales where
    given (only backends whose coverage names paged=True, mask "tree" or the kv_dtype are routed them) and
    FlashAttention's options in use."""
    options: Dict[str, Any] = {"causal": "none" if tree_mask is not None else "bottom_right"}
    if block_table is not None:
        options["block_table"] = block_table
    if tree_mask is not None:
        options["tree_mask"] = tree_mask
    if k_scale is not None:
        options["k_scale"], options["v_scale"] = k_scale, v_scale
    options.update(_decode_options(window, softcap, alibi_slopes))
    return options


@_sdpa_decode_op.register_fake
def _sdpa_decode_fake(query, k_cache, v_cache, cache_seqlens, scale, block_table=None, window_left=-1,
                      window_right=-1, softcap=0.0, alibi_slopes=None, tree_mask=None, k_scale=None, v_scale=None,
                      decision=None):
    batch, heads, seq_q, _ = query.shape
    out = query.new_empty((batch, heads, seq_q, v_cache.shape[-1]))
    return out, query.new_empty((batch, heads, seq_q), dtype=torch.float32)


def _decode_signature(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                      alibi_slopes, tree_mask, k_scale=None, v_scale=None) -> Optional[tuple]:
    """What validation (bar the cache lengths' values) and routing read from an sdpa_decode call."""
    try:
        # values and their types: True == 1 hashes alike, but validation tells them apart
        options = (window_size, tuple(type(w) for w in window_size), softcap, type(softcap),
                   None if alibi_slopes is None else (alibi_slopes.shape, alibi_slopes.dtype, alibi_slopes.device))
        signature = ("sdpa_decode", query.shape, k_cache.shape, v_cache.shape, query.dtype, k_cache.dtype,
                     v_cache.dtype, query.device, k_cache.device, v_cache.device,
                     torch.is_grad_enabled() and (query.requires_grad or k_cache.requires_grad or v_cache.requires_grad),
                     type(scale), None if cache_seqlens is None else (cache_seqlens.shape, cache_seqlens.dtype,
                                                                      cache_seqlens.device),
                     None if block_table is None else (block_table.shape, block_table.dtype, block_table.device),
                     None if tree_mask is None else (tree_mask.shape, tree_mask.dtype, tree_mask.device),
                     options, None if k_scale is None else (k_scale.shape, k_scale.dtype, k_scale.device),
                     None if v_scale is None else (v_scale.shape, v_scale.dtype, v_scale.device))
        hash(signature)
    except (AttributeError, TypeError):
        return None
    return signature


# The return type follows return_lse: `out` alone, or (out, lse) with return_lse=True.
@overload
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = ..., *, scale: Optional[float] = ...,
                return_lse: Literal[False] = ..., block_table: Optional[torch.Tensor] = ...,
                window_size: Tuple[int, int] = ..., softcap: float = ...,
                alibi_slopes: Optional[torch.Tensor] = ..., tree_mask: Optional[torch.Tensor] = ...,
                k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...) -> torch.Tensor: ...


@overload
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = ..., *, scale: Optional[float] = ...,
                return_lse: Literal[True], block_table: Optional[torch.Tensor] = ...,
                window_size: Tuple[int, int] = ..., softcap: float = ...,
                alibi_slopes: Optional[torch.Tensor] = ..., tree_mask: Optional[torch.Tensor] = ...,
                k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...
                ) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = ..., *, scale: Optional[float] = ...,
                return_lse: bool = ..., block_table: Optional[torch.Tensor] = ...,
                window_size: Tuple[int, int] = ..., softcap: float = ...,
                alibi_slopes: Optional[torch.Tensor] = ..., tree_mask: Optional[torch.Tensor] = ...,
                k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...


@routed_op(_decode_request)
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
                return_lse: bool = False, block_table: Optional[torch.Tensor] = None,
                window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                alibi_slopes: Optional[torch.Tensor] = None, tree_mask: Optional[torch.Tensor] = None,
                k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of Lq new tokens against a KV cache, one valid length per sequence.

    The Lq query tokens are the last Lq positions of each sequence's valid part: causal masking is
    bottom-right within the valid length (the FlashAttention kv-cache convention), so token i sees keys
    j <= i + L_b - Lq, and a token that sees none gives 0. Keys at or past a sequence's length are never read.
    NaN and Inf follow torch's math SDPA within each valid part: NaN or +inf in a query row or a valid key
    gives that row NaN (lse NaN), NaN or Inf in a valid value gives NaN.

    With tree_mask (speculative decoding's verification of a draft tree) the Lq tokens are still the last Lq
    positions, but token i sees every key before L_b - Lq (the prefix) and key L_b - Lq + t iff
    tree_mask[b, i, t], in place of the causal mask: a lower-triangular tree_mask gives the causal result.

    Args:
        query: (B, Hq, Lq, D), torch SDPA's layout (heads before tokens; rt.flash_attn_with_kvcache takes
            (B, S, H, D)).
        k_cache: (B, Hkv, S_max, D), Hkv dividing Hq (query head h reads KV head h // (Hq // Hkv)); paged:
            (num_pages, Hkv, page_size, D) for any page size >= 1.
        v_cache: (B, Hkv, S_max, Dv); paged: (num_pages, Hkv, page_size, Dv).
        cache_seqlens: int32/int64 (B,), each in [1, S_max]; None: every sequence uses all S_max positions.
            The values of cache_seqlens and block_table are checked only where RLX_TRITON_CHECK_VALUES allows
            it (by default where they are on the CPU: on a GPU the check would be a host sync); unchecked, the
            kernel clamps lengths to [0, S_max] (0: the sequence gives 0 and lse -inf) and drops keys whose
            page is outside k_cache.
        scale: the score scale (default 1/sqrt(D)).
        return_lse: also return the log-sum-exp of each row's scores.
        block_table: int32/int64 (B, pages), each sequence's pages in order; S_max = pages x page_size and
            sequence b's key n is slot n % page_size of page block_table[b, n // page_size] (only the pages a
            sequence's length reaches are read).
        window_size: (left, right), as flash_attn_with_kvcache with causal=True: keeps the keys within left
            positions before each token's diagonal i + L_b - Lq (-1: unbounded).
        softcap: > 0 maps each scaled score s to softcap * tanh(s / softcap).
        alibi_slopes: (Hq,) or (B, Hq) float32, adds -slope * |i + L_b - Lq - j| to the score of key j, in
            FlashAttention's form. window_size, softcap and alibi_slopes run on the Triton kernel; Metal
            refuses them (the torch path runs).
        tree_mask: bool (Lq, Lq), shared by the batch, or (B, Lq, Lq): row i says which of the Lq newest
            positions token i sees (its ancestors in the draft tree and itself). It composes with paged caches,
            GQA, scale, softcap, alibi_slopes (-slope * |L_b - Lq + i - j|), window_size (counted from each
            token's position L_b - Lq + i, so a window also hides far ancestors) and return_lse. The Triton
            kernel takes Lq <= 64; other calls run torch. On the torch path a call without return_lse runs
            torch's SDPA with the tree's mask over the (gathered) cache, its positions past each length zeroed
            first (what is stored there never reaches a row, as on the kernel).
        k_scale, v_scale: the scales of a quantised cache (k_cache / v_cache of dtype torch.float8_e4m3fn,
            torch.float8_e5m2 or torch.int8, symmetric): float32, one element (per tensor) or the cache's shape
            without its last dimension, (B, Hkv, S_max) or paged (num_pages, Hkv, page_size) (per token and head).
            Values are dequantised on load, x = q * scale, and computed in float32; the output is in query's
            dtype. A quantised cache without scales, scales with a float cache, or scales of another shape, dtype
            or device: ValueError / TypeError naming k_scale or v_scale.

    Returns:
        out (B, Hq, Lq, Dv) in query's dtype; with return_lse=True, (out, lse) with lse (B, Hq, Lq) float32
        in natural log (-inf where a token sees no key).

    Raises:
        TypeError: a wrong type or dtype (the message names the argument).
        ValueError: a wrong shape, length, value or device, before any launch (a head count that fits
            flash_attn_with_kvcache's layout says so); a tree_mask that is not bool or not (Lq, Lq) /
            (B, Lq, Lq).
        rt.MissingKernel: in strict mode, when no kernel covers the call.

    Example:
        >>> import torch, rlx_triton as rt
        >>> q = torch.randn(2, 32, 1, 128)
        >>> k_cache = v_cache = torch.randn(2, 8, 4096, 128)
        >>> lengths = torch.tensor([4096, 1500], dtype=torch.int32)
        >>> out, lse = rt.sdpa_decode(q, k_cache, v_cache, lengths, return_lse=True)
        >>> out.shape, lse.shape
        (torch.Size([2, 32, 1, 128]), torch.Size([2, 32, 1]))
        >>> pages = torch.randn(16, 8, 256, 128)              # 16 pages of 256 keys each
        >>> table = torch.arange(16, dtype=torch.int32).view(2, 8)
        >>> rt.sdpa_decode(q, pages, pages, lengths.clamp(max=2048), block_table=table).shape
        torch.Size([2, 32, 1, 128])
        >>> slopes = 2.0 ** -torch.arange(1, 33, dtype=torch.float32) / 4     # ALiBi, one slope per query head
        >>> local = rt.sdpa_decode(q, k_cache, v_cache, lengths, window_size=(1024, 0), softcap=30.0,
        ...                        alibi_slopes=slopes)
        >>> local.shape
        torch.Size([2, 32, 1, 128])
        >>> draft = torch.randn(2, 32, 4, 128)                 # 4 drafted tokens: root, two children, a grandchild
        >>> tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
        >>> rt.sdpa_decode(draft, k_cache, v_cache, lengths, tree_mask=tree).shape
        torch.Size([2, 32, 4, 128])
    """
    if scale is not None and not isinstance(scale, float):
        scale = scale_value(scale, "sdpa_decode")
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _decode_signature(query, k_cache, v_cache, cache_seqlens, scale, block_table,
                                                         window_size, softcap, alibi_slopes, tree_mask, k_scale,
                                                         v_scale)
    decided = exact_route(signature) if signature is not None else None
    if decided is None:
        _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                         alibi_slopes, tree_mask, k_scale, v_scale)
    else:   # the values change between calls
        if cache_seqlens is not None:
            _check_cache_lengths(cache_seqlens, _decode_capacity(k_cache, block_table))
        if block_table is not None:
            _check_pages(block_table, cache_seqlens, k_cache)
    scale = None if scale is None else float(scale)
    window = _decode_window(window_size, _decode_capacity(k_cache, block_table), tree_mask is not None)
    softcap = float(softcap)
    if decided is None and (not compiling or needs_grad(query, k_cache, v_cache)):
        # eager calls (and, under torch.compile, calls autograd records) are routed here, once
        decided = route(_decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, block_table=block_table,
                                        window_size=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                        tree_mask=tree_mask, k_scale=k_scale, v_scale=v_scale, _validate=False),
                        call=lambda: (sdpa_decode, (query, k_cache, v_cache, cache_seqlens),
                                      dict(scale=scale, block_table=block_table, window_size=window_size,
                                           softcap=softcap, alibi_slopes=alibi_slopes, tree_mask=tree_mask,
                                           k_scale=k_scale, v_scale=v_scale)))
        if signature is not None:
            remember_exact_route(signature, decided)
    if decided is not None and decided.backend == "torch":
        # the library fallback outside the custom op: differentiable, and no custom-op dispatch cost
        from rlx_triton.backends.torch_ref import sdpa_decode as library

        options = _backend_options(block_table, window, softcap, alibi_slopes, tree_mask, k_scale, v_scale)
        if not return_lse:   # the output alone (a tree mask's: torch's SDPA, `sdpa_decode_output`)
            return library.sdpa_decode_output(query, k_cache, v_cache, scale=scale, cache_seqlens=cache_seqlens,
                                              **options)
        out, lse = library.sdpa_decode(query, k_cache, v_cache, scale=scale, cache_seqlens=cache_seqlens,
                                       candidate=None, **options)
    elif decided is not None and decided is planning_route():   # a speed model's plan: the launches, not the op
        out, lse = _run_decode(decided, query, k_cache, v_cache, cache_seqlens, scale, block_table, window, softcap,
                               alibi_slopes, tree_mask, k_scale, v_scale)
    else:
        out, lse = _sdpa_decode_op(query, k_cache, v_cache, cache_seqlens, scale, block_table, window[0], window[1],
                                   softcap, alibi_slopes, tree_mask, k_scale, v_scale,
                                   None if decided is None else _decisions.hand_off(decided))
    return (out, lse) if return_lse else out
