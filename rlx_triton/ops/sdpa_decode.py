"""Public attention ops: rt.scaled_dot_product_attention (torch's drop-in), rt.sdpa_decode (KV-cache decode)
and rt.patch_sdpa().

Both ops validate their input first (errors name the argument), build a routing Request from the
shapes, and run as torch.library custom ops (`rlx_triton::sdpa`, `rlx_triton::sdpa_decode`) with fake
implementations, so `torch.compile(fullgraph=True)` sees one opaque node per call. A call is routed
once: in eager mode the wrapper decides and hands its decision to the custom op (a key into the
decisions it made, `_decision_key`); under torch.compile the op decides when it runs, since only then
are the real shapes known. Routing reads shapes and dtypes only, never tensor data.

Repeated calls are cheap: a call with exactly the signature of an earlier one reuses its decision, and
a call whose only change is the KV length (a decode step) reuses the decision of its power-of-two
bucket after checking just what the length touches (key and value agree on it, the mask's last dim).

Every input torch's SDPA accepts is accepted: CausalBias masks (upper-left runs as is_causal, lower-right
as the kernels' bottom-right alignment), a 0-dim tensor scale, enable_gqa with key and value head
counts that differ (torch), nested tensors (torch); each gives torch's values, on a kernel where one
covers it and through torch's op otherwise (strict mode refuses those, with the reason).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import Iterator, Optional, Tuple, Union

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from rlx_triton.caches import BoundedCache
from rlx_triton.config import settings
from rlx_triton.ops._checks import FLOAT_DTYPES, attention_layout_hint, check_is_tensor, needs_grad
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.route import Route, exact_route, remember_exact_route


_FAMILY = KernelFamily.SDPA_DECODE.value


class AttentionInputError(ValueError, RuntimeError):
    """Bad attention input: a ValueError naming the argument, and a RuntimeError like torch's own checks."""


def _check_scale(scale, op: str) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")


def _scale_value(scale, op: str):
    """scale as a Python number: torch takes a 0-dim tensor for it (its value is read, as torch reads it)."""
    if isinstance(scale, torch.Tensor):
        if scale.dim() != 0 or scale.is_complex() or scale.dtype == torch.bool:
            raise TypeError(f"{op}: scale must be a float, a 0-dim real tensor or None, got a tensor of shape "
                            f"{tuple(scale.shape)} and dtype {scale.dtype}")
        return scale.item()
    return scale


def _decision_key(decided: Route) -> str:
    """The key the custom op receives for a decision made in the wrapper (eager mode routes once)."""
    remembered = _decision_keys.get(id(decided))
    # an id outlives its Route once the decision is evicted: its key counts only while it still names it
    if remembered is not None and remembered[1] is decided:
        return remembered[0]
    key = str(next(_decision_ids))  # itertools.count: one atomic step under the GIL, so keys never repeat
    _decisions.put(key, decided)
    _decision_keys.put(id(decided), (key, decided))
    return key


def _decided(key: Optional[str]) -> Optional[Route]:
    """The wrapper's decision for the custom op, or None (under torch.compile, or evicted: route again)."""
    return _decisions.get(key) if key else None


# decisions handed from the wrappers to the custom ops: key -> Route, and Route id -> (key, Route). Bounded
# LRUs: a decision evicted between a wrapper and its op only makes the op route again (the same route)
_decisions: BoundedCache[str, Route] = BoundedCache("op_decisions")
_decision_keys: BoundedCache[int, Tuple[str, Route]] = BoundedCache("op_decision_ids")
_decision_ids = itertools.count()


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


