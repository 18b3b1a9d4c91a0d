"""The split-K flash-decoding kernel (@triton.jit code only): a few query tokens against a long KV range in
one launch.

`_sdpa_decode_kernel` runs on a grid of (batch x KV heads x blocks of packed query rows, splits). The
split count comes from the device (launch.py `kv_splits`, the split rule: SM count, row blocks, the KV
length's bucket; the candidate's `split_k` bounds it wherever that bound can fill the GPU), so the grid is
fixed per (bucket, device). How many splits of a sequence are *live* is decided on the device from its
valid length (`_live_splits`: every live split gets a balanced share of at least one BLOCK_N tile), so
nothing syncs with the host, empty splits exit at once and the launch can be captured in a CUDA graph.

Each program runs an fp32 online softmax (base 2) over its KV tiles, K and V double-buffered by the
software pipeline (num_stages 3), in two loops (`_attend_tile`): first the whole tiles no mask reaches, with
no masking at all, then the edge tiles, which apply every mask. Where masking reaches only the newest keys
(bottom-right causal, a tree mask; or none at all) the edge tiles are those from the first tile holding one
of the newest keys (or the range's last partial tile) on; a bool or float mask, top-left causal and a
window make every tile an edge tile. With one split it writes the output and LSE directly. Otherwise it
writes a normalised partial output and its log-sum-exp, takes a ticket from its row block's counter,
and the program that takes the last ticket merges the live splits of its rows (in split order, so the
result does not depend on which program finishes last) and resets the counter for the next launch.
More than MERGE_GROUP live splits merge in two levels, so no program reads more than MERGE_GROUP partials
per row: the last of each group of MERGE_GROUP splits merges its group into the group's first slot, and
the last group to finish merges the groups. The counters and partials are allocated with each launch
(zeroed counters, from torch's caching allocator), so a captured CUDA graph owns its own and launches on
several streams or graphs never share one; the launch leaves its counters at zero.

The query heads sharing one KV head (GQA/MQA) and the query tokens are packed into the M rows of
`tl.dot` (packed row r -> head `kv_head * group + r // Lq`, token `r % Lq`), 16 to 64 rows per tile, so
one read of a KV tile serves every token of the group's heads. Head dims D and Dv are padded to powers of
two with masks. Masks (bool: True keeps; float: added) are read through strides, stride 0 on broadcast
dimensions. A tree mask (MASK_TREE, speculative decoding's draft trees: (B, Lq, Lq) bool, Lq <= 64) decides
the Lq newest keys of each sequence, L_b - Lq + t visible to token i iff mask[b, i, t], the keys before them
visible to all: each program reads its rows of it once, as bits (two int32 words a row), and tests them in
the edge tiles only. A paged cache (PAGED) is read through a block table: logical key n of sequence b is
slot n % page_size of page block_table[b, n // page_size], any page size >= 1, each key row still one
contiguous read of D (Dv) elements. Causal masking is top-left (torch SDPA) or bottom-right within each
sequence's valid length (the FlashAttention kv-cache convention). Rows whose
keys are all masked produce 0 and LSE = -inf, as do sequences of length 0. Index values are clamped and
masked, never trusted: lengths to [0, S], left paddings to [0, length], a cache row or page outside the
cache reads nothing (its keys are dropped), so no value makes a launch read or write out of bounds.

Non-finite values follow torch's math SDPA over the keys a call reads (keys past a sequence's valid
length, and under top-left alignment past the last query token, are never read): masking any other
key adds -inf to its score, so NaN or +inf in a query row, a key or a mask gives a NaN row with a NaN
LSE, and NaN or Inf in a value gives NaN through the P @ V product (0 * NaN), as in torch. Calls with
FlashAttention's options (softcap, local window, ALiBi, cache rows, left padding) mask as FlashAttention
does: keys outside a row's window, the causal diagonal included, are dropped, so a NaN there stays out;
so are the keys a tree mask hides in such a call.
"""
from __future__ import annotations

import triton
import triton.language as tl

from rlx_triton.backends.triton import _online_softmax as online_softmax
from rlx_triton.backends.triton._kv_dequant import dequantized_rows, stored_as_operand

