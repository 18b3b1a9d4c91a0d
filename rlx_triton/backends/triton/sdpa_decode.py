"""Split-K flash-decoding attention (Triton) for short query lengths against a long KV range: one launch.

`_sdpa_decode_kernel` runs on a grid of (batch x KV heads x blocks of packed query rows, splits). The
split count comes from the device (`kv_splits`, the split rule: SM count, row blocks, the KV length's
bucket; the candidate's `split_k` bounds it wherever that bound can fill the GPU), so the grid is fixed per
(bucket, device). How
many splits of a sequence are *live* is decided on the device from its valid length (`_live_splits`:
every live split gets a balanced share of at least one BLOCK_N tile), so nothing syncs with the host,
empty splits exit at once and the launch can be captured in a CUDA graph.

Each program runs an fp32 online softmax (base 2) over its KV tiles, K and V double-buffered by the
software pipeline (num_stages 3). With one split it writes the output and LSE directly. Otherwise it
writes a normalised partial output and its log-sum-exp, takes a ticket from its row block's counter,
and the program that takes the last ticket merges the live splits of its rows (in split order, so the
result does not depend on which program finishes last) and resets the counter for the next launch.
More than MERGE_GROUP live splits merge in two levels, so no program reads more than MERGE_GROUP partials
per row: the last of each group of MERGE_GROUP splits merges its group into the group's first slot, and
the last group to finish merges the groups. The counters and partials are allocated with each launch
(zeroed counters, from torch's caching allocator), so a captured CUDA graph owns its own and launches on
several streams or graphs never share one; the launch leaves its counters at zero.

The query heads sharing one KV head (GQA/MQA) and the query tokens are packed into the M rows of
`tl.dot` (packed row r -> head `kv_head * group + r // Lq`, token `r % Lq`), at least 16 rows per tile.
Head dims D and Dv are padded to powers of two with masks. Masks (bool: True keeps; float: added) are
read through strides, stride 0 on broadcast dimensions. A paged cache (PAGED) is read through a block
table: logical key n of sequence b is slot n % page_size of page block_table[b, n // page_size], any
page size >= 1, each key row still one contiguous read of D (Dv) elements. Causal masking is top-left (torch SDPA) or
bottom-right within each sequence's valid length (the FlashAttention kv-cache convention). Rows whose
keys are all masked produce 0 and LSE = -inf, as do sequences of length 0. Index values are clamped and
masked, never trusted: lengths to [0, S], left paddings to [0, length], a cache row or page outside the
cache reads nothing (its keys are dropped), so no value makes a launch read or write out of bounds.

Non-finite values follow torch's math SDPA over the keys a call reads (keys past a sequence's valid
length, and under top-left alignment past the last query token, are never read): masking any other
key adds -inf to its score, so NaN or +inf in a query row, a key or a mask gives a NaN row with a NaN
LSE, and NaN or Inf in a value gives NaN through the P @ V product (0 * NaN), as in torch. Calls with
FlashAttention's options (softcap, local window, ALiBi, cache rows, left padding) mask as FlashAttention
does: keys outside a row's window, the causal diagonal included, are dropped, so a NaN there stays out.

With the router's route the launch goes through the autotune bridge (backends/triton/autotune.py),
keyed on the token, batch and KV-length buckets and the head shape; without one the candidate is
launched directly. The module also declares the family's routing data (COVERAGE, APPROVALS, RECIPES,
AUDIT_KERNELS).
"""
from __future__ import annotations

import math
import threading
from typing import Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.torch_ref.flash_attn import decode_masking, masking
from rlx_triton.backends.torch_ref.flash_attn import through_decode as kvcache_through_decode
from rlx_triton.backends.torch_ref.sdpa_decode import sdpa_through_decode
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeVariant
from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2
# ALiBi's two forms in FlashAttention 2: slope x key position (the causal window), -slope x |distance| otherwise
ALIBI_NONE, ALIBI_KEY_INDEX, ALIBI_DISTANCE = 0, 1, 2
_CAUSAL_CODES = {"none": CAUSAL_NONE, "top_left": CAUSAL_TOP_LEFT, "bottom_right": CAUSAL_BOTTOM_RIGHT}

MAX_SEQ_Q = 16
MAX_HEAD_DIM = 256
# the unit that executes the dots with low-precision operands (fp32 operands run on the FMA units)
_DOT_UNITS = {torch.float16: "fp16_mma", torch.bfloat16: "bf16_mma"}


# ---------------------------------------------------------------------------------------------------
# The split rule: how many programs share the KV range of one block of query rows.
# ---------------------------------------------------------------------------------------------------
MIN_FILL = 0.9  # share of the SMs the last wave of a launch should keep busy
MIN_BLOCK_N = 16
# the split count where the candidate's split_k cannot fill one wave (FlashAttention's bound on splits)
MAX_LIFTED_SPLITS = 128
# partials one program merges per row: more live splits merge in two levels of at most this many
MERGE_GROUP = 16
MAX_MERGE_GROUPS = MAX_LIFTED_SPLITS // MERGE_GROUP
# partials a merge reads at once (their loads in flight together; divides MERGE_GROUP) where Dv is at most
# 128; at Dv 256 the tiles of several partials would cost occupancy (sm_90: 168 -> 255 registers), so one
MERGE_CHUNK = 4


