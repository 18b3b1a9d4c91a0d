"""Ragged ("varlen") attention candidates: one launch over a batch of packed prefill chunks and decodes.

Field -> Triton meta-parameter (CUDA):
- `block_m`: BLOCK_M, packed query rows per program: BLOCK_Q = BLOCK_M // group query tokens of one
  sequence times the `group` query heads sharing one KV head (GQA/MQA packed into the rows of tl.dot);
  the launcher raises it to the next power of two of the group, and to at least 16 (the smallest tl.dot
  tile). Grid = (total_q // BLOCK_Q + num_seqs, num_kv_heads): bounded from shapes, no host sync.
- `block_n`: BLOCK_N, keys per loop iteration.
- `tg_size`: threads per program; `num_warps = tg_size // 32`.
- `stages`: `num_stages` of the K/V loop (1 in the interpreter).
- `use_f16_dot`: True -> QK^T and PV dots take fp16/bf16 operands (tensor cores) for 16-bit inputs;
  False -> operands upcast to fp32 and the dots use input_precision="ieee" (the fp32 candidate).
  fp32 inputs always take fp32 operands with ieee precision.

Metal: no shader (the Metal backend's coverage refuses the family by name).

Kernel name: `varlen_attention_tok{total_q}_b{num_seqs}_h{num_heads}_d{head_dim}_sq{max_seqlen_q}_sk{max_seqlen_k}_<tag>_<profile>`.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..policy import HybridPrecisionSpec, KernelFamily, MemoryPolicy, PrecisionProfile, ThreadPolicy
from . import base


@base.candidate_dataclass
class VarlenAttentionCandidate(base.Candidate):
    """Tagged e.g. `bm64_bn64_tg128_ns3_f16dot`."""

    block_m: int = base.int_field("bm", sets="packed query rows per program (query tokens x GQA group; at least 16 "
                                             "for tl.dot)")
    block_n: int = base.int_field("bn", sets="keys loaded per loop iteration (BLOCK_N)")
    tg_size: int = base.int_field("tg", sets="threads per program, num_warps = tg / 32")
    stages: int = base.int_field("ns", sets="software-pipelining depth of the K/V loop (num_stages)")
    use_f16_dot: bool = base.flag_field("f16dot", "f32dot", words={
        "f16dot": base.WordMeaning("QK^T and PV dots on fp16/bf16 operands (tensor cores)",
                                   dtypes=("float16", "bfloat16"), otherwise="the kernel keeps fp32 operands"),
        "f32dot": "operands upcast to fp32, ieee dots"})


# 16 packed rows for decodes (a GQA group of 4-16 heads x 1-4 tokens), 64 or 128 for prefill chunks
VarlenAttentionVariant = base.define_variants(
    VarlenAttentionCandidate,
    (
        ("BASE_F32", VarlenAttentionCandidate(16, 32, 128, 1, False)),
        ("DECODE_F16", VarlenAttentionCandidate(16, 32, 128, 2, True)),
        ("PREFILL_F16", VarlenAttentionCandidate(64, 64, 128, 3, True)),
        # one stage: 8 warps at 219-255 registers run one CTA per SM whatever the depth, and the deeper
        # pipeline only held registers and shared memory (rlx-triton perf: prefill-4k 286.7 -> 274.4 us on an
        # H200, 643.6 -> 596.0 us on an A100, where the paged variant also stops spilling)
        ("PREFILL_M128_F16", VarlenAttentionCandidate(128, 64, 256, 1, True)),
    ),
    fp32="BASE_F32",
    default="DECODE_F16",
)

FP32_VARIANT = VarlenAttentionVariant.FP32
DEFAULT_VARIANT = VarlenAttentionVariant.DEFAULT

# query tokens per sequence up to which a launch takes the decode-sized candidate
DECODE_TOKENS = 16


def staging_bytes(c: VarlenAttentionCandidate) -> int:
    """One pipeline stage of K and V tiles at head dim 128 in 16-bit elements."""
    return c.block_n * 2 * 128 * 2


validate_candidate = base.tiled_rules({"block_m": (16, 128), "block_n": (16, 128)}, staging_bytes,
                                      base.pipelined, base.PIPELINE_NEEDS_SHARED)


def validate_precision(hybrid: HybridPrecisionSpec) -> Optional[str]:
    return None   # the dots accumulate in fp32 whatever the operands


def choose_default(profile: PrecisionProfile, thread_policy: ThreadPolicy, candidates: Sequence[Any]) -> Any:
    """16-bit dot operands for ULTRA_LOW_LATENCY and BALANCED, fp32 operands otherwise: the first candidate
    within the thread policy with the preferred operands, else the first with them, else the first."""
    preferred = profile in (PrecisionProfile.ULTRA_LOW_LATENCY, PrecisionProfile.BALANCED)
    for fits in (True, False):
        for c in candidates:
            if c.use_f16_dot == preferred and (not fits or c.tg_size <= thread_policy.max_threads_per_tg):
                return c
    return candidates[0]


def choose_launch(plan: Any, fields: Mapping[str, int]) -> Any:
    """Decode-shaped launches (at most DECODE_TOKENS query tokens per sequence) take the plan's first 16-row
    candidate with the default's dot operands, longer ones its first 64-row one; else the plan default."""
    default = plan.default_candidate
    rows = 16 if fields["seq_q"] <= DECODE_TOKENS else 64
    for c in plan.candidates:
        if c.block_m == rows and c.use_f16_dot == default.use_f16_dot:
            return c
    return default


def check_launch(fields: Mapping[str, int]) -> Optional[str]:
    kv_heads = fields.get("num_kv_heads")
    if kv_heads is not None and fields["num_heads"] % kv_heads != 0:
        return "num_kv_heads"
    return None


SPEC = base.FamilySpec(
    family=KernelFamily.VARLEN_ATTENTION,
    variants=VarlenAttentionVariant,
    launch_fields=(
        base.LaunchField("tokens", "tok", meaning="query tokens of all sequences together (total_q)"),
        base.LaunchField("batch", "b", bucket="batch_bucket", meaning="sequences in the call"),
        base.LaunchField("num_heads", "h", bucket="num_heads_bucket", meaning="query heads"),
        base.LaunchField("head_dim", "d", high=512, bucket="head_dim_bucket", meaning="size of one head of q and k"),
        base.LaunchField("seq_q", "sq", bucket="seq_q_bucket", error_name="seq_q/seq_kv",
                         meaning="query tokens of the longest sequence (max_seqlen_q)"),
        base.LaunchField("seq_kv", "sk", bucket="seq_kv_bucket", error_name="seq_q/seq_kv",
                         meaning="keys of the longest sequence (max_seqlen_k)"),
        # optional: not part of the kernel name or the shape bucket
        base.LaunchField("num_kv_heads", required=False,
                         meaning="key/value heads (fewer than num_heads: grouped-query attention)"),
        base.LaunchField("head_dim_v", high=512, required=False, meaning="size of one head of v"),
        base.LaunchField("page_size", required=False, meaning="tokens per page of a paged KV cache"),
    ),
    validate_candidate=validate_candidate,
    validate_precision=validate_precision,
    choose_default=choose_default,
    choose_launch=choose_launch,
    check_launch=check_launch,
    tile_fields=("block_m", "block_n"),
)
