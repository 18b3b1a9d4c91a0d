"""cuDNN LSTM forward by its launch rules: the input projection GEMM per layer, then the recurrence, either as
cuDNN's persistent kernel (one launch per layer, the weights on chip, a grid-wide exchange of h every step) or
as its standard algorithm (a GEMM and a pointwise kernel launched every step).

Which algorithm torch runs (pytorch aten/src/ATen/native/cudnn/RNN.cpp `get_algo`, cuDNN >= 8.2.1):
- proj_size > 0: STANDARD;
- unpacked input, not double, compute capability >= 6.0, forward, LSTM with hidden <= 192:
  PERSIST_STATIC_SMALL_H;
- fp16, one layer, one direction, hidden and input multiples of 128, hidden <= 1024, and the device rule
  (sm_8x with >= 98 SMs and not sm_86: batch % 8 == 0 and batch <= 128): PERSIST_STATIC, a persistent kernel
  too, priced like the small-H one;
- otherwise STANDARD.
The published "cudnn" rows are priced with the same choice (what torch's nn.LSTM asks cuDNN for).

Per layer (layers run one after another: a bidirectional layer needs both directions of the whole sequence
below it):
- input projection: x (seq x batch, inputs) @ W_ih^T for every direction at once: one GEMM of
  N = 4 x hidden x directions (rlx_triton.perf.library.gemm), its output in cuDNN's workspace;
- persistent recurrence: each direction's 4 x hidden gate rows are split over CTAs that each own 8 hidden units
  (their 32 gate rows, so a unit's cell update needs no exchange: the partition of persistent RNN kernels,
  e.g. speakrs' lstmproj), as many CTAs as that gives, at most the SMs a direction gets; every step each CTA
  multiplies its rows of R by h_{t-1} (batch columns) with R in registers, applies the gates (3 sigmoids and
  2 tanh per unit: exp + reciprocal each, on the SFU), writes its h slice and waits at a grid barrier for every
  other slice: the step's dependent chain is the store's fence, the barrier's atomic arrive and poll, and the
  load of the new h (3 L2 round trips and an atomic). Both directions run in the same launch, concurrently;
- standard recurrence: per step a GEMM (batch x H @ H x 4H for every direction, directions on concurrent
  streams) and cuDNN's pointwise LSTM kernel: two launches per step, each reading back the h the step before
  wrote (one dependent L2 read).
The recurrent product's loop efficiency (RECURRENT_EFFICIENCY) is an FFMA fraction like SGEMM's.

fp32 runs with TF32 off (FFMA), tf32 with TF32 on (its GEMMs on tensor cores, the recurrence too); fp16 on
tensor cores with fp32 accumulation; bf16 and fp8 are not modelled.
"""
from __future__ import annotations

import dataclasses
from typing import List, Mapping, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.perf.library import Unmodelled, library_model
from rlx_triton.perf.library.eager import elementwise
from rlx_triton.perf.library.gemm import ELEMENT_BYTES, UNIT, gemm_kernels

# the hidden sizes torch's get_algo sends to PERSIST_STATIC_SMALL_H for an LSTM forward
SMALL_H_LIMIT = 192
# hidden units a persistent CTA owns (all 4 gate rows of each, so the cell update stays in the CTA)
UNITS_PER_CTA = 8
# recurrent product per step: a thread holds 4 gate rows of R for its unit in registers and reads each h element
# once from shared memory for all 4: 4 FFMA per LDS, 4 / 5 of the issue slots
RECURRENT_EFFICIENCY = 4 / 5
# SFU operations per hidden unit per sequence per step: sigmoid (i, f, o gates) and tanh (g, c) as exp + rcp each
GATE_SFU_OPS = 5 * 2
# the dependent round trips of one step's grid-wide exchange: fence of the h store, the barrier's poll, the load
# of h (L2 hits: the data another SM wrote) and the arrive (a global atomic)
STEP_CHAIN = {"l2_hit": 3, "atomic": 1}


def lstm_algorithm(batch: int, hidden: int, inputs: int, layers: int, directions: int, dtype: str, profile, *,
                   packed: bool = False, proj_size: int = 0) -> str:
    """The cuDNN algorithm torch's get_algo picks: "persist_small_h", "persist_static" or "standard"."""
    if proj_size:
        return "standard"
    if not packed:
        capability = getattr(profile, "capability", None) or (0, 0)
        if capability >= (6, 0) and hidden <= SMALL_H_LIMIT:
            return "persist_small_h"
        if (dtype == "fp16" and layers == 1 and directions == 1 and hidden <= 1024 and hidden % 128 == 0
                and inputs % 128 == 0 and capability[0] >= 8 and capability != (8, 6) and profile.sm_count >= 98
                and batch % 8 == 0 and batch <= 128):
            return "persist_static"
    return "standard"


