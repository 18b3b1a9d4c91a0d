"""SDPA decode candidates: `SdpaDecodeCandidate`, its named variants and the rules a candidate must pass.

Field -> Triton meta-parameter (CUDA):
- `split_k`: SPLIT_K, the maximum number of KV splits, a fixed grid dimension (grid =
  (batch * kv_heads * query-row blocks, split_k)); each program reduces its share of seq_kv.
- `tg_size`: threads per program; `num_warps = tg_size // 32`.
- `tile_m`: the least BLOCK_M, query rows per program (GQA group x query tokens packed into one
  tile); the launcher raises it to at least 16, the smallest tl.dot tile.
- `tile_n`: BLOCK_N, KV rows loaded per loop iteration.
- `tile_k`: upper-bound hint for BLOCK_D (head_dim is padded to the next power of two anyway).
- `pad_q`, `pad_kv`: sequence padding factors (query / KV length rounded up to a multiple).
- `use_f16_kv`: True -> QK^T and PV dots take fp16/bf16 operands (tensor cores); False -> operands
  upcast to fp32 and the dots use input_precision="ieee" (this family's fp32 candidate, BaseF32).
- `partial_reduce`: True -> two-stage (per-split partials + merge kernel with log-sum-exp); False ->
  single pass when split_k == 1.
num_stages is the launcher's choice (2 on sm_80+, 1 in the interpreter).

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32`, grid = (batch * heads, split_k) threadgroups; `tile_n` keys are staged per
iteration; `partial_reduce` stages partial (max, sum, acc) rows in threadgroup memory (~16 KiB).

Kernel name: `sdpa_decode_m{m}_tok{tokens}_b{batch}_h{num_heads}_d{head_dim}_sq{seq_q}_sk{seq_kv}_<tag>_<profile>`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..policy import (
    ConvertPolicy,
    HybridPrecisionSpec,
    KernelFamily,
    MemoryPolicy,
    PrecisionProfile,
    ScalarType,
    ThreadPolicy,
)
from .base import (
    Candidate,
    FamilySpec,
    LaunchField,
    WordMeaning,
    candidate_dataclass,
    check_staging,
    check_tg_limit,
    check_tg_set,
    define_variants,
    first_error,
    flag_field,
    int_field,
    is_pow2,
)


# the 16-bit dot word: fp32 requests keep fp32 operands whatever the candidate says
SIXTEEN_BIT_OPERANDS = WordMeaning("QK^T and PV dots on fp16/bf16 operands (tensor cores)",
                                   dtypes=("float16", "bfloat16"), otherwise="the kernel keeps fp32 operands")


@candidate_dataclass
class SdpaDecodeCandidate(Candidate):
    """Tagged `skp{}_tg{}_tm{}_tn{}_tk{}_pq{}_pk{}_{f16kv|f32kv}_{partial|full}`; rows persisted before
    the tile and padding fields existed parse with those fields set to 1."""

    split_k: int = int_field("skp", sets=(
        "most KV splits per sequence where that many fill the GPU (grid dim 1; the count comes from the device), "
        "merged by log-sum-exp"))
    tg_size: int = int_field("tg", sets="threads per program, num_warps = tg / 32 (Metal: threads per threadgroup)")
    tile_m: int = int_field("tm", legacy_default=1,
                            sets="query rows per program (GQA group x query tokens; at least 16 for tl.dot)")
    tile_n: int = int_field("tn", legacy_default=1, sets="KV rows loaded per loop iteration (BLOCK_N)")
    tile_k: int = int_field("tk", legacy_default=1,
                            sets="bound on the head-dim block (BLOCK_D; head_dim is padded to a power of two)")
    pad_q: int = int_field("pq", legacy_default=1, sets="query length padded to a multiple of this")
    pad_kv: int = int_field("pk", legacy_default=1, sets="KV length padded to a multiple of this")
    use_f16_kv: bool = flag_field("f16kv", "f32kv", words={
        "f16kv": SIXTEEN_BIT_OPERANDS, "f32kv": "operands upcast to fp32, ieee dots"})
    partial_reduce: bool = flag_field("partial", "full", words={
        "partial": "per-split partial results (Triton: merged by the last split, same launch; Metal: a combine pass)",
        "full": "one pass (when split_k is 1)"})


def _sdpa(split_k, tg_size, tile_m, tile_n, tile_k, use_f16_kv, partial_reduce) -> SdpaDecodeCandidate:
    return SdpaDecodeCandidate(split_k, tg_size, tile_m, tile_n, tile_k, 1, 1, use_f16_kv, partial_reduce)


# The seed's four variants first (their tags are names in winner tables); then two for grouped-query heads
# and long caches:
# 16 packed query rows per program make the dots tensor-core sized, and 16 splits fill an H100's
# 132 SMs when batch * kv_heads is small.
SdpaDecodeVariant = define_variants(
    SdpaDecodeCandidate,
    (
        ("BASE_F32", _sdpa(1, 128, 1, 64, 64, False, False)),
        ("BASE_F16_KV", _sdpa(1, 128, 1, 64, 64, True, False)),
        ("SPLIT_K4_F16_KV", _sdpa(4, 256, 1, 128, 128, True, False)),
        ("PARTIAL_F16_KV", _sdpa(4, 256, 1, 128, 128, True, True)),
        ("PACKED_GQA_F16_KV", _sdpa(4, 128, 16, 64, 128, True, True)),
        ("LONG_KV_SPLIT16_F16_KV", _sdpa(16, 256, 16, 128, 128, True, True)),
    ),
    fp32="BASE_F32",
    default="BASE_F16_KV",
)

FP32_VARIANT = SdpaDecodeVariant.FP32
DEFAULT_VARIANT = SdpaDecodeVariant.DEFAULT  # what choose_default picks under the default (BALANCED) plan

# Approximate threadgroup staging of the decode paths, in bytes (only the memory policy reads them).
PARTIAL_STAGING_BYTES = 16 * 1024
FULL_STAGING_BYTES = 4 * 1024


def validate_candidate(c: SdpaDecodeCandidate, thread_policy: ThreadPolicy, memory_policy: MemoryPolicy) -> Optional[str]:
    def split_k() -> Optional[str]:
        if not (1 <= c.split_k <= 32 and is_pow2(c.split_k)):
            return "split_k must be a power-of-two in [1, 32]"
        return None

    def tiles() -> Optional[str]:
        if c.tile_m == 0 or c.tile_n == 0 or c.tile_k == 0:
            return "tile sizes must be non-zero"
        if c.pad_q == 0 or c.pad_kv == 0:
            return "padding factors must be non-zero"
        if c.tile_m > 1024 or c.tile_n > 1024 or c.tile_k > 4096:
            return "tile sizes exceed supported planner bounds"
        if c.pad_q > 4096 or c.pad_kv > 4096:
            return "padding factors exceed supported planner bounds"
        return None

    def memory() -> Optional[str]:
        staging = PARTIAL_STAGING_BYTES if c.partial_reduce else FULL_STAGING_BYTES
        return check_staging(staging, memory_policy, c.partial_reduce, "partial_reduce requires shared memory staging")

    # checked in this order: the tg_size set, the tiles, the thread policy (the first failure is the error)
    return first_error(
        split_k, lambda: check_tg_set(c.tg_size), tiles, lambda: check_tg_limit(c.tg_size, thread_policy), memory
    )


KV_CACHE_STORAGE = frozenset({ScalarType.F16, ScalarType.BF16, ScalarType.F32})
# caches of one byte per value, which the kernels read with a scale and convert to their compute type on load
QUANTISED_KV_STORAGE = frozenset({ScalarType.F8E4M3, ScalarType.F8E5M2, ScalarType.I8})


def validate_precision(hybrid: HybridPrecisionSpec) -> Optional[str]:
    kv = hybrid.kv_cache
    if kv.storage in QUANTISED_KV_STORAGE and kv.convert is ConvertPolicy.DEQUANT_ON_LOAD:
        if kv.compute not in KV_CACHE_STORAGE:
            return "a quantised kv-cache dequantises on load to F32/F16/BF16"
        return None
    if kv.storage not in KV_CACHE_STORAGE:
        return "sdpa decode requires kv-cache storage in F16/BF16/F32"
    return None


def choose_default(profile: PrecisionProfile, thread_policy: ThreadPolicy, candidates: Sequence[SdpaDecodeCandidate]):
    """The precision rule: f16 KV for ULTRA_LOW_LATENCY/BALANCED, partial reduce for ULTRA_LOW_LATENCY;
    first candidate within the thread policy matching both, else the first matching the KV precision
    (thread policy ignored), else the first candidate."""
    preferred_f16 = profile in (PrecisionProfile.ULTRA_LOW_LATENCY, PrecisionProfile.BALANCED)
    preferred_partial = profile is PrecisionProfile.ULTRA_LOW_LATENCY
    for c in candidates:
        if c.tg_size <= thread_policy.max_threads_per_tg and (c.use_f16_kv, c.partial_reduce) == (
            preferred_f16,
            preferred_partial,
        ):
            return c
    for c in candidates:
        if c.use_f16_kv == preferred_f16:
            return c
    return candidates[0]


def choose_launch(plan: Any, fields: Mapping[str, int]) -> SdpaDecodeCandidate:
    """A conservative heuristic: few tokens or a long cache prefer the first partial-reduce
    candidate of the plan; otherwise the plan default."""
    if fields["tokens"] <= 8 or fields["seq_kv"] > 1024:
        for c in plan.candidates:
            if c.partial_reduce:
                return c
    return plan.default_candidate


def check_launch(fields: Mapping[str, int]) -> Optional[str]:
    kv_heads = fields.get("num_kv_heads")
    if kv_heads is not None and fields["num_heads"] % kv_heads != 0:
        return "num_kv_heads"
    return None


SPEC = FamilySpec(
    family=KernelFamily.SDPA_DECODE,
    variants=SdpaDecodeVariant,
    launch_fields=(
        LaunchField("m", "m", bucket="m_bucket", meaning="query rows per KV head"),
        LaunchField("tokens", "tok", meaning="query tokens: the length the planner buckets on"),
        LaunchField("batch", "b", bucket="batch_bucket", meaning="sequences in the call"),
        LaunchField("num_heads", "h", bucket="heads_bucket", meaning="query heads"),
        LaunchField("head_dim", "d", high=512, bucket="head_dim_bucket", meaning="size of one head of q and k"),
        LaunchField("seq_q", "sq", bucket="seq_q_bucket", error_name="seq_q/seq_kv",
                    meaning="query tokens (1: a decode step)"),
        LaunchField("seq_kv", "sk", bucket="seq_kv_bucket", error_name="seq_q/seq_kv",
                    meaning="tokens in the KV cache"),
        # optional: not part of the kernel name or the shape bucket
        LaunchField("num_kv_heads", required=False,
                    meaning="key/value heads (fewer than num_heads: grouped-query attention)"),
        LaunchField("head_dim_v", high=512, required=False, meaning="size of one head of v"),
    ),
    validate_candidate=validate_candidate,
    validate_precision=validate_precision,
    choose_default=choose_default,
    choose_launch=choose_launch,
    check_launch=check_launch,
    tile_fields=("tile_m", "tile_n", "tile_k"),
    padding_fields=("pad_q", "pad_kv"),
)
