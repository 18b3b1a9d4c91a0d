"""The ragged attention kernel (@triton.jit code only): one launch over packed prefill chunks and decodes.

`_varlen_attention_kernel` runs on a grid of (total_q // BLOCK_Q + num_seqs, num_kv_heads): a bound on
the query blocks of the batch that needs no length read on the host (sequence s owns the block indices
[cu_seqlens_q[s] // BLOCK_Q + s, cu_seqlens_q[s + 1] // BLOCK_Q + s + 1), at least its blocks), so the
launch is the same for every step of a serving loop with the same shapes and can be captured in a CUDA
graph. A program finds its sequence by binary search over those block starts (`_find_sequence`), then
reads BLOCK_Q query tokens of it times the `group` query heads of its KV head, packed into the BLOCK_M
rows of tl.dot (row r -> token r // group, head kv_head * group + r % group); programs past their
sequence's tokens exit at once.

Keys come from a contiguous (total_k, Hkv, D) buffer at rows cu_seqlens_k[s] + n, or from a paged cache
(num_pages, page_size, Hkv, D), key n of sequence s at slot n % page_size of page block_table[s, n //
page_size], any page size >= 1. Sequence s has cu_seqlens_k[s + 1] - cu_seqlens_k[s] keys, or with SEQUSED
seqused_k[s] (FlashAttention's seqused_k: the used part of a larger slot; a paged call then reads no key
offset). Masking is FlashAttention 2's, aligned bottom-right within each sequence: key n is in query row
i's window when diagonal - left <= n <= diagonal + right, diagonal = i + seqlen_k - seqlen_q (-1: that side
unbounded; causal is the window (-1, 0)), and the loop visits only the key tiles some row of the block can
see: first the tiles every row of the block sees whole, with no mask (on a causal prefill all but the
diagonal's), then the tiles at the window's edges and the last partial tile, masked. Scores: scale, then softcap * tanh(s / softcap), then ALiBi (slope x key index under the causal window,
-slope x |distance to the diagonal| otherwise), in base 2.
Attention sinks (per-head logits, transformers' s_aux) start each row's running max at the sink and its
sum at 1, so they join the softmax's denominator and no value.

The softmax is online in fp32; a key outside a row's window gets -inf, the only masked score. A NaN
score (a NaN in the query, a visible key, or +inf - inf) is not masked: it makes the row's sum NaN, and
a NaN or Inf in a visible value reaches the output through P @ V, as in torch's math SDPA. A row whose
keys are all masked writes 0 and LSE +inf (FlashAttention's convention); with sinks its LSE is the sink.
Offsets are int64; head dims are padded to powers of two with masks.

A quantised cache (KV_QUANT 1: one scale per tensor; 2: one per key row and head; k/v of dtype float8_e4m3fn,
float8_e5m2 or int8, symmetric; KV_E4M3_BITS: an e4m3 cache as bytes) becomes dot operands as
backends/triton/_kv_dequant.py describes, except V's per-row scales: they multiply the probabilities before
the PV dot (the running sum l stays unscaled), since dequantising V's rows in float32 spills the paged default
candidate on sm_80's e4m3 byte path. The scales are read with their own strides ((num_pages, page_size, Hkv)
paged: page, slot, head).
"""
from __future__ import annotations

import triton
import triton.language as tl

from rlx_triton.backends.triton import _online_softmax as online_softmax
from rlx_triton.backends.triton._kv_dequant import stored_as_operand

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
# ALiBi's two forms in FlashAttention 2 (the ALIBI constexpr)
ALIBI_NONE, ALIBI_KEY_INDEX, ALIBI_DISTANCE = 0, 1, 2


