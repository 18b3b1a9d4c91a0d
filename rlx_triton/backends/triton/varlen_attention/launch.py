"""Ragged attention launches: candidate -> meta-parameters, the launch record with its byte and FLOP model,
and the autotune bridge for routed calls.

`varlen_attention_plan` builds the one launch of a call from shapes and strides only (meta tensors give
the plan at any shape): the grid is (total_q // BLOCK_Q + num_seqs, num_kv_heads) whatever the lengths
are, so nothing is read on the host, the same shapes launch the same binary every step, and the launch
can be captured in a CUDA graph. The counts model the kernel's loop: per query block, the key tiles its
rows' windows reach; the sequences' lengths are data on the device, so the counts take the lengths the
caller states on the host (`lengths`, the perf cases do), else every sequence at max_seqlen_q x
max_seqlen_k (an upper bound).

A quantised cache (fp8 e4m3 / e5m2 or int8 k/v with float32 k_scale / v_scale) is read as stored, one byte a
value (its scales counted too where they are per key row and head); an e4m3 cache on CUDA before sm_89 is handed
over as its bytes (a uint8 view of the same memory) and decoded in the kernel, as the decode launcher does.
"""
from __future__ import annotations

import math
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import triton

from rlx_triton.backends.triton.launches import Launch
from rlx_triton.backends.triton.sdpa_decode.launch import (KV_QUANT_NONE, KV_QUANT_PER_TENSOR,
                                                           KV_QUANT_PER_TOKEN_HEAD, _converts_e4m3)
from rlx_triton.backends.triton.varlen_attention.kernels import (ALIBI_DISTANCE, ALIBI_KEY_INDEX, ALIBI_NONE,
                                                                 _varlen_attention_kernel)
from rlx_triton.backends.triton.varlen_attention.routing import APPROVALS

MIN_DOT = 16            # tl.dot's smallest tile side
LOG2E = 1.4426950408889634
# the unit that executes the dots with 16-bit operands (fp32 operands run on the FMA units)
_DOT_UNITS = {torch.float16: "fp16_mma", torch.bfloat16: "bf16_mma"}
_CONFIG_KEYS = ("BLOCK_M", "BLOCK_Q", "BLOCK_N", "DOT_LOWP")
# Autotune key: the token bucket and the head shape (never raw lengths or tensors)
_TUNE_KEY = ["token_bucket", "group", "head_dim", "head_dim_v"]


def _interpreting() -> bool:
    return triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False