# the codes of the CAUSAL, MASK_KIND and ALIBI constexprs
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
MASK_NONE, MASK_BOOL, MASK_FLOAT, MASK_TREE = 0, 1, 2, 3
# ALiBi's two forms in FlashAttention 2: slope x key position (the causal window), -slope x |distance| otherwise
ALIBI_NONE, ALIBI_KEY_INDEX, ALIBI_DISTANCE = 0, 1, 2
# the columns of a tree mask a program holds as bits: two int32 words a row
MAX_TREE_TOKENS = 64

# the split count where the candidate's split_k cannot fill one wave (FlashAttention's bound on splits); the
# merge's group counters are laid out for that many
MAX_LIFTED_SPLITS = 128
# partials one program merges per row: more live splits merge in two levels of at most this many
MERGE_GROUP = 16
MAX_MERGE_GROUPS = MAX_LIFTED_SPLITS // MERGE_GROUP
_MERGE_GROUP, _MAX_MERGE_GROUPS = tl.constexpr(MERGE_GROUP), tl.constexpr(MAX_MERGE_GROUPS)  # the kernel's copies


@triton.jit
def _live_splits(seqlen, num_splits, split, split_tiles, BLOCK_N: tl.constexpr, FIXED_SPLITS: tl.constexpr):
    """(live splits, first key, end key) of `split` for a sequence of `seqlen` valid keys: the sequence's
    tiles are shared as evenly as whole tiles allow by at most `num_splits` programs of at least one tile
    (one program, with an empty range, for a sequence of none). FIXED_SPLITS: every split takes `split_tiles`
    tiles (the last what is left), so where a sequence's splits start depends on its own length alone, not on
    the grid (the batch, the SM count): the deterministic profile's batch invariance."""
    tiles = tl.cdiv(seqlen, BLOCK_N)
    # a sequence without keys still has split 0 run an empty range: it writes its rows as seeing no key
    if FIXED_SPLITS:
        live = tl.maximum(tl.cdiv(tiles, split_tiles), 1)
        first_tile = split.to(tl.int64) * split_tiles
        end_tile = tl.minimum(first_tile + split_tiles, tiles)
    else:
        live = tl.maximum(tl.minimum(tiles, num_splits), 1)
        # int64: split x tiles passes 2^31 for the longest sequences
        first_tile = (split.to(tl.int64) * tiles) // live
        end_tile = ((split + 1).to(tl.int64) * tiles) // live
    lo = (first_tile * BLOCK_N).to(tl.int32)
    hi = tl.minimum(end_tile * BLOCK_N, seqlen).to(tl.int32)
    return live, lo, hi