@triton.jit
def _find_sequence(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence owning global query block `q_block`: the last s with cu_seqlens_q[s] // BLOCK_Q + s <= q_block."""
    low = 0
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        start = tl.load(cu_seqlens_q_ptr + mid) // BLOCK_Q + mid
        if start <= q_block:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit(do_not_specialize=["num_seqs", "token_bucket"])
def _varlen_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    cu_seqlens_q_ptr, cu_seqlens_k_ptr, block_table_ptr, alibi_ptr, sinks_ptr,  # tables read under PAGED / ALIBI / SINKS only
    seqused_k_ptr,  # keys each sequence uses, read under SEQUSED only
    k_scale_ptr, v_scale_ptr,  # a quantised cache's float32 scales, read under KV_QUANT only
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kp, stride_kt, stride_kh,  # paged: pages, slots within a page, heads; contiguous: stride_kp unused
    stride_vp, stride_vt, stride_vh,
    stride_btb, stride_alibi_b,  # block table rows; ALiBi slopes per (sequence, head): 0 for slopes per head
    stride_lse_h,  # lse is (H, total_q)
    stride_ksp, stride_kst, stride_ksh,  # per-token-head scales (KV_QUANT 2), laid out as the caches' rows
    stride_vsp, stride_vst, stride_vsh,
    num_seqs, group, head_dim, head_dim_v, page_size,
    qk_scale,  # softmax scale * log2(e)
    softcap, window_left, window_right,
    token_bucket,  # read by the autotuner's key only
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, DOT_LOWP: tl.constexpr, PAGED: tl.constexpr, WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS: tl.constexpr, SEQUSED: tl.constexpr,
    KV_QUANT: tl.constexpr = 0, KV_E4M3_BITS: tl.constexpr = False,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(cu_seqlens_q_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    seqlen_q = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= seqlen_q:
        return  # a spare block of the grid's bound
    k_start = tl.load(cu_seqlens_k_ptr + seq)
    if SEQUSED:  # the first seqused_k[s] keys from k_start (FlashAttention's seqused_k)
        seqlen_k = tl.load(seqused_k_ptr + seq)
    else:
        seqlen_k = tl.load(cu_seqlens_k_ptr + seq + 1) - k_start

    # packed rows: (query token of the block, query head of the group)
    rows = tl.arange(0, BLOCK_M)
    tok = local_block * BLOCK_Q + rows // group
    row_valid = (rows // group < BLOCK_Q) & (tok < seqlen_q)
    head = kv_head * group + rows % group
    token64 = (q_start + tok).to(tl.int64)
    head64 = head.to(tl.int64)
    seq64 = seq.to(tl.int64)

    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_valid = offs_d < head_dim
    dv_valid = offs_dv < head_dim_v
    q = tl.load(q_ptr + token64[:, None] * stride_qt + head64[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if not DOT_LOWP:
        q = q.to(tl.float32)

    # each row's bottom-right diagonal, and the key range any row of the block may see
    diagonal = tok + seqlen_k - seqlen_q
    lo = seqlen_k * 0
    hi = seqlen_k
    # the tiles of [full_lo, full_hi) hold only keys every row of the block sees: they skip the mask (on causal
    # prefill every tile but the diagonal's); a tile is full when it ends by hi and by the first row's right
    # window edge and starts at or past the last row's left edge. Tiles start at lo + i * BLOCK_N.
    full_lo = lo
    full_end = hi
    if WINDOW:
        first_diagonal = local_block * BLOCK_Q + seqlen_k - seqlen_q
        last_diagonal = tl.minimum(local_block * BLOCK_Q + BLOCK_Q, seqlen_q) - 1 + seqlen_k - seqlen_q
        lo = tl.where(window_left >= 0, tl.maximum(first_diagonal - window_left, 0), 0)
        hi = tl.where(window_right >= 0, tl.minimum(last_diagonal + window_right + 1, seqlen_k), seqlen_k)
        full_lo = tl.where(window_left >= 0, tl.maximum(last_diagonal - window_left, lo), lo)
        full_end = tl.where(window_right >= 0, tl.minimum(first_diagonal + window_right + 1, hi), hi)
    full_lo = tl.maximum(tl.minimum(lo + tl.cdiv(full_lo - lo, BLOCK_N) * BLOCK_N, hi), lo)   # hi < lo: none
    full_hi = tl.maximum(lo + (tl.maximum(full_end - lo, 0) // BLOCK_N) * BLOCK_N, full_lo)
    if ALIBI != 0:  # slopes in base-2 units, as the scores are
        slopes = tl.load(alibi_ptr + seq64 * stride_alibi_b + head64, mask=row_valid, other=0.0) * LOG2E

    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    if KV_QUANT == 2:
        ks_base = k_scale_ptr + kv_head.to(tl.int64) * stride_ksh
        vs_base = v_scale_ptr + kv_head.to(tl.int64) * stride_vsh
    # a quantised cache's per-tensor scales: K's joins the score scale, V's scales the output at the end
    if KV_QUANT == 1:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    if SINKS:  # the sink joins the denominator: running max starts at it, the running sum at exp(0) = 1
        m_i = tl.load(sinks_ptr + head64, mask=row_valid, other=float("-inf")).to(tl.float32) * LOG2E
        l_i = tl.where(row_valid, 1.0, 0.0)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # two passes over the key tiles: the unmasked ones, [full_lo, full_hi), then the masked ones at the window's
    # edges, [lo, full_lo) and [full_hi, hi), as one loop (a third copy of the body costs registers)
    left_tiles = tl.cdiv(full_lo - lo, BLOCK_N)   # full_lo is hi where no tile is full: a partial last tile
    edge_tiles = left_tiles + tl.cdiv(hi - full_hi, BLOCK_N)
    for masked in tl.static_range(2):
        if masked:
            tile_count = edge_tiles
        else:
            tile_count = (full_hi - full_lo) // BLOCK_N
        for tile in range(0, tile_count):
            if masked:
                start_n = tl.where(tile < left_tiles, lo + tile * BLOCK_N, full_hi + (tile - left_tiles) * BLOCK_N)
            else:
                start_n = full_lo + tile * BLOCK_N
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_valid = offs_n < hi
            if PAGED:
                pages = tl.load(block_table_ptr + seq64 * stride_btb + offs_n // page_size, mask=n_valid,
                                other=0).to(tl.int64)
                slots = (offs_n % page_size).to(tl.int64)
                k_rows = pages * stride_kp + slots * stride_kt
                v_rows = pages * stride_vp + slots * stride_vt
                if KV_QUANT == 2:
                    ks_rows = pages * stride_ksp + slots * stride_kst
                    vs_rows = pages * stride_vsp + slots * stride_vst
            else:
                key_rows = (k_start + offs_n).to(tl.int64)
                k_rows = key_rows * stride_kt
                v_rows = key_rows * stride_vt
                if KV_QUANT == 2:
                    ks_rows = key_rows * stride_kst
                    vs_rows = key_rows * stride_vst
            k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=n_valid[:, None] & d_valid[None, :], other=0.0)
            k = stored_as_operand(k, q, KV_QUANT, KV_E4M3_BITS)
            scores = online_softmax.scores(q, k, DOT_LOWP)
            if KV_QUANT == 2:
                scores = scores * tl.load(ks_base + ks_rows, mask=n_valid, other=0.0)[None, :]
            scores = scores * qk_scale
            if SOFTCAP:
                # softcap * tanh(s / softcap) of the natural-log score s, with tanh(x) = 2 * sigmoid(2x) - 1
                capped = 2.0 * tl.sigmoid(scores * (2.0 * LN2 / softcap)) - 1.0
                scores = capped * (softcap * LOG2E)
            if ALIBI == 1:
                scores += slopes[:, None] * offs_n.to(tl.float32)[None, :]
            if ALIBI == 2:
                scores -= slopes[:, None] * tl.abs((diagonal[:, None] - offs_n[None, :]).to(tl.float32))

            if masked:
                keep = row_valid[:, None] & n_valid[None, :]
                if WINDOW:
                    keep = keep & ((window_left < 0) | (offs_n[None, :] >= diagonal[:, None] - window_left)) \
                        & ((window_right < 0) | (offs_n[None, :] <= diagonal[:, None] + window_right))
                scores = tl.where(keep, scores, float("-inf"))

            m_new, p, alpha, l_i = online_softmax.rescale(m_i, l_i, scores)
            v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :], mask=n_valid[:, None] & dv_valid[None, :],
                        other=0.0)
            v = stored_as_operand(v, q, KV_QUANT, KV_E4M3_BITS)
            if KV_QUANT == 2:   # the sum of the weights (l) stays unscaled: only the rows of V are
                p = p * tl.load(vs_base + vs_rows, mask=n_valid, other=0.0)[None, :]
            acc = online_softmax.accumulate(acc, alpha, p, v, DOT_LOWP)
            m_i = m_new

    out, no_keys, l_safe = online_softmax.normalise(acc, l_i)
    if KV_QUANT == 1:
        out = out * v_scale
    lse = tl.where(no_keys, float("inf"), (m_i + tl.log2(l_safe)) * LN2)   # FlashAttention's +inf for no key
    tl.store(o_ptr + token64[:, None] * stride_ot + head64[:, None] * stride_oh + offs_dv[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & dv_valid[None, :])
    tl.store(lse_ptr + head64 * stride_lse_h + token64, lse, mask=row_valid)
