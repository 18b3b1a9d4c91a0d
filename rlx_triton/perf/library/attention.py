"""Models of the attention kernels libraries launch, by their launch rules: FlashAttention 2 (`fa2`), FlashAttention 3
(`fa3`), FlashInfer's decode (`flashinfer`), cuDNN's SDPA (`cudnn`), and what torch's
scaled_dot_product_attention runs (`torch`: its backend choice, then that backend's kernels).

Each model turns an attention shape (batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, page_size) into the
LibraryKernel records (rlx_triton.backends.torch_ref.library_kernel) of the launches the library makes: its tile
sizes and warps per head dim and architecture, its grid, its resident CTAs per SM, the work its tiles really do
(whole tiles: rows past seq_q and keys past seq_kv are computed; causal masking skips the tiles above the diagonal
and computes the diagonal ones whole), the softmax beside the MMAs and whether the kernel hides it, its split-KV
rule and the combine launch that follows, and the prologue each wave of CTAs waits for. rlx_triton.perf.roofline
prices the records with the same constants as the Triton launches.

What the models rest on (each constant below names its source):
- the libraries' own launch code: FA2 csrc/flash_attn/src/flash_fwd_launch_template.h and flash_api.cpp
  (tiles, num_splits_heuristic, seqlenq_ngroups_swapped, the combine kernel), FA3 hopper/tile_size.h and
  hopper/heuristics.h (tiles, pack_gqa, num_splits_heuristic), FlashInfer include/flashinfer/attention/scheduler.cuh
  (the decode split), torch aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (the backend choice), xFormers'
  cutlass kernel_forward.h (torch's memory-efficient kernel);
- instruction throughput from the CUDA C++ Programming Guide (16 exponentials per SM per clock on the SFU, 128
  fp32 lanes) and the device profiles (rlx_triton/devices.py);
- the FA3 paper's own statements (Shah et al., "FlashAttention-3", arXiv 2407.08608): mma.sync, the sm_80
  instruction FA2 runs on Hopper too, reaches about 2/3 of the Hopper tensor cores' peak (§2.2, after Luo et al.'s
  microbenchmarks); the exponentials of the softmax take about half the MMA time at head dim 128 (§3.1).

Not modelled (Unmodelled says so where a shape needs it): fp8 (no device profile states an fp8 tensor rate);
FlashInfer's prefill; FA2's paged KV at page sizes that are not multiples of 256 (FA2 refuses them); FA3 off sm_90.
cuDNN's kernels are closed: its model is a warp-specialised wgmma kernel like FA3's with 128 x 128 tiles, and for a
decode FA3's GQA packing and split rule (which cuDNN's published decode times require), labelled as such in its note.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Mapping, Optional, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.devices import occupancy
from rlx_triton.perf.library import Unmodelled, library_model

ATTENTION_OPS = ("attention_prefill", "attention_decode", "paged_decode")

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "fp8": 1, "fp64": 8}
TENSOR_UNIT = {"fp16": "fp16_mma", "bf16": "bf16_mma"}
# torch dtype names (requests) -> the published format's
FROM_TORCH_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}

# FA3 paper §2.2: "the mma.sync instruction can only reach 2/3 of the peak throughput of the Hopper H100 Tensor
# Cores" (citing Luo et al.'s microbenchmarks), relative to wgmma under the same clocks; on sm_8x it is the native
# tensor-core instruction.
MMA_SYNC_ON_SM90 = 2.0 / 3.0

# The softmax beside the MMAs, per score (one query-key pair of a computed tile), as FA2's and FA3's softmax do it
# (softmax.h): one exp2 on the SFU; on the fp32 pipe one FFMA (scale and subtract the row max), one FMNMX (the row
# max), one FADD (the row sum) and half an F2FP (two scores packed to 16 bits for the P.V MMA), plus the rescale of
# the O accumulator once per KV tile (dv multiplies per row per tile: dv / block_n per score). Each fp32 instruction
# takes one FMA issue slot, so it counts 2 FLOPs at the fp32_fma rate (which counts an FMA as 2).
SOFTMAX_FP32_PER_SCORE = 3.5
FP32_FLOPS_PER_INSTRUCTION = 2

# FA2 does not publish its register counts: a thread holds its share of the O and S accumulators (fp32) plus about
# this many registers for addresses, loop state, the softmax's row max and sum and MMA operand fragments (an
# estimate; it gives FA2's own comments' occupancy: "64 x 64 (96KB smem) ... we can get 2 CTAs per SM" on H100).
FA2_REGISTERS_BESIDE_ACCUMULATORS = 64
MAX_REGISTERS = 255

# FlashInfer's and the combine kernels' small CTAs: registers per thread (an estimate; they hold a few vectors)
SMALL_KERNEL_REGISTERS = 64

# FA3 hopper/heuristics.h num_splits_heuristic: a KV head larger than the L2 it assumes (50 MB) is split even when
# the grid fills the GPU
FA3_ASSUMED_L2 = 50 * 1024 * 1024
# FA2's and FA3's split cap (flash_api.cpp: "num_splits > 128 not supported")
MAX_SPLITS = 128


@dataclass(frozen=True)
class Attention:
    """One attention call's shape, as the published format and the routed requests state it."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool = False
    head_dim_v: Optional[int] = None
    page_size: Optional[int] = None
    local: bool = False        # a sliding window (FA's window_size)
    alibi: bool = False
    softcap: bool = False
    mask: str = "none"         # "none", "bool", "float": an explicit mask tensor (torch SDPA)
    top_left: bool = False     # causal aligned top-left (torch's is_causal) rather than bottom-right (FA's)

    @classmethod
    def of(cls, shape: Mapping[str, int]) -> "Attention":
        page = shape.get("page_size")
        return cls(batch=int(shape["batch"]), heads=int(shape["heads"]), kv_heads=int(shape["kv_heads"]),
                   seq_q=int(shape["seq_q"]), seq_kv=int(shape["seq_kv"]), head_dim=int(shape["head_dim"]),
                   causal=bool(shape.get("causal", 0)), page_size=None if page is None else int(page))

    @property
    def dv(self) -> int:
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    @property
    def group(self) -> int:
        return max(1, self.heads // max(1, self.kv_heads))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_dtype(dtype: str, library: str, allowed=("fp16", "bf16")) -> None:
    if dtype == "fp8":
        raise Unmodelled(f"{library} fp8: no device profile states an fp8 tensor-core rate")
    if dtype not in allowed:
        raise Unmodelled(f"{library} runs {', '.join(allowed)} only, not {dtype}")


def _io_bytes(shape: Attention, size: int) -> Tuple[int, int]:
    """(read, written): q, K and V once each (K and V once per KV head: query heads of a group share them through
    L2), and the output with its fp32 LSE."""
    q = shape.batch * shape.heads * shape.seq_q * shape.head_dim
    kv = shape.batch * shape.kv_heads * shape.seq_kv * (shape.head_dim + shape.dv)
    out = shape.batch * shape.heads * shape.seq_q * shape.dv
    lse = shape.batch * shape.heads * shape.seq_q * 4
    return (q + kv) * size, out * size + lse


def visited_tiles(rows: int, keys: int, block_m: int, block_n: int, causal: bool, *, rows_per_query: int = 1,
                  top_left: bool = False, window_keys: Optional[int] = None) -> Tuple[int, int, int]:
    """(KV tiles visited over all m-blocks, m-blocks, n-blocks) of one head's (rows x keys) score matrix in
    block_m x block_n tiles. Causal masking visits the tiles left of the diagonal and the diagonal ones (whole);
    bottom-right aligned (FlashAttention: query i sees keys <= i + keys - queries) unless top_left (torch's
    is_causal: keys <= i). rows_per_query: packed GQA rows (query heads of a group stacked as rows), which share
    their query's causal bound. window_keys: a local window's reach (the keys each row sees)."""
    m_blocks, n_blocks = _cdiv(rows, block_m), _cdiv(keys, block_n)
    if not causal and window_keys is None:
        return m_blocks * n_blocks, m_blocks, n_blocks
    queries = _cdiv(rows, rows_per_query)
    offset = 0 if top_left else keys - queries
    visited = 0
    for m in range(m_blocks):
        first_query = (m * block_m) // rows_per_query
        last_query = (min((m + 1) * block_m, rows) - 1) // rows_per_query
        high = min(keys, last_query + offset + 1) if causal else keys
        low = 0 if window_keys is None else max(0, first_query + offset - window_keys)
        if high > low:
            visited += _cdiv(high, block_n) - low // block_n
    return visited, m_blocks, n_blocks


def _softmax_side_ops(scores: float, dv: int, block_n: int) -> dict:
    """The softmax beside the MMAs for `scores` computed scores (SOFTMAX_FP32_PER_SCORE)."""
    fp32 = scores * (SOFTMAX_FP32_PER_SCORE + dv / block_n) * FP32_FLOPS_PER_INSTRUCTION
    return {"sfu": float(scores), "fp32_fma": float(fp32)}


def _waves(ctas: int, profile, ctas_per_sm: int) -> int:
    return max(1, _cdiv(ctas, profile.sm_count * max(1, ctas_per_sm)))


def _combine_kernel(library: str, shape: Attention, rows: int, splits: int, size: int, block_m: int,
                    profile) -> LibraryKernel:
    """The launch after a split-KV kernel that merges its fp32 partials (each split's O and LSE) into the output:
    FA2 flash_fwd_splitkv_combine_kernel / FA3 flash_fwd_combine (one CTA per block_m rows, 128 threads); it reads
    every split's LSE, then their O rows scaled by them: two dependent L2 round trips (the partials were just
    written)."""
    rows_total = shape.batch * shape.heads * rows
    ctas = _cdiv(rows_total, block_m)
    per_sm = occupancy(profile, SMALL_KERNEL_REGISTERS, block_m * splits * 4, 4).ctas_per_sm
    return LibraryKernel(
        f"{library} split-KV combine ({splits} splits)", bytes_read=splits * rows_total * (shape.dv + 1) * 4,
        bytes_written=rows_total * shape.dv * size + rows_total * 4, flops=0, unit="fp32_fma",
        chain={"l2_hit": 2}, ctas=ctas, ctas_per_sm=max(1, per_sm),
        note=f"{library}'s combine of {splits} fp32 partials: {ctas} CTAs of {block_m} rows, 128 threads")


# ---------------------------------------------------------------------------------------------------------------
# FlashAttention 2
# ---------------------------------------------------------------------------------------------------------------
def fa2_head_dim(head_dim: int) -> int:
    """The kernel's head dim (flash_api.cpp HEADDIM_SWITCH): 32, 64, 96, 128, 192 or 256."""
    for kernel_dim in (32, 64, 96, 128, 192, 256):
        if head_dim <= kernel_dim:
            return kernel_dim
    raise Unmodelled(f"FA2 takes head dims up to 256, not {head_dim}")


def fa2_forward_tile(head_dim: int, causal: bool, profile) -> Tuple[int, int, int]:
    """(block_m, block_n, warps) of FA2's forward kernel without dropout (flash_fwd_launch_template.h
    run_mha_fwd_hdim*): sm8x (8.6, 8.9) takes smaller tiles for its 100 KB of shared memory; sm80 and sm90 the
    same ones (FA2 runs its sm80 kernels on Hopper)."""
    sm8x = profile.capability[0] == 8 and profile.capability[1] > 0
    if head_dim <= 32:
        return 128, 128, 4
    if head_dim <= 64:
        return 128, 128, 4
    if head_dim <= 96:
        return (64, 64, 4) if sm8x and causal else (128, 64, 4)
    if head_dim <= 128:
        if sm8x:
            return (64, 64, 4) if causal else (128, 32, 4)
        return 128, 64, 4
    if head_dim <= 192:
        return 128, 64, 8
    # hdim 256: 128 x 64 with 8 warps where a CTA may take 2 x 256 x (128 + 128) B of shared memory and an SM holds
    # less than 4 x 256 x (64 + 128) B (A100); else 64 x 64 with 4 warps (H100: "we can get 2 CTAs per SM")
    if profile.shared_per_cta >= 2 * 256 * (128 + 2 * 64) and profile.shared_per_sm < 4 * 256 * (64 + 2 * 64):
        return 128, 64, 8
    return 64, 64, 4


def fa2_split_tile(head_dim: int, splits: int) -> Tuple[int, int, int]:
    """(block_m, block_n, warps) of FA2's split-KV kernel (run_mha_fwd_splitkv_dispatch): block_m 64 always,
    block_n 256 / 128 / 64 by head dim; with one split the block-size-aligned variant (block_n 128 / 64)."""
    if splits <= 1:
        return 64, (128 if head_dim <= 64 else 64), 4
    return 64, (256 if head_dim <= 64 else 128 if head_dim <= 128 else 64), 4


def fa2_num_splits(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = MAX_SPLITS) -> int:
    """FA2's num_splits_heuristic (flash_api.cpp), called with num_sms = 2 x SMs ("we're using 128 threads per
    block"): one split where the grid nearly fills the GPU, else the fewest splits whose wave efficiency
    (waves / ceil(waves)) is within 85% of the best; split counts that give the same blocks per split as one
    fewer are skipped."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(splits: int) -> bool:
        return splits == 1 or _cdiv(num_n_blocks, splits) != _cdiv(num_n_blocks, splits - 1)

    efficiency = []
    for splits in range(1, max_splits + 1):
        if not eligible(splits):
            efficiency.append(0.0)
            continue
        waves = batch_nheads_mblocks * splits / num_sms
        efficiency.append(waves / math.ceil(waves))
    best = max(efficiency, default=0.0)
    for splits in range(1, max_splits + 1):
        if eligible(splits) and efficiency[splits - 1] >= 0.85 * best:
            return splits
    return 1


def fa2_ngroups_swapped(shape: Attention) -> bool:
    """FA2's seqlenq_ngroups_swapped (mha_fwd, mha_fwd_kvcache): one query token, grouped heads, no window, no
    ALiBi, head dim a multiple of 8: q (b, 1, hkv x g, d) is viewed as (b, g, hkv, d), the group becoming the rows
    of one KV head's tile."""
    return (shape.seq_q == 1 and shape.heads > shape.kv_heads and not shape.local and not shape.alibi
            and shape.head_dim % 8 == 0)


def _fa2_ctas_per_sm(block_m: int, block_n: int, warps: int, head_dim: int, dv: int, size: int, profile) -> int:
    threads = 32 * warps
    registers = min(MAX_REGISTERS, (block_m * dv + block_m * block_n) // threads + FA2_REGISTERS_BESIDE_ACCUMULATORS)
    shared = block_m * head_dim * size + block_n * (head_dim + dv) * size   # Q tile, K and V tiles
    return max(1, occupancy(profile, registers, shared, warps).ctas_per_sm)


def fa2(shape: Attention, dtype: str, profile, *, api: str = "fwd", num_splits: int = 0) -> List[LibraryKernel]:
    """FA2's forward launches. api "fwd" (mha_fwd / mha_varlen_fwd, what torch's flash SDPA calls): the split
    heuristic runs, one split takes the plain forward kernel; api "kvcache" (mha_fwd_kvcache): always the split
    kernel (force_split_kernel), which a paged cache needs (pages of a multiple of 256 keys)."""
    _check_dtype(dtype, "FA2")
    if profile.capability is None or profile.capability < (8, 0):
        raise Unmodelled("FA2 needs sm_80 or newer")
    if shape.page_size is not None and shape.page_size % 256:
        raise Unmodelled(f"FA2's paged KV takes pages of a multiple of 256 keys (flash_api.cpp), not "
                         f"{shape.page_size}")
    if shape.page_size is not None:
        api = "kvcache"
    size = DTYPE_BYTES[dtype]
    kernel_dim = fa2_head_dim(max(shape.head_dim, shape.dv))
    swapped = fa2_ngroups_swapped(shape)
    heads = shape.kv_heads if swapped else shape.heads
    rows = shape.group if swapped else shape.seq_q
    work = replace(shape, heads=heads, seq_q=rows, causal=shape.causal and not (shape.seq_q == 1 and not shape.alibi))
    # set_params_splitkv: block_n 256 / 128 / 64 by head dim, m-blocks of 64 rows, 2 x SMs of 128-thread CTAs
    split_block_n = 256 if kernel_dim <= 64 else 128 if kernel_dim <= 128 else 64
    splits = num_splits or fa2_num_splits(shape.batch * heads * _cdiv(rows, 64), 2 * profile.sm_count,
                                          _cdiv(shape.seq_kv, split_block_n))
    split_kernel = splits > 1 or api == "kvcache"
    if split_kernel:
        block_m, block_n, warps = fa2_split_tile(kernel_dim, splits)
    else:
        block_m, block_n, warps = fa2_forward_tile(kernel_dim, work.causal, profile)
    tiles, m_blocks, n_blocks = visited_tiles(rows, shape.seq_kv, block_m, block_n, work.causal,
                                              rows_per_query=shape.group if swapped else 1)
    ctas = m_blocks * shape.batch * heads * (splits if split_kernel else 1)
    scores = shape.batch * heads * tiles * block_m * block_n
    per_sm = _fa2_ctas_per_sm(block_m, block_n, warps, kernel_dim, kernel_dim, size, profile)
    read, written = _io_bytes(shape, size)
    if splits > 1:   # fp32 partials of O and LSE per split instead of the output
        written = splits * shape.batch * shape.heads * shape.seq_q * (shape.dv + 1) * 4
    sm90 = profile.capability[0] >= 9
    efficiency = MMA_SYNC_ON_SM90 if sm90 else 1.0
    kind = "split-KV" if split_kernel else "forward"
    note = (f"FA2 {kind} kernel {block_m}x{block_n}, {warps} warps, head dim {kernel_dim}: grid {m_blocks} m-blocks x "
            f"{shape.batch} x {heads} heads" + (f" x {splits} splits" if split_kernel else "")
            + (" (seqlenq_ngroups_swapped: the GQA group as rows)" if swapped else "")
            + f", {per_sm} CTAs/SM; mma.sync" + (" at 2/3 of the Hopper tensor-core rate (FA3 paper §2.2)" if sm90 else "")
            + "; softmax (exp on the SFU, fp32 scaling/max/sum) not overlapped with the MMAs; one HBM round trip "
            "(Q and the first K tile) before each wave computes")
    kernels = [LibraryKernel(
        f"FA2 {kind} {block_m}x{block_n}", bytes_read=read, bytes_written=written,
        flops=2.0 * scores * (kernel_dim + kernel_dim), unit=TENSOR_UNIT[dtype], ctas=ctas, ctas_per_sm=per_sm,
        efficiency=efficiency, side_ops=_softmax_side_ops(scores, kernel_dim, block_n),
        chain={"hbm": _waves(ctas, profile, per_sm)}, note=note)]
    if splits > 1:
        # flash_fwd_splitkv_combine_kernel: block_m 4 / 8 / 16 rows as the head dim divides 128 / 64
        combine_m = 4 if kernel_dim % 128 == 0 else 8 if kernel_dim % 64 == 0 else 16
        kernels.append(_combine_kernel("FA2", shape, shape.seq_q, splits, size, combine_m, profile))
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# FlashAttention 3 (sm_90)
# ---------------------------------------------------------------------------------------------------------------
def fa3_tile(head_dim: int, dv: int, causal: bool, local: bool, paged_non_tma: bool) -> Tuple[int, int]:
    """(block_m, block_n) of FA3's forward on sm_90 for 16-bit inputs (hopper/tile_size.h tile_size_fwd_sm90)."""
    blockn_128 = causal or local or paged_non_tma
    if head_dim <= 64:
        if dv == 512:
            return 64, 64
        if dv == 256:
            return 128, 96
        return 192, (128 if blockn_128 else 192)
    if head_dim <= 96:
        return 192, (128 if local or paged_non_tma else 144)
    if head_dim <= 128:
        return 128, (128 if blockn_128 else 176)
    if head_dim <= 192:
        return 128, (96 if paged_non_tma or local else 128 if dv <= 128 else 112)
    return 128, (64 if local else 80)


def fa3_num_splits(total_mblocks: int, num_sms: int, num_n_blocks: int, num_m_blocks: int, size_one_kv_head: int,
                   causal_or_local: bool, max_splits: int = MAX_SPLITS) -> int:
    """FA3's num_splits_heuristic (hopper/heuristics.h): where the grid nearly fills the SMs, split only a KV head
    larger than L2 with enough m-blocks to read it twice (never causal); no split for 4 KV blocks or fewer; else
    the fewest splits within 85% of the best wave efficiency."""
    if total_mblocks >= 0.8 * num_sms:
        if size_one_kv_head > FA3_ASSUMED_L2 and num_m_blocks >= num_sms * 2 and not causal_or_local:
            return min(_cdiv(size_one_kv_head, FA3_ASSUMED_L2), max_splits)
        return 1
    if num_n_blocks <= 4:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    efficiency = []
    for splits in range(1, max_splits + 1):
        waves = total_mblocks * splits / num_sms
        efficiency.append(waves / math.ceil(waves))
    best = max(efficiency)
    for splits in range(1, max_splits + 1):
        if efficiency[splits - 1] >= 0.85 * best:
            return splits
    return 1


def fa3_should_pack_gqa(seq_q: int, group: int, block_m: int, varlen_q: bool = False) -> bool:
    """FA3's should_pack_gqa: pack the group's query heads into the rows where unpacked tiles would be less than
    90% as full."""
    if varlen_q:
        return True
    nopack = seq_q / (_cdiv(seq_q, block_m) * block_m)
    pack = seq_q * group / (_cdiv(seq_q * group, block_m) * block_m)
    return nopack < 0.9 * pack


def fa3(shape: Attention, dtype: str, profile, *, num_splits: int = 0, varlen: bool = False) -> List[LibraryKernel]:
    """FA3's forward on sm_90: a persistent warp-specialised kernel (one producer warpgroup loading by TMA, block_m /
    64 consumer warpgroups issuing wgmma), one CTA per SM, softmax overlapped with the MMAs of the other
    warpgroup (ping-pong); then its combine launch where it splits."""
    _check_dtype(dtype, "FA3")
    if profile.arch != "sm_90":
        raise Unmodelled(f"FA3 runs on sm_90 (Hopper) only, not {profile.arch}")
    if max(shape.head_dim, shape.dv) > 256:
        raise Unmodelled(f"FA3 takes head dims up to 256, not {max(shape.head_dim, shape.dv)}")
    size = DTYPE_BYTES[dtype]
    d = _cdiv(shape.head_dim, 8) * 8
    dv = _cdiv(shape.dv, 8) * 8
    causal = shape.causal and shape.seq_q > 1
    paged = shape.page_size is not None
    block_m, block_n = fa3_tile(d, dv, causal, shape.local, False)
    # get_pagedkv_tma: pages go through TMA only where page_size % block_n == 0 and the packed rows exceed one tile;
    # otherwise each thread gathers its rows (paged_kv_non_TMA), which changes the tile
    paged_non_tma = shape.page_size is not None and not (shape.page_size % block_n == 0
                                                         and shape.seq_q * shape.group > block_m)
    if paged_non_tma:
        block_m, block_n = fa3_tile(d, dv, causal, shape.local, True)
    packed_rows = shape.seq_q * shape.group
    n_blocks = _cdiv(shape.seq_kv, block_n)
    m_blocks_packed = _cdiv(packed_rows, block_m)
    kv_head_bytes = shape.seq_kv * (d + dv) * size
    # the heuristic counted in packed m-blocks (batch x kv_heads): a split kernel always packs the group
    # (get_pack_gqa), so those are the CTAs the splits multiply
    grouped = shape.kv_heads if shape.heads != shape.kv_heads else shape.heads
    splits = num_splits or fa3_num_splits(shape.batch * grouped * m_blocks_packed, profile.sm_count, n_blocks,
                                          m_blocks_packed, kv_head_bytes, causal or shape.local)
    pack = (paged_non_tma or splits > 1 or varlen
            or (shape.heads != shape.kv_heads and fa3_should_pack_gqa(shape.seq_q, shape.group, block_m)))
    heads = shape.kv_heads if pack else shape.heads
    rows = packed_rows if pack else shape.seq_q
    tiles, m_blocks, _ = visited_tiles(rows, shape.seq_kv, block_m, block_n, causal,
                                       rows_per_query=shape.group if pack else 1)
    work_units = shape.batch * heads * m_blocks * splits
    scores = shape.batch * heads * tiles * block_m * block_n
    read, written = _io_bytes(shape, size)
    if splits > 1:
        written = splits * shape.batch * shape.heads * shape.seq_q * (shape.dv + 1) * 4
    consumers = block_m // 64
    note = (f"FA3 {block_m}x{block_n} (hopper/tile_size.h), {consumers} wgmma warpgroups + 1 TMA producer, 1 CTA/SM, "
            f"persistent over {work_units} tiles ({m_blocks} m-blocks x {shape.batch} x {heads} heads"
            + (" packed GQA" if pack else "") + (f" x {splits} splits" if splits > 1 else "")
            + (", pages gathered by the threads (not TMA)" if paged_non_tma else "")
            + "); wgmma at the sustained tensor-core rate; the softmax's fp32 work hidden by the ping-pong of "
            "warpgroups, its exponentials on the SFU left on the critical path (the FA3 paper's published rates at "
            "head dims 64 / 128 / 256 sit about one SFU exponential per score below the wgmma rate); one HBM round "
            "trip before each wave")
    kernels = [LibraryKernel(
        f"FA3 forward {block_m}x{block_n}", bytes_read=read, bytes_written=written,
        flops=2.0 * scores * (d + dv), unit=TENSOR_UNIT[dtype], ctas=work_units, ctas_per_sm=1, efficiency=1.0,
        side_ops={"sfu": float(scores)}, chain={"hbm": _waves(work_units, profile, 1)}, note=note)]
    if splits > 1:
        kernels.append(_combine_kernel("FA3", shape, shape.seq_q, splits, size, 16 if dv <= 128 else 8, profile))
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer decode
# ---------------------------------------------------------------------------------------------------------------
FLASHINFER_STAGES = 2   # decode.cuh: num_stages_smem


def flashinfer_decode(shape: Attention, dtype: str, profile) -> List[LibraryKernel]:
    """FlashInfer's BatchDecodeWithPagedKVCache on the CUDA cores (its default for small groups): one CTA per
    (sequence chunk, KV head) of bdx x bdy x bdz threads (bdx = head_dim / 8 lanes of 16 B, bdy = the GQA group,
    bdz filling 128 threads), cp.async double-buffered. plan() splits the KV (scheduler.cuh): no split where
    batch x kv_heads fills max_grid_size = resident CTAs per SM x SMs, else the fewest pages per chunk (binary
    search) whose chunks x kv_heads fit it, then a merge launch (VariableLengthMergeStates)."""
    _check_dtype(dtype, "FlashInfer decode")
    if shape.seq_q != 1:
        raise Unmodelled("FlashInfer's decode takes one query token per sequence (its prefill kernels are not modelled)")
    size = DTYPE_BYTES[dtype]
    page = shape.page_size or 1
    bdx = max(1, shape.head_dim * size // 16)
    bdy = shape.group
    threads = max(128, bdx * bdy)
    bdz = max(1, threads // (bdx * bdy))
    tokens_per_iteration = bdy * bdz * (1 if shape.group > 1 else 8 if size > 1 else 2)
    shared = FLASHINFER_STAGES * tokens_per_iteration * (shape.head_dim + shape.dv) * size
    warps = _cdiv(bdx * bdy * bdz, 32)
    per_sm = max(1, occupancy(profile, SMALL_KERNEL_REGISTERS, shared, warps).ctas_per_sm)
    max_grid = per_sm * profile.sm_count
    pages = _cdiv(shape.seq_kv, page)
    if shape.batch * shape.kv_heads >= max_grid:
        chunk_pages, chunks = pages, shape.batch
    else:
        low, high = 1, max(1, pages)
        while low < high:   # PartitionPagedKVCacheBinarySearchMinNumPagePerBatch
            mid = (low + high) // 2
            if shape.batch * _cdiv(pages, mid) * shape.kv_heads > max_grid:
                low = mid + 1
            else:
                high = mid
        chunk_pages, chunks = low, shape.batch * _cdiv(pages, low)
    ctas = chunks * shape.kv_heads
    read, written = _io_bytes(shape, size)
    read += shape.batch * pages * 4   # the page indices
    split = chunks > shape.batch
    if split:
        written = chunks * shape.heads * (shape.dv + 1) * 4
    flops = 2.0 * shape.batch * shape.heads * shape.seq_kv * (shape.head_dim + shape.dv)
    kernels = [LibraryKernel(
        "FlashInfer batch decode", bytes_read=read, bytes_written=written, flops=flops, unit="fp32_fma",
        ctas=ctas, ctas_per_sm=per_sm,
        side_ops={"sfu": float(shape.batch * shape.heads * shape.seq_kv)},
        chain={"hbm": 2 * _waves(ctas, profile, per_sm)},
        note=(f"FlashInfer decode (CUDA cores): {ctas} CTAs = {chunks} chunks of {chunk_pages} pages of {page} x "
              f"{shape.kv_heads} KV heads, {bdx}x{bdy}x{bdz} threads, {per_sm} CTAs/SM (max_grid_size {max_grid}); "
              "the page indices then the first KV tile: two HBM round trips before each wave"))]
    if split:
        rows = shape.batch * shape.heads
        kernels.append(LibraryKernel(
            "FlashInfer merge states", bytes_read=chunks * shape.heads * (shape.dv + 1) * 4,
            bytes_written=rows * shape.dv * size, ctas=rows, ctas_per_sm=8, chain={"l2_hit": 2},
            note=f"VariableLengthMergeStates of {chunks // shape.batch} chunks per sequence, one CTA per (sequence, head)"))
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# cuDNN SDPA
# ---------------------------------------------------------------------------------------------------------------
CUDNN_TILE = (128, 128)   # assumption: cuDNN's kernels are closed; 128 x 128 tiles as its sm90 benchmarks describe
# A decode (a few query rows): cuDNN's launch rules are not public, but the published decode times (cudnn-frontend's
# decode sweep on an H200: b1 h64/8 kv32k reads 134 MB in 41 us, 3.3 TB/s) rule out one CTA per query head over
# the whole KV: it must share KV tiles across the GQA group and split the KV to fill the SMs. Modelled so, with
# FA3's rules for both (packed group rows in 64-row tiles, FA3's num_splits_heuristic, a combine launch).
CUDNN_DECODE_TILE = (64, 128)
CUDNN_DECODE_MAX_ROWS = 64


def cudnn(shape: Attention, dtype: str, profile) -> List[LibraryKernel]:
    """cuDNN's SDPA forward (the graph torch builds for its cuDNN backend). Its kernels are closed: on sm_90 modelled
    as a warp-specialised wgmma kernel like FA3's (128 x 128 tiles, 3 warpgroups, 1 CTA/SM, softmax hidden but its
    exponentials), on sm_8x as an mma.sync kernel with the softmax beside the MMAs; one CTA per (m-block, batch,
    head); a decode packs the group and splits the KV (CUDNN_DECODE_TILE); an explicit mask (bias) is read once per
    batch."""
    _check_dtype(dtype, "cuDNN SDPA")
    if profile.capability is None or profile.capability < (8, 0):
        raise Unmodelled("cuDNN's fused SDPA needs sm_80 or newer")
    if shape.head_dim % 8 or shape.dv % 8 or max(shape.head_dim, shape.dv) > 256:
        raise Unmodelled(f"cuDNN SDPA takes head dims that are multiples of 8 up to 256, not {shape.head_dim}")
    size = DTYPE_BYTES[dtype]
    causal = shape.causal and not (shape.seq_q == 1 and not shape.top_left)
    decode = shape.seq_q * shape.group <= CUDNN_DECODE_MAX_ROWS
    splits, heads, rows, per_query = 1, shape.heads, shape.seq_q, 1
    if decode:
        block_m, block_n = CUDNN_DECODE_TILE
        heads, rows, per_query = shape.kv_heads, shape.seq_q * shape.group, shape.group
        n_blocks = _cdiv(shape.seq_kv, block_n)
        splits = fa3_num_splits(shape.batch * heads, profile.sm_count, n_blocks, 1,
                                shape.seq_kv * (shape.head_dim + shape.dv) * size, False)
    else:
        block_m, block_n = CUDNN_TILE
    tiles, m_blocks, _ = visited_tiles(rows, shape.seq_kv, block_m, block_n, causal, rows_per_query=per_query,
                                       top_left=shape.top_left)
    ctas = m_blocks * shape.batch * heads * splits
    scores = shape.batch * heads * tiles * block_m * block_n
    d, dv = _cdiv(shape.head_dim, 16) * 16, _cdiv(shape.dv, 16) * 16
    read, written = _io_bytes(shape, size)
    if shape.mask != "none":
        read += shape.batch * shape.seq_q * shape.seq_kv * size
    if splits > 1:
        written = splits * shape.batch * shape.heads * shape.seq_q * (shape.dv + 1) * 4
    hopper = profile.capability[0] >= 9
    if hopper:
        side, per_sm = {"sfu": float(scores)}, 1
        how = "wgmma, softmax hidden but its SFU exponentials (as FA3)"
    else:
        side = _softmax_side_ops(scores, dv, block_n)
        per_sm = max(1, occupancy(profile, MAX_REGISTERS, (block_m * d + block_n * (d + dv)) * size, 4).ctas_per_sm)
        how = "mma.sync, softmax beside the MMAs"
    kernels = [LibraryKernel(
        "cuDNN SDPA forward", bytes_read=read, bytes_written=written, flops=2.0 * scores * (d + dv),
        unit=TENSOR_UNIT[dtype], ctas=ctas, ctas_per_sm=per_sm, efficiency=1.0, side_ops=side,
        chain={"hbm": _waves(ctas, profile, per_sm)},
        note=(f"cuDNN SDPA (closed kernels; modelled as {block_m}x{block_n} tiles, {how}): {ctas} CTAs = {m_blocks} "
              f"m-blocks x {shape.batch} x {heads} heads" + (" (GQA group packed)" if decode else "")
              + (f" x {splits} KV splits (as FA3's rule)" if splits > 1 else "")))]
    if splits > 1:
        kernels.append(_combine_kernel("cuDNN", shape, shape.seq_q, splits, size, 16, profile))
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# torch's own SDPA backends beside flash and cuDNN: memory-efficient (cutlass) and math
# ---------------------------------------------------------------------------------------------------------------
def mem_efficient(shape: Attention, dtype: str, profile) -> List[LibraryKernel]:
    """torch's memory-efficient SDPA (xFormers' cutlass kernel_forward.h): 64 x 64 tiles (32 x 128 past head dim
    128), 4 warps, mma.sync tensor cores for fp16/bf16 and three TF32 products per fp32 product for fp32
    (OpMultiplyAddFastF32, sm80+); softmax beside the MMAs; a mask (bias) tile read per KV tile; no split-KV."""
    if dtype not in ("fp16", "bf16", "fp32"):
        raise Unmodelled(f"torch's memory-efficient SDPA takes fp16, bf16 or fp32, not {dtype}")
    size = DTYPE_BYTES[dtype]
    block_m, block_n = (64, 64) if max(shape.head_dim, shape.dv) <= 128 else (32, 128)
    tiles, m_blocks, _ = visited_tiles(shape.seq_q, shape.seq_kv, block_m, block_n, shape.causal,
                                       top_left=shape.top_left)
    ctas = m_blocks * shape.batch * shape.heads
    scores = shape.batch * shape.heads * tiles * block_m * block_n
    read, written = _io_bytes(shape, size)
    if shape.mask != "none":
        read += shape.batch * shape.seq_q * shape.seq_kv * size
    unit = TENSOR_UNIT.get(dtype, "tf32x3")
    shared = (block_m * shape.head_dim + block_n * (shape.head_dim + shape.dv)) * size
    per_sm = max(1, occupancy(profile, 128, shared, 4).ctas_per_sm)
    sm90 = profile.capability[0] >= 9
    return [LibraryKernel(
        "torch memory-efficient attention", bytes_read=read, bytes_written=written,
        flops=2.0 * scores * (shape.head_dim + shape.dv), unit=unit, ctas=ctas, ctas_per_sm=per_sm,
        efficiency=MMA_SYNC_ON_SM90 if sm90 else 1.0, side_ops=_softmax_side_ops(scores, shape.dv, block_n),
        chain={"hbm": _waves(ctas, profile, per_sm)},
        note=(f"cutlass memory-efficient attention {block_m}x{block_n}, 4 warps, {ctas} CTAs, {per_sm} CTAs/SM, "
              f"{unit} by mma.sync" + (" at 2/3 of the Hopper rate" if sm90 else "") + ", softmax beside the MMAs"))]


def elementwise(name: str, elements_read: float, elements_written: float, size: int, note: str = "",
                read_size: Optional[int] = None) -> LibraryKernel:
    """One of torch's elementwise or reduction kernels: its tensors read and written once, at the bandwidth (its
    grid fills the GPU); the launch latency is what a small one costs."""
    return LibraryKernel(name, bytes_read=int(elements_read * (read_size or size)),
                         bytes_written=int(elements_written * size), note=note or "torch elementwise kernel")


def batched_matmul(name: str, batch: int, m: int, n: int, k: int, size: int, unit: str, profile,
                   note: str = "") -> LibraryKernel:
    """A cuBLAS batched GEMM (torch.matmul / einsum): A, B and C once each; the FLOPs on `unit` (fp32 without TF32
    on the CUDA cores: torch's default allow_tf32=False for matmul), whole 128 x 128 output tiles; its grid of
    batch x tiles fills the GPU or leaves SMs idle. Modelled by its bytes, tiles and FLOPs only, not cuBLAS's
    kernel choice."""
    tile = 128
    ctas = batch * _cdiv(m, tile) * _cdiv(n, tile)
    # cuBLAS splits the reduction (split-K / stream-K kernels) where the output tiles leave SMs idle, in slices of
    # at least 256 of k; the fp32 partials are a few KB, their reduction not counted
    splits = max(1, min(_cdiv(profile.sm_count, ctas), _cdiv(k, 256)))
    padded_m = _cdiv(m, 16) * 16 if unit in TENSOR_UNIT.values() else m
    return LibraryKernel(name, bytes_read=batch * (m * k + k * n) * size, bytes_written=batch * m * n * size,
                         flops=2.0 * batch * padded_m * n * k, unit=unit, ctas=ctas * splits, ctas_per_sm=1,
                         chain={"hbm": 1}, note=note or (f"cuBLAS batched GEMM {batch} x ({m} x {k}) @ ({k} x {n}), "
                                                         f"{ctas} output tiles" + (f" x {splits} K splits" if splits > 1 else "")))


def math_sdpa(shape: Attention, dtype: str, profile) -> List[LibraryKernel]:
    """torch's math SDPA (_scaled_dot_product_attention_math): q and k each scaled by sqrt(scale), K and V repeated
    for GQA (repeat_interleave), Q.K^T and P.V as batched GEMMs, the mask added, _safe_softmax, all materialised
    in the input dtype."""
    size = DTYPE_BYTES.get(dtype, 4)
    unit = TENSOR_UNIT.get(dtype, "fp32_fma")
    b, h, sq, sk = shape.batch, shape.heads, shape.seq_q, shape.seq_kv
    kernels = []
    if shape.heads != shape.kv_heads:
        for which in ("key", "value"):
            kernels.append(elementwise(f"math SDPA repeat_interleave {which}", b * shape.kv_heads * sk * shape.head_dim,
                                       b * h * sk * shape.head_dim, size))
    kernels += [elementwise("math SDPA q * sqrt(scale)", b * h * sq * shape.head_dim, b * h * sq * shape.head_dim, size),
                elementwise("math SDPA k * sqrt(scale)", b * h * sk * shape.head_dim, b * h * sk * shape.head_dim, size),
                batched_matmul("math SDPA Q.K^T", b * h, sq, sk, shape.head_dim, size, unit, profile)]
    if shape.causal or shape.mask != "none":
        kernels.append(elementwise("math SDPA mask add", 2 * b * h * sq * sk, b * h * sq * sk, size))
    kernels += [elementwise("math SDPA _safe_softmax", b * h * sq * sk, b * h * sq * sk, size),
                batched_matmul("math SDPA P.V", b * h, sq, shape.dv, sk, size, unit, profile)]
    return kernels


# ---------------------------------------------------------------------------------------------------------------
# what torch.nn.functional.scaled_dot_product_attention runs
# ---------------------------------------------------------------------------------------------------------------
# sdp_utils.cpp check_prefer_cudnn_attention: cuDNN first on sm90 / sm100 with cuDNN > 9.15 (torch's CUDA-13 wheels
# from 2.10 bundle cuDNN 9.15.1 or newer; 2.12 / 2.13 +cu130 pin nvidia-cudnn-cu13 9.20); flash first elsewhere
TORCH_PREFERS_CUDNN_ON = ((9, 0), (10, 0))
# check_cudnn_tensor_shapes: head dims up to 256 only with cuDNN > 9.22 (and frontend >= 1.24); the 9.20 torch
# bundles allows 128
TORCH_CUDNN_MAX_HEAD_DIM = 128
CUDNN_MAX_BATCH_OR_HEADS = 65535


def torch_sdpa_backend(shape: Attention, dtype: str, profile, *, dropout: bool = False, layout: str = "batched") -> Tuple[str, str]:
    """(backend, why) torch's select_sdp_backend picks (sdp_utils.cpp): cuDNN > flash > memory-efficient > math on
    sm90/sm100 (check_prefer_cudnn_attention), flash > memory-efficient > math elsewhere (cuDNN after math, so never)."""
    half = dtype in ("fp16", "bf16")
    fused_layout = layout == "batched"
    cudnn_ok = (half and fused_layout and shape.seq_kv != 1 and shape.head_dim % 8 == 0 and shape.dv % 8 == 0
                and max(shape.head_dim, shape.dv) <= TORCH_CUDNN_MAX_HEAD_DIM
                and max(shape.batch, shape.heads) <= CUDNN_MAX_BATCH_OR_HEADS)
    flash_ok = (half and fused_layout and shape.mask == "none" and shape.head_dim == shape.dv
                and shape.head_dim <= 256 and profile.capability >= (8, 0)
                and not (shape.causal and shape.seq_q != shape.seq_kv))
    alignment = 8 if half else 4
    mem_ok = (dtype in ("fp16", "bf16", "fp32") and fused_layout and shape.head_dim % alignment == 0
              and shape.dv % alignment == 0)
    if profile.capability in TORCH_PREFERS_CUDNN_ON and cudnn_ok:
        return "cudnn", "cuDNN first on sm90 (torch's bundled cuDNN > 9.15)"
    if flash_ok:
        return "flash", "flash: no mask, fp16/bf16, equal head dims <= 256"
    if mem_ok:
        return "efficient", "memory-efficient: " + ("a mask" if shape.mask != "none" else
                                                    "fp32" if not half else "flash refused the shape")
    return "math", "math: no fused backend takes it"


def torch_sdpa(shape: Attention, dtype: str, profile, *, dropout: bool = False, layout: str = "batched") -> List[LibraryKernel]:
    """The kernels torch's SDPA launches: its backend's, plus the boolean mask's conversion to an additive bias the
    cuDNN and memory-efficient paths make (convert_boolean_attn_mask)."""
    backend, why = torch_sdpa_backend(shape, dtype, profile, dropout=dropout, layout=layout)
    size = DTYPE_BYTES.get(dtype, 4)
    kernels: List[LibraryKernel] = []
    if shape.mask == "bool" and backend in ("cudnn", "efficient", "math"):
        elements = shape.batch * shape.seq_q * shape.seq_kv
        kernels.append(elementwise("SDPA bool mask -> additive bias", elements, elements, size, read_size=1))
    chosen = {"cudnn": lambda: cudnn(shape, dtype, profile), "flash": lambda: fa2(shape, dtype, profile, api="fwd"),
              "efficient": lambda: mem_efficient(shape, dtype, profile),
              "math": lambda: math_sdpa(shape, dtype, profile)}[backend]()
    chosen[0] = replace(chosen[0], note=f"torch SDPA -> {why}. {chosen[0].note}")
    return kernels + chosen


# ---------------------------------------------------------------------------------------------------------------
# registered models (the published format's ops and impls)
# ---------------------------------------------------------------------------------------------------------------
def _published(op: str, shape: Mapping[str, int]) -> Attention:
    parsed = Attention.of(shape)
    if op != "paged_decode":
        parsed = replace(parsed, page_size=None)
    return parsed


def _register(op: str) -> None:
    @library_model(op, "fa2")
    def fa2_model(shape, dtype, profile):
        parsed = _published(op, shape)
        # a decode is measured through flash_attn_with_kvcache (the split kernel), a prefill through flash_attn_func
        return fa2(parsed, dtype, profile, api="fwd" if op == "attention_prefill" else "kvcache")

    @library_model(op, "fa3")
    def fa3_model(shape, dtype, profile):
        return fa3(_published(op, shape), dtype, profile)

    @library_model(op, "cudnn")
    def cudnn_model(shape, dtype, profile):
        parsed = _published(op, shape)
        kernels = []
        if parsed.page_size is not None:
            kernels.append(page_gather(parsed, dtype))
        return kernels + cudnn(replace(parsed, page_size=None), dtype, profile)

    @library_model(op, "torch")
    def torch_model(shape, dtype, profile):
        parsed = _published(op, shape)
        kernels = []
        if parsed.page_size is not None:   # torch's SDPA takes no page table: the pages are gathered first
            kernels.append(page_gather(parsed, dtype))
        return kernels + torch_sdpa(replace(parsed, page_size=None), dtype, profile)

    if op != "attention_prefill":
        @library_model(op, "flashinfer")
        def flashinfer_model(shape, dtype, profile):
            return flashinfer_decode(_published(op, shape), dtype, profile)


def page_gather(shape: Attention, dtype: str) -> LibraryKernel:
    """Gathering a paged K and V into contiguous memory (torch indexing by the block table): read and written once."""
    size = DTYPE_BYTES.get(dtype, 4)
    elements = shape.batch * shape.kv_heads * shape.seq_kv * (shape.head_dim + shape.dv)
    return elementwise("gather K and V pages", elements, elements, size, note="index the pages by the block table")


for _op in ATTENTION_OPS:
    _register(_op)
