"""rt.flash_attn_varlen_func and rt.flash_attn_func: FlashAttention 2's ragged and batched entry points, with
its signatures, shapes, semantics and return values.

flash_attn_varlen_func: q (total_q, H, D) packed by cu_seqlens_q (num_seqs + 1,); k/v (total_k, Hkv, D/Dv)
packed by cu_seqlens_k, or paged (num_pages, page_size, Hkv, D/Dv) with block_table (num_seqs, pages) and
the key lengths in cu_seqlens_k. flash_attn_func: q (B, Sq, H, D), k/v (B, Sk, Hkv, D/Dv), run as the
varlen call of its equal-length batch. Beyond FA2: any page size >= 1, float32 (and float64 on the torch
path), Dv != D, attention sinks (`s_aux`, per-head logits, as transformers passes them), and quantised paged
caches (fp8 e4m3 / e5m2 or int8 k/v with float32 `k_scale` / `v_scale`, per tensor or per key row and head,
rlx_triton/kv_quant.py), dequantised on load.

Routing: one Triton launch over the whole ragged batch (backends/triton/varlen_attention) where its coverage
takes the request; what no kernel covers (dropout, autograd, float64, head dims past 256; Metal, whose
coverage refuses the family) runs the torch path (backends/torch_ref/varlen_attention.py) with the reason in
explain, and strict mode raises MissingKernel naming it. Every argument is checked before a launch, with a
ValueError or TypeError naming it.
"""
from __future__ import annotations

from typing import Any, Dict, Literal, Optional, Tuple, Union, overload

import torch

from rlx_triton.backends.torch_ref import varlen_attention as reference
from rlx_triton.backends.torch_ref.flash_attn import masking
from rlx_triton.kv_quant import check_kv_scales, is_quantised, kv_features
from rlx_triton.ops import _decisions
from rlx_triton.ops._attention_options import attention_option_features, check_attention_options, values_readable
from rlx_triton.ops._checks import FLOAT_DTYPES, check_is_tensor, needs_grad
from rlx_triton.planner import KernelFamily
from rlx_triton.router import Request, route, routed_op
from rlx_triton.router.route import planning_route

_OP = "flash_attn_varlen_func"
INDEX_DTYPES = (torch.int32, torch.int64)
# (out, softmax_lse, S_dmask): what return_attn_probs=True returns
_WithAttnProbs = Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]


class VarlenAttentionInputError(ValueError):
    """A flash_attn_varlen_func / flash_attn_func argument with the wrong shape, value or device."""


