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

The module also declares the family's routing data (COVERAGE, APPROVALS, RECIPES, AUDIT_KERNELS).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2
_CAUSAL_CODES = {"none": CAUSAL_NONE, "top_left": CAUSAL_TOP_LEFT, "bottom_right": CAUSAL_BOTTOM_RIGHT}

MAX_SEQ_Q = 16
MAX_HEAD_DIM = 256


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

        keep = row_valid[:, None] & n_valid[None, :]
        if CAUSAL == 1:
            keep = keep & (offs_n[None, :] <= tok[:, None])
        if CAUSAL == 2:
            keep = keep & (offs_n[None, :] <= causal_limit[:, None])
        if MASK_KIND == 1:
            mask_keep = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=0)
            keep = keep & (mask_keep != 0)
        if MASK_KIND == 2:
            mask_add = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=0.0)
            scores = scores + mask_add.to(tl.float32) * 1.4426950408889634
        scores = tl.where(keep, scores, float("-inf"))

        # online softmax; a row with no visible key so far keeps m = -inf, l = 0, acc = 0
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

    has_keys = l_i > 0.0
    l_safe = tl.where(has_keys, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse2 = tl.where(has_keys, m_i + tl.log2(l_safe), float("-inf"))

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
    has_keys = denom > 0.0
    denom_safe = tl.where(has_keys, denom, 1.0)
    out = tl.sum(w[:, None] * parts, 0) / denom_safe
    tl.store(o_ptr + row64 * head_dim_v + offs_dv, out.to(o_ptr.dtype.element_ty), mask=dv_valid)
    tl.store(lse_ptr + row64, tl.where(has_keys, (m_safe + tl.log2(denom_safe)) * 0.6931471805599453,
                                       float("-inf")))


def _interpreting() -> bool:
    return triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False


def _meta(candidate, *, rows: int, head_dim: int, head_dim_v: int, dtype: torch.dtype) -> dict:
    """Candidate -> meta-parameters.

    split_k -> SPLIT_K (grid dim 1, the maximum number of KV splits), tg_size // 32 -> num_warps,
    tile_n -> BLOCK_N, tile_m -> the least BLOCK_M (packed query rows; at least 16 for tl.dot and up to
    64 so a whole GQA group x tokens shares one K/V read), D/Dv -> next powers of two (>= 16),
    use_f16_kv -> fp16/bf16 dot operands for 16-bit inputs (fp32 operands with ieee precision otherwise;
    bf16 under the interpreter also takes fp32 operands, since the interpreter computes on bf16 bits),
    partial_reduce False with split_k 1 -> single pass.
    """
    block_m = max(16, triton.next_power_of_2(max(1, candidate.tile_m)), min(triton.next_power_of_2(rows), 64))
    lowp = bool(candidate.use_f16_kv) and dtype in (torch.float16, torch.bfloat16)
    if dtype == torch.bfloat16 and _interpreting():
        lowp = False
    return dict(
        BLOCK_M=block_m,
        BLOCK_N=max(16, triton.next_power_of_2(candidate.tile_n)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_DV=max(16, triton.next_power_of_2(head_dim_v)),
        SPLIT_K=max(1, int(candidate.split_k)),
        SINGLE_PASS=int(candidate.split_k) <= 1 and not candidate.partial_reduce,
        DOT_LOWP=lowp,
        num_warps=max(1, candidate.tg_size // 32),
        num_stages=2,
    )


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


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
    zero output for rows that see no key). Inputs are assumed validated by the op layer.
    """
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    group = num_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))

    rows = group * seq_q
    meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype)
    split_k = meta["SPLIT_K"]
    num_m_blocks = triton.cdiv(rows, meta["BLOCK_M"])

    out = torch.empty((batch, num_heads, seq_q, head_dim_v), device=query.device, dtype=query.dtype)
    lse = torch.empty((batch, num_heads, seq_q), device=query.device, dtype=torch.float32)

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
        part_o = torch.empty((batch, num_heads, seq_q, split_k, head_dim_v), device=query.device,
                             dtype=torch.float32)
        part_lse = torch.empty((batch, num_heads, seq_q, split_k), device=query.device, dtype=torch.float32)

    grid = (batch * num_kv_heads * num_m_blocks, split_k)
    _sdpa_decode_split_kernel[grid](
        query, key, value, mask, seqlens, out, lse, part_o, part_lse,
        query.stride(0), query.stride(1), query.stride(2),
        key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        *mask_strides,
        num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, num_m_blocks,
        float(scale) * LOG2E,
        MASK_KIND=mask_kind, CAUSAL=_CAUSAL_CODES[causal], HAS_SEQLENS=cache_seqlens is not None, **meta,
    )
    if not meta["SINGLE_PASS"]:
        _sdpa_decode_merge_kernel[(batch * num_heads * seq_q,)](
            part_o, part_lse, out, lse, seqlens,
            num_heads * seq_q, seq_kv, head_dim_v,
            SPLIT_K=split_k, BLOCK_N=meta["BLOCK_N"], BLOCK_S=triton.next_power_of_2(split_k),
            BLOCK_DV=meta["BLOCK_DV"], HAS_SEQLENS=cache_seqlens is not None,
            num_warps=4,
        )
    return out, lse