# --------------------------------------------------------------------------------------------------
# rt.scaled_dot_product_attention
# --------------------------------------------------------------------------------------------------
def _causal_bias(attn_mask, is_causal: bool, query, key) -> Tuple[Optional[torch.Tensor], bool, bool]:
    """(attn_mask, is_causal, lower_right) with a torch CausalBias mask replaced by the alignment it stands for.

    As torch dispatches it: upper-left, or lower-right with as many queries as keys, is is_causal; lower-right
    aligns the last query with the last key (the kernels' bottom-right alignment); is_causal=True with a
    CausalBias is torch's ValueError.
    """
    if not isinstance(attn_mask, CausalBias):
        return attn_mask, is_causal, False
    op = "scaled_dot_product_attention"
    if is_causal:
        raise AttentionInputError(f"{op}: CausalBias should not be used with causal=True")
    if attn_mask.variant == CausalVariant.UPPER_LEFT or attn_mask.seq_len_q == attn_mask.seq_len_kv:
        return None, True, False
    if attn_mask.variant != CausalVariant.LOWER_RIGHT:
        raise AttentionInputError(f"{op}: CausalBias.variant must be a CausalVariant, got {attn_mask.variant!r}")
    sizes = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
    if isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and not (query.is_nested or key.is_nested) \
            and query.dim() >= 2 and key.dim() >= 2 and sizes != (query.shape[-2], key.shape[-2]):
        raise AttentionInputError(f"{op}: a lower-right CausalBias of (L, S) = {sizes} needs query length L and key "
                                  f"length S, got {query.shape[-2]} and {key.shape[-2]}")
    return None, False, True


def _call_signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                    lower_right) -> Optional[tuple]:
    """Everything validation and routing read from a call (the scale's type, not its value), or None when
    it is not hashable as such."""
    try:
        signature = (query.shape, key.shape, value.shape, query.dtype, key.dtype, value.dtype, query.device,
                     key.device, value.device,
                     torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad),
                     dropout_p, is_causal, type(scale), enable_gqa, lower_right,
                     None if attn_mask is None else (attn_mask.shape, attn_mask.dtype, attn_mask.device,
                                                     attn_mask.requires_grad))
    except (AttributeError, RuntimeError):  # not tensors (validation will say so), or a strided nested tensor
        return None
    return signature  # hashed by the route cache's lookup: an unhashable value is caught there


def _kv_bucket_signature(signature: tuple) -> Optional[tuple]:
    """The call's signature with the KV length S replaced by its power-of-two bucket: calls that differ only
    in S within one bucket share their route (what a decode step changes). None where S is 0 or the key is
    not (..., S, E)."""
    q_shape, k_shape, v_shape = signature[0], signature[1], signature[2]
    if len(k_shape) < 2 or len(v_shape) < 2:
        return None
    seq_kv = k_shape[-2]
    if seq_kv < 1:
        return None
    mask = signature[-1]
    if mask is not None:  # its last dim is S or 1
        mask = (mask[0][:-1], mask[0][-1] == 1) + mask[1:]
    return ("kv-bucket", q_shape, k_shape[:-2], k_shape[-1], v_shape[:-2], v_shape[-1], (seq_kv - 1).bit_length(),
            signature[3:-1], mask)


def _kv_length_agrees(key, value, attn_mask) -> bool:
    """What a new KV length could break in a call that is otherwise known: value's length and the mask's last dim."""
    seq_kv = key.shape[-2]
    return value.shape[-2] == seq_kv and (attn_mask is None or attn_mask.shape[-1] in (1, seq_kv))


def _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    op = "scaled_dot_product_attention"
    _validate_nested(query, key, value, attn_mask, dropout_p, scale)
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
        heads, kv_heads, v_heads = query.shape[-3], key.shape[-3], value.shape[-3]
        if kv_heads == 0 or v_heads == 0 or heads % kv_heads != 0 or heads % v_heads != 0:
            raise AttentionInputError(f"{op}: with enable_gqa the number of heads in key and value must divide "
                                      f"the number of heads in query, got query {heads}, key {kv_heads}, "
                                      f"value {v_heads}")
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


def _validate_nested(query, key, value, attn_mask, dropout_p, scale) -> None:
    """What rlx_triton checks of any call, nested tensors included (on those torch's op checks the rest as it
    runs them): tensors, the scale, the dropout probability."""
    op = "scaled_dot_product_attention"
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        check_is_tensor(name, tensor, op=op)
    if attn_mask is not None:
        check_is_tensor("attn_mask", attn_mask, op=op)
    _check_scale(scale, op)
    if not isinstance(dropout_p, (int, float)) or isinstance(dropout_p, bool) or not 0.0 <= dropout_p <= 1.0:
        raise AttentionInputError(f"{op}: dropout_p must be a probability in [0, 1], got {dropout_p!r}")


