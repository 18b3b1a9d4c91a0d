"""Split-K flash-decoding attention kernels (Triton) for short query lengths against a long KV range.

Stage 1 (`_sdpa_decode_split_kernel`) gives every (batch, KV head, block of packed query rows) a fixed
number of KV splits (`candidate.split_k`, a grid dimension). The number of *live* splits of a sequence is
computed on the device from its valid length, so the grid never depends on data: empty splits exit at
once, nothing syncs with the host and the launch can be captured in a CUDA graph. Each program runs an
fp32 online softmax (base 2) over its KV range and writes a normalised partial output and its
log-sum-exp. Stage 2 (`_sdpa_decode_merge_kernel`) merges the live splits of each query row. With
`split_k == 1` and `partial_reduce == False` stage 1 writes the final output directly (single pass).

The query heads sharing one KV head (GQA/MQA) and the query tokens are packed into the M rows of
`tl.dot` (packed row r -> head `kv_head * group + r // Lq`, token `r % Lq`), at least 16 rows per tile.
Head dims D and Dv are padded to powers of two with masks. Masks (bool: True keeps; float: added) are
read through strides, stride 0 on broadcast dimensions. Causal masking is top-left (torch SDPA) or
bottom-right within each sequence's valid length (the FlashAttention kv-cache convention). Rows whose
keys are all masked produce 0 and LSE = -inf.

Non-finite values follow torch's math SDPA over the keys a call reads (keys past a sequence's valid
length, and under top-left alignment past the last query token, are never read): masking any other
key adds -inf to its score, so NaN or +inf in a query row, a key or a mask gives a NaN row with a NaN
LSE, and NaN or Inf in a value gives NaN through the P @ V product (0 * NaN), as in torch.

The module also declares the family's routing data (COVERAGE, APPROVALS, RECIPES, AUDIT_KERNELS).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.torch_ref.sdpa_decode import sdpa_through_decode
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeVariant
from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2
_CAUSAL_CODES = {"none": CAUSAL_NONE, "top_left": CAUSAL_TOP_LEFT, "bottom_right": CAUSAL_BOTTOM_RIGHT}

MAX_SEQ_Q = 16
MAX_HEAD_DIM = 256
# the unit that executes the dots with low-precision operands (fp32 operands run on the FMA units)
_DOT_UNITS = {torch.float16: "fp16_mma", torch.bfloat16: "bf16_mma"}


@triton.jit
def _split_bounds(seqlen, split, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr):
    # every split covers a whole number of BLOCK_N tiles; trailing splits of a short sequence are empty
    per_split = tl.cdiv(tl.cdiv(seqlen, SPLIT_K), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seqlen)
    return lo, hi, per_split


@triton.jit
def _sdpa_decode_split_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, seqlens_ptr,
    o_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mh, stride_ml, stride_mn,
    num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, num_m_blocks,
    qk_scale,  # softmax scale * log2(e)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLIT_K: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, SINGLE_PASS: tl.constexpr, DOT_LOWP: tl.constexpr,
):
    pid_bhm = tl.program_id(0)
    split = tl.program_id(1)
    m_block = pid_bhm % num_m_blocks
    bh = pid_bhm // num_m_blocks
    kv_head = bh % num_kv_heads
    batch = bh // num_kv_heads

    if HAS_SEQLENS:
        seqlen = tl.load(seqlens_ptr + batch).to(tl.int32)
    else:
        seqlen = seq_kv
    lo, hi, per_split = _split_bounds(seqlen, split, SPLIT_K, BLOCK_N)
    if lo >= hi:
        return  # an empty split: the merge kernel never reads it

    # packed query rows of this program: (query head within the group, query token)
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < group * seq_q
    g = rows // seq_q
    tok = rows % seq_q
    head = kv_head * group + g
    batch64 = batch.to(tl.int64)
    head64 = head.to(tl.int64)
    tok64 = tok.to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_valid = offs_d < head_dim
    dv_valid = offs_dv < head_dim_v

    q_ptrs = (q_ptr + batch64 * stride_qb + head64[:, None] * stride_qh + tok64[:, None] * stride_ql
              + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if not DOT_LOWP:
        q = q.to(tl.float32)

    k_base = k_ptr + batch64 * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + batch64 * stride_vb + kv_head.to(tl.int64) * stride_vh
    if MASK_KIND != 0:
        mask_rows = mask_ptr + batch64 * stride_mb + head64 * stride_mh + tok64 * stride_ml
    # last key each row may see under bottom-right causal masking
    causal_limit = tok + seqlen - seq_q

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        offs_n64 = offs_n.to(tl.int64)

        k = tl.load(k_base + offs_n64[:, None] * stride_kn + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        if DOT_LOWP:
            scores = tl.dot(q, tl.trans(k))
        else:
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        scores = scores * qk_scale

        # padding rows and keys past the range are never read: their scores are replaced by -inf. Masking
        # inside the range is additive, as torch's math SDPA masks (score - inf): NaN and +inf scores of
        # masked keys stay NaN instead of being dropped
        keep = row_valid[:, None] & n_valid[None, :]
        if CAUSAL == 1:
            scores = tl.where(offs_n[None, :] <= tok[:, None], scores, scores - float("inf"))
        if CAUSAL == 2:
            scores = tl.where(offs_n[None, :] <= causal_limit[:, None], scores, scores - float("inf"))
        if MASK_KIND == 1:
            mask_keep = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=1)
            scores = tl.where(mask_keep != 0, scores, scores - float("inf"))
        if MASK_KIND == 2:
            mask_add = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=0.0)
            scores = scores + mask_add.to(tl.float32) * 1.4426950408889634
        scores = tl.where(keep, scores, float("-inf"))

        # online softmax; a row with no visible key so far keeps m = -inf, l = 0, acc = 0. A NaN score
        # makes l NaN whether or not the max keeps it (tl.max drops NaN): p = exp2(NaN - m) is NaN
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(v_base + offs_n64[:, None] * stride_vn + offs_dv[None, :],
                    mask=n_valid[:, None] & dv_valid[None, :], other=0.0)
        if DOT_LOWP:
            pv = tl.dot(p.to(v.dtype), v)
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # l is exactly 0 only when every score was -inf (the largest score contributes exp2(0) = 1); a NaN l
    # (a NaN or +inf score) must stay NaN in the output and the LSE, so the test is l == 0, not l > 0
    no_keys = l_i == 0.0
    l_safe = tl.where(no_keys, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse2 = tl.where(no_keys, float("-inf"), m_i + tl.log2(l_safe))

    # rows of o / lse / partials are contiguous (batch, head, token)
    out_row = (batch64 * (num_kv_heads * group) + head64) * seq_q + tok64
    if SINGLE_PASS:
        o_ptrs = o_ptr + out_row[:, None] * head_dim_v + offs_dv[None, :]
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & dv_valid[None, :])
        tl.store(lse_ptr + out_row, lse2 * 0.6931471805599453, mask=row_valid)
    else:
        part_row = out_row * SPLIT_K + split
        tl.store(part_o_ptr + part_row[:, None] * head_dim_v + offs_dv[None, :], out,
                 mask=row_valid[:, None] & dv_valid[None, :])
        tl.store(part_lse_ptr + part_row, lse2, mask=row_valid)


@triton.jit
def _sdpa_decode_merge_kernel(
    part_o_ptr, part_lse_ptr, o_ptr, lse_ptr, seqlens_ptr,
    rows_per_batch, seq_kv, head_dim_v,
    SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,
):
    row = tl.program_id(0)
    batch = row // rows_per_batch
    if HAS_SEQLENS:
        seqlen = tl.load(seqlens_ptr + batch).to(tl.int32)
    else:
        seqlen = seq_kv
    per_split = tl.cdiv(tl.cdiv(seqlen, SPLIT_K), BLOCK_N) * BLOCK_N
    num_live = tl.cdiv(seqlen, per_split)

    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    s_live = offs_s < num_live
    dv_valid = offs_dv < head_dim_v
    row64 = row.to(tl.int64)

    lse = tl.load(part_lse_ptr + row64 * SPLIT_K + offs_s, mask=s_live, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    denom = tl.sum(w, 0)
    parts = tl.load(part_o_ptr + (row64 * SPLIT_K + offs_s[:, None]) * head_dim_v + offs_dv[None, :],
                    mask=s_live[:, None] & dv_valid[None, :], other=0.0)
    # as in the split kernel: a NaN partial LSE makes denom NaN, which must not read as "no keys"
    no_keys = denom == 0.0
    denom_safe = tl.where(no_keys, 1.0, denom)
    out = tl.sum(w[:, None] * parts, 0) / denom_safe
    tl.store(o_ptr + row64 * head_dim_v + offs_dv, out.to(o_ptr.dtype.element_ty), mask=dv_valid)
    tl.store(lse_ptr + row64, tl.where(no_keys, float("-inf"),
                                       (m_safe + tl.log2(denom_safe)) * 0.6931471805599453))


def _interpreting() -> bool:
    return triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False


# Bytes of K/V tiles, q, the accumulator and the score tile (scores, probabilities, mask pointers) one
# thread may hold before ptxas spills, measured with the audit (mask + causal + cache lengths, sm_80 and
# sm_90): fp16/bf16 operands spill above ~300 B/thread, fp32 ieee operands above ~250 B/thread.
_THREAD_BYTES_LOWP = 288
_THREAD_BYTES_FP32 = 224


def _meta(candidate, *, rows: int, head_dim: int, head_dim_v: int, dtype: torch.dtype) -> dict:
    """Candidate -> meta-parameters of the split kernel.

    split_k -> SPLIT_K (grid dim 1, the maximum number of KV splits); tg_size // 32 -> num_warps;
    tile_n -> BLOCK_N; tile_m -> the least BLOCK_M (packed query rows: at least 16 for tl.dot, and up to
    64 so a whole GQA group x tokens shares one read of K/V); D and Dv -> next powers of two (>= 16).
    The tiles are upper bounds: while K/V tiles, q, the accumulator and the score tile exceed the
    per-thread register budget, BLOCK_N halves down to 32, then num_warps doubles up to 8, then BLOCK_M
    and BLOCK_N halve down to 16, then num_warps doubles up to 16 (no candidate spills on sm_80/sm_90).
    use_f16_kv -> fp16/bf16 dot operands for 16-bit inputs; fp32 operands with ieee precision otherwise
    (bf16 under the interpreter also takes fp32 operands: the interpreter computes on raw bf16 bits).
    split_k == 1 with partial_reduce False -> single pass (no partials, no merge kernel).
    tile_k, pad_q and pad_kv need no mapping: D is padded to a power of two and every length is masked.
    """
    lowp = bool(candidate.use_f16_kv) and dtype in (torch.float16, torch.bfloat16)
    if dtype == torch.bfloat16 and _interpreting():
        lowp = False
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_dv = max(16, triton.next_power_of_2(head_dim_v))
    block_m = max(16, triton.next_power_of_2(max(1, candidate.tile_m)), min(triton.next_power_of_2(rows), 64))
    block_n = max(16, triton.next_power_of_2(candidate.tile_n))
    num_warps = max(1, candidate.tg_size // 32)
    operand_bytes = 2 if lowp else 4
    budget = _THREAD_BYTES_LOWP if lowp else _THREAD_BYTES_FP32

    def thread_bytes():
        kv = block_n * (block_d + block_dv) * operand_bytes
        q_acc = block_m * (block_d + block_dv) * 4
        scores = block_m * block_n * 16
        return (kv + q_acc + scores) / (32 * num_warps)

    while thread_bytes() > budget:
        if block_n > 32:
            block_n //= 2
        elif num_warps < 8:
            num_warps *= 2
        elif block_m > 16:
            block_m //= 2
        elif block_n > 16:
            block_n //= 2
        elif num_warps < 16:
            num_warps *= 2
        else:
            break
    return dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        SPLIT_K=max(1, int(candidate.split_k)),
        SINGLE_PASS=int(candidate.split_k) <= 1 and not candidate.partial_reduce,
        DOT_LOWP=lowp,
        num_warps=num_warps,
        num_stages=1 if _interpreting() else 2,
    )


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _unique_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a strided view reads (broadcast dimensions have stride 0)."""
    count = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            count *= size
    return count * t.element_size()


