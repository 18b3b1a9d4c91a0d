"""Convolution candidates (SincNet conv|abs|pool, Conv1d blocks, Conv2d of the ResNet embedding trunk).

Convolution runs as an implicit GEMM: output positions x output channels, reduced over c_in x taps.

Field -> Triton meta-parameter (CUDA):
- `tile_pos`: BLOCK_P, output positions per program (conv2d: output pixels); grid dim 0 =
  cdiv(positions, tile_pos).
- `tile_co`: BLOCK_CO, output channels per program; grid dim 1 = cdiv(c_out, tile_co).
- `tile_k`: BLOCK_K, reduction chunk over c_in x taps per tl.dot.
- `tg_size`: `num_warps = tg_size // 32`.
- `stages`: `num_stages` (software pipelining depth of the reduction loop).
- `precision`: tl.dot `input_precision`: "ieee" (true fp32, this family's fp32 candidate),
  "tf32x3" (three-pass TF32, ~fp32 accuracy on tensor cores) or "tf32" (fast, ~1e-3 relative).
- `fuse_epilogue`: True -> bias / abs / pooling / norm / residual applied in the same kernel;
  False -> the epilogue runs as a separate pass.

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32` (simdgroup_matrix 8x8 tiles cover tile_pos x tile_co), grid = (cdiv(positions,
tile_pos), cdiv(c_out, tile_co), batch); one stage of the operand tiles, (tile_pos + tile_co) x
tile_k fp32, is staged in threadgroup memory; Metal has no TF32, so "tf32"/"tf32x3" run as fp32.

Kernel name: `conv_batch{}_c_in{}_c_out{}_length{}_taps{}_stride{}_tokens{}_<tag>_<profile>`.
"""
from __future__ import annotations

from ..policy import KernelFamily
from . import base


@base.candidate_dataclass
class ConvCandidate(base.Candidate):
    """Tagged e.g. `tp64_tc32_tk32_tg128_ns2_ieee_fused`."""

    tile_pos: int = base.int_field("tp", sets="output positions (conv2d: pixels) per program (BLOCK_P)")
    tile_co: int = base.int_field("tc", sets="output channels per program (BLOCK_CO)")
    tile_k: int = base.int_field("tk", sets="reduction chunk over c_in x taps per tl.dot (BLOCK_K)")
    tg_size: int = base.int_field("tg", sets=base.TG_SIZE_SETS)
    stages: int = base.int_field("ns", sets=base.STAGES_SETS)
    precision: str = base.choice_field("ieee", "tf32x3", "tf32", words=base.PRECISION_WORDS)
    fuse_epilogue: bool = base.flag_field("fused", "unfused", words={
        "fused": "bias, abs, pooling, norm and residual in the same kernel",
        "unfused": "the epilogue runs as a separate pass"})


ConvVariant = base.define_variants(
    ConvCandidate,
    (
        ("IEEE_P64_CO32", ConvCandidate(64, 32, 32, 128, 2, "ieee", True)),
        ("IEEE_P128_CO64", ConvCandidate(128, 64, 32, 256, 3, "ieee", True)),
        # true fp32 on TF32 tensor cores, channel tiles fitted to the ResNet trunk's layers: 32 channels
        # (stem, layer1: 128 pixels a program, twice the MMA work for each tap's addresses and masks), and 64
        # for the 64/128/256-channel layers; one stage (a gathered patch is not staged through shared
        # memory, so deeper pipelines only held registers)
        ("TF32X3_P128_CO32", ConvCandidate(128, 32, 16, 128, 1, "tf32x3", True)),
        ("TF32X3_P64_CO64", ConvCandidate(64, 64, 16, 128, 1, "tf32x3", True)),
        # SincNet on GPUs: 64 channel lanes hold all 40 + 40 sinc filters (and a block's 60 channels) in one
        # program, so each sample's preparation is shared by every filter; 32 positions over 8 warps, one stage
        # (the gathered samples are not staged through shared memory: a deeper pipeline only holds registers)
        ("TF32X3_P32_CO64_W8", ConvCandidate(32, 64, 16, 256, 1, "tf32x3", True)),
        ("TF32_P128_CO64", ConvCandidate(128, 64, 32, 256, 3, "tf32", True)),
        # few output channels (SincNet's first layers): small tiles, epilogue as its own pass
        ("IEEE_P64_CO16_UNFUSED", ConvCandidate(64, 16, 16, 128, 2, "ieee", False)),
    ),
    fp32="IEEE_P64_CO32",
    default="IEEE_P64_CO32",
)

FP32_VARIANT = ConvVariant.FP32
DEFAULT_VARIANT = ConvVariant.DEFAULT


def staging_bytes(c: ConvCandidate) -> int:
    """One stage of fp32 operand tiles: input (tile_pos x tile_k) and weights (tile_k x tile_co)."""
    return (c.tile_pos + c.tile_co) * c.tile_k * 4


validate_candidate = base.tiled_rules(
    {"tile_pos": (16, 256), "tile_co": (16, 128), "tile_k": (16, 128)},
    staging_bytes,
    base.pipelined,
    base.PIPELINE_NEEDS_SHARED,
)

SPEC = base.FamilySpec.diarization(
    KernelFamily.CONV,
    ConvVariant,
    base.diarization_launch_fields("batch", "c_in", "c_out", "length", "taps", "stride", meanings={
        "batch": "waveforms, sequences or images in the call", "c_in": "input channels", "c_out": "output channels",
        "length": "input samples or frames (conv2d: pixels)", "taps": "kernel size (conv2d: height x width)",
        "stride": "kernel stride", "tokens": "output positions (conv2d: pixels): the length the planner buckets on"}),
    validate_candidate,
    tile_fields=("tile_pos", "tile_co", "tile_k"),
)