def merge_chunk(block_dv: int) -> int:
    """Partials the merge reads at once for Dv tiles of `block_dv`."""
    return MERGE_CHUNK if block_dv <= 128 else 1
_MERGE_GROUP, _MAX_MERGE_GROUPS = tl.constexpr(MERGE_GROUP), tl.constexpr(MAX_MERGE_GROUPS)  # the kernel's copies


def kv_bucket(seq_kv: int) -> int:
    """The power of two at or above a KV length: the rule reads buckets, so the grid is fixed per bucket."""
    return 1 << max(0, int(seq_kv) - 1).bit_length()


def last_wave_fill(programs: int, sm_count: int, programs_per_sm: int = 1) -> float:
    """Share of the SMs busy in the last wave of `programs` equal programs, `programs_per_sm` resident per SM:
    a whole number of waves keeps every SM busy, a last wave of r programs keeps min(r, SMs) of them."""
    remainder = programs % (sm_count * max(1, programs_per_sm))
    return 1.0 if remainder == 0 else min(remainder, sm_count) / sm_count


def block_n_for_short_kv(sm_count: int, row_blocks: int, seq_kv: int, block_n: int) -> int:
    """BLOCK_N halved (down to 16) while the bucket's tiles of all row blocks could not give MIN_FILL of the
    SMs one tile each: a short KV range is spread over more programs in smaller tiles."""
    tiles_wanted = MIN_FILL * sm_count
    while block_n > MIN_BLOCK_N and row_blocks * triton.cdiv(kv_bucket(seq_kv), block_n) < tiles_wanted:
        block_n //= 2
    return block_n


def kv_splits(sm_count: int, row_blocks: int, seq_kv: int, block_n: int, max_splits: int,
              programs_per_sm: int = 1) -> int:
    """Grid splits (grid dim 1) for `row_blocks` (batch x KV heads x query-row blocks) over `seq_kv` keys.

    The rule: the split count s in [1, cap] whose launch of row_blocks x s programs leaves the fewest SMs
    idle in its last wave (`last_wave_fill` with `programs_per_sm` resident per SM; the smallest such s),
    where cap = min(max_splits, the candidate's split_k; the number of BLOCK_N tiles in the KV length's
    bucket), so every split of a full bucket has at least one tile. One split (no partials, no merge)
    wherever it fills the GPU as well as any. Where row_blocks x max_splits programs cannot keep MIN_FILL
    of the SMs busy even once (MQA at batch 1 or 2: one or two row blocks), split_k stops being the bound:
    the cap becomes min(MAX_LIFTED_SPLITS, the tiles) and the smallest count that keeps MIN_FILL of the SMs
    busy is taken (each split more adds partials, merged in two levels), so the KV range is read at the
    bandwidth of the whole GPU instead of a tenth of it. A candidate with split_k 1 never splits, and a
    CPU (sm_count 1) never does either.
    """
    tiles = triton.cdiv(kv_bucket(seq_kv), block_n)
    # never past MAX_LIFTED_SPLITS: the merge's group counters are laid out for that many
    cap = max(1, min(int(max_splits), tiles, MAX_LIFTED_SPLITS))
    lifted = max_splits > 1 and row_blocks * max_splits < MIN_FILL * sm_count
    if lifted:
        cap = max(cap, min(MAX_LIFTED_SPLITS, tiles))
    best, best_fill = 1, -1.0
    for splits in range(1, cap + 1):
        fill = last_wave_fill(row_blocks * splits, sm_count, programs_per_sm)
        if lifted and fill >= MIN_FILL:
            return splits
        if fill > best_fill + 1e-9:
            best, best_fill = splits, fill
    return best


def programs_per_sm(device: torch.device, *, block_m: int, block_n: int, block_d: int, block_dv: int,
                    element_bytes: int, num_warps: int, lowp: bool) -> int:
    """Programs of one config resident per SM on the device the router reads facts from (1 where it has no
    CUDA profile), by the occupancy calculator's rules on the config's estimated resources: shared memory =
    the pipeline's K/V stages plus the fp32 output tile the epilogue stages; registers = the per-thread
    budget `_meta` keeps the config within (128 with tensor-core dots, all 255 with fp32 operands)."""
    from rlx_triton import devices
    from rlx_triton.perf.roofline import occupancy
    from rlx_triton.router.device import device_facts

    facts = device_facts(device)
    key = (facts.fingerprint, block_m, block_n, block_d, block_dv, element_bytes, num_warps, lowp)
    resident = _resident.get(key)
    if resident is None:
        profile = None
        if facts.kind == "cuda" and facts.capability is not None:
            profile = devices.profile_for_name(facts.name) or next(
                (p for p in devices.cuda_profiles() if p.capability == tuple(facts.capability)), None)
        resident = 1
        if profile is not None:
            shared = (NUM_STAGES - 1) * block_n * (block_d + block_dv) * element_bytes + block_m * block_dv * 4
            resident = max(1, occupancy(profile, 128 if lowp else 255, shared, num_warps).ctas_per_sm)
        _resident[key] = resident
    return resident


