"""rt.scaled_dot_product_attention, torch's drop-in, and rt.patch_sdpa(), which installs it in place of
torch.nn.functional.scaled_dot_product_attention inside a block.

A call is validated first (errors name the argument, where torch raises for the same call), reduced to a
routing Request from the shapes, and runs as the torch.library custom op `rlx_triton::sdpa` with a fake
implementation, so `torch.compile(fullgraph=True)` sees one opaque node per call. A call is routed once: in
eager mode the wrapper decides and hands its decision to the custom op (ops/_decisions.py); under
torch.compile the op decides when it runs, since only then are the real shapes known. Routing reads shapes
and dtypes only, never tensor data.

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
import math
from typing import Iterator, Optional, Tuple

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from rlx_triton.ops import _decisions
from rlx_triton.ops._attention_options import (ATTENTION_GIVEN, TOKENS, AttentionInputError,
                                               check_same_dtype_and_device, check_scale, heads_divide, scale_value)
from rlx_triton.ops._checks import check_is_tensor, needs_grad
from rlx_triton.ops._request_spec import Derived, Feature, RequestSpec, flag
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.route import Route, exact_route, planning_route, remember_exact_route, unrecord
from rlx_triton.router.speed import Call

_FAMILY = KernelFamily.SDPA_DECODE.value
# torch's op, bound once: the library route of a repeated call calls it without looking it up
_library_sdpa = torch._C._nn.scaled_dot_product_attention
_is_dynamo_compiling = torch.compiler.is_dynamo_compiling
# a tensor's sizes as a plain tuple (what a signature holds): torch's C helper where it has one, a third cheaper
# than building a torch.Size; it raises RuntimeError on a nested or symbolic tensor, as .shape does on a nested one
_sizes = getattr(torch._C, "_non_sym_sizes", None) or (lambda tensor: tuple(tensor.shape))
_compiler = torch.compiler


def _batched_heads_divide(fields, features) -> Optional[str]:
    """Grouped heads divide where the layout is batched (otherwise torch's op broadcasts them)."""
    return heads_divide(fields, features) if features["layout"] == "batched" else None


def _grouped_rows(fields, features) -> int:
    """Query rows per KV head: the GQA group's query tokens where the heads are grouped (a batched layout)."""
    if features["layout"] != "batched":
        return fields["seq_q"]
    return fields["seq_q"] * (fields["num_heads"] // fields["num_kv_heads"])


# what a call sends the router (ops/_request_spec.py), read by `_build_sdpa_request` and by `rlx-triton explain`
SDPA_REQUEST = RequestSpec(
    _FAMILY, "scaled_dot_product_attention", ATTENTION_GIVEN,
    (Derived("m", _grouped_rows, "seq_q x num_heads / num_kv_heads (seq_q where the layout is not batched)",
             ("seq_q", "num_heads", "num_kv_heads", "layout"), "query rows per KV head"), TOKENS),
    {"mask": Feature("none", ("none", "bool", "float")),
     "causal": Feature("none", ("none", "top_left", "top_left_with_mask", "bottom_right")),
     "dropout": flag(False),
     "layout": Feature("batched", ("batched", "broadcast", "unbatched", "unequal_kv_heads")),
     "requires_grad": flag(False)},
    (_batched_heads_divide,),
)


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


# A call's remembered signature: (query, key and value shapes, query's dtype and device, dropout_p, is_causal,
# the scale's type, enable_gqa, the mask's `_mask_signature` or None), all as given, and NEEDS_GRAD after it
# where autograd records the call (those calls are remembered apart: see the wrapper)
_MASK_FIELD = 9
NEEDS_GRAD = "needs-grad"


def _mask_signature(attn_mask) -> tuple:
    """What a call's signature holds of its mask: a CausalBias's variant and sizes (it stands for an
    alignment, not for data), or a tensor's shape, dtype, device and whether it requires grad."""
    if isinstance(attn_mask, CausalBias):
        return (CausalBias, attn_mask.variant, attn_mask.seq_len_q, attn_mask.seq_len_kv)
    return (_sizes(attn_mask), attn_mask.dtype, attn_mask.device, attn_mask.requires_grad)


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
    mask = signature[_MASK_FIELD]
    if mask is not None and mask[0] is CausalBias:   # what the alignment depends on: whether L equals S
        mask = mask[:3] + (mask[3] == mask[2],)
    elif mask is not None:  # its last dim is S or 1
        mask = (mask[0][:-1], mask[0][-1] == 1) + mask[1:]
    return ("kv-bucket", q_shape, k_shape[:-2], k_shape[-1], v_shape[:-2], v_shape[-1], (seq_kv - 1).bit_length(),
            signature[3:_MASK_FIELD], mask, signature[_MASK_FIELD + 1:])


def _same_dtype_and_device(query, key, value) -> bool:
    """What validation checks of a call that its remembered signature leaves out."""
    dtype, device = query.dtype, query.device
    return key.dtype is dtype and value.dtype is dtype and key.device == device and value.device == device


def _kv_length_agrees(key, value, attn_mask) -> bool:
    """What a new KV length could break in a call that is otherwise known: value's length and the mask's last dim."""
    seq_kv = key.shape[-2]
    return value.shape[-2] == seq_kv and (attn_mask is None or attn_mask.shape[-1] in (1, seq_kv))


def _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> None:
    op = "scaled_dot_product_attention"
    _validate_nested(query, key, value, attn_mask, dropout_p, scale)
    check_same_dtype_and_device(op, query=query, key=key, value=value)
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
    check_scale(scale, op)
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
    scale = scale_value(scale, "scaled_dot_product_attention")
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
    backend = chosen.module
    assert backend is not None, "route() names the module that runs the call"
    return backend.scaled_dot_product_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa,
                                                candidate=chosen.candidate, lower_right=lower_right,
                                                route=chosen if chosen.candidate is not None else None)


@torch.library.custom_op("rlx_triton::sdpa", mutates_args=())
def _sdpa_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Optional[torch.Tensor],
             is_causal: bool, scale: Optional[float], enable_gqa: bool, lower_right: bool = False,
             decision: Optional[str] = None) -> torch.Tensor:
    chosen = _decisions.received(decision)
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


