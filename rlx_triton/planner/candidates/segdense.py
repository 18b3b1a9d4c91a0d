"""Segmentation dense-head candidates (pyannote: LSTM features -> Linear -> Linear -> classifier ->
log-softmax or sigmoid), one row (frame) tile per program.

Field -> Triton meta-parameter (CUDA):
- `row_tile`: BLOCK_R, rows (frames x batch) per program; grid = cdiv(rows, row_tile).
- `tg_size`: `num_warps = tg_size // 32`.
- `stages`: `num_stages` of the feature-reduction loop.
- `precision`: tl.dot `input_precision`: "ieee" (this family's fp32 candidate), "tf32x3" or "tf32".
- `fused_activation`: True -> the final log-softmax / sigmoid runs in the same kernel; False -> a
  separate pass.

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32`, grid = cdiv(rows, row_tile); one FEATURE_CHUNK-wide stage of the row tile and of a
HIDDEN_TILE-wide weight tile is staged in threadgroup memory (fp32).

Kernel name: `segdense_rows{}_in_features{}_hidden{}_classes{}_tokens{}_<tag>_<profile>`.
"""
from __future__ import annotations

from ..policy import KernelFamily
from . import base


@base.candidate_dataclass
class SegdenseCandidate(base.Candidate):
    """Tagged e.g. `rt32_tg128_ns2_ieee_fusedact`."""

    row_tile: int = base.int_field("rt", sets="rows (frames x batch) per program (BLOCK_R)")
    tg_size: int = base.int_field("tg", sets=base.TG_SIZE_SETS)
    stages: int = base.int_field("ns", sets=base.STAGES_SETS)
    precision: str = base.choice_field("ieee", "tf32x3", "tf32", words=base.PRECISION_WORDS)
    fused_activation: bool = base.flag_field("fusedact", "splitact", words={
        "fusedact": "the final log-softmax or sigmoid in the same kernel",
        "splitact": "the final activation as a separate pass"})


SegdenseVariant = base.define_variants(
    SegdenseCandidate,
    (
        ("R32_IEEE", SegdenseCandidate(32, 128, 2, "ieee", True)),
        ("R16_IEEE", SegdenseCandidate(16, 64, 1, "ieee", True)),
        ("R64_TF32X3", SegdenseCandidate(64, 128, 2, "tf32x3", True)),
        ("R128_IEEE", SegdenseCandidate(128, 256, 2, "ieee", True)),
        ("R32_IEEE_SPLIT_ACTIVATION", SegdenseCandidate(32, 128, 2, "ieee", False)),
    ),
    fp32="R32_IEEE",
    default="R32_IEEE",
)

FP32_VARIANT = SegdenseVariant.FP32
DEFAULT_VARIANT = SegdenseVariant.DEFAULT

FEATURE_CHUNK = 32
HIDDEN_TILE = 128  # pyannote's segmentation head is 128 wide


def staging_bytes(c: SegdenseCandidate) -> int:
    return (c.row_tile + HIDDEN_TILE) * FEATURE_CHUNK * 4


validate_candidate = base.tiled_rules({"row_tile": (16, 128)}, staging_bytes, base.pipelined, base.PIPELINE_NEEDS_SHARED)

SPEC = base.FamilySpec.diarization(
    KernelFamily.SEGDENSE,
    SegdenseVariant,
    base.diarization_launch_fields("rows", "in_features", "hidden", "classes", meanings={
        "rows": "frames x batch", "in_features": "input features", "hidden": "widest hidden layer",
        "classes": "output classes", "tokens": "rows: the length the planner buckets on"}),
    validate_candidate,
    tile_fields=("row_tile",),
)