_resident: Dict[tuple, int] = {}


@triton.jit
def _live_splits(seqlen, num_splits, split, BLOCK_N: tl.constexpr):
    """(live splits, first key, end key) of `split` for a sequence of `seqlen` valid keys: the sequence's
    tiles are shared as evenly as whole tiles allow by at most `num_splits` programs of at least one tile
    (one program, with an empty range, for a sequence of none)."""
    tiles = tl.cdiv(seqlen, BLOCK_N)
    # a sequence without keys still has split 0 run an empty range: it writes its rows as seeing no key
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
@triton.jit(do_not_specialize=["seq_kv", "token_bucket", "batch_bucket", "kv_len_bucket"])
def _sdpa_decode_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, seqlens_ptr,
    o_ptr, lse_ptr, part_o_ptr, part_lse_ptr, tickets_ptr, block_table_ptr,
    alibi_ptr, batch_idx_ptr, leftpad_ptr,  # read under ALIBI / BATCH_IDX / LEFTPAD only
    stride_qb, stride_qh, stride_ql,
    stride_kb, stride_kh, stride_kn,  # paged: stride_kb steps pages, stride_kn slots within a page
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mh, stride_ml, stride_mn,
    stride_btb,  # block table rows (one per sequence)
    stride_alibi_b,  # ALiBi slopes per (batch, head): 0 for slopes per head
    num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, page_size,
    cache_rows,  # k/v's dim 0: cache rows (BATCH_IDX) or pages (PAGED); an index outside it reads nothing
    qk_scale,  # softmax scale * log2(e)
    softcap, window_left, window_right,  # read under SOFTCAP / WINDOW only
    token_bucket, batch_bucket, kv_len_bucket,  # read by the autotuner's key only
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    MAX_SPLITS: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, DOT_LOWP: tl.constexpr, PAGED: tl.constexpr,
    SOFTCAP: tl.constexpr = False, WINDOW: tl.constexpr = False, ALIBI: tl.constexpr = 0,
    BATCH_IDX: tl.constexpr = False, LEFTPAD: tl.constexpr = False, MERGE_CHUNK: tl.constexpr = 4,
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
    live, lo, hi = _live_splits(seqlen - first_key, num_splits, split, BLOCK_N)
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
        table_row = block_table_ptr + batch64 * stride_btb
    else:
        k_base = k_ptr + cache_row * stride_kb + kv_head.to(tl.int64) * stride_kh
        v_base = v_ptr + cache_row * stride_vb + kv_head.to(tl.int64) * stride_vh
    if MASK_KIND != 0:
        mask_rows = mask_ptr + batch64 * stride_mb + head64 * stride_mh + tok64 * stride_ml
    # last key each row may see under bottom-right causal masking: its diagonal. Positions count from the
    # first valid key, so a left padding shifts keys and diagonal alike and the difference is kept
    causal_limit = tok + seqlen - seq_q
    if ALIBI != 0:  # slopes in base-2 units, as the scores are
        slopes = tl.load(alibi_ptr + batch64 * stride_alibi_b + head64, mask=row_valid, other=0.0) * 1.4426950408889634

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < hi
        offs_n64 = offs_n.to(tl.int64)
        if PAGED:
            pages = tl.load(table_row + offs_n // page_size, mask=n_valid, other=0).to(tl.int64)
            # a key on a page outside the cache is not read: it is dropped like a key past the length
            n_valid = n_valid & (pages >= 0) & (pages < cache_rows)
            slots = (offs_n % page_size).to(tl.int64)
            k_rows = pages * stride_kb + slots * stride_kn
            v_rows = pages * stride_vb + slots * stride_vn
        else:
            k_rows = offs_n64 * stride_kn
            v_rows = offs_n64 * stride_vn

        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        if DOT_LOWP:
            scores = tl.dot(q, tl.trans(k))
        else:
            scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
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
        scores = tl.where(keep, scores, float("-inf"))

        # online softmax; a row with no visible key so far keeps m = -inf, l = 0, acc = 0. A NaN score
        # makes l NaN whether or not the max keeps it (tl.max drops NaN): p = exp2(NaN - m) is NaN
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)

        v = tl.load(v_base + v_rows[:, None] + offs_dv[None, :],
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
        weights = ()
        parts = ()
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


def _interpreting() -> bool:
    return triton.knobs.runtime.interpret if hasattr(triton, "knobs") else False


# K and V tiles in flight while one is consumed: the software pipeline's depth (num_stages 3 = two buffers)
NUM_STAGES = 3
# Shared memory the pipeline's K/V buffers may take: two stages of BLOCK_N x (D + Dv) keys within 64 KiB
# leave room for 3 programs per SM on sm_90 (228 KiB) and 2 on sm_80 (164 KiB).
_PIPELINE_BYTES = 64 * 1024
# Bytes per thread of K/V tiles, q, the accumulator and the score tile (the formula in _meta) below which
# ptxas keeps everything in registers, measured with rlx-triton perf / the audit on sm_80 and sm_90 (mask +
# causal + cache lengths). Tensor-core dots (fp16/bf16 operands, 4 warps): no spills up to ~900 B (16-32
# rows, D 64-256); fp32 operands, multiplied on the FMA units from registers: spills above ~250 B
# (16-bit inputs upcast to fp32 operands: both copies of a K/V tile counted).
_THREAD_BYTES_LOWP = 768
_THREAD_BYTES_FP32 = 224
# warps of a tensor-core decode tile: one row of 4 warps across the 16-64 packed query rows
_LOWP_WARPS = 4


def _meta(candidate, *, rows: int, head_dim: int, head_dim_v: int, dtype: torch.dtype,
          max_block_n: Optional[int] = None) -> dict:
    """Candidate -> meta-parameters of the kernel.

    split_k -> MAX_SPLITS (the split rule's upper bound where it can fill the GPU); tile_n -> BLOCK_N (at most `max_block_n`, the
    split rule's tile for a short KV range); tile_m -> the least BLOCK_M (packed query rows: at least 16
    for tl.dot, and up to 64 so a whole GQA group x tokens shares one read of K/V); D and Dv -> next
    powers of two (>= 16). use_f16_kv -> fp16/bf16 dot operands for 16-bit inputs (tensor cores); fp32
    operands with ieee precision otherwise (bf16 under the interpreter also takes fp32 operands: the
    interpreter computes on raw bf16 bits). tg_size // 32 -> num_warps for fp32 operands; tensor-core
    tiles take 4 warps (at most tg_size // 32).
    K and V are double-buffered (num_stages 3): BLOCK_N halves while the two stages would pass
    _PIPELINE_BYTES. The tiles are upper bounds: while K/V tiles, q, the accumulator and the score tile
    exceed the per-thread register budget, BLOCK_N halves down to 32, then num_warps doubles up to 8,
    then BLOCK_M and BLOCK_N halve down to 16, then num_warps doubles up to 16 (no routed configuration
    spills on sm_80/sm_90). partial_reduce, tile_k, pad_q and pad_kv need no mapping: one split writes the
    output directly and more merge in the same launch, D is padded to a power of two and every length is
    masked.
    """
    lowp = bool(candidate.use_f16_kv) and dtype in (torch.float16, torch.bfloat16)
    if dtype == torch.bfloat16 and _interpreting():
        lowp = False
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_dv = max(16, triton.next_power_of_2(head_dim_v))
    block_m = max(16, triton.next_power_of_2(max(1, candidate.tile_m)), min(triton.next_power_of_2(rows), 64))
    block_n = max(MIN_BLOCK_N, triton.next_power_of_2(candidate.tile_n))
    if max_block_n is not None:
        block_n = max(MIN_BLOCK_N, min(block_n, max_block_n))
    warps = max(1, candidate.tg_size // 32)
    num_warps = min(warps, _LOWP_WARPS) if lowp else warps
    element_bytes = torch.empty((), dtype=dtype).element_size()
    operand_bytes = 2 if lowp else 4
    budget = _THREAD_BYTES_LOWP if lowp else _THREAD_BYTES_FP32

    while block_n > MIN_BLOCK_N and (NUM_STAGES - 1) * block_n * (block_d + block_dv) * element_bytes > _PIPELINE_BYTES:
        block_n //= 2

    # 16-bit tiles multiplied as fp32 operands are held twice: as loaded and converted
    tile_bytes = operand_bytes if lowp or element_bytes == 4 else element_bytes + operand_bytes

    def thread_bytes():
        kv = block_n * (block_d + block_dv) * tile_bytes
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
        MAX_SPLITS=max(1, triton.next_power_of_2(int(candidate.split_k))),
        DOT_LOWP=lowp,
        MERGE_CHUNK=merge_chunk(block_dv),
        num_warps=num_warps,
        num_stages=1 if _interpreting() else NUM_STAGES,
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


def _sm_count(device: torch.device) -> int:
    """SMs of the device the router reads facts from (1 where there are none: a CPU never splits)."""
    from rlx_triton.router.device import device_facts

    return device_facts(device).sm_count or 1


def _ticket_counters(device: torch.device, count: int) -> torch.Tensor:
    """Zeroed ticket counters for one launch, allocated with it from torch's caching allocator like the
    partials: no buffer outlives the launch that uses it or is shared with another launch, so a CUDA graph
    keeps its own counters alive (its memory pool holds them) and launches on other streams or other graphs
    never count on each other's. The zeroing is a device-side fill, captured and replayed with the launch;
    the launch itself leaves them at zero (the last ticket of a row block resets its counter), so a
    benchmark that reruns it needs no zeroing in between."""
    return torch.zeros(count, device=device, dtype=torch.int32)


# Autotune key: the token, batch and KV-length buckets and the head shape (never raw lengths or tensors).
_TUNE_KEY = ["token_bucket", "batch_bucket", "num_kv_heads", "group", "head_dim", "head_dim_v", "kv_len_bucket"]
_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "MAX_SPLITS", "DOT_LOWP")
_tuned: Dict[tuple, object] = {}
_tuned_lock = threading.Lock()


def tuned_kernel(*, rows: int, head_dim: int, head_dim_v: int, dtype: torch.dtype, max_block_n: int):
    """`_sdpa_decode_kernel` under the autotune bridge, one config per candidate approved for the current
    precision profile, for one head shape (query rows, D, Dv, dtype) and short-KV tile bound."""
    from rlx_triton.router import plans
    from rlx_triton.router.approvals import approval_for

    profile = plans.profile_name(plans.current_profile())
    rows_class = min(triton.next_power_of_2(rows), 64)
    key = (profile, rows_class, triton.next_power_of_2(head_dim), triton.next_power_of_2(head_dim_v), dtype,
           max_block_n)
    tuned = _tuned.get(key)
    if tuned is None:
        with _tuned_lock:
            tuned = _tuned.get(key)
            if tuned is None:
                from rlx_triton.backends.triton.autotune import TunedKernel

                candidates = [c for c in plans.plan_for("sdpa_decode").candidates
                              if approval_for(APPROVALS, c.tag(), profile) is not None]

                def to_config(candidate):
                    meta = _meta(candidate, rows=rows_class, head_dim=head_dim, head_dim_v=head_dim_v, dtype=dtype,
                                 max_block_n=max_block_n)
                    return triton.Config({name: meta[name] for name in _CONFIG_KEYS}, num_warps=meta["num_warps"],
                                         num_stages=meta["num_stages"])

                tuned = TunedKernel(_sdpa_decode_kernel, candidates, to_config, key=_TUNE_KEY,
                                    check=_partials_hold_the_grid)
                _tuned[key] = tuned
    return tuned


def _partials_hold_the_grid(config, grid: tuple, args: tuple) -> Optional[str]:
    """Why a config's grid would write more splits than the launch's partial buffers hold, or None."""
    part_o = args[7]  # (B, H, Lq, splits held, Dv), or the output itself where the launch holds one split
    held = part_o.shape[3] if part_o.dim() == 5 else 1
    return None if grid[1] <= held else f"{grid[1]} KV splits, the partial buffers hold {held}"


def sdpa_decode_plan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                     attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                     scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                     block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                     window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                     cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
                     candidate, route=None,
                     sm_count: Optional[int] = None) -> Tuple[List[Launch], Tuple[torch.Tensor, torch.Tensor]]:
    """The launch of `sdpa_decode` as a record, and the (out, lse) buffers it fills.

    Built from shapes and strides only, so meta tensors give the plan at any shape. sm_count: the SMs the
    split rule fills (default: the device's, from the router's device facts). Bytes count every element
    the launch may read once (K and V up to the padded length S: with cache_seqlens the keys past a
    sequence's length are skipped, so the real traffic can be less) and every element it writes, the
    partials written and read back by the merge included; FLOPs are the two dots as the dot units execute
    them (query rows padded to BLOCK_M, head dims to BLOCK_D / BLOCK_DV).
    """
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    page_size = 1
    if block_table is not None:  # key (num_pages, Hkv, page_size, D): the sequences' capacity is their pages'
        page_size = seq_kv
        seq_kv = block_table.shape[1] * page_size
    group = num_heads // num_kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    fa_options = (softcap > 0 or tuple(window) != (-1, -1) or alibi_slopes is not None or cache_leftpad is not None
                  or cache_batch_idx is not None)
    if causal == "bottom_right" and fa_options:
        # FlashAttention's masking, which these options come with, drops the keys right of the diagonal (a
        # window side of 0) where torch's math SDPA adds -inf to their scores: a NaN in such a key stays out
        window = (window[0], 0)
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))
    if causal == "top_left" and seq_q < seq_kv and block_table is None:
        # token i sees keys 0..i only: the keys past Lq are never read (views, no copy)
        key, value = key[:, :, :seq_q], value[:, :, :seq_q]
        if attn_mask is not None and attn_mask.shape[-1] != 1:
            attn_mask = attn_mask[..., :seq_q]
        if cache_seqlens is not None:
            cache_seqlens = cache_seqlens.clamp(max=seq_q)
        seq_kv = seq_q
    device = query.device
    sms = sm_count if sm_count is not None else _sm_count(device)

    rows = group * seq_q
    heads_blocks = batch * num_kv_heads
    meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype)
    max_block_n = block_n_for_short_kv(sms, heads_blocks * triton.cdiv(rows, meta["BLOCK_M"]), seq_kv,
                                       meta["BLOCK_N"])
    if max_block_n < meta["BLOCK_N"]:
        meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype,
                     max_block_n=max_block_n)

    def grid_for(config: dict) -> Tuple[int, int]:
        row_blocks = heads_blocks * triton.cdiv(rows, config["BLOCK_M"])
        resident = programs_per_sm(device, block_m=config["BLOCK_M"], block_n=config["BLOCK_N"],
                                   block_d=meta["BLOCK_D"], block_dv=meta["BLOCK_DV"],
                                   element_bytes=query.element_size(), num_warps=meta["num_warps"],
                                   lowp=config["DOT_LOWP"]) if sms > 1 else 1
        return row_blocks, kv_splits(sms, row_blocks, seq_kv, config["BLOCK_N"], config["MAX_SPLITS"], resident)

    row_blocks, splits = grid_for(meta)
    tuned = None
    if route is not None and route.candidate is not None:
        tuned = tuned_kernel(rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype,
                             max_block_n=max_block_n)
        if candidate.tag() not in tuned.tags:
            tuned = None
    # a cold bucket may be tuned on this call: the partials then hold the largest grid of any config
    splits_held = splits
    if tuned is not None:
        from rlx_triton.backends.triton.autotune import tuning_allowed

        if tuning_allowed(route, device):
            splits_held = max(grid_for(config.kwargs)[1] for config in tuned.configs)

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
    table = block_table if block_table is not None else seqlens
    alibi_mode = ALIBI_NONE
    if alibi_slopes is not None:
        alibi_mode = ALIBI_KEY_INDEX if decode_masking(causal, window, seq_kv).is_causal else ALIBI_DISTANCE
        alibi_slopes = alibi_slopes.contiguous()
    slopes = alibi_slopes if alibi_slopes is not None else lse
    batch_idx = cache_batch_idx if cache_batch_idx is not None else seqlens
    leftpad = cache_leftpad if cache_leftpad is not None else seqlens
    if splits_held > 1:
        part_o = torch.empty((batch, num_heads, seq_q, splits_held, head_dim_v), device=device, dtype=torch.float32)
        part_lse = torch.empty((batch, num_heads, seq_q, splits_held), device=device, dtype=torch.float32)
        # a counter per row block, then MAX_MERGE_GROUPS group counters per row block
        tickets = _ticket_counters(device, heads_blocks * triton.cdiv(rows, MIN_BLOCK_N) * (1 + MAX_MERGE_GROUPS))
    else:
        part_o, part_lse, tickets = out, lse, lse

    size = query.element_size()
    read = (query.numel() + batch * num_kv_heads * seq_kv * (head_dim + head_dim_v)) * size
    if attn_mask is not None:
        read += _unique_bytes(mask)
    if cache_seqlens is not None:
        read += cache_seqlens.numel() * cache_seqlens.element_size()
    for index in (block_table, alibi_slopes, cache_batch_idx, cache_leftpad):
        if index is not None:
            read += index.numel() * index.element_size()
    written = out.numel() * size + lse.numel() * 4
    if splits > 1:  # the partials, written by every split and read back by the merging one; the tickets
        partials = batch * num_heads * seq_q * splits * (head_dim_v + 1) * 4
        if splits > MERGE_GROUP:  # the groups' merged partials, written and read once more
            partials += batch * num_heads * seq_q * triton.cdiv(splits, MERGE_GROUP) * (head_dim_v + 1) * 4
        read += partials + row_blocks * 4
        written += partials + row_blocks * 4
    padded_rows = row_blocks * meta["BLOCK_M"]
    flops = 2 * padded_rows * seq_kv * (meta["BLOCK_D"] + meta["BLOCK_DV"])
    unit = _DOT_UNITS.get(query.dtype, "fp32_fma") if meta["DOT_LOWP"] else "fp32_fma"

    args = (query, key, value, mask, seqlens, out, lse, part_o, part_lse, tickets, table, slopes, batch_idx, leftpad,
            query.stride(0), query.stride(1), query.stride(2),
            key.stride(0), key.stride(1), key.stride(2),
            value.stride(0), value.stride(1), value.stride(2),
            *mask_strides,
            table.stride(0) if block_table is not None else 0,
            slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
            num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, page_size, key.shape[0],
            float(scale) * LOG2E,
            float(softcap) if softcap > 0 else 1.0, int(window[0]), int(window[1]),
            triton.next_power_of_2(seq_q), triton.next_power_of_2(batch), kv_bucket(seq_kv))
    flags = dict(BLOCK_D=meta["BLOCK_D"], BLOCK_DV=meta["BLOCK_DV"], MERGE_CHUNK=meta["MERGE_CHUNK"],
                 MASK_KIND=mask_kind, CAUSAL=_CAUSAL_CODES[causal], HAS_SEQLENS=cache_seqlens is not None,
                 PAGED=block_table is not None, SOFTCAP=softcap > 0, WINDOW=tuple(window) != (-1, -1),
                 ALIBI=alibi_mode, BATCH_IDX=cache_batch_idx is not None, LEFTPAD=cache_leftpad is not None)
    counts = dict(bytes_read=read, bytes_written=written, flops=flops, unit=unit)
    if tuned is not None:
        record = Launch.tuned(tuned, candidate, grid_for, args, flags, route=route, **counts)
    else:
        record = Launch(_sdpa_decode_kernel, (row_blocks, splits), args,
                        meta=dict(flags, **{name: meta[name] for name in _CONFIG_KEYS}),
                        num_warps=meta["num_warps"], num_stages=meta["num_stages"], **counts)
    return [record], (out, lse)


