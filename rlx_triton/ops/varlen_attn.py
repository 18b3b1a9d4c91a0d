"""rt.varlen_attn: torch.nn.attention.varlen.varlen_attn's signature and semantics, on rt's ragged kernel.

query (T_q, H_q, D) packed by cu_seq_q (N + 1,); key/value (T_k, H_kv, D/Dv) packed by cu_seq_k, or with
block_table (N, pages) pages (total_pages, page_size, H_kv, D/Dv) of any size >= 1. Where torch's docstring and
code differ, the code decides (it is what a call gives):
- window_size (left, right) is FlashAttention's, aligned bottom-right within each sequence: (-1, 0) is causal,
  (W, 0) a causal sliding window, the default (-1, -1) attends to every key of the sequence;
- seqused_k (N,): sequence b uses only the first seqused_k[b] keys, from cu_seq_k[b] (contiguous) or from its
  first page (paged; cu_seq_k may then be None); without it sequence b has cu_seq_k[b + 1] - cu_seq_k[b] keys;
- H_q != H_kv needs enable_gqa (ValueError otherwise, worded as torch's), H_kv dividing H_q;
- return_aux=AuxRequest(lse=True) returns (out, lse), lse (H_q, T_q) float32 in natural log (what the op and its
  fake return; the docstring says (T_q, H_q)); AuxRequest() or None returns out alone;
- num_splits is FlashAttention's split hint: the kernel never splits a sequence's keys, so a sequence's result
  never depends on the rest of the batch (num_splits=1's promise, kept for every value).

Routing: the varlen family's request (op "varlen_attn", seqused_k as the feature "seqused"): the Triton kernel
where its coverage and approvals take it, else the library route: torch's own op (FlashAttention 2) where it
takes the call on CUDA, else the float64-checked torch path of backends/torch_ref/varlen_attention.py (torch's
op has no CPU kernel). This module is written without postponed annotations: its signature is torch's, object
for object (inspect.signature compares equal).
"""
from typing import NamedTuple

import torch

from rlx_triton.ops._attention_options import check_attention_options
from rlx_triton.ops._checks import check_is_tensor
from rlx_triton.ops.varlen_attention import (INDEX_DTYPES, VarlenAttentionInputError, attention, check_block_table,
                                             check_length, check_offsets, check_qkv, check_values, varlen_request)
from rlx_triton.router import Request, routed_op

try:
    from torch.nn.attention.varlen import AuxRequest
except ImportError:  # torch < 2.9 has no varlen_attn: the same request, declared here
    class AuxRequest(NamedTuple):  # type: ignore[no-redef]
        """Which auxiliary outputs varlen_attn returns (torch.nn.attention.varlen.AuxRequest's fields)."""

        lse: bool = False

OP = "varlen_attn"
NAMES = {"op": OP, "q": "query", "k": "key", "cu_q": "cu_seq_q", "cu_k": "cu_seq_k", "max_q": "max_q",
         "max_k": "max_k"}


def _check_heads(query, key, enable_gqa, paged: bool) -> None:
    """torch's own head check (ValueError, its words), on the dims it reads."""
    num_heads_q = query.shape[1]
    num_heads_k = key.shape[2] if paged else key.shape[1]
    if not enable_gqa and num_heads_q != num_heads_k:
        raise VarlenAttentionInputError(
            f"{OP}: Expect query and key/value to have the same number of heads but got Hq={num_heads_q} and "
            f"Hkv={num_heads_k}. Try setting enable_gqa=True for GQA.")
    if enable_gqa and (num_heads_k == 0 or num_heads_q % num_heads_k != 0):
        raise VarlenAttentionInputError(
            f"{OP}: Expect number of query heads to be a multiple of kv heads for GQA but got Hq={num_heads_q} and "
            f"Hkv={num_heads_k}.")


