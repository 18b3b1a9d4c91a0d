"""Kaldi-compatible log-mel filterbank candidates (torchaudio.compliance.kaldi.fbank semantics).

The power spectrum is a DFT written as matrix products on tiles of frames, then the mel matrix
product. The Triton backend has two kernels: "tf32x3" candidates run the two-stage DFT on tensor cores
(N = N1 x N2, a length-N1 then a length-N2 DFT as matrix products, about a quarter of the dense work at
N = 512) wherever N factors with N1 <= 16 and N2 <= 64; "ieee" candidates, and the sizes that do not
factor, run the dense DFT (frames x window @ an exact cos/sin basis, reduced over the window in chunks
of WINDOW_CHUNK samples).

Field -> Triton meta-parameter (CUDA):
- `tile_frames`: BLOCK_F, frames per program; grid = cdiv(frames, tile_frames) x batch. The two-stage
  kernel runs its DFT over steps of a few frames inside the tile and the mel product over the whole
  tile, so the mel matrix is read once per tile.
- `tile_freq`: BLOCK_K, frequency bins per step: of the dense DFT (bins computed per tl.dot chunk), or
  of the two-stage kernel's mel product (bins reduced per tl.dot step).
- `tg_size`: `num_warps = tg_size // 32`.
- `stages`: `num_stages` of the reduction loops.
- `precision`: tl.dot `input_precision`, "ieee" (this family's fp32 candidate) or "tf32x3" (fp32
  accuracy on tensor cores). Never "tf32": log-mel energies of quiet frames lose digits that
  diarization needs.

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32`, grid = (cdiv(frames, tile_frames), batch); one window chunk of the frames tile and
of the cos/sin basis tile is staged in threadgroup memory (fp32; Metal runs "tf32x3" as fp32).

Kernel name: `fbank_batch{}_samples{}_frames{}_window{}_bins{}_tokens{}_<tag>_<profile>`.
"""
from __future__ import annotations

from typing import Mapping, Optional

from ..policy import KernelFamily
from . import base


@base.candidate_dataclass
class FbankCandidate(base.Candidate):
    """Tagged e.g. `fr32_fq64_tg128_ns2_ieee`."""

    tile_frames: int = base.int_field("fr", sets="frames per program (BLOCK_F)")
    tile_freq: int = base.int_field("fq", sets="DFT frequency bins per tl.dot chunk (BLOCK_K)")
    tg_size: int = base.int_field("tg", sets=base.TG_SIZE_SETS)
    stages: int = base.int_field("ns", sets=base.STAGES_SETS)
    precision: str = base.choice_field("ieee", "tf32x3", words=base.PRECISION_WORDS)


FbankVariant = base.define_variants(
    FbankCandidate,
    (
        # 16 frames x 32 bins first: the only tiling whose mel projection fits sm_80's registers without spills
        ("IEEE_F16_Q32", FbankCandidate(16, 32, 64, 2, "ieee")),
        ("IEEE_F32_Q64", FbankCandidate(32, 64, 128, 2, "ieee")),
        ("IEEE_F64_Q64", FbankCandidate(64, 64, 256, 3, "ieee")),
        ("TF32X3_F64_Q64", FbankCandidate(64, 64, 256, 3, "tf32x3")),
        # tensor-core tiles of 64 and 128 frames: the mel matrix is reused across the whole tile
        ("TF32X3_F64_Q32", FbankCandidate(64, 32, 256, 2, "tf32x3")),
        ("TF32X3_F128_Q32", FbankCandidate(128, 32, 256, 2, "tf32x3")),
    ),
    fp32="IEEE_F16_Q32",
    default="IEEE_F16_Q32",
)

FP32_VARIANT = FbankVariant.FP32
DEFAULT_VARIANT = FbankVariant.DEFAULT

WINDOW_CHUNK = 32


def staging_bytes(c: FbankCandidate) -> int:
    """One window chunk of fp32 frames (tile_frames) and of the cos and sin basis (2 x tile_freq): what the
    Metal kernel stages in threadgroup memory (the Triton kernels' shared memory is the compiler's)."""
    return (c.tile_frames + 2 * c.tile_freq) * WINDOW_CHUNK * 4


def check_launch(fields: Mapping[str, int]) -> Optional[str]:
    # a real FFT of `window` points has window // 2 + 1 bins
    if fields["bins"] > fields["window"] // 2 + 1:
        return "bins"
    return None


validate_candidate = base.tiled_rules(
    {"tile_frames": (16, 128), "tile_freq": (16, 128)},
    staging_bytes,
    base.pipelined,
    base.PIPELINE_NEEDS_SHARED,
)

SPEC = base.FamilySpec.diarization(
    KernelFamily.FBANK,
    FbankVariant,
    base.diarization_launch_fields("batch", "samples", "frames", "window", "bins", meanings={
        "batch": "waveforms in the call", "samples": "samples per waveform", "frames": "output frames",
        "window": "FFT size", "bins": "mel bins", "tokens": "output frames: the length the planner buckets on"}),
    validate_candidate,
    check_launch=check_launch,
    tile_fields=("tile_frames", "tile_freq"),
)
