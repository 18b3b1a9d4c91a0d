"""What a kernel's SASS cannot say about one launch: how many passes its loops make, and its latency chain.

`loop_trips(launch, loops)` gives, per loop of `rlx_triton.perf.compiled.sass_loops` (address order), the
passes one CTA makes on average. Kernels whose loops the SASS alone cannot count state them from the
launch record in `TRIPS` (kernel function name -> trips of its non-spin loops in address order, read from
the record's arguments and constexprs); a table whose length differs from the compiled loops is not used.
Other kernels get the generic rule: the loop doing the most work per pass (FLOPs of its FFMA and tensor-core
instructions, else bytes of its global loads) does all of the launch's FLOPs (bytes), so its passes are
the launch's FLOPs / (CTAs x warps x FLOPs of one warp's pass); every other loop makes one pass per CTA.
Stated: the decode kernel's KV loops, the on-chip LSTM's time loop, the fbank split's loops, and the conv2d
GEMM's loops (the tf32x3 form loops per tap, then per channel chunk: KH*KW and KH*KW*chunks passes; its Winograd
form per kernel row, then per chunk: KH and KH*chunks, and its direct recompute of non-finite tiles none).
Spin loops (a barrier's poll) make no counted pass: their time is the chain's.

`chain_steps(launch)` gives the dependent steps the launch cannot overlap with anything else, by latency
kind (the profile's LATENCY_KEYS: l2_hit, hbm, atomic, cta_barrier), from `CHAINS` (kernel function name ->
steps, from the launch record); a kernel without an entry has no chain. The entries follow the kernels'
code (backends/triton/*.py):
- `_sdpa_decode_kernel` with more than one split: after the last split of a row block finishes, its ticket
  (an atomic) and the merge: the partials' LSE vector, then one dependent L2 round trip per MERGE_CHUNK
  partials (the merge issues a chunk's loads before it uses the first); beyond MERGE_GROUP splits two levels
  (a group's merge, a second ticket, the merge of the groups).
- `_lstm_onchip_kernel`: per step, the h_{t-1} row's exchange words read from L2 (all requested at once: one
  round trip); with SYNC the producers' stores reach L2 first and the poll that sees them is the read (two L2
  trips: the store's and the poll's).
- `_lstm_recurrence_kernel`: per step, the h_{t-1} row it wrote the step before, read back from L2.
- both recurrences, given the compiled loops: every CTA barrier of a pass of the time loop, per step (each
  operand's or result's pass through shared memory, any reduction across warps: a step runs one program per
  SM for its group, so no other work hides them).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

# the unit's executed tensor-core FLOPs per FLOP a launch record states (tf32x3 runs three TF32 products)
_EXECUTED_PER_FLOP = {"tf32x3": 3, "tf32x4": 4}


def named_args(launch) -> Dict[str, Any]:
    """Every parameter of a launch record by name: its positional arguments and its meta."""
    from rlx_triton.backends.triton.launches import _params_of

    params = _params_of(launch.jit)
    named = {param.name: value for param, value in zip(params, launch.args)}
    named.update(launch.meta)
    return named


def _sdpa_decode_trips(launch, arg) -> List[float]:
    from rlx_triton.backends.triton.sdpa_decode import CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, MASK_NONE, MASK_TREE

    splits = max(1, launch.grid[1] if len(launch.grid) > 1 else 1)
    seq_kv, block_n = int(arg["seq_kv"]), int(arg["BLOCK_N"])
    tiles = math.ceil(seq_kv / block_n)
    # the KV tiles shared by the splits, in two loops (kernels.py): the whole tiles no mask reaches, then the edge
    # tiles (where masking reaches only the newest keys: from the tile holding the first of them, or the range's
    # last partial tile, on; otherwise every tile)
    tail_only = (int(arg["MASK_KIND"]) in (MASK_NONE, MASK_TREE) and int(arg["CAUSAL"]) != CAUSAL_TOP_LEFT
                 and not arg.get("WINDOW"))
    if not tail_only:
        edge = tiles
    elif int(arg["MASK_KIND"]) == MASK_TREE or int(arg["CAUSAL"]) == CAUSAL_BOTTOM_RIGHT:
        edge = tiles - max(0, seq_kv - int(arg["seq_q"])) // block_n
    else:
        edge = tiles - seq_kv // block_n
    kv_loops = [(tiles - edge) / splits, edge / splits]
    # the merge loops run in one program per row block (their cost is the chain), so they make no pass on average
    return kv_loops + [0.0, 0.0, 0.0] if int(arg["MAX_SPLITS"]) > 1 else kv_loops


def _lstm_onchip_trips(launch, arg) -> List[float]:
    return [float(int(arg["step_end"]) - int(arg["step_begin"]))]


def _fbank_split_trips(launch, arg) -> List[float]:
    frame_p = int(arg["N1P"]) * int(arg["N2P"])
    per_step = int(arg["STEP_SAMPLES"]) // frame_p
    sub_f = int(arg["BLOCK_F"]) if per_step >= int(arg["BLOCK_F"]) else max(1, per_step)   # the kernel's SUB_F
    bins = int(arg["K2P"]) * int(arg["N1P"])
    return [math.ceil(int(arg["BLOCK_F"]) / sub_f), math.ceil(bins / int(arg["BLOCK_K"]))]


def _conv2d_trips(launch, arg) -> List[float]:
    # the tf32x3 GEMM's loops per tap, then per channel chunk (two loops); the other forms one flat loop
    taps = int(arg["KH"]) * int(arg["KW"])
    c_in, block_k = int(arg["c_in"]), int(arg["BLOCK_K"])
    if arg.get("FOLD_TAPS"):
        return [float(math.ceil(c_in * taps / block_k))]
    steps = float(taps * math.ceil(c_in / block_k))
    if arg.get("PRECISION") != "tf32x3":
        return [steps]
    if arg.get("WINOGRAD"):
        # per kernel row, then per channel chunk; the direct recompute of a tile with a non-finite value
        # (its tap and chunk loops) does not run on finite data
        rows = int(arg["KH"])
        return [float(rows), float(rows * math.ceil(c_in / block_k)), 0.0, 0.0]
    return [float(taps), steps]


TRIPS: Mapping[str, Callable[[Any, Dict[str, Any]], List[float]]] = {
    "_sdpa_decode_kernel": _sdpa_decode_trips,
    "_lstm_onchip_kernel": _lstm_onchip_trips,
    "_fbank_split_kernel": _fbank_split_trips,
    "_conv2d_kernel": _conv2d_trips,
}


def _sdpa_decode_chain(launch, arg, loops) -> Dict[str, int]:
    from rlx_triton.backends.triton.sdpa_decode import MERGE_GROUP

    splits = launch.grid[1] if len(launch.grid) > 1 else 1
    if splits <= 1 or int(arg["MAX_SPLITS"]) <= 1:
        return {}
    chunk = max(1, int(arg.get("MERGE_CHUNK", 1)))

    def merge(count: int) -> int:   # the LSE vector, then the partials a chunk at a time
        return 1 + math.ceil(count / chunk)

    if splits <= MERGE_GROUP:
        return {"atomic": 1, "l2_hit": merge(splits)}
    groups = math.ceil(splits / MERGE_GROUP)
    return {"atomic": 2, "l2_hit": merge(MERGE_GROUP) + merge(groups)}


def _time_loop_barriers(loops: Optional[Sequence[dict]]) -> int:
    """CTA barriers in one pass of a recurrence's time loop (its largest non-spin loop); 0 without the SASS."""
    work = [loop for loop in loops or () if not loop["spin"]]
    return int(max(work, key=lambda loop: loop["own"]).get("bar", 0)) if work else 0