def _library_call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """torch's own op on a call's arguments as given (it takes a CausalBias and a 0-dim tensor scale itself):
    no argument torch would take as its default (its parser pays for each one given), and positional where
    torch allows (it is slower on keywords)."""
    if enable_gqa:
        return _library_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True)
    if attn_mask is None and not is_causal and not dropout_p:
        return _library_sdpa(query, key, value) if scale is None else _library_sdpa(query, key, value, scale=scale)
    return _library_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)


def _public_call(*args) -> Call:
    """The public call with these arguments, for a new decision's speed estimate. A closure made here and not
    in the wrapper: the arguments a closure captures would cost every call of the wrapper a cell each."""
    return lambda: (scaled_dot_product_attention, args, {})


def _decide_sdpa(signature, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 lower_right, call: Call) -> Route:
    """The route of an eager call whose exact signature is new: its KV-length bucket's, or validated and routed
    (`call`: the public call, which a new decision's speed estimate plans)."""
    bucketed = _kv_bucket_signature(signature) if signature is not None else None
    decided = exact_route(bucketed) if bucketed is not None else None
    if decided is not None and _kv_length_agrees(key, value, attn_mask):
        # a decode step: its bucket's route, and its own signature is not remembered (each step has a new one,
        # which would push the calls that do repeat out of the route cache)
        return decided
    _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    decided = route(_build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                                        lower_right), call=call)
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

    Decode-shaped calls (up to 64 query tokens, head dims up to 256, fp16/bf16/fp32, bool or float mask,
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
    # torch.compiler.is_compiling(), two frames cheaper: dynamo folds is_dynamo_compiling() to True while it
    # traces, and the flag covers export's tracing without dynamo
    compiling = _is_dynamo_compiling() or _compiler._is_compiling_flag
    signature: Optional[tuple] = None
    decided = None
    if not compiling:
        # a signature seen before is neither validated nor routed again (nested tensors are never remembered).
        # Built inline from the arguments as given, as this is what every repeated call pays, it holds what
        # routing reads (the scale's type, not its value) and what validation reads, except what torch's op
        # checks itself and only a kernel route needs checked here: key's and value's dtype and device
        # (query's), and whether autograd records the call (it then goes to torch's op, remembered under the
        # signature with NEEDS_GRAD)
        try:
            signature = (_sizes(query), _sizes(key), _sizes(value), query.dtype, query.device, dropout_p, is_causal,
                         type(scale), enable_gqa, None if attn_mask is None else _mask_signature(attn_mask))
            decided = exact_route(signature)
        except (AttributeError, RuntimeError):  # not tensors (validation will say so), or a strided nested tensor
            signature = None
        except TypeError:  # an unhashable value: validation will say what is wrong
            signature = None
        if decided is not None and decided.backend == "torch":
            # the repeated call's whole cost: torch's own op on the arguments as given (inline, as
            # `_library_call` spells it: a call frame is a tenth of what is left to save here)
            sdpa = _library_sdpa
            if enable_gqa:
                return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=True)
            if attn_mask is None and not is_causal and not dropout_p:
                return sdpa(query, key, value) if scale is None else sdpa(query, key, value, scale=scale)
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale)
    given_mask, given_causal, given_scale = attn_mask, is_causal, scale   # what a new decision plans
    if attn_mask is not None:
        attn_mask, is_causal, lower_right = _causal_bias(attn_mask, is_causal, query, key)
    else:
        lower_right = False
    if scale is not None and not isinstance(scale, float):
        scale = scale_value(scale, "scaled_dot_product_attention")
    if signature is not None:   # not remembered, or remembered on a kernel
        try:
            if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
                if decided is not None:
                    unrecord(decided)   # the kernel route of the same call without autograd
                signature = signature + (NEEDS_GRAD,)
                decided = exact_route(signature)
            if decided is not None and decided.backend != "torch" and not _same_dtype_and_device(query, key, value):
                signature = decided = None   # validated below: the error names the argument
        except AttributeError:   # not tensors: validation will say so
            signature = decided = None
    if decided is None and _is_nested(query, key, value, attn_mask):
        _validate_nested(query, key, value, attn_mask, dropout_p, scale)
        route(_nested_request(query, key, value, attn_mask, dropout_p))  # torch, or strict mode's refusal
        return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, False)
    if decided is None and not compiling:  # first call with this signature
        decided = _decide_sdpa(signature, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                               lower_right, _public_call(query, key, value, given_mask, dropout_p, given_causal,
                                                         given_scale, enable_gqa))
    elif compiling:
        _validate_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # under torch.compile the custom op routes when it runs; calls it cannot express (dropout, autograd)
        # are decided here, so strict mode refuses them the same way in both modes
        if needs_grad(query, key, value, attn_mask) or dropout_p > 0.0:
            decided = route(_build_sdpa_request(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa,
                                                lower_right))
    if decided is not None and decided.backend == "torch":
        return _library_call(query, key, value, given_mask, dropout_p, given_causal, given_scale, enable_gqa)
    scale = None if scale is None else float(scale)
    if decided is not None and decided is planning_route():   # a speed model's plan: the launches, not the op
        return _run_sdpa(decided, query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa), lower_right)
    return _sdpa_op(query, key, value, attn_mask, bool(is_causal), scale, bool(enable_gqa), lower_right,
                    None if decided is None else _decisions.hand_off(decided))



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
