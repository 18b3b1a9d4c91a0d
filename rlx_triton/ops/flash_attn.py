"""rt.flash_attn_with_kvcache: FlashAttention 2's kv-cache decode entry point, with its signature and semantics.

Layouts are FlashAttention's: q (B, Sq, H, D); k_cache/v_cache (B_cache, S_cache, Hkv, D/Dv), or
(num_pages, page_size, Hkv, D/Dv) with a block_table (B, pages_per_sequence). New k/v are written into
the caches in place (the custom op `rlx_triton::flash_attn_with_kvcache` declares both caches mutated).
Beyond FA2: float32 and float64 inputs, any page size >= 1, Dv != D, rotary dims that are not multiples
of 16, cache_leftpad with a paged cache.

Routing: the attention step runs on a decode kernel when its coverage takes the request (the appends
and the rotary embedding run in torch first, `backends/<backend>/sdpa_decode.flash_attn_with_kvcache`);
the Triton kernel takes every FA2 argument: contiguous and paged caches (any page size), causal or not,
local windows, softcap, ALiBi (per head or per batch x head), cache_batch_idx, cache_leftpad, new k/v and
rotary. What a kernel does not cover (float64, more than 64 query tokens or head dims past 256, autograd;
on Metal, which has no kv-cache entry point, everything) runs the torch path (backends/torch_ref/flash_attn.py),
with the reason in explain, and strict mode raises MissingKernel naming it. Every argument is checked
before anything is written, as FlashAttention checks it, with a ValueError or TypeError naming the argument.
"""
from __future__ import annotations

from typing import Literal, Optional, Tuple, Union, overload

import torch

from rlx_triton.backends.torch_ref import flash_attn as reference
from rlx_triton.kv_quant import check_kv_scales, is_quantised, kv_features
from rlx_triton.ops import _decisions
from rlx_triton.ops._attention_options import attention_option_features, check_attention_options, values_readable
from rlx_triton.ops._checks import FLOAT_DTYPES, attention_layout_hint, check_is_tensor, needs_grad
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.route import planning_route

_OP = "flash_attn_with_kvcache"
_INDEX_DTYPES = (torch.int32, torch.int64)


class FlashAttnInputError(ValueError):
    """A flash_attn_with_kvcache argument with the wrong shape, value or device; the message names it."""


def _fail(message: str) -> FlashAttnInputError:
    return FlashAttnInputError(f"{_OP}: {message}")


