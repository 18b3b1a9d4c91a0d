"""LSTM candidates (multi-layer, bidirectional): input projection as one GEMM, then the recurrence.

Field -> Triton meta-parameter (CUDA):
- `batch_tile`: BLOCK_B, sequences per program (tl.dot needs >= 16; short batches are masked).
- `hidden_tile`: BLOCK_H, hidden units per program per step (persistent, stepwise: grid =
  (directions, cdiv(batch, batch_tile)), each program loops over the units); in onchip mode UNITS,
  the hidden units a program owns for the whole sequence (its 4 * hidden_tile gate columns are
  one tl.dot operand, so 4 * hidden_tile >= 16): grid = (directions, cdiv(hidden, hidden_tile),
  cdiv(batch, batch_tile)).
- `tg_size`: `num_warps = tg_size // 32`.
- `stages`: `num_stages` of the input-projection GEMM loop.
- `mode`: "onchip" -> the hidden units of each direction are split across programs, each holding
  its slice of W_hh on chip for all timesteps; the programs of a (direction, batch tile) exchange
  h_t through global memory, each waiting for the h it reads every step (one launch per layer, only
  where all of them can be resident at once; where programs do not run concurrently, as in the CPU
  interpreter, one launch per timestep with the same arithmetic);
  "persistent" -> one program per (direction, batch tile) loops over all timesteps, streaming W_hh;
  "stepwise" -> one launch per timestep (h/c round-trip through global memory), which the CPU
  interpreter can check step by step.
- `precision`: tl.dot `input_precision` of the input projection (and, in onchip mode, of the
  recurrent product, whose warps also split the hidden size when the program's gate columns leave
  them without work; a 16-column program over a hidden size of at most 64 multiplies in fp32 FMAs,
  which issue less there): "ieee" (this family's fp32 candidate), "tf32x3" or "tf32". Gate
  nonlinearities and the cell state are always fp32.

Field -> Metal threadgroup parameter (Apple): threads per threadgroup = `tg_size`, simdgroups =
`tg_size // 32`, grid = (cdiv(batch, batch_tile), cdiv(hidden, hidden_tile), directions); the
persistent mode keeps the h and c tiles in threadgroup memory across timesteps; onchip runs as
persistent (one threadgroup per direction and sequence).

Kernel name: `lstm_batch{}_seq{}_input_size{}_hidden{}_layers{}_directions{}_tokens{}_<tag>_<profile>`.
"""
from __future__ import annotations

from ..policy import KernelFamily
from . import base


@base.candidate_dataclass
class LstmCandidate(base.Candidate):
    """Tagged e.g. `bt16_ht64_tg128_ns2_stepwise_ieee`."""

    batch_tile: int = base.int_field("bt", sets="sequences per program (BLOCK_B)")
    hidden_tile: int = base.int_field("ht", sets="hidden units per program (BLOCK_H; onchip: the units it owns)")
    tg_size: int = base.int_field("tg", sets=base.TG_SIZE_SETS)
    stages: int = base.int_field("ns", sets=base.STAGES_SETS)
    mode: str = base.choice_field("persistent", "stepwise", "onchip", words={
        "persistent": "one program loops over all timesteps with h and c on chip",
        "stepwise": "one launch per timestep",
        "onchip": "hidden units split across programs that hold W_hh on chip and hand each other h each step"})
    precision: str = base.choice_field("ieee", "tf32x3", "tf32", words=base.PRECISION_WORDS)


LstmVariant = base.define_variants(
    LstmCandidate,
    (
        ("ONCHIP_IEEE", LstmCandidate(16, 4, 256, 2, "onchip", "ieee")),
        ("ONCHIP_TF32X3", LstmCandidate(16, 4, 256, 2, "onchip", "tf32x3")),
        # 16 units per program (a quarter of the programs, each with four times the work): the recurrent product
        # on tensor cores
        ("ONCHIP_TF32X3_WIDE", LstmCandidate(16, 16, 256, 2, "onchip", "tf32x3")),
        ("STEPWISE_IEEE", LstmCandidate(16, 64, 128, 2, "stepwise", "ieee")),
        ("PERSISTENT_IEEE", LstmCandidate(16, 128, 256, 2, "persistent", "ieee")),
        ("PERSISTENT_TF32X3", LstmCandidate(32, 128, 256, 2, "persistent", "tf32x3")),
        ("STEPWISE_TF32", LstmCandidate(32, 64, 128, 2, "stepwise", "tf32")),
    ),
    fp32="ONCHIP_IEEE",
    default="ONCHIP_IEEE",
)

FP32_VARIANT = LstmVariant.FP32
DEFAULT_VARIANT = LstmVariant.DEFAULT


def staging_bytes(c: LstmCandidate) -> int:
    """The fp32 h tile, plus the c tile when the state stays on chip (persistent and onchip modes)."""
    state_tiles = 1 if c.mode == "stepwise" else 2
    return state_tiles * c.batch_tile * c.hidden_tile * 4


def needs_shared(c: LstmCandidate) -> bool:
    return c.mode != "stepwise" or base.pipelined(c)


_NEEDS_SHARED = "persistent mode and stages > 1 require shared memory staging"
_tiled = base.tiled_rules({"batch_tile": (16, 64), "hidden_tile": (16, 256)}, staging_bytes, needs_shared,
                          _NEEDS_SHARED)
_onchip_tiled = base.tiled_rules({"batch_tile": (16, 64), "hidden_tile": (4, 256)}, staging_bytes, needs_shared,
                                 _NEEDS_SHARED)


def validate_candidate(c: LstmCandidate, thread_policy, memory_policy):
    """The tiled rules; an onchip program may own as few as 4 hidden units (its 16 gate columns)."""
    return (_onchip_tiled if c.mode == "onchip" else _tiled)(c, thread_policy, memory_policy)

SPEC = base.FamilySpec.diarization(
    KernelFamily.LSTM,
    LstmVariant,
    base.diarization_launch_fields(
        "batch", "seq", "input_size", "hidden", "layers", "directions", high={"directions": 2},
        meanings={"batch": "sequences in the call", "seq": "timesteps", "input_size": "features per timestep",
                  "hidden": "hidden units", "layers": "stacked layers", "directions": "1, or 2 for a bidirectional LSTM",
                  "tokens": "timesteps: the length the planner buckets on"}),
    validate_candidate,
    tile_fields=("batch_tile", "hidden_tile"),
)