def _is_nested(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_nested for t in tensors)


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
    attn_mask, is_causal, lower_right = _causal_bias(attn_mask, is_causal, query, key)
    scale = _scale_value(scale, "scaled_dot_product_attention")
    if _is_nested(query, key, value, attn_mask):
        _validate_nested(query, key, value, attn_mask, dropout_p, scale)
        return _nested_request(query, key, value, attn_mask, dropout_p)
    _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return _build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa, lower_right)


def _mask_kind(attn_mask) -> str:
    return "none" if attn_mask is None else "bool" if attn_mask.dtype == torch.bool else "float"


def _nested_request(query, key, value, attn_mask, dropout_p) -> Request:
    """Nested tensors have no fixed shape to route on: the request says so, and only torch's op takes them."""
    return SDPA_REQUEST.unshaped(
        {"mask": _mask_kind(attn_mask), "dropout": dropout_p > 0.0, "layout": "nested",
         "requires_grad": needs_grad(query, key, value, attn_mask)}, tensor=query)


def _build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                        lower_right: bool = False) -> Request:
    # runs on every call with a new signature: each tensor's shape is read once
    q_shape, k_shape, v_shape = query.shape, key.shape, value.shape
    layout = _sdpa_layout(q_shape, k_shape, v_shape)
    seq_q, seq_kv, head_dim, head_dim_v = q_shape[-2], k_shape[-2], q_shape[-1], v_shape[-1]
    if len(q_shape) == 3:
        batch, num_heads, num_kv_heads, num_v_heads = 1, q_shape[0], k_shape[0], v_shape[0]
    elif len(q_shape) >= 4:
        batch, num_heads, num_kv_heads, num_v_heads = math.prod(q_shape[:-3]), q_shape[-3], k_shape[-3], v_shape[-3]
    else:
        batch, num_heads, num_kv_heads, num_v_heads = 1, 1, 1, 1
    # torch broadcasts a single KV head without enable_gqa; other head counts must match
    if num_kv_heads != num_heads and not (enable_gqa or num_kv_heads == 1):
        layout = "broadcast"
    if layout == "batched" and (num_kv_heads == 0 or num_heads % num_kv_heads != 0):
        layout = "broadcast"
    if layout == "batched" and num_v_heads != num_kv_heads:
        layout = "unequal_kv_heads"   # enable_gqa with key and value head counts that differ: torch's op
    if lower_right:  # a lower-right CausalBias, which was the call's mask
        causal = "bottom_right"
    elif is_causal:
        causal = "top_left" if attn_mask is None else "top_left_with_mask"
    else:
        causal = "none"
    return SDPA_REQUEST.make(
        {"batch": batch, "num_heads": num_heads, "head_dim": head_dim, "seq_q": seq_q, "seq_kv": seq_kv,
         "num_kv_heads": num_kv_heads, "head_dim_v": head_dim_v},
        {"mask": _mask_kind(attn_mask), "causal": causal, "dropout": dropout_p > 0.0, "layout": layout,
         "requires_grad": needs_grad(query, key, value, attn_mask)}, tensor=query)


def _run_sdpa(chosen: Route, query, key, value, attn_mask, is_causal, scale, enable_gqa, lower_right) -> torch.Tensor:
    return chosen.module.scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                      candidate=chosen.candidate, lower_right=lower_right,
                                                      route=chosen if chosen.candidate is not None else None)


@torch.library.custom_op("rlx_triton::sdpa", mutates_args=())
def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
             is_causal: bool, scale: Optional[float], enable_gqa: bool, lower_right: bool = False,
             decision: Optional[str] = None) -> torch.Tensor:
    chosen = _decided(decision)
    if chosen is None:  # under torch.compile (or a forgotten decision): route now
        chosen = route(_build_sdpa_request(query, key, value, attn_mask, 0.0, is_causal, enable_gqa, lower_right))
    out = _run_sdpa(chosen, query, key, value, attn_mask, is_causal, scale, enable_gqa, lower_right)
    return out.contiguous()


