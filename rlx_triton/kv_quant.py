"""Quantised KV caches: fp8 (e4m3, e5m2) or int8 caches with float32 scales, per tensor or per token and head.

What every decode entry point (rt.sdpa_decode, rt.flash_attn_with_kvcache, rt.flash_attn_varlen_func) shares:
the checks of `k_scale` / `v_scale` against their caches, the request features a quantised cache adds
(`kv_dtype`, `kv_scale`), and the two conversions: `dequantize` (x = q * scale, in float32: what the kernels do on
load) and `quantize` (round to nearest, saturating: how appended keys and values enter a quantised cache).

A scale is a float32 tensor on the cache's device of one element (per tensor) or of the cache's shape without its
last (head) dimension (per token and head): (B, Hkv, S) for sdpa_decode's contiguous cache, (num_pages, Hkv,
page_size) paged, and the FlashAttention layouts' own order, (B, S, Hkv) or (num_pages, page_size, Hkv).
int8 is symmetric (no zero point).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch

QUANTISED_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
# the request feature values: the cache's storage dtype and how its scales are laid out
KV_DTYPES = ("none",) + tuple(str(dtype).removeprefix("torch.") for dtype in QUANTISED_DTYPES)
KV_SCALES = ("none", "per_tensor", "per_token_head")
# the largest magnitude each storage holds: values beyond it saturate
_LIMITS = {torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max),
           torch.float8_e5m2: float(torch.finfo(torch.float8_e5m2).max), torch.int8: 127.0}


def is_quantised(cache: torch.Tensor) -> bool:
    return cache.dtype in QUANTISED_DTYPES


def check_kv_scales(op: str, error: type, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor]) -> None:
    """A quantised cache has its scale and a float cache none; each scale is float32 on the cache's device, of one
    element or of the cache's shape without its last dimension. `error`: the op's ValueError type."""
    if k_cache.dtype != v_cache.dtype:
        raise error(f"{op}: k_cache and v_cache must have the same dtype, got {k_cache.dtype} and {v_cache.dtype}")
    for name, cache, scale in (("k_scale", k_cache, k_scale), ("v_scale", v_cache, v_scale)):
        cache_name = name.replace("scale", "cache")
        if scale is None:
            if is_quantised(cache):
                raise error(f"{op}: {cache_name} of dtype {cache.dtype} needs {name} (float32, one element or "
                            f"{tuple(cache.shape[:-1])})")
            continue
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a float32 tensor, got {type(scale).__name__}")
        if not is_quantised(cache):
            raise error(f"{op}: {name} is for an fp8 or int8 {cache_name}, which is {cache.dtype}")
        if scale.dtype != torch.float32:
            raise TypeError(f"{op}: {name} must be float32, got {scale.dtype}")
        if scale.device != cache.device:
            raise error(f"{op}: {name} must be on {cache.device}, got {scale.device}")
        if scale.numel() != 1 and tuple(scale.shape) != tuple(cache.shape[:-1]):
            raise error(f"{op}: {name} must have one element (per tensor) or shape {tuple(cache.shape[:-1])} "
                        f"(per token and head), got {tuple(scale.shape)}")
    if (k_scale is None) != (v_scale is None) or (k_scale is not None and v_scale is not None and
                                                   (k_scale.numel() == 1) != (v_scale.numel() == 1)):
        raise error(f"{op}: k_scale and v_scale must both be per tensor or both per token and head")


def scale_kind(scale: Optional[torch.Tensor]) -> str:
    """"none", "per_tensor" or "per_token_head"."""
    if scale is None:
        return "none"
    return "per_tensor" if scale.numel() == 1 else "per_token_head"


def kv_features(cache: torch.Tensor, scale: Optional[torch.Tensor]) -> Dict[str, Any]:
    """The request features of a cache: kv_dtype and kv_scale (named only for a quantised cache)."""
    if not is_quantised(cache):
        return {}
    return {"kv_dtype": str(cache.dtype).removeprefix("torch."), "kv_scale": scale_kind(scale)}


def dequantize(cache: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """The cache's values in float32 (q * scale; a float cache converted as it is)."""
    values = cache.to(torch.float32)
    if scale is None:
        return values
    if scale.numel() == 1:
        return values * scale.reshape(())
    return values * scale[..., None]


def token_head_scales(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The per-token-head scales that store `values` (..., D) in `dtype` without saturating: max |x| of each row
    over the dtype's largest magnitude (1 for an all-zero row, which stores zeros either way), float32."""
    largest = values.to(torch.float32).abs().amax(dim=-1)
    return torch.where(largest > 0, largest / _LIMITS[dtype], torch.ones_like(largest))


def quantize(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values / scale in `dtype`, rounded to nearest and saturated at the dtype's largest magnitude (int8 at
    +-127: symmetric). `scale` is one element or of values' shape without its last dimension. A NaN stays NaN in
    fp8 and becomes 0 in int8 (which has no NaN)."""
    divided = values.to(torch.float32) / (scale.reshape(()) if scale.numel() == 1 else scale[..., None])
    limit = _LIMITS[dtype]
    saturated = divided.clamp(-limit, limit)
    if dtype == torch.int8:
        return torch.nan_to_num(saturated.round(), nan=0.0).to(torch.int8)
    return saturated.to(dtype)