def kernel_meta(candidate, *, group: int, head_dim: int, head_dim_v: int, dtype: torch.dtype) -> dict:
    """Candidate -> meta-parameters. block_m -> BLOCK_M (at least 16 and the group's next power of two),
    BLOCK_Q = BLOCK_M // group query tokens; block_n -> BLOCK_N, halved for head dims past 128 so a K/V
    tile pair stays within the registers (fp32 operands: one group's rows, 32 keys, 8 warps); BLOCK_D / BLOCK_DV the head dims' next powers of two (masked). use_f16_dot -> 16-bit dot
    operands for fp16/bf16 inputs (tensor cores; bf16 under the interpreter takes fp32 operands: it
    computes on raw bf16 bits); fp32 operands use input_precision "ieee"."""
    lowp = bool(candidate.use_f16_dot) and dtype in (torch.float16, torch.bfloat16)
    if dtype == torch.bfloat16 and _interpreting():
        lowp = False
    block_d = max(MIN_DOT, triton.next_power_of_2(head_dim))
    block_dv = max(MIN_DOT, triton.next_power_of_2(head_dim_v))
    block_m = max(MIN_DOT, triton.next_power_of_2(max(1, candidate.block_m)), triton.next_power_of_2(group))
    block_n = max(MIN_DOT, triton.next_power_of_2(candidate.block_n))
    if max(block_d, block_dv) > 128:
        block_n = max(MIN_DOT, block_n // 2)
    num_warps = max(1, candidate.tg_size // 32)
    if not lowp:
        # fp32 operands multiply on the FMA units from registers: one GQA group's rows (at least 16), 32 keys
        # a tile and 8 warps keep q, the accumulator and a K/V tile pair unspilled at D 128 (audit, sm_80/sm_90)
        block_m = max(MIN_DOT, triton.next_power_of_2(group))
        block_n = min(block_n, 32)
        num_warps = max(num_warps, 8)
    return dict(BLOCK_M=block_m, BLOCK_Q=max(1, block_m // group), BLOCK_N=block_n, BLOCK_D=block_d,
                BLOCK_DV=block_dv, DOT_LOWP=lowp, num_warps=num_warps,
                num_stages=1 if _interpreting() else max(1, candidate.stages))


_tuned: Dict[tuple, object] = {}
_tuned_lock = threading.Lock()


def tuned_kernel(*, group: int, head_dim: int, head_dim_v: int, dtype: torch.dtype):
    """`_varlen_attention_kernel` under the autotune bridge, one config per candidate approved for the current
    precision profile, for one head shape (group, D, Dv, dtype)."""
    from rlx_triton.backends.triton.autotune import TunedKernel
    from rlx_triton.router import plans
    from rlx_triton.backends.candidates import approved_candidates

    profile = plans.profile_name(plans.current_profile())
    key = (profile, group, triton.next_power_of_2(head_dim), triton.next_power_of_2(head_dim_v), dtype)
    tuned = _tuned.get(key)
    if tuned is None:
        with _tuned_lock:
            tuned = _tuned.get(key)
            if tuned is None:
                candidates = approved_candidates(plans.plan_for("varlen_attention").candidates, APPROVALS, profile)

                def to_config(candidate):
                    meta = kernel_meta(candidate, group=group, head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype)
                    return triton.Config({name: meta[name] for name in _CONFIG_KEYS}, num_warps=meta["num_warps"],
                                         num_stages=meta["num_stages"])

                tuned = TunedKernel(_varlen_attention_kernel, candidates, to_config, key=_TUNE_KEY)
                _tuned[key] = tuned
    return tuned


def kv_quant_args(paged: bool, k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
                  placeholder: torch.Tensor) -> Tuple[int, torch.Tensor, torch.Tensor, Tuple[int, ...]]:
    """(KV_QUANT code, k scale tensor, v scale tensor, their 6 strides (page, slot, head of each)) of a call: a
    quantised cache's scales, per tensor (one element) or per key row and head, laid out as the cache's rows
    ((num_pages, page_size, Hkv) paged, (total_k, Hkv) contiguous: no page stride), or a placeholder never read."""
    if k_scale is None or v_scale is None:
        return KV_QUANT_NONE, placeholder, placeholder, (0,) * 6
    if k_scale.numel() == 1:
        return KV_QUANT_PER_TENSOR, k_scale.reshape(1), v_scale.reshape(1), (0,) * 6
    if paged:
        return KV_QUANT_PER_TOKEN_HEAD, k_scale, v_scale, (*k_scale.stride(), *v_scale.stride())
    return KV_QUANT_PER_TOKEN_HEAD, k_scale, v_scale, (0, *k_scale.stride(), 0, *v_scale.stride())


def visited_keys(seqlen_q: int, seqlen_k: int, block_q: int, left: int, right: int) -> int:
    """Keys the kernel's loop visits for one sequence, summed over its query blocks (the loop's bounds:
    the window of the block's first and last rows, clipped to the sequence)."""
    total = 0
    for start in range(0, seqlen_q, block_q):
        first = start + seqlen_k - seqlen_q
        last = min(start + block_q, seqlen_q) - 1 + seqlen_k - seqlen_q
        lo = max(first - left, 0) if left >= 0 else 0
        hi = min(last + right + 1, seqlen_k) if right >= 0 else seqlen_k
        total += max(hi - lo, 0)
    return total


def varlen_attention_plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                          cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, scale: float,
                          window: Tuple[int, int] = (-1, -1), alibi: str = "none",
                          alibi_slopes: Optional[torch.Tensor] = None, softcap: float = 0.0,
                          block_table: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                          seqused_k: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                          v_scale: Optional[torch.Tensor] = None, candidate, route=None,
                          lengths: Optional[Sequence[Tuple[int, int]]] = None
                          ) -> Tuple[List[Launch], Tuple[torch.Tensor, torch.Tensor]]:
    """The launch of one ragged attention call as a record, and the (out, lse) buffers it fills.

    q (total_q, H, D); k/v (total_k, Hkv, D/Dv), or with block_table (num_seqs, pages) paged caches
    (num_pages, page_size, Hkv, D/Dv); cu_seqlens_q/_k (num_seqs + 1,) int32 offsets (the key lengths of a
    paged call too); seqused_k (num_seqs,): the keys each sequence uses instead (then a paged call needs no
    cu_seqlens_k: None). window: FlashAttention's normalized (left, right) (causal is (-1, 0)); alibi: "none",
    "key_index" (the causal form) or "distance"; alibi_slopes (H,) or (num_seqs, H) float32; sinks (H,)
    float32 logits; k_scale / v_scale: a quantised k/v's (float8_e4m3fn, float8_e5m2 or int8) float32 scales,
    one element or the cache's shape without its head dim. Returns out (total_q, H, Dv) in q's dtype and lse (H, total_q) float32."""
    total_q, num_heads, head_dim = q.shape
    paged = block_table is not None
    num_kv_heads, head_dim_v = k.shape[-2], v.shape[-1]
    group = num_heads // num_kv_heads
    num_seqs = cu_seqlens_q.shape[0] - 1
    meta = kernel_meta(candidate, group=group, head_dim=head_dim, head_dim_v=head_dim_v, dtype=q.dtype)
    device = q.device
    out = torch.empty((total_q, num_heads, head_dim_v), device=device, dtype=q.dtype)
    lse = torch.empty((num_heads, total_q), device=device, dtype=torch.float32)

    def grid_for(config) -> Tuple[int, int]:
        return total_q // config["BLOCK_Q"] + num_seqs, num_kv_heads

    if paged:
        k_strides, v_strides = k.stride()[:3], v.stride()[:3]
        page_size = k.shape[1]
    else:
        k_strides, v_strides = (0,) + k.stride()[:2], (0,) + v.stride()[:2]
        page_size = 1
    slopes = alibi_slopes.contiguous() if alibi_slopes is not None else lse
    if cu_seqlens_k is None:   # a paged call with seqused_k reads no key offset: any int tensor stands in
        cu_seqlens_k = cu_seqlens_q
    table = block_table if block_table is not None else cu_seqlens_k
    sink_logits = sinks if sinks is not None else lse
    used = seqused_k if seqused_k is not None else cu_seqlens_k
    kv_quant, k_scales, v_scales, scale_strides = kv_quant_args(paged, k_scale, v_scale, lse)
    e4m3_bits = k.dtype == torch.float8_e4m3fn and not _converts_e4m3(device)
    if e4m3_bits:   # read as bytes and decoded in the kernel (the views share the cache's memory)
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    left, right = window
    args = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, table, slopes, sink_logits, used, k_scales, v_scales,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), *k_strides, *v_strides,
            table.stride(0) if paged else 0,
            slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
            lse.stride(0), *scale_strides, num_seqs, group, head_dim, head_dim_v, page_size,
            float(scale) * LOG2E, float(softcap) if softcap > 0 else 1.0, int(left), int(right),
            triton.next_power_of_2(max(1, max_seqlen_q)))
    alibi_mode = {"none": ALIBI_NONE, "key_index": ALIBI_KEY_INDEX, "distance": ALIBI_DISTANCE}[alibi]
    flags = dict(BLOCK_D=meta["BLOCK_D"], BLOCK_DV=meta["BLOCK_DV"], PAGED=paged, WINDOW=tuple(window) != (-1, -1),
                 SOFTCAP=softcap > 0, ALIBI=alibi_mode, SINKS=sinks is not None, SEQUSED=seqused_k is not None,
                 KV_QUANT=kv_quant, KV_E4M3_BITS=e4m3_bits)

    # counts: each element read once (q, the keys and values of the sequences, the tables), out and lse
    # written once; FLOPs are the two dots as the units execute them (rows padded to BLOCK_M, D to BLOCK_D); a
    # quantised cache's values are one byte each, with a float32 scale per key row and head where it has them
    size = q.element_size()
    pairs = list(lengths) if lengths is not None else [(max_seqlen_q, max_seqlen_k)] * num_seqs
    keys_read = sum(seqlen_k for _, seqlen_k in pairs)
    read = q.numel() * size + keys_read * num_kv_heads * (head_dim + head_dim_v) * k.element_size()
    if kv_quant == KV_QUANT_PER_TOKEN_HEAD:
        read += keys_read * num_kv_heads * 2 * 4
    elif kv_quant == KV_QUANT_PER_TENSOR:
        read += 2 * 4
    read += sum(t.numel() * t.element_size() for t in (cu_seqlens_q, cu_seqlens_k, block_table, alibi_slopes, sinks,
                                                       seqused_k) if t is not None)
    written = out.numel() * size + lse.numel() * 4
    visited = sum(visited_keys(sq, sk, meta["BLOCK_Q"], left, right) for sq, sk in pairs)
    flops = 2 * meta["BLOCK_M"] * num_kv_heads * visited * (meta["BLOCK_D"] + meta["BLOCK_DV"])
    unit = _DOT_UNITS.get(q.dtype, "fp32_fma") if meta["DOT_LOWP"] else "fp32_fma"
    counts = dict(bytes_read=read, bytes_written=written, flops=flops, unit=unit)

    tuned = None
    if route is not None and route.candidate is not None:
        tuned = tuned_kernel(group=group, head_dim=head_dim, head_dim_v=head_dim_v, dtype=q.dtype)
        if candidate.tag() not in tuned.tags:
            tuned = None
    if tuned is not None:
        record = Launch.tuned(tuned, candidate, grid_for, args, flags, route=route, **counts)
    else:
        record = Launch(_varlen_attention_kernel, grid_for(meta), args,
                        meta=dict(flags, **{name: meta[name] for name in _CONFIG_KEYS}),
                        num_warps=meta["num_warps"], num_stages=meta["num_stages"], **counts)
    return [record], (out, lse)


def launch_count(request, candidate) -> int:
    """Launches of one routed call: one, whatever the mix of prefill chunks and decodes."""
    return 1


def softmax_scale(scale: Optional[float], head_dim: int) -> float:
    return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)
