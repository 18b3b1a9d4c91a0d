"""Public attention ops: rt.scaled_dot_product_attention (torch's drop-in), rt.sdpa_decode (KV-cache decode)
and rt.patch_sdpa().

Both ops validate their input first (errors name the argument), build a routing Request from the
shapes, and run as torch.library custom ops (`rlx_triton::sdpa`, `rlx_triton::sdpa_decode`) with fake
implementations, so `torch.compile(fullgraph=True)` sees one opaque node per call. Inside the op the
router picks the Triton decode kernel for covered (decode-shaped) requests and torch otherwise; routing
reads shapes and dtypes only, never tensor data, so a call never syncs with the host.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional, Tuple, Union

import torch

from rlx_triton.ops._checks import FLOAT_DTYPES, check_is_tensor, needs_grad
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.request import dtype_name
from rlx_triton.router.route import exact_route, remember_exact_route


_FAMILY = KernelFamily.SDPA_DECODE.value


class AttentionInputError(ValueError, RuntimeError):
    """Bad attention input: a ValueError naming the argument, and a RuntimeError like torch's own checks."""


def _check_scale(scale, op: str) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")


def _check_same_dtype_and_device(op: str, **tensors: torch.Tensor) -> None:
    (first_name, first), *rest = tensors.items()
    if first.dtype not in FLOAT_DTYPES:
        raise AttentionInputError(f"{op}: {first_name} must be a floating-point tensor, got {first.dtype}")
    for name, tensor in rest:
        if tensor.dtype != first.dtype:
            raise AttentionInputError(f"{op}: expected {', '.join(tensors)} to have the same dtype, but got "
                                      f"{first_name}.dtype: {first.dtype} and {name}.dtype: {tensor.dtype}")
        if tensor.device != first.device:
            raise AttentionInputError(f"{op}: expected {', '.join(tensors)} on one device, but got "
                                      f"{first_name} on {first.device} and {name} on {tensor.device}")


def _library_route(build_request, *tensors) -> bool:
    """Whether this call runs torch's own implementation outside the custom op.

    The router decides (in strict mode it raises MissingKernel instead): calls that autograd records
    go to the library (the kernels are forward-only and the custom ops have no backward, a typed
    `requires_grad` refusal), and an eager call the router sends to the library then skips the
    custom-op dispatch. Under torch.compile other calls stay one opaque custom-op node, which routes
    when it runs.
    """
    if torch.compiler.is_compiling() and not needs_grad(*tensors):
        return False
    return route(build_request()).backend == "torch"


# --------------------------------------------------------------------------------------------------
# rt.scaled_dot_product_attention
# --------------------------------------------------------------------------------------------------
def _call_signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> Optional[tuple]:
    """Everything validation and routing read from a call, or None when it is not hashable as such."""
    try:
        signature = (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype, query.device,
                     key.device, value.device, query.requires_grad, key.requires_grad, value.requires_grad,
                     torch.is_grad_enabled(), dropout_p, is_causal, scale, enable_gqa,
                     None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device,
                                                     attn_mask.requires_grad))
        hash(signature)
    except (AttributeError, TypeError):  # not tensors, or an unhashable scale: validation will say what is wrong
        return None
    return signature