def _recurrence_steps(arg, l2_per_step: int, loops) -> Dict[str, int]:
    steps = int(arg["step_end"]) - int(arg["step_begin"])
    return {"l2_hit": l2_per_step * steps, "cta_barrier": _time_loop_barriers(loops) * steps}


def _lstm_onchip_chain(launch, arg, loops) -> Dict[str, int]:
    return _recurrence_steps(arg, 2 if arg.get("SYNC") else 1, loops)


def _lstm_recurrence_chain(launch, arg, loops) -> Dict[str, int]:
    return _recurrence_steps(arg, 1, loops)


CHAINS: Mapping[str, Callable[[Any, Dict[str, Any], Optional[Sequence[dict]]], Dict[str, int]]] = {
    "_sdpa_decode_kernel": _sdpa_decode_chain,
    "_lstm_onchip_kernel": _lstm_onchip_chain,
    "_lstm_recurrence_kernel": _lstm_recurrence_chain,
}


def _kernel_name(launch) -> str:
    return launch.function.__name__


def loop_trips(launch, loops: Sequence[dict], num_warps: Optional[int] = None) -> tuple:
    """(trips per loop, rule) of a launch: passes one CTA makes through each loop of `loops` (sass_loops order),
    and which rule gave them ("table" or "work", see the module docstring)."""
    work = [index for index, loop in enumerate(loops) if not loop["spin"]]
    trips = [0.0] * len(loops)
    stated = TRIPS.get(_kernel_name(launch))
    if stated is not None:
        table = stated(launch, named_args(launch))
        if len(table) == len(work):
            for index, value in zip(work, table):
                trips[index] = float(value)
            return trips, "table"
    if not work:
        return trips, "work"
    warps = int(num_warps or launch.num_warps)
    ctas = max(1, launch.ctas)
    flops = launch.flops * _EXECUTED_PER_FLOP.get(launch.unit, 1)
    hot = max(work, key=lambda i: (loops[i]["pass_flops"], loops[i]["pass_bytes"], loops[i]["own"]))
    for index in work:
        trips[index] = 1.0
    if loops[hot]["pass_flops"] and flops:
        trips[hot] = max(1.0, flops / (ctas * warps * loops[hot]["pass_flops"]))
    elif loops[hot]["pass_bytes"] and launch.bytes_read:
        trips[hot] = max(1.0, launch.bytes_read / (ctas * warps * loops[hot]["pass_bytes"]))
    return trips, "work"


def chain_steps(launch, loops: Optional[Sequence[dict]] = None) -> Dict[str, int]:
    """The launch's dependent steps by latency kind (see the module docstring); {} for a kernel without a chain.
    `loops` (sass_loops of its compiled kernel) give the recurrences their CTA barriers per step."""
    stated = CHAINS.get(_kernel_name(launch))
    if stated is None:
        return {}
    return {kind: int(count) for kind, count in stated(launch, named_args(launch), loops).items() if count}