def _sdpa_out_shape(query, key, value) -> Tuple[int, ...]:
    if query.dim() >= 4:
        lead = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
        return (*lead, query.shape[-3], query.shape[-2], value.shape[-1])
    lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    return (*lead, query.shape[-2], value.shape[-1])


@_sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, lower_right=False, decision=None):
    return query.new_empty(_sdpa_out_shape(query, key, value))


def _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, lower_right) -> torch.Tensor:
    """torch's own op, outside the custom op: differentiable (autograd calls always route here), draws dropout
    from torch's random stream (no kernel covers dropout), takes nested tensors, and costs no custom-op
    dispatch. A lower-right causal alignment is given to it as its mask, as torch does off its fused kernels."""
    if lower_right:
        from rlx_triton.backends.torch_ref.sdpa_decode import lower_right_mask

        attn_mask, is_causal = lower_right_mask(query.shape[-2], key.shape[-2], query.device), False
    return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                     is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _decide_sdpa(signature, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 lower_right) -> Route:
    """The route of an eager call whose exact signature is new: its KV-length bucket's, or validated and routed."""
    bucketed = _kv_bucket_signature(signature) if signature is not None else None
    decided = exact_route(bucketed) if bucketed is not None else None
    if decided is None or not _kv_length_agrees(key, value, attn_mask):
        _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        decided = route(_build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                                            lower_right))
        if bucketed is not None:
            remember_exact_route(bucketed, decided)
    if signature is not None:
        remember_exact_route(signature, decided)
    return decided