def _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    op = "scaled_dot_product_attention"
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_is_tensor(name, tensor, op=op)
    if attn_mask is not None:
        check_is_tensor("attn_mask", attn_mask, op=op)
    _check_scale(scale, op)
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or not 0.0 <= dropout_p <= 1.0:
        raise AttentionInputError(f"{op}: dropout_p must be a probability in [0, 1], got {dropout_p!r}")
    _check_same_dtype_and_device(op, query=query, key=key, value=value)
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise AttentionInputError(f"{op}: query, key and value need at least 2 dims (..., L, E), got "
                                  f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    if query.shape[-1] != key.shape[-1]:
        raise AttentionInputError(f"{op}: key's last dim (embedding) must equal query's, got key "
                                  f"{tuple(key.shape)} for query {tuple(query.shape)}")
    if key.shape[-2] != value.shape[-2]:
        raise AttentionInputError(f"{op}: value's sequence length (dim -2) must equal key's, got value "
                                  f"{tuple(value.shape)} for key {tuple(key.shape)}")
    if enable_gqa and query.dim() >= 3 and key.dim() >= 3 and value.dim() >= 3:
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if value.shape[-3] != kv_heads or kv_heads == 0 or heads % kv_heads != 0:
            raise AttentionInputError(f"{op}: with enable_gqa the number of heads in key and value must be "
                                      f"equal and divide the query heads, got query {heads}, key {kv_heads}, "
                                      f"value {value.shape[-3]}")
    if attn_mask is not None:
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            raise AttentionInputError(f"{op}: expected attn_mask dtype to be bool or float or to match query's "
                                      f"dtype {query.dtype}, got {attn_mask.dtype}")
        target = (*query.shape[:-1], key.shape[-2])
        try:
            if torch.broadcast_shapes(attn_mask.shape, target) != torch.Size(target):
                raise RuntimeError
        except RuntimeError:
            raise AttentionInputError(f"{op}: attn_mask of shape {tuple(attn_mask.shape)} does not broadcast "
                                      f"to (..., L, S) = {target}") from None


def _sdpa_layout(q_shape: torch.Size, k_shape: torch.Size, v_shape: torch.Size) -> str:
    dims = len(q_shape)
    if dims < 3 or not dims == len(k_shape) == len(v_shape):
        return "unbatched" if dims < 3 else "broadcast"
    lead = 2 if dims == 3 else 3
    if q_shape[:-lead] != k_shape[:-lead] or k_shape[:-lead] != v_shape[:-lead]:
        return "broadcast"
    return "batched"


def _sdpa_request(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False) -> Request:
    """Validates a torch-SDPA call and reduces it to a routing Request (what explain() shows)."""
    _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)


def _build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa) -> Request:
    # runs on every call with a new signature: each tensor's shape is read once
    q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
    layout = _sdpa_layout(q_shape, k_shape, v_shape)
    seq_q, seq_kv, head_dim, head_dim_v = q_shape[-2], k_shape[-2], q_shape[-1], v_shape[-1]
    if len(q_shape) == 3:
        batch, num_heads, num_kv_heads = 1, q_shape[0], k_shape[0]
    elif len(q_shape) >= 4:
        batch, num_heads, num_kv_heads = math.prod(q_shape[:-3]), q_shape[-3], k_shape[-3]
    else:
        batch, num_heads, num_kv_heads = 1, 1, 1
    # torch broadcasts a single KV head without enable_gqa; other head counts must match
    if num_kv_heads != num_heads and not (enable_gqa or num_kv_heads == 1):
        layout = "broadcast"
    if layout == "batched" and (num_kv_heads == 0 or num_heads % num_kv_heads != 0):
        layout = "broadcast"
    group = num_heads // num_kv_heads if layout == "batched" else 1
    if attn_mask is None:
        mask = "none"
    else:
        mask = "bool" if attn_mask.dtype == torch.bool else "float"
    causal = ("top_left" if attn_mask is None else "top_left_with_mask") if is_causal else "none"
    return Request(
        _FAMILY, "scaled_dot_product_attention",
        (("m", seq_q * group), ("tokens", seq_q), ("batch", batch), ("num_heads", num_heads),
         ("head_dim", head_dim), ("seq_q", seq_q), ("seq_kv", seq_kv), ("num_kv_heads", num_kv_heads),
         ("head_dim_v", head_dim_v)),
        dtype_name(query.dtype), query.device,
        (("mask", mask), ("causal", causal), ("dropout", dropout_p > 0.0), ("layout", layout),
         ("requires_grad", needs_grad(query, key, value, attn_mask))),
    )


@torch.library.custom_op("rlx_triton::sdpa", mutates_args=())
def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
             is_causal: bool, scale: Optional[float], enable_gqa: bool) -> torch.Tensor:
    chosen = route(_build_sdpa_request(query, key, value, attn_mask, 0.0, is_causal, enable_gqa))
    out = chosen.module.scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                     candidate=chosen.candidate)
    return out.contiguous()


def _sdpa_out_shape(query, key, value) -> Tuple[int, ...]:
    if query.dim() >= 4:
        lead = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        return (*lead, query.shape[-3], query.shape[-2], value.shape[-1])
    lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    return (*lead, query.shape[-2], value.shape[-1])