def sdpa_decode(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                scale: Optional[float] = None, cache_seqlens: Optional[torch.Tensor] = None,
                block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                window: Tuple[int, int] = (-1, -1), alibi_slopes: Optional[torch.Tensor] = None,
                cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
                candidate, route=None, sm_count: Optional[int] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a few query tokens against a KV range; returns (out, lse).

    query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) with Hq % Hkv == 0 (strided views are
    read in place when their last dim is contiguous). attn_mask: bool (True keeps) or float (added),
    broadcastable to (B, Hq, Lq, S). causal: "none", "top_left" (torch SDPA) or "bottom_right" (within each
    sequence's valid length). cache_seqlens: (B,) int valid KV lengths in [1, S] or None (= S).
    block_table: (B, pages) int32/int64 page indices of a paged cache: key (num_pages, Hkv, page_size, D) and
    value (num_pages, Hkv, page_size, Dv), S = pages x page_size (no mask, bottom-right or no causal masking).
    FlashAttention's options, with bottom-right or no causal masking and no mask: softcap > 0 maps each scaled
    score s to softcap * tanh(s / softcap); window (left, right) keeps the keys within left before and right
    after each row's diagonal (-1: unbounded); alibi_slopes (Hq,) or (B, Hq) float32 add slope x key position
    where the causal mask is the only bound (`decode_masking`), -slope x |distance to the diagonal| otherwise;
    cache_batch_idx (B,) reads sequence b from cache row cache_batch_idx[b] (not paged); cache_leftpad (B,)
    makes keys [cache_leftpad[b], L_b) the valid ones, positions counted from the first.
    route: the router's decision (then the launch goes through the autotune bridge); sm_count: the SMs
    the split rule fills (default: the device's).
    Returns out (B, Hq, Lq, Dv) in query's dtype and lse (B, Hq, Lq) float32 in natural log (-inf and a
    zero output for rows that see no key). Inputs are assumed validated by the op layer. Runs exactly the
    record of `sdpa_decode_plan`: one launch.
    """
    plan, outputs = sdpa_decode_plan(query, key, value, attn_mask=attn_mask, causal=causal, scale=scale,
                                     cache_seqlens=cache_seqlens, block_table=block_table, softcap=softcap,
                                     window=window, alibi_slopes=alibi_slopes, cache_batch_idx=cache_batch_idx,
                                     cache_leftpad=cache_leftpad, candidate=candidate, route=route,
                                     sm_count=sm_count)
    launches.run(plan)
    return outputs


def launch_count(request, candidate) -> int:
    """Launches `sdpa_decode` runs for a routed request: one (the merge is folded into the kernel)."""
    return 1


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 candidate, lower_right: bool = False, route=None) -> torch.Tensor:
    """torch SDPA (dropout 0) through the decode kernel: (N..., Hq, Lq, D) or (N, Lq, D) inputs.

    Leading dims of query, key and value must match (the op routes batch broadcasting to torch); the
    KV heads divide the query heads (enable_gqa, or a single KV head that torch broadcasts). lower_right:
    causal masking aligned to the last key (torch's lower-right CausalBias).
    """
    return sdpa_through_decode(sdpa_decode, query, key, value, attn_mask, is_causal, scale, candidate,
                               lower_right=lower_right, route=route)


def flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, *, candidate, route=None):
    """FlashAttention's kv-cache call ((B, S, H, D) layouts, paged or not) through the decode kernel: the
    appends and rotary in torch, the attention in one launch with the softcap, the local window, ALiBi,
    cache_batch_idx and cache_leftpad in the kernel."""
    capacity = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    mask = masking(causal, tuple(window_size), q.shape[1], capacity, alibi_slopes is not None)
    # causal is the window (-1, 0) in FlashAttention: keys right of the diagonal are dropped, not masked by -inf
    window = (mask.left, mask.right) if mask.is_local or mask.is_causal else (-1, -1)

    def attention(*args, **options):
        plan, outputs = sdpa_decode_plan(*args, softcap=softcap, window=window, **options)
        launches.run(plan)
        return outputs

    return kvcache_through_decode(attention, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                  cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal, window_size,
                                  rotary_interleaved, alibi_slopes, candidate=candidate, route=route)


# ---------------------------------------------------------------------------------------------------
# Routing data (read by rlx_triton.router) and the compile audit's kernel list.
# ---------------------------------------------------------------------------------------------------
COVERAGE = Coverage(
    ops=frozenset({"scaled_dot_product_attention", "sdpa_decode", "flash_attn_with_kvcache"}),
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
        # a block table (pages of any size >= 1); requests without one carry no paged feature
        "paged": frozenset({True}),
        # FlashAttention's logits softcap, local window, ALiBi slopes, cache rows and left padding (requests
        # without them carry none of these features)
        "softcap": frozenset({True}),
        "window": frozenset({True}),
        "alibi": frozenset({"per_head", "per_batch_head"}),
        "cache_batch_idx": frozenset({True}),
        "cache_leftpad": frozenset({True}),
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

# Built-in recipe per CUDA device class: the candidate with the widest split cap (split_k 16, 16-row tiles),
# since the split count comes from the device and split_k only bounds it: the rule can then fill the
# SMs at small batch and still takes one split where the batch fills them. A guess from `rlx-triton perf`
# (uncalibrated: no GPU run has measured it), labelled as such in SPEED_EVIDENCE; a winner-table entry
# replaces it. The interpreter and the CPU keep the plan's launch rule.
_WIDEST_SPLITS = SdpaDecodeVariant.LONG_KV_SPLIT16_F16_KV.tag()
RECIPES: dict = {"sm90": _WIDEST_SPLITS, "sm80": _WIDEST_SPLITS, "cuda": _WIDEST_SPLITS}
SPEED_EVIDENCE: dict = {_WIDEST_SPLITS: "estimated by rlx-triton perf (uncalibrated), not measured"}

_AUDIT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "MAX_SPLITS", "MASK_KIND", "CAUSAL", "HAS_SEQLENS",
               "DOT_LOWP", "PAGED", "SOFTCAP", "WINDOW", "ALIBI", "BATCH_IDX", "LEFTPAD", "MERGE_CHUNK")
_SIGNATURE = {name: ("constexpr" if name in _CONSTEXPRS else "i32") for name in _sdpa_decode_kernel.arg_names}
_SIGNATURE.update({"q_ptr": "*{dt}", "k_ptr": "*{dt}", "v_ptr": "*{dt}", "mask_ptr": "*u8", "seqlens_ptr": "*i32",
                   "block_table_ptr": "*i32", "alibi_ptr": "*fp32", "batch_idx_ptr": "*i32", "leftpad_ptr": "*i32",
                   "o_ptr": "*{dt}", "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32",
                   "tickets_ptr": "*i32", "qk_scale": "fp32", "softcap": "fp32"})


def _audit_meta(rows: int, head_dim: int, **options):
    """Constexprs of an audited variant: a bool mask, bottom-right causal masking and cache lengths, with
    `options` (FlashAttention's, which come without a mask) turning features on."""
    def meta(candidate, dt: str) -> dict:
        m = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim, dtype=_AUDIT_DTYPES[dt])
        m.update(MASK_KIND=MASK_NONE if options else MASK_BOOL, CAUSAL=CAUSAL_BOTTOM_RIGHT, HAS_SEQLENS=True,
                 PAGED=False, SOFTCAP=False, WINDOW=False, ALIBI=ALIBI_NONE, BATCH_IDX=False, LEFTPAD=False,
                 stride_mn=1)
        m.update(options)
        return m
    return meta


# what the JIT sees as multiples of 16 in a decode call with head dims of 16 or more: every pointer, the
# strides of q/k/v rows and heads, the head dims; the mask's key stride is 1 (a constexpr to the JIT)
_DIVISIBLE = ("q_ptr", "k_ptr", "v_ptr", "mask_ptr", "seqlens_ptr", "block_table_ptr", "o_ptr", "lse_ptr", "part_o_ptr", "part_lse_ptr",
              "tickets_ptr", "stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_kn", "stride_vb",
              "stride_vh", "stride_vn", "stride_mb", "stride_mh", "stride_ml", "head_dim", "head_dim_v")
_SIGNATURE["stride_mn"] = "constexpr"
_CANDIDATES = tuple(variant.candidate() for variant in SdpaDecodeVariant)
_DEFAULT = SdpaDecodeVariant.DEFAULT.candidate()
AUDIT_KERNELS = [
    # Llama-3-8B decode: 4 query heads per KV head, one token, head dim 128, mask + bottom-right causal
    AuditSpec(name="sdpa_decode_d128", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=4, head_dim=128),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp32", "fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv) and dt != "fp32"),
    # head dim 256 with 16 packed rows (e.g. 8 heads per KV head x 2 tokens)
    AuditSpec(name="sdpa_decode_d256", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=16, head_dim=256),
              candidates=_CANDIDATES, default=_DEFAULT, dtypes=("fp16", "bf16"), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv)),
] + [
    # each option of the paged / FlashAttention path compiled once, on the default candidate in fp16 at the
    # Llama-3-8B decode shape: a variant that adds registers or spills shows here
    AuditSpec(name=f"sdpa_decode_d128_{name}", family="sdpa_decode", kernel=_sdpa_decode_kernel,
              signature=_SIGNATURE, meta=_audit_meta(rows=4, head_dim=128, **options),
              candidates=(_DEFAULT,), default=_DEFAULT, dtypes=("fp16",), divisible=_DIVISIBLE,
              expects_mma=lambda cand, dt: bool(cand.use_f16_kv))
    for name, options in (
        ("paged", dict(PAGED=True)),
        ("window", dict(WINDOW=True)),
        ("softcap", dict(SOFTCAP=True)),
        ("alibi", dict(ALIBI=ALIBI_DISTANCE)),
        ("leftpad_batch_idx", dict(LEFTPAD=True, BATCH_IDX=True, ALIBI=ALIBI_KEY_INDEX)),
    )
]