def _check_flag(op: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")


def _length(value):
    """A max_seqlen argument as an int: 0-d integer tensors (what transformers may compute) are read once."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point() \
            and value.dtype != torch.bool:
        return int(value)
    return value


def check_length(op: str, name: str, value) -> None:
    """A maximum sequence length: an int >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise (TypeError if not isinstance(value, int) or isinstance(value, bool) else VarlenAttentionInputError)(
            f"{op}: {name} must be an int >= 0, got {value!r}")


def _check_options(op: str, q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, s_aux, batch: int) -> None:
    """The options both entry points share: flags, numbers, window, softcap, ALiBi slopes and sinks."""
    num_heads = q.shape[-2]
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"{op}: dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise VarlenAttentionInputError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))):
        raise TypeError(f"{op}: softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    for name, flag in (("causal", causal), ("deterministic", deterministic), ("return_attn_probs", return_attn_probs)):
        _check_flag(op, name, flag)
    check_attention_options(op, VarlenAttentionInputError, window_size=window_size, softcap=softcap,
                            alibi_slopes=alibi_slopes, batch=batch, num_heads=num_heads, device=q.device)
    if s_aux is not None:
        check_is_tensor("s_aux", s_aux, op=op)
        if not s_aux.is_floating_point():
            raise TypeError(f"{op}: s_aux must be a floating-point tensor, got {s_aux.dtype}")
        if tuple(s_aux.shape) != (num_heads,) or s_aux.device != q.device:
            raise VarlenAttentionInputError(f"{op}: s_aux must have shape ({num_heads},) on {q.device}, got "
                                            f"{tuple(s_aux.shape)} on {s_aux.device}")


def check_qkv(op: str, q, k, v, q_dims: int, kv_dims: int, names: Tuple[str, str, str] = ("q", "k", "v"),
              quantised_kv: bool = False) -> None:
    """q, k and v: tensors of the given dims, floating point, of q's dtype and device, with matching heads and
    head dims. quantised_kv: k and v may instead both be of one quantised dtype (fp8 e4m3 / e5m2 or int8, a
    paged cache whose scales `check_kv_scales` checks)."""
    q_name, k_name, v_name = names
    quantised = quantised_kv and isinstance(k, torch.Tensor) and is_quantised(k)
    for name, tensor, dims in ((q_name, q, q_dims), (k_name, k, kv_dims), (v_name, v, kv_dims)):
        check_is_tensor(name, tensor, op=op)
        if tensor.dim() != dims:
            raise VarlenAttentionInputError(f"{op}: {name} must be {dims}-D, got shape {tuple(tensor.shape)}")
        if quantised and tensor is not q:
            if tensor.dtype != k.dtype:
                raise TypeError(f"{op}: {name} must have the dtype of the quantised {k_name} ({k.dtype}), got "
                                f"{tensor.dtype}")
        elif tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: {name} must be a floating-point tensor, got {tensor.dtype}")
        elif tensor.dtype != q.dtype:
            raise TypeError(f"{op}: {name} must have the dtype of {q_name} ({q.dtype}), got {tensor.dtype}")
        if tensor.device != q.device:
            raise VarlenAttentionInputError(f"{op}: {name} must be on {q_name}'s device {q.device}, got "
                                            f"{tensor.device}")
    num_heads, head_dim = q.shape[-2], q.shape[-1]
    num_kv_heads = k.shape[-2]
    if head_dim == 0 or num_heads == 0 or v.shape[-1] == 0:
        raise VarlenAttentionInputError(f"{op}: {q_name} and {v_name} must have nonzero heads and head dims, got "
                                        f"{q_name} {tuple(q.shape)} and {v_name} {tuple(v.shape)}")
    if k.shape[-1] != head_dim:
        raise VarlenAttentionInputError(f"{op}: {k_name}'s head dim must equal {q_name}'s ({head_dim}), got shape "
                                        f"{tuple(k.shape)}")
    if tuple(v.shape[:-1]) != tuple(k.shape[:-1]):
        raise VarlenAttentionInputError(f"{op}: {v_name} must have shape {tuple(k.shape[:-1])} + (Dv,), got "
                                        f"{tuple(v.shape)}")
    if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
        raise VarlenAttentionInputError(f"{op}: number of heads in key/value ({num_kv_heads}) must divide number "
                                        f"of heads in query ({num_heads})")


def check_offsets(name: str, value, batch_plus_one: Optional[int], device: torch.device, op: str = _OP) -> None:
    check_is_tensor(name, value, op=op)
    if value.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: {name} must have dtype torch.int32 (or torch.int64), got {value.dtype}")
    if value.dim() != 1 or value.shape[0] < 2 or (batch_plus_one is not None and value.shape[0] != batch_plus_one):
        expected = "(batch_size + 1,)" if batch_plus_one is None else f"({batch_plus_one},)"
        raise VarlenAttentionInputError(f"{op}: {name} must have shape {expected}, batch_size >= 1, got "
                                        f"{tuple(value.shape)}")
    if value.device != device:
        raise VarlenAttentionInputError(f"{op}: {name} must be on {device}, got {value.device}")


def check_block_table(block_table, batch: int, k: torch.Tensor, q: torch.Tensor, op: str = _OP,
                      k_name: str = "k") -> None:
    """A (batch, max_num_blocks >= 1) int32/int64 page table on q's device, over a paged k of >= 1 page of >= 1
    slot."""
    check_is_tensor("block_table", block_table, op=op)
    if block_table.dtype not in INDEX_DTYPES:
        raise TypeError(f"{op}: block_table must have dtype torch.int32, got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
        raise VarlenAttentionInputError(f"{op}: block_table must have shape (batch_size, max_num_blocks) = "
                                        f"({batch}, >= 1), got {tuple(block_table.shape)}")
    if block_table.device != q.device:
        raise VarlenAttentionInputError(f"{op}: block_table must be on {q.device}, got {block_table.device}")
    if k.shape[0] == 0 or k.shape[1] == 0:
        raise VarlenAttentionInputError(f"{op}: a paged {k_name} must hold at least one page of one slot, got "
                                        f"shape {tuple(k.shape)}")


def check_quantised_paged(op: str, k, v, paged: bool, names: Tuple[str, str] = ("k", "v")) -> None:
    """A quantised (fp8 or int8) k or v is a paged cache: without a block table, ValueError naming it."""
    if paged:
        return
    for name, tensor in zip(names, (k, v)):
        if isinstance(tensor, torch.Tensor) and is_quantised(tensor):
            raise VarlenAttentionInputError(f"{op}: {name} of dtype {tensor.dtype} is a quantised cache, which is "
                                            f"supported paged only (flash_attn_varlen_func with block_table)")


def _validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table,
                     s_aux, k_scale=None, v_scale=None) -> None:
    """FlashAttention's argument checks for the varlen call, without reading tensor data."""
    paged = block_table is not None
    check_quantised_paged(_OP, k, v, paged)
    check_qkv(_OP, q, k, v, 3, 4 if paged else 3, quantised_kv=paged)
    check_kv_scales(_OP, VarlenAttentionInputError, k, v, k_scale, v_scale)
    check_offsets("cu_seqlens_q", cu_seqlens_q, None, q.device)
    batch = cu_seqlens_q.shape[0] - 1
    check_offsets("cu_seqlens_k", cu_seqlens_k, batch + 1, q.device)
    check_length(_OP, "max_seqlen_q", max_seqlen_q)
    check_length(_OP, "max_seqlen_k", max_seqlen_k)
    if paged:
        check_block_table(block_table, batch, k, q)
    _check_options(_OP, q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, s_aux, batch)


# the names a varlen entry point gives its arguments, in its error messages
FA_NAMES = {"op": _OP, "q": "q", "k": "k", "cu_q": "cu_seqlens_q", "cu_k": "cu_seqlens_k", "max_q": "max_seqlen_q",
            "max_k": "max_seqlen_k"}


def check_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, seqused_k=None,
                 names=FA_NAMES) -> None:
    """The checks that read the offsets, the used key counts and the block table (a host sync): skipped while
    compiling, tracing fakes or capturing a CUDA graph, where they are the caller's contract."""
    if not values_readable(cu_seqlens_q):
        return
    op = names["op"]
    checked = [(names["cu_q"], cu_seqlens_q, max_seqlen_q, names["max_q"], q.shape[0])]
    if cu_seqlens_k is not None:   # with seqused_k its differences are no key counts: only its start and order
        checked.append((names["cu_k"], cu_seqlens_k, None if seqused_k is not None else max_seqlen_k,
                        names["max_k"], None))
    for name, offsets, bound, bound_name, rows in checked:
        lengths = offsets[1:] - offsets[:-1]
        if int(offsets[0]) != 0 or bool((lengths < 0).any()):
            raise VarlenAttentionInputError(f"{op}: {name} must start at 0 and never decrease")
        if bound is not None and int(lengths.max()) > bound:
            raise VarlenAttentionInputError(f"{op}: a sequence of {name} is longer ({int(lengths.max())}) than "
                                            f"{bound_name} ({bound})")
        if rows is not None and int(offsets[-1]) > rows:
            raise VarlenAttentionInputError(f"{op}: {name}[-1] ({int(offsets[-1])}) exceeds {names['q']}'s {rows} "
                                            f"tokens")
    if seqused_k is not None:
        lengths_k = seqused_k.to(torch.int64)
        if bool((lengths_k < 0).any()) or int(lengths_k.max()) > max_seqlen_k:
            raise VarlenAttentionInputError(f"{op}: every seqused_k entry must be in [0, {names['max_k']}="
                                            f"{max_seqlen_k}], got values in [{int(lengths_k.min())}, "
                                            f"{int(lengths_k.max())}]")
    else:
        lengths_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int64)
    if block_table is None:
        if seqused_k is None and int(cu_seqlens_k[-1]) > k.shape[0]:
            raise VarlenAttentionInputError(f"{op}: {names['cu_k']}[-1] ({int(cu_seqlens_k[-1])}) exceeds "
                                            f"{names['k']}'s {k.shape[0]} tokens")
        if seqused_k is not None and int((cu_seqlens_k[:-1].to(torch.int64) + lengths_k).max()) > k.shape[0]:
            raise VarlenAttentionInputError(f"{op}: a sequence's keys ({names['cu_k']}[s] + seqused_k[s]) run past "
                                            f"{names['k']}'s {k.shape[0]} tokens")
        return
    page_size = k.shape[1]
    if int(lengths_k.max()) > block_table.shape[1] * page_size:
        raise VarlenAttentionInputError(f"{op}: a sequence's keys ({int(lengths_k.max())}) exceed its "
                                        f"block_table's {block_table.shape[1]} pages of {page_size}")
    needed = (lengths_k + page_size - 1) // page_size
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < needed[:, None]
    pages = block_table[used]
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= k.shape[0]):
        raise VarlenAttentionInputError(f"{op}: block_table entries of the pages a sequence uses must be in "
                                        f"[0, {k.shape[0]}) ({names['k']}'s pages)")


