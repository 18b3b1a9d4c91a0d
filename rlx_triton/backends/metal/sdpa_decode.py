"""Metal launcher of the sdpa_decode family (metal/sdpa_decode.metal): decode attention of a few
query tokens against a KV cache, one pass or split-KV (partial pass + combine pass).

Same functions and signatures as backends/torch_ref/sdpa_decode.py and the Triton launcher
(`sdpa_decode`, and `scaled_dot_product_attention` for torch's SDPA entry point).
Candidate -> launch: tg_size -> threadgroup size (multiple of 32, at most 256 = 8 simdgroups);
split_k <= 1 with partial_reduce False -> the one-pass kernel; otherwise the split-KV pass with
RLX's partition rule (`split_kv_partitions`, capped by split_k) and the combine pass.
use_f16_kv, tile_m and pad_q do not change the Metal kernels: they read K/V in the input dtype
and always compute in fp32.

The shaders implement neither FlashAttention's options (local window, logits softcap, ALiBi, cache rows
by cache_batch_idx, left padding) nor paged caches: COVERAGE names none of these request features, so the
router refuses them by name (shape-unimplemented) and sends such calls to another backend, and the
launcher itself raises `UnsupportedFeature` if handed one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from rlx_triton.backends.metal import candidates as _candidates
from rlx_triton.backends.metal import library
from rlx_triton.backends.torch_ref.sdpa_decode import gathered_pages, sdpa_through_decode
from rlx_triton.router.coverage import SHAPE_UNIMPLEMENTED, Coverage

FAMILY = "sdpa_decode"
CAUSAL_MODES = {"none": 0, "top_left": 1, "bottom_right": 2}
MAX_HEAD_DIM = 256  # 32 lanes x 8 registers per lane
MAX_SEQ_Q = 16
MAX_GROUP_SIZE = 256  # 8 simdgroups: the shader's threadgroup arrays are sized for this
MAX_PARTITIONS = 64

_ROW_ARGUMENTS = ("num_heads:long", "num_kv_heads:long", "query_len:long", "seq_kv:long", "head_dim:long",
                  "head_dim_v:long", "scale:float", "causal_mode:long", "has_mask:long")
KERNEL_ARGUMENTS = {
    "sdpa_decode_one_pass": ("query:T", "key:T", "value:T", "mask:float32", "seqlens:int64", "out:T",
                             "lse:float32") + _ROW_ARGUMENTS,
    "sdpa_decode_split": ("query:T", "key:T", "value:T", "mask:float32", "seqlens:int64",
                          "partial_out:float32", "partial_max_sum:float32") + _ROW_ARGUMENTS
                         + ("partitions:long", "keys_per_partition:long"),
    "sdpa_decode_combine": ("partial_out:float32", "partial_max_sum:float32", "out:T", "lse:float32",
                            "head_dim_v:long", "partitions:long"),
}

COVERAGE = Coverage(
    ops=frozenset({"scaled_dot_product_attention", "sdpa_decode"}),
    devices=frozenset({"mps"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"seq_q": (1, MAX_SEQ_Q), "tokens": (1, MAX_SEQ_Q), "head_dim": (1, MAX_HEAD_DIM),
            "head_dim_v": (1, MAX_HEAD_DIM), "seq_kv": (1, 2**31 - 1), "batch": (1, 2**31 - 1),
            "num_heads": (1, 2**31 - 1)},
    features={
        "mask": frozenset({"none", "bool", "float"}),  # expanded to an additive float32 (B, Hq, Lq, S) mask
        "causal": frozenset(CAUSAL_MODES),
        "dropout": frozenset({False}),
        "requires_grad": frozenset({False}),  # forward-only: autograd calls run torch
        "layout": frozenset({"batched"}),  # query, key and value share their leading dims
    },
)
APPROVALS = _candidates.approvals(FAMILY)
# request features of the decode ops that the shaders do not implement (COVERAGE leaves them unnamed)
UNSUPPORTED_FEATURES = ("paged", "window", "softcap", "alibi", "cache_batch_idx", "cache_leftpad")


class UnsupportedFeature(ValueError):
    """A launch with an option the Metal shaders do not implement; `kind` is the router's refusal kind."""

    kind = SHAPE_UNIMPLEMENTED
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def split_kv_partitions(batch: int, num_heads: int, seq_kv: int, *, tile_n: int, tile_k: int, pad_kv: int,
                        split_k: int) -> int:
    """RLX's flash-decode partition chooser (sdpa_flash_partitions_tuned), capped by split_k.

    ~128 threadgroups fill an M-series GPU (by occupancy), and a partition should hold at least
    64 keys (by keys).
    """
    target_groups = max(128, min(max(tile_n, 32), 1024))
    by_occupancy = -(-target_groups // max(1, batch * num_heads))
    keys_per_part = min(max(tile_k, 64), 1024)
    pad = max(1, pad_kv)
    padded_seq = -(-seq_kv // pad) * pad
    by_keys = max(1, padded_seq // keys_per_part)
    partitions = min(max(min(by_occupancy, by_keys), 1), MAX_PARTITIONS)
    return max(1, min(partitions, max(1, split_k)))


@dataclass(frozen=True)
class SdpaLaunch:
    """How one call runs: one pass, or `partitions` partitions of `keys_per_partition` keys + combine."""

    two_pass: bool
    partitions: int
    keys_per_partition: int
    group_size: int


def launch_shape(candidate, *, batch: int, num_heads: int, seq_kv: int) -> SdpaLaunch:
    split_k = int(_candidates.field(candidate, "split_k", 1))
    partial_reduce = bool(_candidates.field(candidate, "partial_reduce", False))
    group_size = library.group_size_for(int(_candidates.field(candidate, "tg_size", 128)), largest=MAX_GROUP_SIZE)
    if split_k <= 1 and not partial_reduce:
        return SdpaLaunch(False, 1, seq_kv, group_size)
    partitions = split_kv_partitions(batch, num_heads, seq_kv, tile_n=int(_candidates.field(candidate, "tile_n", 128)),
                                     tile_k=int(_candidates.field(candidate, "tile_k", 64)),
                                     pad_kv=int(_candidates.field(candidate, "pad_kv", 1)), split_k=split_k)
    return SdpaLaunch(True, partitions, -(-seq_kv // partitions), group_size)


def _float_mask(attn_mask: Optional[torch.Tensor], shape, device) -> torch.Tensor:
    """The additive float32 mask expanded to (B, Hq, Lq, S) (bool: True keeps -> 0, False -> -inf)."""
    if attn_mask is None:
        return torch.zeros(1, dtype=torch.float32, device=device)
    if attn_mask.dtype == torch.bool:
        additive = torch.zeros(attn_mask.shape, dtype=torch.float32, device=device)
        additive = additive.masked_fill(~attn_mask.to(device), float("-inf"))
    else:
        additive = attn_mask.to(device=device, dtype=torch.float32)
    return additive.expand(*shape).contiguous()


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                window: tuple = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                v_scale: Optional[torch.Tensor] = None, candidate=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Hq, Lq, Dv) in query's dtype, lse (B, Hq, Lq) float32); see the torch_ref module.
    The shader reads contiguous (B, Hkv, S, D) caches: a paged cache is gathered into one first, which is why
    COVERAGE does not name the paged feature (the router sends paged requests elsewhere). softcap, window,
    alibi_slopes, tree_mask and a quantised cache's k_scale / v_scale are the family's keywords; the shaders
    implement none of them (UnsupportedFeature; COVERAGE's mask values leave out "tree", and it names no
    kv_dtype)."""
    for name, used in (("softcap", softcap > 0), ("window", tuple(window) != (-1, -1)),
                       ("alibi", alibi_slopes is not None), ("tree_mask", tree_mask is not None),
                       ("k_scale", k_scale is not None)):
        if used:
            raise UnsupportedFeature(f"sdpa_decode on Metal: {name} is not implemented by the shaders "
                                     f"({SHAPE_UNIMPLEMENTED}; the router sends such calls to another backend)")
    if block_table is not None:
        key, value = gathered_pages(key, block_table), gathered_pages(value, block_table)
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    dtype, device = query.dtype, query.device
    query, key, value = query.contiguous(), key.to(dtype).contiguous(), value.to(dtype).contiguous()
    mask = _float_mask(attn_mask, (batch, num_heads, seq_q, seq_kv), device)
    seqlens = (torch.full((batch,), seq_kv, dtype=torch.int64, device=device) if cache_seqlens is None
               else cache_seqlens.to(device=device, dtype=torch.int64).contiguous())
    out = torch.empty((batch, num_heads, seq_q, head_dim_v), dtype=dtype, device=device)
    lse = torch.empty((batch, num_heads, seq_q), dtype=torch.float32, device=device)
    rows = batch * num_heads * seq_q
    shape = launch_shape(candidate, batch=batch, num_heads=num_heads, seq_kv=seq_kv)
    row_values = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, query_len=seq_q, seq_kv=seq_kv,
                      head_dim=head_dim, head_dim_v=head_dim_v, scale=scale, causal_mode=CAUSAL_MODES[causal],
                      has_mask=int(attn_mask is not None))
    inputs = dict(query=query, key=key, value=value, mask=mask, seqlens=seqlens)
    if not shape.two_pass:
        library.dispatch(FAMILY, "sdpa_decode_one_pass", dtype, KERNEL_ARGUMENTS["sdpa_decode_one_pass"],
                         groups=rows, group_size=shape.group_size, out=out, lse=lse, **inputs, **row_values)
        return out, lse
    partial_out = torch.empty((rows, shape.partitions, head_dim_v), dtype=torch.float32, device=device)
    partial_max_sum = torch.empty((rows, shape.partitions, 2), dtype=torch.float32, device=device)
    library.dispatch(FAMILY, "sdpa_decode_split", dtype, KERNEL_ARGUMENTS["sdpa_decode_split"],
                     groups=rows * shape.partitions, group_size=shape.group_size, partial_out=partial_out,
                     partial_max_sum=partial_max_sum, partitions=shape.partitions,
                     keys_per_partition=shape.keys_per_partition, **inputs, **row_values)
    library.dispatch(FAMILY, "sdpa_decode_combine", dtype, KERNEL_ARGUMENTS["sdpa_decode_combine"],
                     groups=rows, group_size=min(shape.group_size, 128), partial_out=partial_out,
                     partial_max_sum=partial_max_sum, out=out, lse=lse, head_dim_v=head_dim_v,
                     partitions=shape.partitions)
    return out, lse


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate=None, lower_right: bool = False, route=None) -> torch.Tensor:
    """torch SDPA (dropout 0) through the decode kernels: (N..., Hq, Lq, D) or (N, Lq, D) inputs with the
    same leading dims; the KV heads divide the query heads (enable_gqa, or one KV head). lower_right: causal
    masking aligned to the last key (a lower-right CausalBias); route: unused (the shaders have no tuner)."""
    return sdpa_through_decode(sdpa_decode, query, key, value, attn_mask, is_causal, scale, candidate,
                               lower_right=lower_right)