# ---------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["seq_kv", "token_bucket", "batch_bucket", "kv_len_bucket", "split_tiles"])
def _sdpa_decode_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, seqlens_ptr,
    o_ptr, lse_ptr, part_o_ptr, part_lse_ptr, tickets_ptr, block_table_ptr,
    alibi_ptr, batch_idx_ptr, leftpad_ptr,  # read under ALIBI / BATCH_IDX / LEFTPAD only
    k_scale_ptr, v_scale_ptr,  # a quantised cache's scales, read under KV_QUANT only
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kn,  # paged: stride_kb steps pages, stride_kn slots within a page
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mh, stride_ml, stride_mn,
    stride_btb,  # block table rows (one per sequence)
    stride_alibi_b,  # ALiBi slopes per (batch, head): 0 for slopes per head
    stride_ksb, stride_ksh, stride_ksn,  # per-token-head scales (KV_QUANT 2), laid out as the caches' rows
    stride_vsb, stride_vsh, stride_vsn,
    num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, page_size,
    cache_rows,  # k/v's dim 0: cache rows (BATCH_IDX) or pages (PAGED); an index outside it reads nothing
    qk_scale,  # softmax scale * log2(e)
    softcap, window_left, window_right,  # read under SOFTCAP / WINDOW only
    token_bucket, batch_bucket, kv_len_bucket,  # read by the autotuner's key only
    split_tiles,  # KV tiles per split under FIXED_SPLITS
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MAX_SPLITS: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, DOT_LOWP: tl.constexpr, PAGED: tl.constexpr,
    SOFTCAP: tl.constexpr = False, WINDOW: tl.constexpr = False, ALIBI: tl.constexpr = 0,
    BATCH_IDX: tl.constexpr = False, LEFTPAD: tl.constexpr = False, MERGE_CHUNK: tl.constexpr = 4,
    FIXED_SPLITS: tl.constexpr = False, KV_QUANT: tl.constexpr = 0, KV_E4M3_BITS: tl.constexpr = False,
):
    pid_bhm = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    num_m_blocks = tl.cdiv(group * seq_q, BLOCK_M)
    m_block = pid_bhm % num_m_blocks
    bh = pid_bhm // num_m_blocks
    kv_head = bh % num_kv_heads
    batch = bh // num_kv_heads

    # index values are clamped, never trusted: a length outside [0, S], a left padding outside [0, length]
    # or a cache row outside the cache reads and writes nothing out of bounds (the op layer checks the
    # values only where it may read them without a host sync)
    if HAS_SEQLENS:
        seqlen = tl.minimum(tl.maximum(tl.load(seqlens_ptr + batch).to(tl.int32), 0), seq_kv)
    else:
        seqlen = seq_kv
    if BATCH_IDX and not PAGED:  # the cache row of this sequence; outside the cache, the sequence has no key
        cache_row = tl.load(batch_idx_ptr + batch).to(tl.int64)
        seqlen = tl.where((cache_row >= 0) & (cache_row < cache_rows), seqlen, 0)
        cache_row = tl.minimum(tl.maximum(cache_row, 0), cache_rows - 1)
    else:
        cache_row = batch.to(tl.int64)
    if LEFTPAD:
        # keys [first_key, seqlen) of the sequence are its valid ones: the splits share those
        first_key = tl.minimum(tl.maximum(tl.load(leftpad_ptr + batch).to(tl.int32), 0), seqlen)
    else:
        first_key = 0
    live, lo, hi = _live_splits(seqlen - first_key, num_splits, split, split_tiles, BLOCK_N, FIXED_SPLITS)
    lo += first_key
    hi += first_key
    if split >= live:
        return  # an empty split: it takes no ticket and the merge never reads it

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

    if PAGED:  # the page of each key is looked up per tile
        k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
        v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
        ks_base = k_scale_ptr + kv_head.to(tl.int64) * stride_ksh
        vs_base = v_scale_ptr + kv_head.to(tl.int64) * stride_vsh
        table_row = block_table_ptr + batch64 * stride_btb
    else:
        k_base = k_ptr + cache_row * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_base = v_ptr + cache_row * stride_vb + kv_head.to(tl.int64) * stride_vh
        ks_base = k_scale_ptr + cache_row * stride_ksb + kv_head.to(tl.int64) * stride_ksh
        vs_base = v_scale_ptr + cache_row * stride_vsb + kv_head.to(tl.int64) * stride_vsh
        table_row = block_table_ptr  # not read
    # a quantised cache's per-tensor scales: K's joins the score scale, V's scales the output at the end
    if KV_QUANT == 1:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    else:
        v_scale = 1.0
    if MASK_KIND != 0:
        mask_rows = mask_ptr + batch64 * stride_mb + head64 * stride_mh + tok64 * stride_ml
    else:
        mask_rows = mask_ptr + tok64 * 0  # not read
    # last key each row may see under bottom-right causal masking: its diagonal. Positions count from the
    # first valid key, so a left padding shifts keys and diagonal alike and the difference is kept
    causal_limit = tok + seqlen - seq_q
    # a tree mask decides the Q newest keys of the sequence (column t: key tree_start + t); keys before them
    # are the prefix every row sees. Each row's tree row is read once, as bits: columns 0-31 in one int32 and
    # 32-63 in another (the edge tiles test bits instead of loading a tile of the mask through per-key pointers)
    tree_start = seqlen - seq_q
    if MASK_KIND == 3:
        tree_low = _tree_bits(mask_rows, tl.arange(0, 32), seq_q, stride_mn, row_valid)
        tree_high = _tree_bits(mask_rows, tl.arange(0, 32) + 32, seq_q, stride_mn, row_valid)
    else:
        tree_low = tl.zeros([BLOCK_M], dtype=tl.int32)  # not read
        tree_high = tree_low
    if ALIBI != 0:  # slopes in base-2 units, as the scores are
        slopes = tl.load(alibi_ptr + batch64 * stride_alibi_b + head64, mask=row_valid, other=0.0) * 1.4426950408889634
    else:
        slopes = tl.zeros([BLOCK_M], dtype=tl.float32)  # not read
    # a key a tree mask hides is dropped where the call comes with FlashAttention's options (as its masks are)
    FA_MASKING: tl.constexpr = SOFTCAP or WINDOW or ALIBI != 0

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Masking that reaches only the newest keys (bottom-right causal, a tree mask) leaves the tiles before
    # them alone: those whole tiles run without any mask (`EDGE` False), and only the tiles from the first one
    # holding a newest key (or the range's last partial tile) on apply the masks. Masks that reach every key
    # (a bool or float mask, top-left causal, a window) run every tile as an edge tile.
    if (MASK_KIND == 0 or MASK_KIND == 3) and CAUSAL != 1 and not WINDOW:
        if MASK_KIND == 3 or CAUSAL == 2:
            masked_from = tl.maximum(tl.minimum(hi, tree_start), lo)
        else:
            masked_from = hi
        edge_start = lo + ((masked_from - lo) // BLOCK_N) * BLOCK_N
    else:
        edge_start = lo
    for part in tl.static_range(2):   # part 0: the whole tiles before edge_start; part 1: the edge tiles
        for start_n in range(lo if part == 0 else edge_start, edge_start if part == 0 else hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, start_n, hi, k_base, v_base, ks_base, vs_base, table_row, offs_d, offs_dv,
                d_valid, dv_valid, row_valid, tok, causal_limit, tree_start, tree_low, tree_high, first_key,
                mask_rows, slopes, page_size, cache_rows, stride_kb, stride_kn, stride_vb, stride_vn, stride_ksb,
                stride_ksn, stride_vsb, stride_vsn, stride_mn, qk_scale, softcap, window_left, window_right,
                BLOCK_N, MASK_KIND, CAUSAL, DOT_LOWP, PAGED, SOFTCAP, WINDOW, ALIBI, FA_MASKING, KV_QUANT,
                KV_E4M3_BITS, part == 1)

    out, no_keys, l_safe = online_softmax.normalise(acc, l_i)
    if KV_QUANT == 1:
        out = out * v_scale
    lse2 = tl.where(no_keys, float("-inf"), m_i + tl.log2(l_safe))   # a split that saw no key: -inf, merged as 0

    # rows of o / lse / partials are contiguous (batch, head, token)
    out_row = (batch64 * (num_kv_heads * group) + head64) * seq_q + tok64
    out_mask = row_valid[:, None] & dv_valid[None, :]
    if MAX_SPLITS == 1:  # a candidate that never splits: no partials, no merge compiled in
        _store_rows(o_ptr, lse_ptr, out_row, offs_dv, head_dim_v, out, lse2, out_mask, row_valid)
    elif live == 1:  # one split (or one live split of a short sequence): no partials, no ticket
        _store_rows(o_ptr, lse_ptr, out_row, offs_dv, head_dim_v, out, lse2, out_mask, row_valid)
    else:
        part_rows = out_row * num_splits  # partials of a row: (split, Dv), split-major
        tl.store(part_o_ptr + (part_rows + split)[:, None] * head_dim_v + offs_dv[None, :], out, mask=out_mask)
        tl.store(part_lse_ptr + part_rows + split, lse2, mask=row_valid)
        # every thread's partial stores come before the ticket, which releases them to the merging program
        tl.debug_barrier()
        if live <= _MERGE_GROUP:
            ticket = tl.atomic_add(tickets_ptr + pid_bhm, 1, sem="acq_rel", scope="gpu")
            if ticket == live - 1:  # the last live split merges all of them
                merged, merged_lse2 = _merge_partials(part_o_ptr, part_lse_ptr, part_rows, offs_dv, head_dim_v,
                                                      0, 1, live, out_mask, row_valid, BLOCK_M, BLOCK_DV,
                                                      MERGE_CHUNK)
                _store_rows(o_ptr, lse_ptr, out_row, offs_dv, head_dim_v, merged, merged_lse2, out_mask, row_valid)
                tl.store(tickets_ptr + pid_bhm, 0)  # every live split has taken its ticket: ready for the next launch
        else:
            # group counters follow the row blocks' counters in the workspace
            merge_group = split // _MERGE_GROUP
            groups = tl.cdiv(live, _MERGE_GROUP)
            first = merge_group * _MERGE_GROUP
            in_group = tl.minimum(live - first, _MERGE_GROUP)
            group_counter = tickets_ptr + tl.num_programs(0) + pid_bhm * _MAX_MERGE_GROUPS + merge_group
            ticket = tl.atomic_add(group_counter, 1, sem="acq_rel", scope="gpu")
            if ticket == in_group - 1:  # the last split of its group merges the group into the group's first slot
                merged, merged_lse2 = _merge_partials(part_o_ptr, part_lse_ptr, part_rows, offs_dv, head_dim_v,
                                                      first, 1, in_group, out_mask, row_valid, BLOCK_M, BLOCK_DV,
                                                      MERGE_CHUNK)
                tl.store(part_o_ptr + (part_rows + first)[:, None] * head_dim_v + offs_dv[None, :], merged,
                         mask=out_mask)
                tl.store(part_lse_ptr + part_rows + first, merged_lse2, mask=row_valid)
                tl.store(group_counter, 0)
                tl.debug_barrier()
                ticket = tl.atomic_add(tickets_ptr + pid_bhm, 1, sem="acq_rel", scope="gpu")
                if ticket == groups - 1:  # the last group merges the groups (every MERGE_GROUP-th slot)
                    merged, merged_lse2 = _merge_partials(part_o_ptr, part_lse_ptr, part_rows, offs_dv, head_dim_v,
                                                          0, _MERGE_GROUP, groups, out_mask, row_valid, BLOCK_M,
                                                          BLOCK_DV, MERGE_CHUNK)
                    _store_rows(o_ptr, lse_ptr, out_row, offs_dv, head_dim_v, merged, merged_lse2, out_mask,
                                row_valid)
                    tl.store(tickets_ptr + pid_bhm, 0)


@triton.jit
def _tree_bits(mask_rows, columns, seq_q, stride_mn, row_valid):
    """Columns `columns` (32 consecutive ones from a multiple of 32) of each row's tree mask as the bits of an int32,
    columns past seq_q clear (the bits are disjoint, so their sum is their or)."""
    keep = tl.load(mask_rows[:, None] + columns[None, :] * stride_mn,
                   mask=row_valid[:, None] & (columns < seq_q)[None, :], other=0)
    return tl.sum((keep != 0).to(tl.int32) << (columns % 32)[None, :], axis=1)


@triton.jit
def _attend_tile(acc, m_i, l_i, q, start_n, hi, k_base, v_base, ks_base, vs_base, table_row, offs_d, offs_dv, d_valid,
                 dv_valid, row_valid, tok, causal_limit, tree_start, tree_low, tree_high, first_key, mask_rows, slopes,
                 page_size, cache_rows, stride_kb, stride_kn, stride_vb, stride_vn, stride_ksb, stride_ksn,
                 stride_vsb, stride_vsn, stride_mn, qk_scale, softcap, window_left, window_right,
                 BLOCK_N: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, DOT_LOWP: tl.constexpr,
                 PAGED: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, ALIBI: tl.constexpr,
                 FA_MASKING: tl.constexpr, KV_QUANT: tl.constexpr, KV_E4M3_BITS: tl.constexpr,
                 EDGE: tl.constexpr):
    """(acc, m, l) after the KV tile of keys [start_n, start_n + BLOCK_N): its scores, transforms, masks and the
    online-softmax step. EDGE False: a whole tile inside the range that no mask reaches, so only a paged key's page
    is checked (padding rows compute on zero queries and are never stored); EDGE True: keys past the range,
    padding rows and every mask of the call are applied.

    A quantised cache (KV_QUANT 1 per tensor, 2 per token and head; KV_E4M3_BITS an e4m3 cache as bytes) becomes
    dot operands as backends/triton/_kv_dequant.py describes; K's per-key scales multiply the scores here."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_n64 = offs_n.to(tl.int64)
    if EDGE:
        n_valid = offs_n < hi
    else:
        n_valid = offs_n >= 0
    if PAGED:
        pages = tl.load(table_row + offs_n // page_size, mask=n_valid, other=0).to(tl.int64)
        # a key on a page outside the cache is not read: it is dropped like a key past the length
        n_valid = n_valid & (pages >= 0) & (pages < cache_rows)
        slots = (offs_n % page_size).to(tl.int64)
        k_rows = pages * stride_kb + slots * stride_kn
        v_rows = pages * stride_vb + slots * stride_vn
        ks_rows = pages * stride_ksb + slots * stride_ksn
        vs_rows = pages * stride_vsb + slots * stride_vsn
    else:
        k_rows = offs_n64 * stride_kn
        v_rows = offs_n64 * stride_vn
        ks_rows = offs_n64 * stride_ksn
        vs_rows = offs_n64 * stride_vsn

    if EDGE or PAGED:
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=n_valid[:, None] & d_valid[None, :], other=0.0)
    else:
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=d_valid[None, :], other=0.0)
    k = stored_as_operand(k, q, KV_QUANT, KV_E4M3_BITS)
    scores = online_softmax.scores(q, k, DOT_LOWP)
    if KV_QUANT == 2:
        if EDGE or PAGED:
            k_scales = tl.load(ks_base + ks_rows, mask=n_valid, other=0.0)
        else:
            k_scales = tl.load(ks_base + ks_rows)
        scores = scores * k_scales[None, :]
    scores = scores * qk_scale
    if SOFTCAP:
        # softcap * tanh(s / softcap) of the natural-log score s, with tanh(x) = 2 * sigmoid(2x) - 1
        capped = 2.0 * tl.sigmoid(scores * (2.0 * 0.6931471805599453 / softcap)) - 1.0
        scores = capped * (softcap * 1.4426950408889634)
    if ALIBI == 1:
        scores += slopes[:, None] * (offs_n - first_key).to(tl.float32)[None, :]
    if ALIBI == 2:
        distance = (causal_limit[:, None] - offs_n[None, :]).to(tl.float32)
        scores -= slopes[:, None] * tl.abs(distance)

    if EDGE:
        # padding rows and keys past the range are never read: their scores are replaced by -inf. Masking
        # inside the range is additive, as torch's math SDPA masks (score - inf): NaN and +inf scores of
        # masked keys stay NaN instead of being dropped
        keep = row_valid[:, None] & n_valid[None, :]
        if CAUSAL == 1:
            scores = tl.where(offs_n[None, :] <= tok[:, None], scores, scores - float("inf"))
        if CAUSAL == 2:
            scores = tl.where(offs_n[None, :] <= causal_limit[:, None], scores, scores - float("inf"))
        if WINDOW:
            # a local window around each row's bottom-right diagonal (-1: that side unbounded); keys
            # outside it are dropped (-inf), as FlashAttention masks them
            in_window = ((window_left < 0) | (offs_n[None, :] >= causal_limit[:, None] - window_left)) & \
                        ((window_right < 0) | (offs_n[None, :] <= causal_limit[:, None] + window_right))
            scores = tl.where(in_window, scores, float("-inf"))
        if MASK_KIND == 1:
            mask_keep = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=1)
            scores = tl.where(mask_keep != 0, scores, scores - float("inf"))
        if MASK_KIND == 2:
            mask_add = tl.load(mask_rows[:, None] + offs_n64[None, :] * stride_mn, mask=keep, other=0.0)
            scores = scores + mask_add.to(tl.float32) * 1.4426950408889634
        if MASK_KIND == 3:
            # bit t of a row's tree row decides key tree_start + t; keys before tree_start are the prefix
            tree_col = offs_n - tree_start
            column = tl.minimum(tl.maximum(tree_col, 0), 63)
            word = tl.where(column[None, :] < 32, tree_low[:, None], tree_high[:, None])
            tree_keep = (((word >> (column % 32)[None, :]) & 1) != 0) | (tree_col < 0)[None, :]
            if FA_MASKING:   # with FlashAttention's options a key the tree hides is dropped, as its window does
                scores = tl.where(tree_keep != 0, scores, float("-inf"))
            else:            # otherwise masked additively, as the causal mask it generalises
                scores = tl.where(tree_keep != 0, scores, scores - float("inf"))
        scores = tl.where(keep, scores, float("-inf"))
    elif PAGED:
        scores = tl.where(n_valid[None, :], scores, float("-inf"))

    m_new, p, alpha, l_i = online_softmax.rescale(m_i, l_i, scores)
    if EDGE or PAGED:
        v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :], mask=n_valid[:, None] & dv_valid[None, :],
                    other=0.0)
    else:
        v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :], mask=dv_valid[None, :], other=0.0)
    if KV_QUANT == 2:
        if EDGE or PAGED:
            v = dequantized_rows(v, tl.load(vs_base + vs_rows, mask=n_valid, other=0.0), q, KV_E4M3_BITS)
        else:
            v = dequantized_rows(v, tl.load(vs_base + vs_rows), q, KV_E4M3_BITS)
    else:
        v = stored_as_operand(v, q, KV_QUANT, KV_E4M3_BITS)
    acc = online_softmax.accumulate(acc, alpha, p, v, DOT_LOWP)
    return acc, m_new, l_i


@triton.jit
def _merge_partials(part_o_ptr, part_lse_ptr, part_rows, offs_dv, head_dim_v, first, step, count, out_mask,
                    row_valid, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, MERGE_CHUNK: tl.constexpr):
    """(output, base-2 LSE) of `count` <= MERGE_GROUP normalised partials of the rows, slots first + i * step,
    merged in slot order. Partials written by other SMs are read from L2 (.cg)."""
    offs_s = tl.arange(0, _MERGE_GROUP)
    slots = first + offs_s * step
    lse_all = tl.load(part_lse_ptr + part_rows[:, None] + slots[None, :],
                      mask=row_valid[:, None] & (offs_s[None, :] < count), other=float("-inf"), cache_modifier=".cg")
    m = tl.max(lse_all, 1)
    m = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.exp2(lse_all - m[:, None]), 1)
    merged = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    # MERGE_CHUNK partials per step, all their loads issued before the first is used: one L2 round trip per
    # chunk instead of one per partial (`merge_chunk`). The adds stay one partial at a time in slot order
    for i0 in range(0, count, MERGE_CHUNK):
        # one entry per static iteration (annotations quoted: the JIT evaluates them and knows no `tuple`)
        weights: "tuple" = ()
        parts: "tuple" = ()
        for c in tl.static_range(MERGE_CHUNK):
            slot = first + (i0 + c) * step
            present = row_valid & ((i0 + c + tl.zeros_like(part_rows)) < count)   # per row: masks combine as vectors
            weights = weights + (tl.load(part_lse_ptr + part_rows + slot, mask=present, other=float("-inf"),
                                         cache_modifier=".cg"),)
            parts = parts + (tl.load(part_o_ptr + (part_rows + slot)[:, None] * head_dim_v + offs_dv[None, :],
                                     mask=out_mask & present[:, None], other=0.0, cache_modifier=".cg"),)
        for c in tl.static_range(MERGE_CHUNK):
            merged += tl.exp2(weights[c] - m)[:, None] * parts[c]
    # as for l in the kernel: a NaN partial LSE makes denom NaN, which must not read as "no keys"
    no_keys = denom == 0.0
    denom_safe = tl.where(no_keys, 1.0, denom)
    return merged / denom_safe[:, None], tl.where(no_keys, float("-inf"), m + tl.log2(denom_safe))


@triton.jit
def _store_rows(o_ptr, lse_ptr, out_row, offs_dv, head_dim_v, out, lse2, out_mask, row_valid):
    """The output rows in o's dtype and their LSE in natural log (lse2 is base 2)."""
    tl.store(o_ptr + out_row[:, None] * head_dim_v + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=out_mask)
    tl.store(lse_ptr + out_row, lse2 * 0.6931471805599453, mask=row_valid)