def varlen_request(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, dropout_p, causal, window_size, softcap,
             alibi_slopes, block_table, s_aux, layout: str, *, op: str = _OP, seqused: bool = False,
             k_scale: Optional[torch.Tensor] = None) -> Request:
    """The routing request: the kernel's fields, and each FA option in use as a feature the coverage must name
    (seqused: the call gives each sequence's used key count, varlen_attn's seqused_k; a quantised cache: its
    storage dtype and scale layout, kv_dtype and kv_scale)."""
    total_q, num_heads, head_dim = q.shape
    mask = masking(causal, tuple(window_size), max_seqlen_q, max_seqlen_k, alibi_slopes is not None)
    features = {"dropout": dropout_p > 0, "layout": layout, "causal": "bottom_right" if mask.is_causal else "none",
                "requires_grad": needs_grad(q, k, v, s_aux)}
    features.update(attention_option_features(paged=block_table is not None, local_window=mask.is_local,
                                              softcap=softcap, alibi_slopes=alibi_slopes))
    if s_aux is not None:
        features["sinks"] = True
    if seqused:
        features["seqused"] = True
    features.update(kv_features(k, k_scale))
    # a bound of 0 (no sequence has a query token, or a key) routes as 1: the kernel runs it all the same
    fields = {"tokens": total_q, "batch": cu_seqlens_q.shape[0] - 1, "num_heads": num_heads, "head_dim": head_dim,
              "seq_q": max(1, max_seqlen_q), "seq_kv": max(1, max_seqlen_k), "num_kv_heads": k.shape[-2],
              "head_dim_v": v.shape[-1]}
    if block_table is not None:
        fields["page_size"] = k.shape[1]
    return Request.make(KernelFamily.VARLEN_ATTENTION, op, tensor=q, fields=fields, features=features)