def lstm_kernels(batch: int, seq: int, inputs: int, hidden: int, layers: int, directions: int, dtype: str,
                 profile, *, packed: bool = False, proj_size: int = 0) -> List[LibraryKernel]:
    """The kernels of cuDNN's LSTM forward (cudnnRNNForward) for these sizes."""
    if dtype not in ELEMENT_BYTES or dtype in ("bf16", "fp8"):
        raise Unmodelled(f"cuDNN LSTM in {dtype} is not modelled (fp32, tf32 and fp16 are)")
    if min(batch, seq, inputs, hidden, layers, directions) < 1 or directions > 2:
        raise Unmodelled(f"LSTM batch {batch} seq {seq} input {inputs} hidden {hidden} layers {layers} "
                         f"directions {directions}: not a valid LSTM")
    algorithm = lstm_algorithm(batch, hidden, inputs, layers, directions, dtype, profile, packed=packed,
                               proj_size=proj_size)
    element = ELEMENT_BYTES[dtype]
    gates = 4 * hidden
    unit = UNIT[dtype]   # the recurrent product runs on the same units as the GEMMs
    kernels: List[LibraryKernel] = []
    for layer in range(layers):
        width = inputs if layer == 0 else hidden * directions
        kernels += gemm_kernels(seq * batch, gates * directions, width, dtype, profile,
                                label=f"layer {layer} input projection",
                                note="x @ W_ih^T of every step and direction, into cuDNN's workspace")
        step_flops = 2.0 * gates * hidden * batch * directions
        step_reads = batch * gates * directions * element        # the projection's row of this step
        step_writes = batch * hidden * directions * element      # h of this step (the layer's output)
        if algorithm == "standard":
            # one step's GEMM (h_{t-1} @ R^T of each direction, accumulated onto the projection row), launched
            # every step: R and h are L2 hits after the first step, so its fill is an L2 round trip
            step_gemm = gemm_kernels(batch, gates, hidden, dtype, profile, batch=directions,
                                     read_bytes=batch * hidden * directions * element + step_reads,
                                     written_bytes=step_reads, label=f"layer {layer} recurrent GEMM (per step)",
                                     note="cuDNN STANDARD: h_{t-1} @ R^T every step, directions on concurrent "
                                          "streams")
            kernels += [dataclasses.replace(kernel, repeat=seq, chain={"l2_hit": 1}) for kernel in step_gemm]
            kernels.append(LibraryKernel(
                f"layer {layer} pointwise gates (per step)", 2 * step_reads + step_writes, 2 * step_writes,
                8.0 * hidden * batch * directions, "fp32_fma", chain={"l2_hit": 1}, repeat=seq,
                side_ops={"sfu": float(GATE_SFU_OPS * hidden * batch * directions)},
                note="cuDNN's LSTM elementwise kernel: gates, cell and hidden update of one step"))
            continue
        ctas_per_direction = min(max(1, profile.sm_count // directions), -(-hidden // UNITS_PER_CTA))
        weights = gates * hidden * directions * element
        kernels.append(LibraryKernel(
            f"layer {layer} persistent recurrence ({seq} steps)",
            seq * step_reads + weights, seq * step_writes + 2 * batch * hidden * directions * element,
            seq * step_flops, unit, chain={kind: steps * seq for kind, steps in STEP_CHAIN.items()},
            ctas=ctas_per_direction * directions, efficiency=RECURRENT_EFFICIENCY,
            side_ops={"sfu": float(GATE_SFU_OPS * hidden * batch * directions * seq)},
            note=f"cuDNN {algorithm.upper()}: one launch, {ctas_per_direction} CTAs per direction of "
                 f"{UNITS_PER_CTA} units each with R in registers, a grid-wide h exchange every step "
                 f"({', '.join(f'{n} {kind}' for kind, n in STEP_CHAIN.items())}); directions concurrent"))
    return kernels


def _shape(shape: Mapping[str, int]) -> Tuple[int, int, int, int, int, int]:
    return (shape["batch"], shape["seq"], shape["input"], shape["hidden"], shape["layers"],
            2 if shape["bidirectional"] else 1)


@library_model("lstm", "cudnn")
def cudnn_lstm(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    return lstm_kernels(*_shape(shape), dtype, profile)


@library_model("lstm", "torch")
def torch_lstm(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """nn.LSTM(x) without a state: torch fills the zero h0 and c0 (two kernels), then calls cuDNN."""
    batch, seq, inputs, hidden, layers, directions = _shape(shape)
    if dtype not in ELEMENT_BYTES:
        raise Unmodelled(f"torch LSTM in {dtype} is not modelled")
    state = layers * directions * batch * hidden * ELEMENT_BYTES[dtype]
    zeros = [elementwise("h0 zeros", 0, state), elementwise("c0 zeros", 0, state)]
    return zeros + lstm_kernels(batch, seq, inputs, hidden, layers, directions, dtype, profile)