@_sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    return query.new_empty(_sdpa_out_shape(query, key, value))


@routed_op(_sdpa_request)
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention with torch's signature and semantics.

    Decode-shaped calls (up to 16 query tokens, head dims up to 256, fp16/bf16/fp32, bool or float mask,
    top-left is_causal, GQA/MQA, matching leading dims) run the split-K Triton decode kernel when the
    router picks it; everything else (dropout, long queries, broadcast batch dims, ...) runs torch's op,
    and strict mode raises MissingKernel for it. On the kernel, NaN and Inf land where torch's math
    backend puts them (masks are additive: a NaN key under a False mask still gives NaN), except that
    keys no query token can reach under top-left is_causal (past the last token) are not read.
    """
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _call_signature(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                       enable_gqa)
    decided = exact_route(signature) if signature is not None else None
    if decided is None:  # first call with this signature: validate and route it
        _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # under torch.compile the custom op routes when it runs; calls it cannot express (dropout, autograd)
        # are decided here, so strict mode refuses them the same way in both modes
        if needs_grad(query, key, value, attn_mask) or dropout_p > 0.0 or not compiling:
            decided = route(_build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa))
            if signature is not None:
                remember_exact_route(signature, decided)
    scale = None if scale is None else float(scale)
    if decided is not None and decided.backend == "torch":
        # torch's own op, outside the custom op: differentiable (autograd calls always route here), draws
        # dropout from torch's random stream (no kernel covers dropout), and no custom-op dispatch cost
        return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                                         dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                                         enable_gqa=enable_gqa)
    return _sdpa_op(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa))


# --------------------------------------------------------------------------------------------------
# rt.sdpa_decode
# --------------------------------------------------------------------------------------------------
def _validate_decode(query, k_cache, v_cache, cache_seqlens, scale) -> None:
    op = "sdpa_decode"
    for name, tensor in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_is_tensor(name, tensor, op=op)
        if tensor.dim() != 4:
            layout = "(B, Hq, Lq, D)" if name == "query" else "(B, Hkv, S_max, D)" if name == "k_cache" \
                else "(B, Hkv, S_max, Dv)"
            raise AttentionInputError(f"{op}: {name} must be 4-D {layout}, got shape {tuple(tensor.shape)}")
    _check_scale(scale, op)
    _check_same_dtype_and_device(op, query=query, k_cache=k_cache, v_cache=v_cache)
    batch, heads, seq_q, head_dim = query.shape
    if k_cache.shape[0] != batch or k_cache.shape[3] != head_dim:
        raise AttentionInputError(f"{op}: k_cache must be (B, Hkv, S_max, D) = ({batch}, Hkv, S_max, {head_dim}), "
                                  f"got {tuple(k_cache.shape)}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise AttentionInputError(f"{op}: v_cache must be (B, Hkv, S_max, Dv) = {tuple(k_cache.shape[:3])} + (Dv,), "
                                  f"got {tuple(v_cache.shape)}")
    kv_heads, s_max = k_cache.shape[1], k_cache.shape[2]
    if kv_heads == 0 or heads % kv_heads != 0:
        raise AttentionInputError(f"{op}: the KV heads of k_cache ({kv_heads}) must divide the query heads ({heads})")
    if s_max == 0 or seq_q == 0:
        raise AttentionInputError(f"{op}: query tokens and k_cache length must be >= 1, got Lq={seq_q}, S_max={s_max}")
    if cache_seqlens is None:
        return
    check_is_tensor("cache_seqlens", cache_seqlens, op=op)
    if cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: cache_seqlens must be int32 or int64, got {cache_seqlens.dtype}")
    if cache_seqlens.shape != (batch,):
        raise AttentionInputError(f"{op}: cache_seqlens must have shape (B,) = ({batch},), "
                                  f"got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != query.device:
        raise AttentionInputError(f"{op}: cache_seqlens must be on {query.device}, got {cache_seqlens.device}")
    # the value check reads device data: skipped while compiling, tracing fakes or capturing a CUDA graph
    if torch.compiler.is_compiling() or _is_fake(cache_seqlens):
        return
    if cache_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
    if low < 1 or high > s_max:
        raise AttentionInputError(f"{op}: every cache_seqlens entry must be in [1, S_max={s_max}], "
                                  f"got values in [{low}, {high}]")


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(tensor) or tensor.device.type == "meta"


def _decode_request(query, k_cache, v_cache, cache_seqlens=None, *, scale=None, return_lse=False,
                    _validate=True) -> Request:
    """Validates an sdpa_decode call and reduces it to a routing Request (what explain() shows)."""
    if _validate:
        _validate_decode(query, k_cache, v_cache, cache_seqlens, scale)
    batch, heads, seq_q, head_dim = query.shape
    kv_heads, s_max = k_cache.shape[1], k_cache.shape[2]
    return Request.make(
        KernelFamily.SDPA_DECODE, "sdpa_decode", tensor=query,
        fields={"m": seq_q * (heads // kv_heads), "tokens": seq_q, "batch": batch, "num_heads": heads,
                "head_dim": head_dim, "seq_q": seq_q, "seq_kv": s_max, "num_kv_heads": kv_heads,
                "head_dim_v": v_cache.shape[-1]},
        features={"mask": "none", "causal": "bottom_right", "dropout": False, "layout": "batched",
                  "requires_grad": needs_grad(query, k_cache, v_cache)},
    )


@torch.library.custom_op("rlx_triton::sdpa_decode", mutates_args=())
def _sdpa_decode_op(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: Optional[torch.Tensor], scale: Optional[float]) -> Tuple[torch.Tensor, torch.Tensor]:
    chosen = route(_decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, _validate=False))
    out, lse = chosen.module.sdpa_decode(query, k_cache, v_cache, causal="bottom_right", scale=scale,
                                         cache_seqlens=cache_seqlens, candidate=chosen.candidate)
    return out.contiguous(), lse.contiguous()


@_sdpa_decode_op.register_fake
def _sdpa_decode_fake(query, k_cache, v_cache, cache_seqlens, scale):
    batch, heads, seq_q, _ = query.shape
    out = query.new_empty((batch, heads, seq_q, v_cache.shape[-1]))
    return out, query.new_empty((batch, heads, seq_q), dtype=torch.float32)


@routed_op(_decode_request)
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
                return_lse: bool = False) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of Lq new tokens against a KV cache, one valid length per sequence.

    Layout (torch SDPA's): query (B, Hq, Lq, D); k_cache (B, Hkv, S_max, D); v_cache (B, Hkv, S_max, Dv),
    Hkv dividing Hq (query head h reads KV head h // (Hq // Hkv)). cache_seqlens: int32/int64 (B,), each
    in [1, S_max] (None: every sequence uses all S_max positions); keys at or past a sequence's length
    are never read. The Lq query tokens are the last Lq positions of each sequence's valid part: causal
    masking is bottom-right within the valid length (the FlashAttention kv-cache convention), so token i
    sees keys j <= i + L_b - Lq and a token with none gives 0. scale defaults to 1/sqrt(D).
    Returns out (B, Hq, Lq, Dv) in query's dtype, and with return_lse=True also lse (B, Hq, Lq) float32
    in natural log (-inf where a token sees no key).
    NaN and Inf follow torch's math SDPA within each sequence's valid part: a causally hidden key still
    takes part with score - inf, so NaN or +inf in a query row or in any valid key gives that row NaN
    (lse NaN), and NaN or Inf in a valid value gives NaN; the positions past a sequence's length are
    never read.
    """
    _validate_decode(query, k_cache, v_cache, cache_seqlens, scale)
    scale = None if scale is None else float(scale)
    if _library_route(lambda: _decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, _validate=False),
                      query, k_cache, v_cache):
        from rlx_triton.backends.torch_ref import sdpa_decode as library

        out, lse = library.sdpa_decode(query, k_cache, v_cache, causal="bottom_right", scale=scale,
                                       cache_seqlens=cache_seqlens, candidate=None)
    else:
        out, lse = _sdpa_decode_op(query, k_cache, v_cache, cache_seqlens, scale)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# rt.patch_sdpa
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def patch_sdpa() -> Iterator[None]:
    """Replaces torch.nn.functional.scaled_dot_product_attention with rt's inside the block, then restores it."""
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original