@routed_op(_sdpa_request)
def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention with torch's signature and semantics.

    Decode-shaped calls (up to 16 query tokens, head dims up to 256, fp16/bf16/fp32, bool or float mask,
    top-left is_causal or a CausalBias, GQA/MQA, matching leading dims) run the split-K Triton decode
    kernel when the router picks it; everything else (dropout, long queries, broadcast batch dims, nested
    tensors, key and value head counts that differ, ...) runs torch's op. On the kernel, NaN and Inf land
    where torch's math backend puts them (masks are additive: a NaN key under a False mask still gives
    NaN), except that keys no query token can reach under top-left is_causal are not read.

    Args:
        query, key, value: (..., H, L, D) as torch takes them (heads before tokens).
        attn_mask: bool or float, broadcastable to (..., Hq, Lq, S); None for no mask.
        dropout_p, is_causal, enable_gqa: as in torch (dropout runs torch's op).
        scale: a float or a 0-dim tensor, as in torch (default 1/sqrt(D)).

    Returns:
        the attention output (..., Hq, Lq, Dv) in query's dtype, torch's values.

    Raises:
        ValueError, TypeError, RuntimeError: where torch raises for the same call.
        rt.MissingKernel: in strict mode, for a call no kernel covers.

    Example:
        >>> import torch, rlx_triton as rt
        >>> q = torch.randn(2, 32, 1, 128)                    # one new token, 32 query heads
        >>> k = v = torch.randn(2, 8, 1024, 128)              # 8 KV heads
        >>> rt.scaled_dot_product_attention(q, k, v, enable_gqa=True).shape
        torch.Size([2, 32, 1, 128])
    """
    if attn_mask is not None:
        attn_mask, is_causal, lower_right = _causal_bias(attn_mask, is_causal, query, key)
    else:
        lower_right = False
    if scale is not None and not isinstance(scale, float):
        scale = _scale_value(scale, "scaled_dot_product_attention")
    compiling = torch.compiler.is_compiling()
    signature = decided = None
    if not compiling:
        # a signature seen before is neither validated nor routed again (nested tensors are never remembered)
        signature = _call_signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, lower_right)
        try:
            decided = exact_route(signature) if signature is not None else None
        except TypeError:  # an unhashable value: validation will say what is wrong
            signature = None
    if decided is None and _is_nested(query, key, value, attn_mask):
        _validate_nested(query, key, value, attn_mask, dropout_p, scale)
        route(_nested_request(query, key, value, attn_mask, dropout_p))  # torch, or strict mode's refusal
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, False)
    if decided is None and not compiling:  # first call with this signature
        decided = _decide_sdpa(signature, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                               lower_right)
    elif compiling:
        _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # under torch.compile the custom op routes when it runs; calls it cannot express (dropout, autograd)
        # are decided here, so strict mode refuses them the same way in both modes
        if needs_grad(query, key, value, attn_mask) or dropout_p > 0.0:
            decided = route(_build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                                                lower_right))
    scale = None if scale is None else float(scale)
    if decided is not None and decided.backend == "torch":
        if not lower_right:  # the common case without the extra frame: this is the repeated call's cost
            # positional where torch allows: its argument parser is slower on keywords
            if enable_gqa:
                return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                                 scale=scale, enable_gqa=True)
            return torch._C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                                             scale=scale)
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, lower_right)
    return _sdpa_op(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa), lower_right,
                    None if decided is None else _decision_key(decided))


# --------------------------------------------------------------------------------------------------
# rt.sdpa_decode
# --------------------------------------------------------------------------------------------------
def check_attention_options(op: str, error: type, *, window_size, softcap, alibi_slopes, batch: int, num_heads: int,
                            device: torch.device) -> None:
    """FlashAttention's window_size, softcap and alibi_slopes, checked the same way for every op that takes them:
    TypeError for a wrong type or dtype, `error` (a ValueError) for a wrong value, shape or device."""
    if not isinstance(window_size, (tuple, list)) or not all(
            isinstance(w, int) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"{op}: window_size must be a pair of ints (left, right), got {window_size!r}")
    if len(window_size) != 2 or not all(w >= -1 for w in window_size):
        raise error(f"{op}: window_size must be a pair of ints (left, right), each >= -1 (-1: unbounded), got "
                    f"{tuple(window_size)!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{op}: softcap must be a float, got {type(softcap).__name__}")
    if not (0 <= softcap < math.inf):
        raise error(f"{op}: softcap must be a finite float >= 0 (0 turns it off), got {softcap}")
    if alibi_slopes is not None:
        check_is_tensor("alibi_slopes", alibi_slopes, op=op)
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"{op}: alibi_slopes must have dtype torch.float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((num_heads,), (batch, num_heads)):
            raise error(f"{op}: alibi_slopes must have shape ({num_heads},) or ({batch}, {num_heads}), got "
                        f"{tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise error(f"{op}: alibi_slopes must be on {device}, got {alibi_slopes.device}")


def attention_option_features(*, paged: bool, local_window: bool, softcap: float, alibi_slopes,
                              cache_batch_idx=None, cache_leftpad=None) -> dict:
    """The request features of FlashAttention's options in use (coverage names each one a kernel takes)."""
    features = {}
    if paged:
        features["paged"] = True
    if cache_batch_idx is not None:
        features["cache_batch_idx"] = True
    if cache_leftpad is not None:
        features["cache_leftpad"] = True
    if local_window:
        features["window"] = True
    if softcap > 0:
        features["softcap"] = True
    if alibi_slopes is not None:
        features["alibi"] = "per_head" if alibi_slopes.dim() == 1 else "per_batch_head"
    return features


def _decode_window(window_size, s_max: int) -> Tuple[int, int]:
    """The local window sdpa_decode hands a backend, normalized as FlashAttention normalizes a causal call's
    (backends/torch_ref/flash_attn.window_masking): the causal mask bounds the right side (right = 0), and a
    left side reaching the whole cache is unbounded. (left, 0) where it bounds the keys beyond the causal
    mask, (-1, -1) where the causal mask alone does. Plain arithmetic: the wrapper runs it under torch.compile."""
    left = window_size[0]
    return (left, 0) if 0 <= left < s_max else (-1, -1)


def _decode_options(window: Tuple[int, int], softcap: float, alibi_slopes) -> dict:
    """The FlashAttention options of a decode call in a backend's keywords, only those in use (a backend whose
    coverage does not name them is never handed them)."""
    options = {}
    if window != (-1, -1):
        options["window"] = window
    if softcap > 0:
        options["softcap"] = float(softcap)
    if alibi_slopes is not None:
        options["alibi_slopes"] = alibi_slopes
    return options


def _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table=None, window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None) -> None:
    op = "sdpa_decode"
    paged = block_table is not None
    for name, tensor in (("query", query), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_is_tensor(name, tensor, op=op)
        if tensor.dim() != 4:
            cache = "(num_pages, Hkv, page_size, {})" if paged else "(B, Hkv, S_max, {})"
            layout = "(B, Hq, Lq, D)" if name == "query" else cache.format("D" if name == "k_cache" else "Dv")
            raise AttentionInputError(f"{op}: {name} must be 4-D {layout}, got shape {tuple(tensor.shape)}")
    _check_scale(scale, op)
    _check_same_dtype_and_device(op, query=query, k_cache=k_cache, v_cache=v_cache)
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
    if not _values_readable(block_table):
        return
    page_size, num_pages = k_cache.shape[2], k_cache.shape[0]
    used = torch.ones_like(block_table, dtype=torch.bool)
    if cache_seqlens is not None and not _is_fake(cache_seqlens):
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
    if not _values_readable(cache_seqlens):
        return
    low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
    if low < 1 or high > s_max:
        raise AttentionInputError(f"sdpa_decode: every cache_seqlens entry must be in [1, S_max={s_max}], "
                                  f"got values in [{low}, {high}]")


def _values_readable(tensor: torch.Tensor) -> bool:
    """Whether a check may read the tensor's values (on a GPU a host sync, so a decode step would wait for
    the GPU), by RLX_TRITON_CHECK_VALUES: "1" always, "0" never, "auto" (the default) only where the tensor
    is on the CPU. Never while compiling, tracing fakes or capturing a CUDA graph. Unchecked values are the
    caller's contract; the kernels clamp and mask them, so none reads or writes out of bounds."""
    if torch.compiler.is_compiling() or _is_fake(tensor):
        return False
    policy = settings().check_values
    if policy == "0":
        return False
    if policy == "auto":
        return tensor.device.type == "cpu"
    return not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def _is_fake(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(tensor) or tensor.device.type == "meta"


def _decode_request(query, k_cache, v_cache, cache_seqlens=None, *, scale=None, return_lse=False,
                    block_table=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    _validate=True) -> Request:
    """Validates an sdpa_decode call and reduces it to a routing Request (what explain() shows); a paged
    cache, a local window, a softcap and ALiBi slopes are the features paged, window, softcap and alibi, which
    a backend's coverage must name."""
    if _validate:
        _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                         alibi_slopes)
    batch, heads, seq_q, head_dim = query.shape
    kv_heads, s_max = k_cache.shape[1], _decode_capacity(k_cache, block_table)
    features = {"mask": "none", "causal": "bottom_right", "dropout": False, "layout": "batched",
                "requires_grad": needs_grad(query, k_cache, v_cache)}
    features.update(attention_option_features(paged=block_table is not None,
                                              local_window=_decode_window(window_size, s_max) != (-1, -1),
                                              softcap=softcap, alibi_slopes=alibi_slopes))
    return SDPA_DECODE_REQUEST.make(
        {"batch": batch, "num_heads": heads, "head_dim": head_dim, "seq_q": seq_q, "seq_kv": s_max,
         "num_kv_heads": kv_heads, "head_dim_v": v_cache.shape[-1]}, features, tensor=query)


@torch.library.custom_op("rlx_triton::sdpa_decode", mutates_args=())
def _sdpa_decode_op(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    cache_seqlens: Optional[torch.Tensor], scale: Optional[float],
                    block_table: Optional[torch.Tensor] = None, window_left: int = -1, window_right: int = -1,
                    softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                    decision: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    window = (window_left, window_right)   # already normalized by the wrapper (`_decode_window`)
    chosen = _decided(decision)
    if chosen is None:  # under torch.compile (or a forgotten decision): route now
        chosen = route(_decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, block_table=block_table,
                                       window_size=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                       _validate=False))
    options = {"route": chosen} if chosen.backend == "triton" else {}
    if block_table is not None:  # only backends whose coverage names paged=True are routed one
        options["block_table"] = block_table
    options.update(_decode_options(window, softcap, alibi_slopes))
    out, lse = chosen.module.sdpa_decode(query, k_cache, v_cache, causal="bottom_right", scale=scale,
                                         cache_seqlens=cache_seqlens, candidate=chosen.candidate, **options)
    return out.contiguous(), lse.contiguous()


@_sdpa_decode_op.register_fake
def _sdpa_decode_fake(query, k_cache, v_cache, cache_seqlens, scale, block_table=None, window_left=-1,
                      window_right=-1, softcap=0.0, alibi_slopes=None, decision=None):
    batch, heads, seq_q, _ = query.shape
    out = query.new_empty((batch, heads, seq_q, v_cache.shape[-1]))
    return out, query.new_empty((batch, heads, seq_q), dtype=torch.float32)


def _decode_signature(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                      alibi_slopes) -> Optional[tuple]:
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
                     options)
        hash(signature)
    except (AttributeError, TypeError):
        return None
    return signature