def sdpa_decode_plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                     attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                     scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                     candidate) -> Tuple[List[Launch], Tuple[torch.Tensor, torch.Tensor]]:
    """The launches of `sdpa_decode` as records, and the (out, lse) buffers they fill.

    Built from shapes and strides only, so meta tensors give the plan at any shape. Bytes count every
    element a launch may read once (K and V up to the padded length S: with cache_seqlens the keys past
    a sequence's length are skipped, so the real traffic can be less) and every element it writes;
    FLOPs are the two dots as the dot units execute them (query rows padded to BLOCK_M, head dims to
    BLOCK_D / BLOCK_DV).
    """
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    group = num_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))
    if causal == "top_left" and seq_q < seq_kv:
        # token i sees keys 0..i only: the keys past Lq are never read (views, no copy)
        key, value = key[:, :, :seq_q], value[:, :, :seq_q]
        if attn_mask is not None and attn_mask.shape[-1] != 1:
            attn_mask = attn_mask[..., :seq_q]
        if cache_seqlens is not None:
            cache_seqlens = cache_seqlens.clamp(max=seq_q)
        seq_kv = seq_q

    rows = group * seq_q
    meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    split_k = meta["SPLIT_K"]
    num_m_blocks = triton.cdiv(rows, meta["BLOCK_M"])
    device = query.device

    out = torch.empty((batch, num_heads, seq_q, head_dim_v), device=device, dtype=query.dtype)
    lse = torch.empty((batch, num_heads, seq_q), device=device, dtype=torch.float32)

    if attn_mask is None:
        mask_kind, mask, mask_strides = MASK_NONE, query, (0, 0, 0, 0)
    else:
        mask = attn_mask.expand(batch, num_heads, seq_q, seq_kv)  # stride 0 on broadcast dims, no copy
        if mask.dtype == torch.bool:
            mask_kind, mask = MASK_BOOL, mask.view(torch.uint8)
        else:
            mask_kind = MASK_FLOAT
        mask_strides = mask.stride()
    seqlens = cache_seqlens if cache_seqlens is not None else query

    if meta["SINGLE_PASS"]:
        part_o, part_lse = out, lse
    else:
        part_o = torch.empty((batch, num_heads, seq_q, split_k, head_dim_v), device=device, dtype=torch.float32)
        part_lse = torch.empty((batch, num_heads, seq_q, split_k), device=device, dtype=torch.float32)

    size = query.element_size()
    read = (query.numel() + batch * num_kv_heads * seq_kv * (head_dim + head_dim_v)) * size
    if attn_mask is not None:
        read += _unique_bytes(mask)
    if cache_seqlens is not None:
        read += cache_seqlens.numel() * cache_seqlens.element_size()
    written = part_o.numel() * part_o.element_size() + part_lse.numel() * part_lse.element_size()
    padded_rows = batch * num_kv_heads * num_m_blocks * meta["BLOCK_M"]
    flops = 2 * padded_rows * seq_kv * (meta["BLOCK_D"] + meta["BLOCK_DV"])
    unit = _DOT_UNITS.get(query.dtype, "fp32_fma") if meta["DOT_LOWP"] else "fp32_fma"

    plan = [Launch(
        _sdpa_decode_split_kernel, (batch * num_kv_heads * num_m_blocks, split_k),
        (query, key, value, mask, seqlens, out, lse, part_o, part_lse,
         query.stride(0), query.stride(1), query.stride(2),
         key.stride(0), key.stride(1), key.stride(2),
         value.stride(0), value.stride(1), value.stride(2),
         *mask_strides,
         num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, num_m_blocks,
         float(scale) * LOG2E),
        meta=dict(MASK_KIND=mask_kind, CAUSAL=_CAUSAL_CODES[causal], HAS_SEQLENS=cache_seqlens is not None, **meta),
        num_warps=num_warps, num_stages=num_stages, bytes_read=read, bytes_written=written, flops=flops, unit=unit,
    )]
    if not meta["SINGLE_PASS"]:
        out_bytes = out.numel() * out.element_size() + lse.numel() * lse.element_size()
        seqlen_bytes = cache_seqlens.numel() * cache_seqlens.element_size() if cache_seqlens is not None else 0
        plan.append(Launch(
            _sdpa_decode_merge_kernel, (batch * num_heads * seq_q,),
            (part_o, part_lse, out, lse, seqlens, num_heads * seq_q, seq_kv, head_dim_v),
            meta=dict(SPLIT_K=split_k, BLOCK_N=meta["BLOCK_N"], BLOCK_S=triton.next_power_of_2(split_k),
                      BLOCK_DV=meta["BLOCK_DV"], HAS_SEQLENS=cache_seqlens is not None),
            num_warps=4, bytes_read=written + seqlen_bytes, bytes_written=out_bytes,
            flops=3 * part_o.numel(), unit="fp32_fma",
        ))
    return plan, (out, lse)


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                candidate) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a few query tokens against a KV range; returns (out, lse).

    query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) with Hq % Hkv == 0 (strided views are
    read in place when their last dim is contiguous). attn_mask: bool (True keeps) or float (added),
    broadcastable to (B, Hq, Lq, S). causal: "none", "top_left" (torch SDPA) or "bottom_right" (within each
    sequence's valid length). cache_seqlens: (B,) int valid KV lengths in [1, S] or None (= S).
    Returns out (B, Hq, Lq, Dv) in query's dtype and lse (B, Hq, Lq) float32 in natural log (-inf and a
    zero output for rows that see no key). Inputs are assumed validated by the op layer. Runs exactly the
    records of `sdpa_decode_plan`.
    """
    plan, outputs = sdpa_decode_plan(query, key, value, attn_mask=attn_mask, causal=causal, scale=scale,
                                     cache_seqlens=cache_seqlens, candidate=candidate)
    launches.run(plan)
    return outputs


def launch_count(request, candidate) -> int:
    """Launches `sdpa_decode` runs for a routed request: the split kernel, and the merge unless single pass."""
    return 1 if (int(candidate.split_k) <= 1 and not candidate.partial_reduce) else 2


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate) -> torch.Tensor:
    """torch SDPA (dropout 0) through the decode kernels: (N..., Hq, Lq, D) or (N, Lq, D) inputs.

    Leading dims of query, key and value must match (the op routes batch broadcasting to torch); the
    KV heads divide the query heads (enable_gqa, or a single KV head that torch broadcasts).
    """
    return sdpa_through_decode(sdpa_decode, query, key, value, attn_mask, is_causal, scale, candidate)


# ---------------------------------------------------------------------------------------------------
# Routing data (read by rlx_triton.router) and the compile audit's kernel list.
# ---------------------------------------------------------------------------------------------------
COVERAGE = Coverage(
    ops=frozenset({"scaled_dot_product_attention", "sdpa_decode"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"seq_q": (1, MAX_SEQ_Q), "tokens": (1, MAX_SEQ_Q), "head_dim": (1, MAX_HEAD_DIM),
            "head_dim_v": (1, MAX_HEAD_DIM), "seq_kv": (1, 2**31 - 1),
            "batch": (1, 2**31 - 1), "num_heads": (1, 2**31 - 1)},
    features={
        "mask": frozenset({"none", "bool", "float"}),  # float: same dtype as query, added to the scores
        "causal": frozenset({"none", "top_left", "bottom_right"}),
        "dropout": frozenset({False}),
        "requires_grad": frozenset({False}),  # forward-only: autograd calls run torch
        # "batched": query, key and value share their leading dims ((N..., H, L, E) or (N, L, E));
        # "broadcast" (leading dims broadcast against each other) and "unbatched" (fewer than 3 dims) go to torch
        "layout": frozenset({"batched"}),
    },
)

# Largest relative error (max |out - ref| / max |ref|) measured against float64 in the interpreter;
# tests/triton/test_sdpa_decode.py re-measures every entry. The fp32 candidate (fp32 dot operands, ieee)
# is measured on fp32 inputs and approved for every profile; the f16-KV candidates (fp16/bf16 dot
# operands, probabilities rounded to the input dtype before the PV dot) are measured on fp16 inputs and
# not approved for high_fidelity, where the router takes the fp32 candidate instead.
_WHERE = "interpreter, tests/triton/test_sdpa_decode.py::test_approved_candidates_hold_their_error_bound"
_F16_KV_PROFILES = frozenset({"ultra_low_latency", "balanced", "deterministic"})
APPROVALS = {
    variant.candidate().tag(): (
        Approval(max_rel_err=1e-3, reference="float64", where=_WHERE, profiles=_F16_KV_PROFILES)
        if variant.candidate().use_f16_kv else Approval(max_rel_err=1e-5, reference="float64", where=_WHERE))
    for variant in SdpaDecodeVariant
}

# No measured per-device recipe yet (the GPU run is pending): the plan's launch rule picks candidates.
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}

_AUDIT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_SPLIT_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "SPLIT_K", "MASK_KIND", "CAUSAL",
                     "HAS_SEQLENS", "SINGLE_PASS", "DOT_LOWP")
_SPLIT_SIGNATURE = {name: ("constexpr" if name in _SPLIT_CONSTEXPRS else "i32")
                    for name in _sdpa_decode_split_kernel.arg_names}
_SPLIT_SIGNATURE.update({"q_ptr": "*{dt}", "k_ptr": "*{dt}", "v_ptr": "*{dt}", "mask_ptr": "*u8",
                         "seqlens_ptr": "*i32", "o_ptr": "*{dt}", "lse_ptr": "*fp32", "part_o_ptr": "*fp32",
                         "part_lse_ptr": "*fp32", "qk_scale": "fp32"})


def _audit_split_meta(rows: int, head_dim: int):
    def meta(candidate, dt: str) -> dict:
        m = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim, dtype=_AUDIT_DTYPES[dt])
        m.update(MASK_KIND=MASK_BOOL, CAUSAL=CAUSAL_BOTTOM_RIGHT, HAS_SEQLENS=True)
        return m
    return meta


def _audit_merge_meta(candidate, dt: str) -> dict:
    m = _meta(candidate, rows=4, head_dim=128, head_dim_v=128, dtype=_AUDIT_DTYPES[dt])
    return dict(SPLIT_K=m["SPLIT_K"], BLOCK_N=m["BLOCK_N"], BLOCK_S=triton.next_power_of_2(m["SPLIT_K"]),
                BLOCK_DV=m["BLOCK_DV"], HAS_SEQLENS=True, num_warps=4, num_stages=1)


_CANDIDATES = tuple(variant.candidate() for variant in SdpaDecodeVariant)
_DEFAULT = SdpaDecodeVariant.DEFAULT.candidate()
AUDIT_KERNELS = [
    # Llama-3-8B decode: 4 query heads per KV head, one token, head dim 128, mask + bottom-right causal
    AuditSpec(name="sdpa_decode_split_d128", family="sdpa_decode", kernel=_sdpa_decode_split_kernel,
              signature=_SPLIT_SIGNATURE, meta=_audit_split_meta(rows=4, head_dim=128),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp32", "fp16", "bf16"),
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv) and dt != "fp32"),
    # head dim 256 with 16 packed rows (e.g. 8 heads per KV head x 2 tokens)
    AuditSpec(name="sdpa_decode_split_d256", family="sdpa_decode", kernel=_sdpa_decode_split_kernel,
              signature=_SPLIT_SIGNATURE, meta=_audit_split_meta(rows=16, head_dim=256),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp16", "bf16"),
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv)),
    AuditSpec(name="sdpa_decode_merge", family="sdpa_decode", kernel=_sdpa_decode_merge_kernel,
              signature={"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "o_ptr": "*{dt}", "lse_ptr": "*fp32",
                         "seqlens_ptr": "*i32", "rows_per_batch": "i32", "seq_kv": "i32", "head_dim_v": "i32",
                         "SPLIT_K": "constexpr", "BLOCK_N": "constexpr", "BLOCK_S": "constexpr",
                         "BLOCK_DV": "constexpr", "HAS_SEQLENS": "constexpr"},
              meta=_audit_merge_meta, candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp32", "fp16", "bf16"),
              expects_mma=False),
]