def _check_index(name: str, value, shape: tuple, device: torch.device) -> None:
    check_is_tensor(name, value, op=_OP)
    if value.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{_OP}: {name} must have dtype torch.int32 (or torch.int64), got {value.dtype}")
    if tuple(value.shape) != shape:
        raise _fail(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    if value.device != device:
        raise _fail(f"{name} must be on {device}, got {value.device}")


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{_OP}: {name} must be a bool, got {type(value).__name__}")


def _check_number(name: str, value, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{_OP}: {name} must be a float{' or None' if optional else ''}, got {type(value).__name__}")


def _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
              return_softmax_lse, k_scale=None, v_scale=None) -> None:
    """FlashAttention's argument checks (shapes, dtypes, devices, flags), without reading tensor data."""
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_is_tensor(name, tensor, op=_OP)
        if tensor.dim() != 4:
            raise _fail(f"{name} must be 4-D, got shape {tuple(tensor.shape)}")
        if name != "q" and is_quantised(tensor):   # an fp8 / int8 cache beside a floating-point q
            if tensor.device != q.device:
                raise _fail(f"{name} must be on q's device {q.device}, got {tensor.device}")
            continue
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{_OP}: {name} must be a floating-point tensor, got {tensor.dtype}")
        if tensor.dtype != q.dtype:
            raise TypeError(f"{_OP}: {name} must have the dtype of q ({q.dtype}), got {tensor.dtype}")
        if tensor.device != q.device:
            raise _fail(f"{name} must be on q's device {q.device}, got {tensor.device}")
    batch, seqlen_q, num_heads, head_dim = q.shape
    if batch == 0 or seqlen_q == 0 or num_heads == 0 or head_dim == 0:
        raise _fail(f"q must have a nonzero batch, seqlen, heads and head dim, got shape {tuple(q.shape)}")
    rows, slots, num_kv_heads = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise _fail(f"k_cache's head dim must equal q's ({head_dim}), got shape {tuple(k_cache.shape)}")
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]) or v_cache.shape[3] == 0:
        raise _fail(f"v_cache must have shape {tuple(k_cache.shape[:3])} + (Dv,), got {tuple(v_cache.shape)}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise _fail(f"number of heads in key/value ({num_kv_heads}) must divide number of heads in query "
                    f"({num_heads})" + attention_layout_hint(_OP, q, k_cache))
    if slots == 0 or rows == 0:
        raise _fail(f"k_cache must hold at least one position, got shape {tuple(k_cache.shape)}")
    if block_table is not None:
        check_is_tensor("block_table", block_table, op=_OP)
        if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
            raise _fail(f"block_table must have shape (batch, pages_per_sequence) = ({batch}, >= 1), got "
                        f"{tuple(block_table.shape)}")
        _check_index("block_table", block_table, tuple(block_table.shape), q.device)
        if cache_batch_idx is not None:
            raise _fail("a paged KV cache (block_table) does not support cache_batch_idx")
        capacity = slots * block_table.shape[1]
    else:
        if cache_batch_idx is not None:
            _check_index("cache_batch_idx", cache_batch_idx, (batch,), q.device)
        elif rows != batch:
            raise _fail(f"k_cache must have batch {batch} (q's) without cache_batch_idx or block_table, got "
                        f"shape {tuple(k_cache.shape)}")
        capacity = slots
    if (k is None) != (v is None):
        raise _fail("if key is supplied, value must also be passed in (k and v go together)")
    if k is not None:
        for name, tensor, dim in (("k", k, head_dim), ("v", v, v_cache.shape[3])):
            check_is_tensor(name, tensor, op=_OP)
            if tensor.dtype != q.dtype:
                raise TypeError(f"{_OP}: {name} must have the dtype of q ({q.dtype}), got {tensor.dtype}")
            if tensor.device != q.device:
                raise _fail(f"{name} must be on q's device {q.device}, got {tensor.device}")
            if tensor.dim() != 4 or tensor.shape[0] != batch or tensor.shape[2] != num_kv_heads \
                    or tensor.shape[3] != dim:
                raise _fail(f"{name} must have shape ({batch}, seqlen_new, {num_kv_heads}, {dim}), got "
                            f"{tuple(tensor.shape)}")
        if k.shape[1] != v.shape[1] or k.shape[1] == 0:
            raise _fail(f"k and v must have the same seqlen_new >= 1, got {k.shape[1]} and {v.shape[1]}")
        if k.shape[1] > capacity:
            raise _fail(f"k's seqlen_new ({k.shape[1]}) exceeds the KV cache capacity ({capacity})")
        if cache_seqlens is None:
            raise _fail("appending k and v needs cache_seqlens (where the new tokens go)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise _fail("rotary_cos and rotary_sin go together")
    if rotary_cos is not None:
        if k is None:
            raise _fail("if rotary cos/sin are provided, new key / value to be appended to KV cache must also "
                        "be provided")
        for name, tensor in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            check_is_tensor(name, tensor, op=_OP)
            if tensor.dtype != q.dtype:
                raise TypeError(f"{_OP}: {name} must have the dtype of q ({q.dtype}), got {tensor.dtype}")
            if tensor.device != q.device:
                raise _fail(f"{name} must be on q's device {q.device}, got {tensor.device}")
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape or rotary_cos.shape[1] == 0:
            raise _fail(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                        f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        if 2 * rotary_cos.shape[1] > head_dim:
            raise _fail(f"rotary_dim ({2 * rotary_cos.shape[1]}) must be <= headdim ({head_dim})")
        if rotary_cos.shape[0] < capacity:
            raise _fail(f"rotary_cos/rotary_sin seqlen ({rotary_cos.shape[0]}) must be at least the seqlen of "
                        f"the KV cache ({capacity})")
    if cache_seqlens is not None and not isinstance(cache_seqlens, int):
        _check_index("cache_seqlens", cache_seqlens, (batch,), q.device)
    if cache_leftpad is not None:
        _check_index("cache_leftpad", cache_leftpad, (batch,), q.device)
    check_attention_options(_OP, FlashAttnInputError, window_size=window_size, softcap=softcap,
                            alibi_slopes=alibi_slopes, batch=batch, num_heads=num_heads, device=q.device)
    _check_number("softmax_scale", softmax_scale, optional=True)
    _check_flag("causal", causal)
    _check_flag("rotary_interleaved", rotary_interleaved)
    _check_flag("return_softmax_lse", return_softmax_lse)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise _fail(f"num_splits must be an int >= 0 (0: chosen by the kernel), got {num_splits!r}")
    check_kv_scales(_OP, FlashAttnInputError, k_cache, v_cache, k_scale, v_scale)


def _capacity(k_cache: torch.Tensor, block_table: Optional[torch.Tensor]) -> int:
    return k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)


def _seqlens_tensor(cache_seqlens, q: torch.Tensor) -> Optional[torch.Tensor]:
    """cache_seqlens as a (B,) tensor (an int stands for every sequence, as in FlashAttention's wrapper)."""
    if isinstance(cache_seqlens, int):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    return cache_seqlens


def _check_values(q, k_cache, k, rotary_cos, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, causal,
                  window_size, alibi_slopes) -> None:
    """The checks that read index data (a host sync): skipped while compiling, tracing fakes or capturing a
    CUDA graph, where the indices are the caller's contract."""
    if cache_seqlens is None or not values_readable(cache_seqlens):
        return
    capacity = _capacity(k_cache, block_table)
    seqlen_new = 0 if k is None else k.shape[1]
    lengths = cache_seqlens.to(torch.int64)
    low, high = int(lengths.min()), int(lengths.max())
    if low < 0 or high + seqlen_new > capacity:
        raise _fail(f"every cache_seqlens entry plus the {seqlen_new} new tokens must fit in [0, {capacity}] "
                    f"(the KV cache capacity), got cache_seqlens in [{low}, {high}]")
    if cache_leftpad is not None and (bool((cache_leftpad < 0).any()) or bool((cache_leftpad > lengths).any())):
        raise _fail("every cache_leftpad entry must be in [0, cache_seqlens] of its sequence")
    if rotary_cos is not None:
        mask = reference.masking(causal, tuple(window_size), q.shape[1], capacity, alibi_slopes is not None)
        span = max(seqlen_new, q.shape[1] if mask.is_causal or mask.is_local else 1)
        if high + span > rotary_cos.shape[0]:
            raise _fail(f"rotary_cos/rotary_sin hold {rotary_cos.shape[0]} positions, but the rotary positions "
                        f"reach {high + span - 1} (cache_seqlens + token)")
    if cache_batch_idx is not None and cache_batch_idx.numel() and (
            int(cache_batch_idx.min()) < 0 or int(cache_batch_idx.max()) >= k_cache.shape[0]):
        raise _fail(f"cache_batch_idx entries must index k_cache's batch dim [0, {k_cache.shape[0]})")
    if block_table is not None:
        page_size = k_cache.shape[1]
        needed = (lengths + seqlen_new + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < needed[:, None]
        pages = block_table[used]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= k_cache.shape[0]):
            raise _fail(f"block_table entries of the pages a sequence uses must be in [0, {k_cache.shape[0]}) "
                        f"(k_cache's pages)")


def _request(q, k_cache, v_cache, k, cache_batch_idx, cache_leftpad, block_table, causal, window_size, softcap,
             alibi_slopes, k_scale=None) -> Request:
    """The routing request: the decode kernels' fields, and each FA feature in use as a feature their coverage
    must name (an unnamed feature is refused by name)."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    mask = reference.masking(causal, tuple(window_size), seqlen_q, _capacity(k_cache, block_table),
                             alibi_slopes is not None)
    features = {"mask": "none", "causal": "bottom_right" if mask.is_causal else "none", "dropout": False,
                "layout": "batched", "requires_grad": needs_grad(q, k_cache, v_cache, k)}
    features.update(attention_option_features(paged=block_table is not None, local_window=mask.is_local,
                                              softcap=softcap, alibi_slopes=alibi_slopes,
                                              cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad))
    features.update(kv_features(k_cache, k_scale))
    return Request.make(
        KernelFamily.SDPA_DECODE, _OP, tensor=q,
        fields={"m": seqlen_q * (num_heads // num_kv_heads), "tokens": seqlen_q, "batch": batch,
                "num_heads": num_heads, "head_dim": head_dim, "seq_q": seqlen_q,
                "seq_kv": _capacity(k_cache, block_table), "num_kv_heads": num_kv_heads,
                "head_dim_v": v_cache.shape[-1]},
        features=features,
    )


def _explain_request(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                     cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                     window_size=(-1, -1), softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                     return_softmax_lse=False, *, k_scale=None, v_scale=None) -> Request:
    _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
              return_softmax_lse, k_scale, v_scale)
    return _request(q, k_cache, v_cache, k, cache_batch_idx, cache_leftpad, block_table, causal, window_size,
                    softcap, alibi_slopes, k_scale)


def _run(chosen, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
         block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, k_scale=None,
         v_scale=None):
    if chosen.backend == "torch":
        return reference.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                                 cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                                                 tuple(window_size), float(softcap), rotary_interleaved,
                                                 alibi_slopes, k_scale, v_scale)
    options = {"route": chosen} if chosen.backend == "triton" else {}
    if k_scale is not None:   # only a backend whose coverage names the cache's kv_dtype is routed it
        options.update(k_scale=k_scale, v_scale=v_scale)
    return chosen.module.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                                 cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                                                 tuple(window_size), float(softcap), rotary_interleaved, alibi_slopes,
                                                 candidate=chosen.candidate, **options)


# per-token-head scales are written for appended tokens, so they are mutated too
@torch.library.custom_op("rlx_triton::flash_attn_with_kvcache",
                         mutates_args=("k_cache", "v_cache", "k_scale", "v_scale"))
def _flash_attn_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                   v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                   cache_seqlens: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor],
                   cache_leftpad: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                   softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
                   rotary_interleaved: bool, alibi_slopes: Optional[torch.Tensor],
                   k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None,
                   decision: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    window_size = (window_left, window_right)
    chosen = _decisions.received(decision)
    if chosen is None:  # under torch.compile (or a forgotten decision): route now
        chosen = route(_request(q, k_cache, v_cache, k, cache_batch_idx, cache_leftpad, block_table, causal,
                                window_size, softcap, alibi_slopes, k_scale))
    out, lse = _run(chosen, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                    cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved,
                    alibi_slopes, k_scale, v_scale)
    return out.contiguous(), lse.contiguous()


@_flash_attn_op.register_fake
def _flash_attn_fake(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                     cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap,
                     rotary_interleaved, alibi_slopes, k_scale=None, v_scale=None, decision=None):
    batch, seqlen_q, num_heads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, num_heads, v_cache.shape[-1]))
    return out, q.new_empty((batch, num_heads, seqlen_q), dtype=torch.float32)


# The return type follows return_softmax_lse: `out` alone, or (out, softmax_lse) with return_softmax_lse=True
# (passed by keyword; passed by position it is the bool overload's Union).
@overload
def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = ..., v: Optional[torch.Tensor] = ...,
                            rotary_cos: Optional[torch.Tensor] = ..., rotary_sin: Optional[torch.Tensor] = ...,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = ...,
                            cache_batch_idx: Optional[torch.Tensor] = ...,
                            cache_leftpad: Optional[torch.Tensor] = ...,
                            block_table: Optional[torch.Tensor] = ..., softmax_scale: Optional[float] = ...,
                            causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                            rotary_interleaved: bool = ..., alibi_slopes: Optional[torch.Tensor] = ...,
                            num_splits: int = ..., return_softmax_lse: Literal[False] = ..., *,
                            k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...
                            ) -> torch.Tensor: ...


@overload
def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = ..., v: Optional[torch.Tensor] = ...,
                            rotary_cos: Optional[torch.Tensor] = ..., rotary_sin: Optional[torch.Tensor] = ...,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = ...,
                            cache_batch_idx: Optional[torch.Tensor] = ...,
                            cache_leftpad: Optional[torch.Tensor] = ...,
                            block_table: Optional[torch.Tensor] = ..., softmax_scale: Optional[float] = ...,
                            causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                            rotary_interleaved: bool = ..., alibi_slopes: Optional[torch.Tensor] = ...,
                            num_splits: int = ..., *, return_softmax_lse: Literal[True],
                            k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...
                            ) -> Tuple[torch.Tensor, torch.Tensor]: ...


@overload
def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = ..., v: Optional[torch.Tensor] = ...,
                            rotary_cos: Optional[torch.Tensor] = ..., rotary_sin: Optional[torch.Tensor] = ...,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = ...,
                            cache_batch_idx: Optional[torch.Tensor] = ...,
                            cache_leftpad: Optional[torch.Tensor] = ...,
                            block_table: Optional[torch.Tensor] = ..., softmax_scale: Optional[float] = ...,
                            causal: bool = ..., window_size: Tuple[int, int] = ..., softcap: float = ...,
                            rotary_interleaved: bool = ..., alibi_slopes: Optional[torch.Tensor] = ...,
                            num_splits: int = ..., return_softmax_lse: bool = ..., *,
                            k_scale: Optional[torch.Tensor] = ..., v_scale: Optional[torch.Tensor] = ...
                            ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]: ...


@routed_op(_explain_request)
def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                            rotary_cos: Optional[torch.Tensor] = None, rotary_sin: Optional[torch.Tensor] = None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[torch.Tensor] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False, *,
                            k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None
                            ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """FlashAttention 2's flash_attn_with_kvcache: attention of q against a KV cache, appending k/v in place.

    Args:
        q: (B, Sq, H, D) queries, float16, bfloat16 or float32.
        k_cache, v_cache: (B_cache, S_cache, Hkv, D) and (..., Dv) caches, or (num_pages, page_size, Hkv, D/Dv)
            pages read through block_table; Hkv divides H (query head h reads KV head h // (H // Hkv)).
        k, v: optional (B, S_new, Hkv, D/Dv) new keys and values, written into the caches at positions
            cache_seqlens .. cache_seqlens + S_new of each sequence (through block_table when paged, at cache
            row cache_batch_idx[b] otherwise) before attention.
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2) tables; rotary embedding is applied to k
            at its cache positions, and to q at cache_seqlens + t under causal or local attention, at
            cache_seqlens for every token otherwise (absolute cache slots, left padding included, as in FA2);
            rotary_dim <= D.
        cache_seqlens: an int or a (B,) int tensor of current lengths (None: the whole cache).
        cache_batch_idx: optional (B,) int tensor, the cache row of each sequence (not with block_table).
        cache_leftpad: optional (B,) int tensor; sequence b reads keys [cache_leftpad[b], cache_seqlens[b] + S_new).
        block_table: optional (B, pages_per_sequence) int32 page indices of a paged cache.
        softmax_scale: the score scale (default D ** -0.5).
        causal: bottom-right aligned causal masking.
        window_size: (left, right): keys within left before and right after the query's diagonal (-1: unbounded).
        softcap: > 0 maps each scaled score s to softcap * tanh(s / softcap).
        rotary_interleaved: rotate pairs (2i, 2i+1) when True, the two halves otherwise.
        alibi_slopes: optional (H,) or (B, H) float32: adds -slope * |distance| (slope * key index under causal
            attention, as FA2's kernels do, which leaves the output unchanged and shifts the LSE).
        num_splits: a hint; the kernels choose their own split.
        return_softmax_lse: also return the log-sum-exp of the scores.
        k_scale, v_scale: the scales of a quantised cache (k_cache / v_cache of dtype torch.float8_e4m3fn,
            torch.float8_e5m2 or torch.int8, symmetric; q stays floating-point): float32, one element (per
            tensor) or the cache's shape without D, (B_cache, S_cache, Hkv) or paged (num_pages, page_size, Hkv)
            (per token and head). Values are dequantised on load, x = q * scale, and computed in float32. New
            k/v are quantised into the cache (round to nearest, saturating): at the per-tensor scale, or at a
            scale per new token and head (its largest |x| over the dtype's largest value) that is written into
            k_scale / v_scale at the token's slot.

    Returns:
        out (B, Sq, H, Dv) in q's dtype; with return_softmax_lse=True the tuple (out, softmax_lse), softmax_lse
        (B, H, Sq) float32 in natural log. A row that sees no key gives 0 and LSE +inf, as in FA2.

    Raises:
        TypeError / ValueError naming the argument, before any launch, for inputs FA2 rejects (shapes, dtypes,
        devices, options) and for index values outside the cache where they can be read without a host sync
        (RLX_TRITON_CHECK_VALUES).

    Example:
        >>> import torch, rlx_triton as rt
        >>> q, cache = torch.randn(2, 1, 8, 64), torch.randn(2, 128, 2, 64)
        >>> rt.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=torch.tensor([100, 7], dtype=torch.int32)).shape
        torch.Size([2, 1, 8, 64])
    """
    _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
              return_softmax_lse, k_scale, v_scale)
    cache_seqlens = _seqlens_tensor(cache_seqlens, q)
    _check_values(q, k_cache, k, rotary_cos, cache_seqlens, cache_batch_idx, cache_leftpad, block_table, causal,
                  window_size, alibi_slopes)
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    left, right = window_size
    decided = None
    if not torch.compiler.is_compiling():
        decided = route(_request(q, k_cache, v_cache, k, cache_batch_idx, cache_leftpad, block_table, causal,
                                 window_size, softcap, alibi_slopes, k_scale),
                        call=lambda: (flash_attn_with_kvcache,
                                      (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                       cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                                       softcap, rotary_interleaved, alibi_slopes),
                                      dict(k_scale=k_scale, v_scale=v_scale)))
    if decided is not None and (decided.backend == "torch" or decided is planning_route()):
        # the library path outside the custom op: no custom-op dispatch cost (a speed model's plan: its launches)
        out, lse = _run(decided, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                        cache_leftpad, block_table, softmax_scale, causal, (left, right), softcap,
                        rotary_interleaved, alibi_slopes, k_scale, v_scale)
    else:
        decision = None if decided is None else _decisions.hand_off(decided)
        out, lse = _flash_attn_op(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                                  cache_leftpad, block_table, softmax_scale, causal, left, right, float(softcap),
                                  rotary_interleaved, alibi_slopes, k_scale, v_scale, decision)
    return (out, lse) if return_softmax_lse else out