@routed_op(_decode_request)
def sdpa_decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: Optional[torch.Tensor] = None, *, scale: Optional[float] = None,
                return_lse: bool = False, block_table: Optional[torch.Tensor] = None,
                window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                alibi_slopes: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of Lq new tokens against a KV cache, one valid length per sequence.

    The Lq query tokens are the last Lq positions of each sequence's valid part: causal masking is
    bottom-right within the valid length (the FlashAttention kv-cache convention), so token i sees keys
    j <= i + L_b - Lq, and a token that sees none gives 0. Keys at or past a sequence's length are never read.
    NaN and Inf follow torch's math SDPA within each valid part: NaN or +inf in a query row or a valid key
    gives that row NaN (lse NaN), NaN or Inf in a valid value gives NaN.

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

    Returns:
        out (B, Hq, Lq, Dv) in query's dtype; with return_lse=True, (out, lse) with lse (B, Hq, Lq) float32
        in natural log (-inf where a token sees no key).

    Raises:
        TypeError: a wrong type or dtype (the message names the argument).
        ValueError: a wrong shape, length, value or device, before any launch (a head count that fits
            flash_attn_with_kvcache's layout says so).
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
    """
    if scale is not None and not isinstance(scale, float):
        scale = _scale_value(scale, "sdpa_decode")
    compiling = torch.compiler.is_compiling()
    signature = None if compiling else _decode_signature(query, k_cache, v_cache, cache_seqlens, scale, block_table,
                                                         window_size, softcap, alibi_slopes)
    decided = exact_route(signature) if signature is not None else None
    if decided is None:
        _validate_decode(query, k_cache, v_cache, cache_seqlens, scale, block_table, window_size, softcap,
                         alibi_slopes)
    else:   # the values change between calls
        if cache_seqlens is not None:
            _check_cache_lengths(cache_seqlens, _decode_capacity(k_cache, block_table))
        if block_table is not None:
            _check_pages(block_table, cache_seqlens, k_cache)
    scale = None if scale is None else float(scale)
    window = _decode_window(window_size, _decode_capacity(k_cache, block_table))
    softcap = float(softcap)
    if decided is None and (not compiling or needs_grad(query, k_cache, v_cache)):
        # eager calls (and, under torch.compile, calls autograd records) are routed here, once
        decided = route(_decode_request(query, k_cache, v_cache, cache_seqlens, scale=scale, block_table=block_table,
                                        window_size=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                        _validate=False))
        if signature is not None:
            remember_exact_route(signature, decided)
    if decided is not None and decided.backend == "torch":
        # the library fallback outside the custom op: differentiable, and no custom-op dispatch cost
        from rlx_triton.backends.torch_ref import sdpa_decode as library

        out, lse = library.sdpa_decode(query, k_cache, v_cache, causal="bottom_right", scale=scale,
                                       cache_seqlens=cache_seqlens, block_table=block_table, candidate=None,
                                       **_decode_options(window, softcap, alibi_slopes))
    else:
        out, lse = _sdpa_decode_op(query, k_cache, v_cache, cache_seqlens, scale, block_table, window[0], window[1],
                                   softcap, alibi_slopes, None if decided is None else _decision_key(decided))
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------------------------------
# rt.patch_sdpa
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def patch_sdpa() -> Iterator[None]:
    """Replaces torch.nn.functional.scaled_dot_product_attention with rt's inside the block, then restores it.

    Code that calls F.scaled_dot_product_attention (most transformers and diffusers attention modules)
    then routes its decode-shaped calls to rlx_triton's kernels and the rest to torch's op.

    Returns:
        a context manager; torch's function is back in place when the block exits, also on an exception.

    Example:
        >>> import torch.nn.functional as F, rlx_triton as rt
        >>> with rt.patch_sdpa():
        ...     F.scaled_dot_product_attention is rt.scaled_dot_product_attention
        True
        >>> F.scaled_dot_product_attention is rt.scaled_dot_product_attention
        False
    """
    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    functional.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


# ==================================================================================================
# request specs of the two attention ops (rlx_triton/ops/_request_spec.py): what each sends the router,
# read by its request builder above and by `rlx-triton explain`
# ==================================================================================================
from rlx_triton.ops._request_spec import Derived as _Derived  # noqa: E402
from rlx_triton.ops._request_spec import Feature as _Feature  # noqa: E402
from rlx_triton.ops._request_spec import Given as _Given  # noqa: E402
from rlx_triton.ops._request_spec import RequestSpec as _RequestSpec  # noqa: E402
from rlx_triton.ops._request_spec import flag as _flag  # noqa: E402

_ATTENTION_GIVEN = (
    _Given("batch"), _Given("num_heads"), _Given("head_dim"), _Given("seq_kv"),
    _Given("seq_q", 1, "one query token: a decode step"),
    _Given("num_kv_heads", lambda f: f["num_heads"], "= num_heads (no grouped-query heads)"),
    _Given("head_dim_v", lambda f: f["head_dim"], "= head_dim"),
)
_TOKENS = _Derived("tokens", lambda f, o: f["seq_q"], "= seq_q", ("seq_q",))


def _heads_divide(fields, features) -> Optional[str]:
    if fields["num_heads"] % fields["num_kv_heads"]:
        return (f"num_heads={fields['num_heads']} must be a multiple of num_kv_heads={fields['num_kv_heads']} "
                f"(grouped-query attention)")
    return None


def _batched_heads_divide(fields, features) -> Optional[str]:
    """Grouped heads divide where the layout is batched (otherwise torch's op broadcasts them)."""
    return _heads_divide(fields, features) if features["layout"] == "batched" else None


def _grouped_rows(fields, features) -> int:
    """Query rows per KV head: the GQA group's query tokens where the heads are grouped (a batched layout)."""
    if features["layout"] != "batched":
        return fields["seq_q"]
    return fields["seq_q"] * (fields["num_heads"] // fields["num_kv_heads"])


SDPA_DECODE_REQUEST = _RequestSpec(
    _FAMILY, "sdpa_decode", _ATTENTION_GIVEN,
    (_Derived("m", lambda f, o: f["seq_q"] * (f["num_heads"] // f["num_kv_heads"]), "seq_q x num_heads / num_kv_heads",
              ("seq_q", "num_heads", "num_kv_heads"), "query rows per KV head"), _TOKENS),
    {"mask": _Feature("none", ("none",)), "causal": _Feature("bottom_right", ("bottom_right",)),
     "dropout": _Feature(False, (False,)), "layout": _Feature("batched", ("batched",)),
     "requires_grad": _flag(False),
     # FlashAttention's options, named only when in use (a backend's coverage must name each one it takes)
     "paged": _flag(False, sent_at_default=False), "window": _flag(False, sent_at_default=False),
     "softcap": _flag(False, sent_at_default=False),
     "alibi": _Feature("none", ("none", "per_head", "per_batch_head"), sent_at_default=False)},
    (_heads_divide,),
)

SDPA_REQUEST = _RequestSpec(
    _FAMILY, "scaled_dot_product_attention", _ATTENTION_GIVEN,
    (_Derived("m", _grouped_rows, "seq_q x num_heads / num_kv_heads (seq_q where the layout is not batched)",
              ("seq_q", "num_heads", "num_kv_heads", "layout"), "query rows per KV head"), _TOKENS),
    {"mask": _Feature("none", ("none", "bool", "float")),
     "causal": _Feature("none", ("none", "top_left", "top_left_with_mask", "bottom_right")),
     "dropout": _flag(False),
     "layout": _Feature("batched", ("batched", "broadcast", "unbatched", "unequal_kv_heads")),
     "requires_grad": _flag(False)},
    (_batched_heads_divide,),
)
