"""Split-K decode launches: the split rule (how many programs share the KV range of a block of query
rows), candidate -> meta-parameters, the launch record with its byte and FLOP model, and the autotune
bridge.

`sdpa_decode_plan` builds the one launch of a call from shapes and strides only (meta tensors give the plan
at any shape). With the router's route the launch goes through the autotune bridge
(backends/triton/autotune.py), keyed on the token, batch and KV-length buckets and the head shape; without
one the candidate is launched directly.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import triton

from rlx_triton.backends.torch_ref.flash_attn import decode_masking
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.backends.triton.sdpa_decode.kernels import (ALIBI_DISTANCE, ALIBI_KEY_INDEX, ALIBI_NONE,
                                                            CAUSAL_BOTTOM_RIGHT, CAUSAL_NONE, CAUSAL_TOP_LEFT,
                                                            MASK_BOOL, MASK_FLOAT, MASK_NONE, MASK_TREE,
                                                            MAX_LIFTED_SPLITS, MAX_TREE_TOKENS,
                                                            MAX_MERGE_GROUPS, MERGE_GROUP, _sdpa_decode_kernel)
from rlx_triton.backends.triton.sdpa_decode.routing import APPROVALS
from rlx_triton.devices import occupancy

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

_CAUSAL_CODES = {"none": CAUSAL_NONE, "top_left": CAUSAL_TOP_LEFT, "bottom_right": CAUSAL_BOTTOM_RIGHT}
# the unit that executes the dots with low-precision operands (fp32 operands run on the FMA units)
_DOT_UNITS = {torch.float16: "fp16_mma", torch.bfloat16: "bf16_mma"}


# ---------------------------------------------------------------------------------------------------
# The split rule: how many programs share the KV range of one block of query rows.
# ---------------------------------------------------------------------------------------------------
MIN_FILL = 0.9  # share of the SMs the last wave of a launch should keep busy
MIN_BLOCK_N = 16
# partials a merge reads at once (their loads in flight together; divides MERGE_GROUP) where Dv is at most
# 128; at Dv 256 the tiles of several partials would cost occupancy (sm_90: 168 -> 255 registers), so one
MERGE_CHUNK = 4


def merge_chunk(block_dv: int) -> int:
    """Partials the merge reads at once for Dv tiles of `block_dv`."""
    return MERGE_CHUNK if block_dv <= 128 else 1


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


# The deterministic profile's splits: SPLIT_TILES tiles of BLOCK_N keys each, whatever the batch or the GPU, so
# a sequence's partials and their merge depend on its own length alone. A cache too long for MAX_LIFTED_SPLITS
# such splits takes more tiles per split (a property of the cache's capacity, the same in any batch).
SPLIT_TILES = 16


def fixed_split_tiles(seq_kv: int, block_n: int) -> int:
    """Tiles per split of the deterministic profile for a cache of `seq_kv` keys."""
    return max(SPLIT_TILES, triton.cdiv(triton.cdiv(seq_kv, block_n), MAX_LIFTED_SPLITS))


def programs_per_sm(device: torch.device, *, block_m: int, block_n: int, block_d: int, block_dv: int,
                    element_bytes: int, num_warps: int, lowp: bool, converts_cache: bool = False,
                    paged: bool = False) -> int:
    """Programs of one config resident per SM on the device the router reads facts from (1 where it has no
    CUDA profile), by the occupancy calculator's rules on the config's estimated resources: shared memory =
    the pipeline's K/V stages plus the fp32 output tile the epilogue stages; registers = the per-thread
    budget `_meta` keeps the config within (128 with tensor-core dots on 16 rows, 168 where the loop converts a
    1-byte cache, which ptxas compiles to 135-152 on sm_90, and 200 for a paged one, compiled to 191-196; all 255 with fp32 operands and on the 32-64 rows of
    a draft tree's tokens, which ptxas compiles to 170-255 on sm_90). element_bytes: the cache's."""
    from rlx_triton import devices
    from rlx_triton.router.device import device_facts

    facts = device_facts(device)
    key = (facts.fingerprint, block_m, block_n, block_d, block_dv, element_bytes, num_warps, lowp, converts_cache,
           paged)
    resident = _resident.get(key)
    if resident is None:
        profile = None
        if facts.kind == "cuda" and facts.capability is not None:
            profile = devices.profile_for_name(facts.name) or next(
                (p for p in devices.cuda_profiles() if p.capability == tuple(facts.capability)), None)
        resident = 1
        if profile is not None:
            shared = (NUM_STAGES - 1) * block_n * (block_d + block_dv) * element_bytes + block_m * block_dv * 4
            converting = 200 if paged else 168
            registers = (converting if converts_cache else 128) if lowp and block_m <= 16 else 255
            resident = max(1, occupancy(profile, registers, shared, num_warps).ctas_per_sm)
        _resident[key] = resident
    return resident


_resident: Dict[tuple, int] = {}


# the KV_QUANT constexpr's codes: a float cache, one scale per tensor, one per key row and head
KV_QUANT_NONE, KV_QUANT_PER_TENSOR, KV_QUANT_PER_TOKEN_HEAD = 0, 1, 2


def _kv_quant_args(key: torch.Tensor, value: torch.Tensor, k_scale: Optional[torch.Tensor],
                   v_scale: Optional[torch.Tensor], placeholder: torch.Tensor) -> Tuple[int, torch.Tensor, torch.Tensor,
                                                                                        Tuple[int, ...]]:
    """(KV_QUANT code, k scale pointer, v scale pointer, their 6 strides (b, h, n of each)) of a call: the scales
    of a quantised cache laid out as its rows ((B, Hkv, S) or paged (num_pages, Hkv, page_size)), or a
    placeholder that is never read."""
    if k_scale is None or v_scale is None:
        return KV_QUANT_NONE, placeholder, placeholder, (0,) * 6
    if k_scale.numel() == 1:
        return KV_QUANT_PER_TENSOR, k_scale.reshape(1), v_scale.reshape(1), (0,) * 6
    return KV_QUANT_PER_TOKEN_HEAD, k_scale, v_scale, (*k_scale.stride(), *v_scale.stride())


def _converts_e4m3(device: torch.device) -> bool:
    """Whether the kernel can read an fp8 e4m3 cache as fp8 on `device` (the router's facts): CUDA sm_89 and up
    convert it; older GPUs get its bytes and decode them; the interpreter converts it as numpy does."""
    from rlx_triton.router.device import device_facts

    facts = device_facts(device)
    if facts.kind != "cuda" or facts.capability is None:
        return True
    return tuple(facts.capability) >= (8, 9)


def _deterministic() -> bool:
    """Whether the current precision profile is DETERMINISTIC (batch-invariant decode)."""
    from rlx_triton.planner import PrecisionProfile
    from rlx_triton.router import plans

    return plans.current_profile() is PrecisionProfile.DETERMINISTIC


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
# warps of a tensor-core decode tile: one row of 4 warps across 16 packed query rows; tiles of 32 or 64 rows (a
# draft tree's tokens x the group) take 8, which keeps their accumulator at 16-32 values a thread and their
# K/V tile at 64-128 keys (4 warps: 255 registers and spills on sm_90, or 32-key tiles that double the
# instructions per key; measured with rlx-triton perf)
_LOWP_WARPS = 4
_WIDE_LOWP_WARPS = 8


def _meta(candidate, *, rows: int, head_dim: int, head_dim_v: int, dtype: torch.dtype,
          max_block_n: Optional[int] = None) -> dict:
    """Candidate -> meta-parameters of the kernel.

    split_k -> MAX_SPLITS (the split rule's upper bound where it can fill the GPU); tile_n -> BLOCK_N (at most `max_block_n`, the
    split rule's tile for a short KV range); tile_m -> the least BLOCK_M (packed query rows: at least 16
    for tl.dot, and up to 64 so a whole GQA group x tokens shares one read of K/V); D and Dv -> next
    powers of two (>= 16). use_f16_kv -> fp16/bf16 dot operands for 16-bit inputs (tensor cores); fp32
    operands with ieee precision otherwise (bf16 under the interpreter also takes fp32 operands: the
    interpreter computes on raw bf16 bits). tg_size // 32 -> num_warps for fp32 operands; tensor-core
    tiles of 16 rows take 4 warps (at most tg_size // 32), of 32 or 64 rows 8.
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
    num_warps = warps
    if lowp:
        num_warps = _WIDE_LOWP_WARPS if block_m >= 32 else min(warps, _LOWP_WARPS)
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
    from rlx_triton.backends.candidates import approved_candidates

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

                candidates = approved_candidates(plans.plan_for("sdpa_decode").candidates, APPROVALS, profile)

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
                     tree_mask: Optional[torch.Tensor] = None, k_scale: Optional[torch.Tensor] = None,
                     v_scale: Optional[torch.Tensor] = None, candidate, route=None,
                     sm_count: Optional[int] = None) -> Tuple[List[Launch], Tuple[torch.Tensor, torch.Tensor]]:
    """The launch of `sdpa_decode` as a record, and the (out, lse) buffers it fills.

    Built from shapes and strides only, so meta tensors give the plan at any shape. sm_count: the SMs the
    split rule fills (default: the device's, from the router's device facts). Bytes count every element
    the launch may read once (K and V up to the padded length S: with cache_seqlens the keys past a
    sequence's length are skipped, so the real traffic can be less) and every element it writes, the
    partials written and read back by the merge included; FLOPs are the two dots as the dot units execute
    them (query rows padded to BLOCK_M, head dims to BLOCK_D / BLOCK_DV). A tree mask (Q, Q) or (B, Q, Q) bool
    is read through strides (stride 0 over the batch of a shared one), by the tiles holding the Q newest keys.
    """
    batch, num_heads, seq_q, head_dim = query.shape
    if tree_mask is not None and (attn_mask is not None or causal != "none"):
        raise ValueError("sdpa_decode: a tree_mask replaces attn_mask and causal masking (pass causal='none')")
    if tree_mask is not None and seq_q > MAX_TREE_TOKENS:
        raise ValueError(f"sdpa_decode: the kernel holds tree masks of up to {MAX_TREE_TOKENS} tokens, got {seq_q}")
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
    # the deterministic profile: the candidate's tiles and fixed split boundaries, nothing from the batch or the
    # SM count (no short-KV tile, no split rule, no autotuning)
    deterministic = _deterministic()
    meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype)
    max_block_n = meta["BLOCK_N"] if deterministic else \
        block_n_for_short_kv(sms, heads_blocks * triton.cdiv(rows, meta["BLOCK_M"]), seq_kv, meta["BLOCK_N"])
    if max_block_n < meta["BLOCK_N"]:
        meta = _meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype,
                     max_block_n=max_block_n)
    split_tiles = fixed_split_tiles(seq_kv, meta["BLOCK_N"])

    def grid_for(config: Mapping[str, Any]) -> Tuple[int, int]:
        row_blocks = heads_blocks * triton.cdiv(rows, config["BLOCK_M"])
        if deterministic:
            return row_blocks, triton.cdiv(triton.cdiv(seq_kv, config["BLOCK_N"]), split_tiles)
        resident = programs_per_sm(device, block_m=config["BLOCK_M"], block_n=config["BLOCK_N"],
                                   block_d=meta["BLOCK_D"], block_dv=meta["BLOCK_DV"],
                                   element_bytes=key.element_size(), num_warps=meta["num_warps"],
                                   lowp=config["DOT_LOWP"], converts_cache=narrow_cache,
                                   paged=block_table is not None) if sms > 1 else 1
        if narrow_cache:
            # every resident slot of every SM counts as one place to fill: one program per SM converting a
            # 1-byte cache issues too few instructions per cycle to keep the loads in flight
            return row_blocks, kv_splits(sms * resident, row_blocks, seq_kv, config["BLOCK_N"], config["MAX_SPLITS"])
        return row_blocks, kv_splits(sms, row_blocks, seq_kv, config["BLOCK_N"], config["MAX_SPLITS"], resident)

    narrow_cache = key.element_size() < query.element_size() and sms > 1

    if deterministic:   # every split may be live: the kernel's partial and merge path is compiled in
        meta = dict(meta, MAX_SPLITS=max(meta["MAX_SPLITS"], 2))
    row_blocks, splits = grid_for(meta)
    tuned = None
    if route is not None and route.candidate is not None and not deterministic:
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
    mask_strides: Tuple[int, ...]
    if tree_mask is not None:
        # (B, Q, Q) rows and columns of the tree: the same for every head of a sequence
        tree = (tree_mask if tree_mask.dim() == 3 else tree_mask[None]).expand(batch, seq_q, seq_q)
        mask_kind, mask = MASK_TREE, tree.view(torch.uint8)
        mask_strides = (mask.stride(0), 0, mask.stride(1), mask.stride(2))
    elif attn_mask is None:
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
    # a quantised cache's values are read as stored (one byte each), with their scales
    kv_quant, k_scale, v_scale, scale_strides = _kv_quant_args(key, value, k_scale, v_scale, lse)
    e4m3_bits = key.dtype == torch.float8_e4m3fn and not _converts_e4m3(device)
    if e4m3_bits:   # read as bytes and decoded in the kernel (the views share the cache's memory)
        key, value = key.view(torch.uint8), value.view(torch.uint8)
    read = query.numel() * size + batch * num_kv_heads * seq_kv * (head_dim + head_dim_v) * key.element_size()
    if kv_quant == KV_QUANT_PER_TOKEN_HEAD:
        read += batch * num_kv_heads * seq_kv * 2 * 4
    if attn_mask is not None or tree_mask is not None:
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
            k_scale, v_scale,
            query.stride(0), query.stride(1), query.stride(2),
            key.stride(0), key.stride(1), key.stride(2),
            value.stride(0), value.stride(1), value.stride(2),
            *mask_strides,
            table.stride(0) if block_table is not None else 0,
            slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
            *scale_strides,
            num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, page_size, key.shape[0],
            float(scale) * LOG2E,
            float(softcap) if softcap > 0 else 1.0, int(window[0]), int(window[1]),
            triton.next_power_of_2(seq_q), triton.next_power_of_2(batch), kv_bucket(seq_kv), split_tiles)
    flags = dict(BLOCK_D=meta["BLOCK_D"], BLOCK_DV=meta["BLOCK_DV"], MERGE_CHUNK=meta["MERGE_CHUNK"],
                 FIXED_SPLITS=deterministic, KV_QUANT=kv_quant, KV_E4M3_BITS=e4m3_bits,
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



def launch_count(request, candidate) -> int:
    """Launches `sdpa_decode` runs for a routed request: one (the merge is folded into the kernel)."""
    return 1