def _run(chosen, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
         window_size, softcap, alibi_slopes, block_table, s_aux, return_probs=False, varlen_attn=None, k_scale=None,
         v_scale=None):
    """(out, lse, S_dmask) on the route's backend: its flash_attn_varlen_func, or with `varlen_attn` (rt.varlen_attn's
    seqused_k and num_splits) its varlen_attn. A quantised cache's scales are handed over where given (only
    backends whose coverage names the kv_dtype are routed them)."""
    options: Dict[str, Any] = {"route": chosen} if chosen.backend == "triton" else {}
    if k_scale is not None:
        options.update(k_scale=k_scale, v_scale=v_scale)
    run = chosen.module.flash_attn_varlen_func
    if varlen_attn is not None:
        run = chosen.module.varlen_attn
        options.update(varlen_attn)
    return run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               tuple(window_size), float(softcap), alibi_slopes, block_table, s_aux, float(dropout_p),
               return_probs=return_probs, candidate=chosen.candidate, **options)


@torch.library.custom_op("rlx_triton::flash_attn_varlen", mutates_args=())
def _varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
               s_aux: Optional[torch.Tensor], layout: str, decision: Optional[str] = None,
               seqused_k: Optional[torch.Tensor] = None, num_splits: Optional[int] = None,
               op: str = _OP, k_scale: Optional[torch.Tensor] = None,
               v_scale: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """One routed varlen call; `op` "varlen_attn" (rt.varlen_attn, with seqused_k and num_splits) runs the
    backends' varlen_attn, cu_seqlens_k None then standing for a paged call's absent offsets. k_scale / v_scale:
    a quantised cache's scales."""
    window_size = (window_left, window_right)
    chosen = _decisions.received(decision)
    if chosen is None:  # under torch.compile (or a forgotten decision): route now
        chosen = route(varlen_request(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, 0.0, causal, window_size,
                                softcap, alibi_slopes, block_table, s_aux, layout, op=op,
                                seqused=seqused_k is not None, k_scale=k_scale))
    varlen_attn = dict(seqused_k=seqused_k, num_splits=num_splits) if op != _OP else None
    out, lse, _ = _run(chosen, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, 0.0, softmax_scale,
                       causal, window_size, softcap, alibi_slopes, block_table, s_aux, varlen_attn=varlen_attn,
                       k_scale=k_scale, v_scale=v_scale)
    return out.contiguous(), lse.contiguous()


