"""LSTM candidates (multi-layer, bidirectional): input projection as one GEMM, then the recurrence.

Field -> Triton meta-parameter (CUDA):
- `batch_tile`: BLOCK_B, sequences per program (tl.dot needs >= 16; short batches are masked).
- `hidden_tile`: BLOCK_H, hidden units per program; grid = (cdiv(batch, batch_tile),
  cdiv(hidden, hidden_tile), directions).
- `tg_size`: `num_warps = tg_size // 32`.
- `stages`: `num_stages` of the input-projection GEMM loop.
- `mode`: "persistent" -> one program loops over all timesteps, carrying h and c on chip;
  "stepwise" -> one launch per timestep (h/c round-trip through global memory), which the CPU
  interpreter can check step by step.
- `precision`: tl.dot `input_precision` of the input projection and the recurrent GEMV: "ieee"
  (this family's fp32 candidate), "tf32x3" or "tf32". Gate nonlinearities are always fp32.

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32`, grid = (cdiv(batch, batch_tile), cdiv(hidden, hidden_tile), directions); the
persistent mode keeps the h and c tiles in threadgroup memory across timesteps.

Kernel name: `lstm_batch{}_seq{}_input_size{}_hidden{}_layers{}_directions{}_tokens{}_<tag>_<profile>`.
"""
from __future__ import annotations

from ..policy import KernelFamily
from . import base


@base.candidate_dataclass
class LstmCandidate(base.Candidate):
    """Tagged e.g. `bt16_ht64_tg128_ns2_stepwise_ieee`."""

    batch_tile: int = base.int_field("bt")
    hidden_tile: int = base.int_field("ht")
    tg_size: int = base.int_field("tg")
    stages: int = base.int_field("ns")
    mode: str = base.choice_field("persistent", "stepwise")
    precision: str = base.choice_field("ieee", "tf32x3", "tf32")


LstmVariant = base.define_variants(
    LstmCandidate,
    (
        ("STEPWISE_IEEE", LstmCandidate(16, 64, 128, 2, "stepwise", "ieee")),
        ("PERSISTENT_IEEE", LstmCandidate(16, 128, 256, 2, "persistent", "ieee")),
        ("PERSISTENT_TF32X3", LstmCandidate(32, 128, 256, 2, "persistent", "tf32x3")),
        ("STEPWISE_TF32", LstmCandidate(32, 64, 128, 2, "stepwise", "tf32")),
    ),
    fp32="STEPWISE_IEEE",
    default="STEPWISE_IEEE",
)

FP32_VARIANT = LstmVariant.FP32
DEFAULT_VARIANT = LstmVariant.DEFAULT


def staging_bytes(c: LstmCandidate) -> int:
    """The fp32 h tile, plus the c tile when the state stays on chip (persistent mode)."""
    state_tiles = 2 if c.mode == "persistent" else 1
    return state_tiles * c.batch_tile * c.hidden_tile * 4


def needs_shared(c: LstmCandidate) -> bool:
    return c.mode == "persistent" or base.pipelined(c)


validate_candidate = base.tiled_rules(
    {"batch_tile": (16, 64), "hidden_tile": (16, 256)},
    staging_bytes,
    needs_shared,
    "persistent mode and stages > 1 require shared memory staging",
)

SPEC = base.FamilySpec.diarization(
    KernelFamily.LSTM,
    LstmVariant,
    base.diarization_launch_fields("batch", "seq", "input_size", "hidden", "layers", "directions", high={"directions": 2}),
    validate_candidate,
    tile_fields=("batch_tile", "hidden_tile"),
)