def _validate(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, enable_gqa,
              seqused_k, block_table, num_splits) -> None:
    """Every argument, without reading tensor data: TypeError or ValueError naming it, before any launch."""
    paged = block_table is not None
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"{OP}: enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    check_qkv(OP, query, key, value, 3, 4 if paged else 3, names=("query", "key", "value"))
    _check_heads(query, key, enable_gqa, paged)
    check_offsets("cu_seq_q", cu_seq_q, None, query.device, op=OP)
    batch = cu_seq_q.shape[0] - 1
    if cu_seq_k is not None:
        check_offsets("cu_seq_k", cu_seq_k, batch + 1, query.device, op=OP)
    elif not (paged and seqused_k is not None):
        raise VarlenAttentionInputError(f"{OP}: cu_seq_k may be None only for a paged call (block_table) with "
                                        f"seqused_k, which then gives every sequence's key count")
    check_length(OP, "max_q", max_q)
    check_length(OP, "max_k", max_k)
    if return_aux is not None and not isinstance(getattr(return_aux, "lse", None), bool):
        raise TypeError(f"{OP}: return_aux must be an AuxRequest (torch.nn.attention.varlen) or None, got "
                        f"{type(return_aux).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{OP}: scale must be a float or None, got {type(scale).__name__}")
    check_attention_options(OP, VarlenAttentionInputError, window_size=window_size, softcap=0.0, alibi_slopes=None,
                            batch=batch, num_heads=query.shape[1], device=query.device)
    if seqused_k is not None:
        check_is_tensor("seqused_k", seqused_k, op=OP)
        if seqused_k.dtype not in INDEX_DTYPES:
            raise TypeError(f"{OP}: seqused_k must have dtype torch.int32, got {seqused_k.dtype}")
        if tuple(seqused_k.shape) != (batch,) or seqused_k.device != query.device:
            raise VarlenAttentionInputError(f"{OP}: seqused_k must have shape (N,) = ({batch},) on {query.device}, "
                                            f"got {tuple(seqused_k.shape)} on {seqused_k.device}")
    if paged:
        check_block_table(block_table, batch, key, query, op=OP, k_name="key")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"{OP}: num_splits must be an int or None, got {type(num_splits).__name__}")
        if num_splits < 0:
            raise VarlenAttentionInputError(f"{OP}: num_splits must be >= 0 (0: FlashAttention chooses), got "
                                            f"{num_splits}")


def _is_causal(window_size) -> bool:
    """torch's test: the window (-1, 0) written as a tuple (FlashAttention treats every (-1, 0) as causal)."""
    return window_size == (-1, 0)


def _explain_request(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None,
                     num_splits=None) -> Request:
    _validate(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, enable_gqa,
              seqused_k, block_table, num_splits)
    return varlen_request(query, key, value, cu_seq_q, max_q, max_k, 0.0, _is_causal(window_size), window_size, 0.0,
                    None, block_table, None, "packed", op=OP, seqused=seqused_k is not None)


@routed_op(_explain_request)
def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    *,
    return_aux: AuxRequest | None = None,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.attention.varlen.varlen_attn, on rt's ragged attention kernel (the module docstring gives the
    semantics where torch's docstring and code differ).

    Args:
        query: (T_q, H_q, D), float32, float16 or bfloat16 (float64 on the torch path).
        key, value: (T_k, H_kv, D) and (T_k, H_kv, Dv), or with block_table pages (total_pages, page_size, H_kv,
            D/Dv).
        cu_seq_q, cu_seq_k: (N + 1,) int32 (or int64) offsets from 0; cu_seq_k may be None for a paged call with
            seqused_k.
        max_q, max_k: ints at least every sequence's query and key count (FlashAttention normalizes the window
            against them).
        return_aux: AuxRequest(lse=True) also returns the LSE.
        scale: the score scale (default D ** -0.5).
        window_size: (left, right), bottom-right aligned per sequence; (-1, 0) causal, (-1, -1) no mask.
        enable_gqa: lets H_kv divide H_q (query head h reads KV head h // (H_q / H_kv)).
        seqused_k: optional (N,) int32: the keys each sequence uses.
        block_table: optional (N, pages) int32 page indices.
        num_splits: FlashAttention's split hint (None or an int >= 0); results never depend on it.

    Returns:
        out (T_q, H_q, Dv) in query's dtype; with return_aux.lse, (out, lse (H_q, T_q) float32). A row that sees
        no key gives 0 and LSE +inf.

    Raises:
        ValueError / TypeError naming the argument, before any launch; index values outside the tensors where
        they can be read without a host sync (RLX_TRITON_CHECK_VALUES).

    Example:
        >>> import torch, rlx_triton as rt
        >>> q, kv = torch.randn(5, 4, 16), torch.randn(9, 2, 16)
        >>> cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
        >>> rt.varlen_attn(q, kv, kv, cu_q, cu_k, 3, 5, window_size=(-1, 0), enable_gqa=True).shape
        torch.Size([5, 4, 16])
    """
    _validate(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, return_aux, scale, window_size, enable_gqa,
              seqused_k, block_table, num_splits)
    check_values(query, key, cu_seq_q, cu_seq_k, max_q, max_k, block_table, seqused_k, names=NAMES)
    out, lse, _ = attention(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, 0.0,
                            None if scale is None else float(scale), _is_causal(window_size), tuple(window_size), 0.0,
                            None, block_table, None, False, "packed", op=OP, seqused_k=seqused_k,
                            num_splits=num_splits)
    if return_aux is not None and return_aux.lse:
        return out, lse
    return out