@_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                 window_right, softcap, alibi_slopes, block_table, s_aux, layout, decision=None, seqused_k=None,
                 num_splits=None, op=_OP, k_scale=None, v_scale=None):
    total_q, num_heads, _ = q.shape
    return q.new_empty((total_q, num_heads, v.shape[-1])), q.new_empty((num_heads, total_q), dtype=torch.float32)


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
              window_size, softcap, alibi_slopes, block_table, s_aux, return_attn_probs, layout: str, *,
              op: str = _OP, seqused_k: Optional[torch.Tensor] = None, num_splits: Optional[int] = None,
              k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None):
    """(out, lse, S_dmask) of a validated varlen call: routed once, the torch path outside the custom op. op
    "varlen_attn": rt.varlen_attn's call, with its seqused_k and num_splits; k_scale / v_scale: a quantised
    paged cache's scales."""
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    left, right = window_size
    if q.shape[0] == 0:  # no query token: nothing to launch
        return (q.new_empty((0, q.shape[1], v.shape[-1])),
                q.new_empty((q.shape[1], 0), dtype=torch.float32), None)
    decided = None
    if not torch.compiler.is_compiling():
        decided = route(varlen_request(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, dropout_p, causal, window_size,
                                 softcap, alibi_slopes, block_table, s_aux, layout, op=op,
                                 seqused=seqused_k is not None, k_scale=k_scale),
                        call=lambda: (attention, (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                                  alibi_slopes, block_table, s_aux, return_attn_probs, layout),
                                      dict(op=op, seqused_k=seqused_k, num_splits=num_splits, k_scale=k_scale,
                                           v_scale=v_scale)))
    if decided is not None and (decided.backend == "torch" or decided is planning_route()):
        # the library path outside the custom op: no dispatch cost, and autograd through its torch ops (a speed
        # model's plan: its launches)
        return _run(decided, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                    softmax_scale, causal, (left, right), softcap, alibi_slopes, block_table, s_aux,
                    return_probs=return_attn_probs,
                    varlen_attn=dict(seqused_k=seqused_k, num_splits=num_splits) if op != _OP else None,
                    k_scale=k_scale, v_scale=v_scale)
    out, lse = _varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                          left, right, float(softcap), alibi_slopes, block_table, s_aux, layout,
                          None if decided is None else _decisions.hand_off(decided), seqused_k, num_splits, op,
                          k_scale, v_scale)
    return out, lse, None


def _explain_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_attn_probs=False, block_table=None, s_aux=None, *, k_scale=None,
                    v_scale=None) -> Request:
    _validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table, s_aux,
                     k_scale, v_scale)
    return varlen_request(q, k, v, cu_seqlens_q, max_seqlen_q, max_seqlen_k, dropout_p, causal, window_size, softcap,
                    alibi_slopes, block_table, s_aux, "packed", k_scale=k_scale)


# The return type follows return_attn_probs: `out` alone, or (out, softmax_lse, S_dmask) with
# return_attn_probs=True (passed by keyword; passed by position it is the bool overload's Union).
@overload
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: Union[int, torch.Tensor],
                           max_seqlen_k: Union[int, torch.Tensor], dropout_p: float = ...,
                           softmax_scale: Optional[float] = ..., causal: bool = ...,
                           window_size: Tuple[int, int] = ..., softcap: float = ...,
                           alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                           return_attn_probs: Literal[False] = ..., block_table: Optional[torch.Tensor] = ...,
                           s_aux: Optional[torch.Tensor] = ..., *, k_scale: Optional[torch.Tensor] = ...,
                           v_scale: Optional[torch.Tensor] = ...) -> torch.Tensor: ...


@overload
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: Union[int, torch.Tensor],
                           max_seqlen_k: Union[int, torch.Tensor], dropout_p: float = ...,
                           softmax_scale: Optional[float] = ..., causal: bool = ...,
                           window_size: Tuple[int, int] = ..., softcap: float = ...,
                           alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                           *, return_attn_probs: Literal[True], block_table: Optional[torch.Tensor] = ...,
                           s_aux: Optional[torch.Tensor] = ..., k_scale: Optional[torch.Tensor] = ...,
                           v_scale: Optional[torch.Tensor] = ...) -> _WithAttnProbs: ...


@overload
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: Union[int, torch.Tensor],
                           max_seqlen_k: Union[int, torch.Tensor], dropout_p: float = ...,
                           softmax_scale: Optional[float] = ..., causal: bool = ...,
                           window_size: Tuple[int, int] = ..., softcap: float = ...,
                           alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                           return_attn_probs: bool = ..., block_table: Optional[torch.Tensor] = ...,
                           s_aux: Optional[torch.Tensor] = ..., *, k_scale: Optional[torch.Tensor] = ...,
                           v_scale: Optional[torch.Tensor] = ...
                           ) -> Union[torch.Tensor, _WithAttnProbs]: ...


@routed_op(_explain_varlen)
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: Union[int, torch.Tensor],
                           max_seqlen_k: Union[int, torch.Tensor], dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[torch.Tensor] = None,
                           s_aux: Optional[torch.Tensor] = None, *, k_scale: Optional[torch.Tensor] = None,
                           v_scale: Optional[torch.Tensor] = None
                           ) -> Union[torch.Tensor, _WithAttnProbs]:
    """FlashAttention 2's flash_attn_varlen_func: attention over a ragged batch of sequences.

    q (total_q, H, D), sequence s owning rows [cu_seqlens_q[s], cu_seqlens_q[s + 1]); k/v (total_k, Hkv, D/Dv)
    with sequence s's keys at rows [cu_seqlens_k[s], cu_seqlens_k[s + 1]), or, with block_table (num_seqs,
    max_num_blocks) int32, paged k/v (num_blocks, page_block_size, Hkv, D/Dv) holding sequence s's
    cu_seqlens_k[s + 1] - cu_seqlens_k[s] keys in its pages in order (any page size >= 1). Hkv divides H (query
    head h reads KV head h // (H // Hkv)). cu_seqlens_q/_k: (num_seqs + 1,) int32 offsets from 0;
    max_seqlen_q/_k: ints (or 0-d integer tensors) at least every sequence's length (FA normalizes causal
    and the window against them). causal is aligned bottom-right within each sequence; window_size (left,
    right) keeps keys within left before and right after a row's diagonal (-1: unbounded); softcap > 0 maps
    each scaled score s to softcap * tanh(s / softcap); alibi_slopes (H,) or (num_seqs, H) float32 add
    -slope * |distance| (slope * key index under causal attention, as FA2's kernels do); dropout_p drops
    probabilities (the torch path); softmax_scale defaults to D ** -0.5; deterministic is accepted (the
    forward is deterministic). s_aux (beyond FA2): (H,) attention-sink logits, each joining its head's softmax
    denominator.
    k_scale, v_scale (beyond FA2, keyword only): a quantised paged cache: k/v of dtype torch.float8_e4m3fn,
    torch.float8_e5m2 or torch.int8 (symmetric), with block_table, and their float32 scales on k's device, one
    element (per tensor) or of shape (num_blocks, page_block_size, Hkv) (per key row and head). Values are
    dequantised on load (x = stored * scale) and computed in float32; q stays float16, bfloat16 or float32 and the
    output is in q's dtype. A quantised cache without scales, scales beside a float cache, or scales of another
    shape, dtype or device: ValueError / TypeError naming k_scale or v_scale; a quantised k/v without block_table:
    ValueError naming k.
    Returns out (total_q, H, Dv) in q's dtype; with return_attn_probs=True, (out, softmax_lse (H, total_q)
    float32 natural-log LSE, S_dmask), S_dmask None unless dropout_p > 0 (then (num_seqs, H, max_seqlen_q,
    max_seqlen_k) probabilities with the dropped ones negated, FA's sign encoding). A row that sees no key
    gives 0 and LSE +inf, as in FA2.
    """
    max_seqlen_q, max_seqlen_k = _length(max_seqlen_q), _length(max_seqlen_k)
    _validate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                     causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs, block_table, s_aux,
                     k_scale, v_scale)
    check_values(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table)
    out, lse, s_dmask = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                   softmax_scale, causal, window_size, softcap, alibi_slopes, block_table, s_aux,
                                   return_attn_probs, "packed", k_scale=k_scale, v_scale=v_scale)
    return (out, lse, s_dmask) if return_attn_probs else out


def _validate_batched(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, s_aux) -> None:
    op = "flash_attn_func"
    check_quantised_paged(op, k, v, False)
    check_qkv(op, q, k, v, 4, 4)
    if k.shape[0] != q.shape[0]:
        raise VarlenAttentionInputError(f"{op}: k must have q's batch size {q.shape[0]}, got shape {tuple(k.shape)}")
    _check_options(op, q, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                   return_attn_probs, s_aux, q.shape[0])


def _as_varlen(q, k, v):
    """flash_attn_func's (B, S, H, D) tensors as the varlen call of B equal-length sequences (no host sync)."""
    batch, seqlen_q = q.shape[:2]
    seqlen_k = k.shape[1]
    steps = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    return (q.reshape(batch * seqlen_q, *q.shape[2:]), k.reshape(batch * seqlen_k, *k.shape[2:]),
            v.reshape(batch * seqlen_k, *v.shape[2:]), steps * seqlen_q, steps * seqlen_k)


def _explain_batched(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None, deterministic=False, return_attn_probs=False, s_aux=None) -> Request:
    _validate_batched(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, s_aux)
    packed_q, packed_k, packed_v, cu_q, _ = _as_varlen(q, k, v)
    return varlen_request(packed_q, packed_k, packed_v, cu_q, q.shape[1], k.shape[1], dropout_p, causal, window_size,
                    softcap, alibi_slopes, None, s_aux, "batched")


# The return type follows return_attn_probs, as flash_attn_varlen_func's does.
@overload
def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = ...,
                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                    window_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                    return_attn_probs: Literal[False] = ..., s_aux: Optional[torch.Tensor] = ...
                    ) -> torch.Tensor: ...


@overload
def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = ...,
                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                    window_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                    *, return_attn_probs: Literal[True], s_aux: Optional[torch.Tensor] = ...
                    ) -> _WithAttnProbs: ...


@overload
def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = ...,
                    softmax_scale: Optional[float] = ..., causal: bool = ...,
                    window_size: Tuple[int, int] = ..., softcap: float = ...,
                    alibi_slopes: Optional[torch.Tensor] = ..., deterministic: bool = ...,
                    return_attn_probs: bool = ..., s_aux: Optional[torch.Tensor] = ...
                    ) -> Union[torch.Tensor, _WithAttnProbs]: ...


@routed_op(_explain_batched)
def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[torch.Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False, s_aux: Optional[torch.Tensor] = None
                    ) -> Union[torch.Tensor, _WithAttnProbs]:
    """FlashAttention 2's flash_attn_func: q (B, Sq, H, D), k/v (B, Sk, Hkv, D/Dv), the options of
    flash_attn_varlen_func (alibi_slopes (H,) or (B, H)). Returns out (B, Sq, H, Dv); with
    return_attn_probs=True, (out, softmax_lse (B, H, Sq) float32, S_dmask), S_dmask None unless dropout_p > 0
    (then (B, H, Sq, Sk))."""
    _validate_batched(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                      return_attn_probs, s_aux)
    batch, seqlen_q, num_heads = q.shape[:3]
    packed_q, packed_k, packed_v, cu_q, cu_k = _as_varlen(q, k, v)
    out, lse, s_dmask = attention(packed_q, packed_k, packed_v, cu_q, cu_k, seqlen_q, k.shape[1], dropout_p,
                                   softmax_scale, causal, window_size, softcap, alibi_slopes, None, s_aux,
                                   return_attn_probs, "batched")
    out = out.reshape(batch, seqlen_q, num_heads, v.shape[-1])
    if not return_attn_probs:
        return out
    return out, lse.reshape(num_heads, batch, seqlen_q).transpose(0, 1), s_dmask
