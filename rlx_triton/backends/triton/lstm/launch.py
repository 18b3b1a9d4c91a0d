"""LSTM launch plans: candidate -> meta-parameters, the launch records with their byte and FLOP models,
the co-residency check of the on-chip recurrence, the autotune bridge and the candidate helpers.

`lstm_plan` builds a call's launches as records from shapes (meta inputs give the plan at any shape): per
layer the input projection, then the recurrence. The on-chip recurrence's programs wait for each other's h
every step (through the exchange, `exchange_buffer`), and a program waiting for one that is not resident
deadlocks, so the plan checks that every program of the launch fits on the device at once, from the compiled
kernel's registers, shared memory and warps and the tensors' GPU (`co_residency_refusal`), and marks the
record for a cooperative launch
(`launch_cooperative_grid`: the driver runs it whole or refuses it, whatever other streams, MPS clients or
a sanitizer hold). A refusal, at plan time or by the driver, runs the persistent candidate of the same
precision (`fallback_candidate`) with one warning (`warn_fallback`), and rt.explain's `runs` line says so
and why (`explain_execution`). Where programs do not run concurrently (the CPU interpreter) a group of
several programs runs one launch per step (`recurrence_mode`). With the router's route the projection and
the on-chip recurrence run through the autotune bridge (key: batch bucket, sequence-length bucket,
hidden / N, K).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import triton

from rlx_triton import devices
from rlx_triton.devices import occupancy
from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.backends.triton.lstm.kernels import (EXCHANGE_ROWS, GATES, MIN_DOT, PAD_TAG, _lstm_input_proj_kernel,
                                                     _lstm_onchip_kernel,
                                                     _lstm_recurrence_kernel)
from rlx_triton.backends.triton.lstm.routing import APPROVALS
from rlx_triton.backends.triton.lstm.weights import _block_k, _layer_weights
from rlx_triton.planner.candidates.lstm import LstmCandidate, LstmVariant
from rlx_triton.router.coverage import DEVICE_UNSUPPORTED, Refusal
from rlx_triton.router.device import device_facts

THREADS_PER_WARP = 32


# ---------------------------------------------------------------------------------------------
# candidate -> meta-parameters
# ---------------------------------------------------------------------------------------------
def make_candidate(batch_tile=16, hidden_tile=32, tg_size=128, stages=1, mode="persistent",
                   precision="ieee") -> LstmCandidate:
    return LstmCandidate(batch_tile=batch_tile, hidden_tile=hidden_tile, tg_size=tg_size, stages=stages,
                         mode=mode, precision=precision)


PROJ_TILE = 64   # the projection's output tile side: no spills on sm_80/sm_90 for any candidate (audit)


def _warps(candidate) -> int:
    return max(1, candidate.tg_size // THREADS_PER_WARP)


def _proj_meta(candidate) -> dict:
    # PROJ_TILE x PROJ_TILE output tiles, K in chunks of MIN_DOT
    return dict(BLOCK_M=PROJ_TILE, BLOCK_N=PROJ_TILE, BLOCK_K=MIN_DOT, PRECISION=candidate.precision,
                num_warps=_warps(candidate), num_stages=max(1, candidate.stages))


def _rec_meta(candidate) -> dict:
    """Meta-parameters of `_lstm_recurrence_kernel` (persistent and stepwise modes).

    BLOCK_B = batch_tile; BLOCK_H = hidden_tile capped so the four fp32 gate accumulators
    (4 x BLOCK_B x BLOCK_H) take at most 16 registers per thread each (BLOCK_B*BLOCK_H <= 4*tg_size;
    larger tiles spill on sm_90); W_hh is streamed in BLOCK_K=16 x BLOCK_H tiles per gate.
    num_stages: in persistent mode the W_hh k-loop is software-pipelined `stages` deep (the next
    tile is fetched from L2 while the current one is in the dot); stepwise launches use one stage
    (two spill on sm_80). The arithmetic is the same either way."""
    num_warps = _warps(candidate)
    block_b = max(MIN_DOT, int(candidate.batch_tile))
    block_h = max(MIN_DOT, int(candidate.hidden_tile))
    while block_h > MIN_DOT and block_b * block_h > GATES * THREADS_PER_WARP * num_warps:
        block_h //= 2
    stages = max(1, int(candidate.stages)) if candidate.mode == "persistent" else 1
    return dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=MIN_DOT, num_warps=num_warps, num_stages=stages)


MMA_TILE = (16, 8)   # rows x columns of one warp's tensor-core product (m16n8), the unit the warps of a dot split


def _k_split(candidate) -> int:
    """Slices of K (the hidden size) the on-chip tensor-core recurrent product splits across a program's warps
    (kernels.py `_recurrent_product`): a program's output tile, BLOCK_B x 4 UNITS, is only (BLOCK_B / 16) x
    (4 UNITS / 8) warp tiles, which leaves most of its warps without work (16 gate columns: two tiles for eight
    warps), so the warps also split K and the slices are summed after, behind two more CTA barriers a step. sm_90
    SASS per step at hidden 128, 8 warps, instructions a warp (CTA barriers): 16 columns 286 (2) as fp32 FMAs ->
    156 (4) in four slices; 64 columns 400 (4) -> 371 (4) in two slices, 335 (6) unsplit, where two slices are
    the faster by the model, narrowly: hence at least two."""
    tiles = (max(MIN_DOT, int(candidate.batch_tile)) // MMA_TILE[0]) * (GATES * _units(candidate) // MMA_TILE[1])
    return max(2, _warps(candidate) // tiles)


def _units(candidate) -> int:
    return max(MIN_DOT // GATES, int(candidate.hidden_tile))


def _onchip_meta(candidate, hidden: int) -> dict:
    """Meta-parameters of `_lstm_onchip_kernel`: BLOCK_B = batch_tile, UNITS = hidden_tile units per program
    (4 * UNITS gate columns: at least 16), BLOCK_K = the hidden size padded to a power of two (a program reads
    the whole h row), PRECISION = the candidate's, K_SPLIT = `_k_split`. One stage: the time loop must not be
    software-pipelined, since the next h row is written by other programs during the step."""
    return dict(BLOCK_B=max(MIN_DOT, int(candidate.batch_tile)), UNITS=_units(candidate), BLOCK_K=_block_k(hidden),
                PRECISION=candidate.precision, K_SPLIT=_k_split(candidate), num_warps=_warps(candidate),
                num_stages=1)


def _bucket(value: int) -> int:
    return triton.next_power_of_2(max(1, int(value)))


# ---------------------------------------------------------------------------------------------
# co-residency of the on-chip recurrence
# ---------------------------------------------------------------------------------------------
_RESOURCES: Dict[tuple, Tuple[int, int, int]] = {}
_SM_LIMITS: Dict[tuple, Any] = {}


def _compiled_resources(record: Launch, facts) -> Tuple[int, int, int]:
    """(registers, shared bytes, warps) of the record's kernel as compiled for the device: the JIT's own
    compile on a CUDA tensor, the ahead-of-time compile for the profile's arch on meta tensors."""
    device = next(a.device for a in record.args if isinstance(a, torch.Tensor))
    arch = facts.capability[0] * 10 + facts.capability[1]
    key = (record.config_key(), arch, device.type)
    if key in _RESOURCES:
        return _RESOURCES[key]
    if device.type == "cuda":
        with launches.on_device(device):   # compiled for, and its occupancy read on, the tensors' GPU
            compiled = record.jit.warmup(*record.args, grid=record.grid, **record.meta, num_warps=record.num_warps,
                                         num_stages=record.num_stages, **record.launch_options())
            if hasattr(compiled, "_init_handles"):
                compiled._init_handles()
        resources = (int(compiled.n_regs), int(compiled.metadata.shared), int(compiled.metadata.num_warps))
    else:
        from rlx_triton.perf.compiled import CompileJob, compiled_in_process

        job = CompileJob.of(record, arch)
        compiled = compiled_in_process([job], interpreted_in_a_worker=True)[job]
        if not compiled.ok:
            raise RuntimeError(f"{record.name} does not compile for sm_{arch}: {compiled.error}")
        resources = (compiled.registers, compiled.shared, compiled.num_warps)
    _RESOURCES[key] = resources
    return resources


def _sm_limits(facts, device: torch.device):
    """The per-SM limits of the device: its own properties on CUDA, else the profile of its name (or of
    its compute capability), with the SM count the facts report."""
    key = (facts.fingerprint, device.type)
    if key in _SM_LIMITS:
        return _SM_LIMITS[key]
    base = devices.profile_for_name(facts.name) or next(
        (p for p in devices.cuda_profiles() if p.capability == tuple(facts.capability)), devices.profile("h100"))
    limits = dataclasses.replace(base, sm_count=int(facts.sm_count or base.sm_count))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        threads_per_sm = getattr(props, "max_threads_per_multi_processor", None)
        limits = dataclasses.replace(
            limits, sm_count=props.multi_processor_count,
            registers_per_sm=getattr(props, "regs_per_multiprocessor", limits.registers_per_sm),
            shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", limits.shared_per_sm),
            shared_per_cta=getattr(props, "shared_memory_per_block_optin", limits.shared_per_cta),
            max_warps_per_sm=limits.max_warps_per_sm if threads_per_sm is None else threads_per_sm // 32)
    _SM_LIMITS[key] = limits
    return limits


def co_residency_refusal(record: Launch, facts) -> Optional[Refusal]:
    """None when every program of the on-chip recurrence launch `record` can be resident at once on the
    device `facts` describe (so no program waits for the h of one that cannot start), else the typed
    refusal: the programs, the CTAs per SM the compiled kernel allows and the SMs."""

    if facts.kind != "cuda":
        return Refusal(DEVICE_UNSUPPORTED, f"the synchronised on-chip recurrence runs on CUDA devices, not "
                                           f"{facts.kind!r}")
    device = next(a.device for a in record.args if isinstance(a, torch.Tensor))
    try:
        registers, shared, warps = _compiled_resources(record, facts)
    except Exception as error:  # a configuration that does not compile here cannot be resident either
        return Refusal(DEVICE_UNSUPPORTED, f"{record.name} did not compile: {type(error).__name__}: {error}")
    limits = _sm_limits(facts, device)
    occ = occupancy(limits, registers, shared, warps)
    capacity = limits.sm_count * occ.ctas_per_sm
    if record.ctas > capacity:
        return Refusal(DEVICE_UNSUPPORTED,
                       f"{record.ctas} programs of {record.name} must be resident at once, but {limits.name} "
                       f"holds {capacity} ({occ.ctas_per_sm} per SM, limited by {occ.limiter}: {registers} "
                       f"registers, {shared} B shared memory, {warps} warps; {limits.sm_count} SMs)")
    return None


# cooperative launches the driver refused, per (device, compiled binary, grid): the reason
_REFUSED_LAUNCHES: Dict[tuple, str] = {}
# (candidate, device) pairs whose fallback was announced: one warning each per process
_WARNED: set = set()


def _launch_key(record: Launch, facts) -> tuple:
    return (facts.fingerprint, record.config_key(), record.grid)


def remember_refused_launch(record: Launch, facts, reason: str) -> None:
    _REFUSED_LAUNCHES[_launch_key(record, facts)] = reason


def synchronised_refusal(record: Launch, facts) -> Optional[Refusal]:
    """Why the synchronised on-chip launch `record` cannot run on the device `facts` describe, or None: the
    driver refused the same launch before, or `co_residency_refusal`."""
    refused = _REFUSED_LAUNCHES.get(_launch_key(record, facts))
    if refused is not None:
        return Refusal(DEVICE_UNSUPPORTED, refused)
    return co_residency_refusal(record, facts)


def warn_fallback(candidate, facts, reason: str) -> None:
    """One RuntimeWarning per (candidate, device) and process: the on-chip recurrence runs as its persistent
    fallback, and why."""
    key = (candidate.tag(), facts.fingerprint)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"rlx_triton lstm: the on-chip recurrence {candidate.tag()} cannot run synchronised on "
                  f"{facts.name}: {reason}; it runs as {fallback_candidate(candidate).tag()} (one program per "
                  f"direction and batch tile, slower)", RuntimeWarning, stacklevel=4)


def fallback_candidate(candidate):
    """The candidate a refused on-chip recurrence runs as: the persistent candidate of the same precision
    (one program per direction and batch tile, no wait between programs, always resident)."""
    for variant in LstmVariant:
        other = variant.candidate()
        if other.mode == "persistent" and other.precision == candidate.precision:
            return other
    return LstmVariant.PERSISTENT_IEEE.candidate()


# ---------------------------------------------------------------------------------------------
# the autotune bridge: projection and on-chip recurrence, keyed on buckets
# ---------------------------------------------------------------------------------------------
_PROJ_TUNE_KEY = ["batch_bucket", "seq_bucket", "N", "K"]
_REC_TUNE_KEY = ["batch_bucket", "seq_bucket", "H"]
_tuned: Dict[str, Any] = {}


def _config(meta: dict) -> triton.Config:
    meta = dict(meta)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _onchip_config(candidate) -> triton.Config:
    meta = _onchip_meta(candidate, 16)
    meta.pop("BLOCK_K")   # the hidden size's, not the candidate's: passed with the launch
    return _config(meta)


def _resident_configs(configs, named_args, **kwargs):
    """The autotuner's prune: only configurations whose programs can all be resident are benchmarked (the
    routed candidate's is, the launcher checked it), so a benchmark never waits for a program forever."""
    facts = device_facts(named_args["g_ptr"].device)
    if facts.kind != "cuda" or not kwargs.get("SYNC"):
        return configs
    grid_for = _onchip_grid(named_args["H"], named_args["B"], named_args["whh_ptr"].shape[0])
    args = tuple(named_args[name] for name in _lstm_onchip_kernel.arg_names if name in named_args)
    parameters = set(_lstm_onchip_kernel.arg_names)
    kept = []
    for config in configs:
        meta = {key: value for key, value in {**kwargs, **config.kwargs}.items() if key in parameters}
        record = Launch(_lstm_onchip_kernel, grid_for(meta), args, meta=meta, num_warps=config.num_warps,
                        num_stages=config.num_stages, cooperative=bool(kwargs.get("launch_cooperative_grid")))
        if co_residency_refusal(record, facts) is None:
            kept.append(config)
    return kept


def tuned_kernels() -> Dict[str, Any]:
    """{"projection", "recurrence"}: the two kernels under the autotune bridge, with a config per approved
    on-chip candidate (a cold bucket is benchmarked only where the bridge allows tuning; the routed
    candidate is injected otherwise). Benchmarks of the recurrence start from the saved exchange (h0 in
    slot 1) and cell state, and only co-resident configurations are benchmarked."""
    if not _tuned:
        from rlx_triton.backends.triton.autotune import TunedKernel

        onchip = [c for c in plan_candidates("lstm") if c.mode == "onchip" and c.tag() in APPROVALS]
        _tuned["projection"] = TunedKernel(_lstm_input_proj_kernel, onchip, lambda c: _config(_proj_meta(c)),
                                           key=_PROJ_TUNE_KEY)
        _tuned["recurrence"] = TunedKernel(_lstm_onchip_kernel, onchip, _onchip_config, key=_REC_TUNE_KEY,
                                           restore_value=["xchg_ptr", "c_ptr"],
                                           prune_configs_by={"early_config_prune": _resident_configs})
    return _tuned


# ---------------------------------------------------------------------------------------------
# launch plans
# ---------------------------------------------------------------------------------------------
_PROJ_UNITS = {"ieee": "fp32_fma", "tf32x3": "tf32x3", "tf32": "tf32"}


def _as_batched(input, hx, batch_first: bool):
    """(x, hx, unbatched): an unbatched (T, I) input and its (layers*D, H) state gain a batch of one."""
    unbatched = input.dim() == 2
    x = input.unsqueeze(1 if not batch_first else 0) if unbatched else input
    if hx is not None and unbatched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    return x, hx, unbatched


def _batch_tiles(batch: int, block_b: int) -> int:
    return triton.cdiv(batch, block_b)


def _onchip_grid(hidden: int, batch: int, directions: int):
    return lambda meta: (directions, triton.cdiv(hidden, meta["UNITS"]), _batch_tiles(batch, meta["BLOCK_B"]))


def _projection_launch(layer_in, w_ih_cat, bias, gates, candidate, *, batch: int, seq: int, tuned) -> Launch:
    """G = X @ W_ih_cat^T + bias for every timestep and direction of one layer."""
    rows, in_features = gates.shape[0], layer_in.shape[-1]
    n_cols = w_ih_cat.shape[0]
    args = (layer_in, w_ih_cat, bias if bias is not None else w_ih_cat, gates, rows, n_cols, in_features,
            in_features, w_ih_cat.stride(0), gates.stride(0), _bucket(batch), _bucket(seq))
    counts = dict(bytes_read=(rows * in_features + n_cols * in_features + (n_cols if bias is not None else 0)) * 4,
                  bytes_written=rows * n_cols * 4, flops=2 * rows * n_cols * in_features,
                  unit=_PROJ_UNITS[candidate.precision])
    flags = dict(HAS_BIAS=bias is not None)
    grid_for = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))  # noqa: E731
    if tuned is not None:
        return Launch.tuned(tuned[0]["projection"], candidate, grid_for, args, flags, route=tuned[1], **counts)
    meta = _proj_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return Launch(_lstm_input_proj_kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=num_warps,
                  num_stages=num_stages, **counts)


def _recurrence_launches(gates, w_hh_stack, h0, c_state, y, hn, *, T, B, hidden, directions, batch_first,
                         candidate) -> List[Launch]:
    """The recurrence of one layer on `_lstm_recurrence_kernel`: one launch over [0, T) (persistent), or one
    per timestep (stepwise).

    Bytes are what each launch needs from memory once: W_hh (every stepwise launch reads all of it again),
    the input gates, the previous h and the cell state of its steps, and the h rows it writes."""
    meta = _rec_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    strides = _gate_strides(y, T, B, GATES * hidden * directions, batch_first)
    grid = (directions, triton.cdiv(B, meta["BLOCK_B"]))
    state = directions * B * hidden * 4

    def launch(step_begin: int, step_end: int) -> Launch:
        steps = step_end - step_begin
        read = w_hh_stack.numel() * 4 + steps * (B * GATES * hidden * directions * 4 + state) + 2 * state
        written = steps * state + 2 * state
        return Launch(_lstm_recurrence_kernel, grid,
                      (gates, w_hh_stack, h0, c_state, y, hn, T, B, hidden, step_begin, step_end, *strides),
                      meta=meta, num_warps=num_warps, num_stages=num_stages, bytes_read=read, bytes_written=written,
                      flops=steps * (2 * B * directions * GATES * hidden * hidden), unit="fp32_fma")

    if candidate.mode == "stepwise":
        return [launch(s, s + 1) for s in range(T)]
    return [launch(0, T)]


def _gate_strides(y, T: int, B: int, n_cols: int, batch_first: bool) -> tuple:
    """(stride_gt, stride_gb, stride_yt, stride_yb): G rows are b*T + t batch-first, else t*B + b."""
    if batch_first:
        return n_cols, T * n_cols, y.stride(1), y.stride(0)
    return B * n_cols, n_cols, y.stride(0), y.stride(1)


def _onchip_launches(gates, w_hh_stack, exchange, c_state, y, hn, *, T, B, hidden, directions, batch_first,
                     candidate, synchronised: bool, polls: bool, tuned) -> List[Launch]:
    """The recurrence of one layer on `_lstm_onchip_kernel`: one synchronised launch over [0, T), or (the
    mode the interpreter checks, where programs run one after another) one launch per timestep with the
    launch boundary as the wait: the same arithmetic, W_hh reloaded and the cell state saved per launch.
    `exchange` is the layer's (directions, 2, rows, BLOCK_K) int64 exchange with h0 in slot 1 (`exchange_buffer`).
    `polls` (the kernel's SYNC): each step's reads wait for their tags, as a GPU's concurrent threads and
    programs must; the interpreter, which runs each operation over a whole program before the next, reads
    once (a synchronised launch there is a group of one program, whose previous step is complete).

    Bytes: W_hh once per launch, the input gates and the cell state, the h rows the steps write (the
    exchange words the programs of a group read back from L2 are not memory traffic)."""
    strides = _gate_strides(y, T, B, GATES * hidden * directions, batch_first)
    state = directions * B * hidden * 4
    grid_for = _onchip_grid(hidden, B, directions)
    flags = dict(BLOCK_K=_block_k(hidden), SYNC=polls)
    # programs that wait for each other's h: a cooperative launch, which the driver makes resident all at
    # once or refuses (a group of one program waits for no other)
    cooperative = synchronised and _onchip_parts(hidden, candidate) > 1

    def launch(step_begin: int, step_end: int) -> Launch:
        steps = step_end - step_begin
        args = (gates, w_hh_stack, exchange, c_state, y, hn, T, B, hidden, step_begin, step_end, *strides,
                _bucket(B), _bucket(T))
        counts = dict(bytes_read=w_hh_stack.numel() * 4 + steps * B * GATES * hidden * directions * 4 + 2 * state,
                      bytes_written=steps * state + 2 * state,
                      flops=steps * (2 * B * directions * GATES * hidden * hidden),
                      unit=_PROJ_UNITS[candidate.precision])
        if tuned is not None:
            return Launch.tuned(tuned[0]["recurrence"], candidate, grid_for, args, flags, route=tuned[1],
                                cooperative=cooperative, **counts)
        meta = _onchip_meta(candidate, hidden)
        num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
        return Launch(_lstm_onchip_kernel, grid_for(meta), args, meta={**meta, **flags},
                      num_warps=num_warps, num_stages=num_stages, cooperative=cooperative, **counts)

    if synchronised:
        return [launch(0, T)]
    return [launch(s, s + 1) for s in range(T)]


FIRST_READ_TAG = 1   # the tag step 0 reads h0 with (kernels.py: step s reads tag s + 1)


def exchange_shape(directions: int, batch: int, hidden: int) -> Tuple[int, int, int, int]:
    """One layer's exchange: (directions, 2 slots, the batch padded to EXCHANGE_ROWS, BLOCK_K)."""
    return directions, 2, triton.cdiv(batch, EXCHANGE_ROWS) * EXCHANGE_ROWS, _block_k(hidden)


def exchange_buffer(h0_all: torch.Tensor, num_layers: int, directions: int, hidden: int) -> torch.Tensor:
    """The on-chip recurrence's exchange for every layer of a call: int64 (layers, directions, 2, rows, BLOCK_K)
    with rows the batch padded to EXCHANGE_ROWS. Slot 0 holds tag 0 (no step reads it), slot 1 each layer's h0
    tagged FIRST_READ_TAG (padded rows 0.0), as the kernel's `_tagged_bits` packs a word (fp32 bits low, tag
    high); columns past the hidden size hold 0.0 tagged PAD_TAG. Built with every call, so a captured CUDA
    graph rebuilds it at each replay and a launch never reads another's words."""
    batch = h0_all.shape[1]
    exchange = torch.zeros(num_layers, *exchange_shape(directions, batch, hidden), device=h0_all.device,
                           dtype=torch.int64)
    exchange[..., hidden:] = PAD_TAG << 32
    exchange[:, :, 1, :, :hidden] = FIRST_READ_TAG << 32
    h0_bits = h0_all.reshape(num_layers, directions, batch, hidden).view(torch.int32).to(torch.int64)
    exchange[:, :, 1, :batch, :hidden] |= h0_bits & 0xFFFFFFFF
    return exchange


def _onchip_parts(hidden: int, candidate) -> int:
    """Programs per (direction, batch tile) group: the hidden units split UNITS at a time."""
    return triton.cdiv(hidden, _onchip_meta(candidate, hidden)["UNITS"])


def recurrence_mode(candidate, *, hidden: int, facts, step_launches: Optional[bool] = None) -> str:
    """How an on-chip candidate runs its recurrence on the device `facts` describe: "synchronised" (one
    launch per layer, the programs of a group wait for each other's h each step) on CUDA, or where a group is a
    single program; "step_launches" (one launch per step) where programs do not run concurrently (the
    interpreter), or when asked for (step_launches=True)."""
    if step_launches is None:
        step_launches = facts.kind != "cuda" and _onchip_parts(hidden, candidate) > 1
    return "step_launches" if step_launches else "synchronised"


def lstm_plan(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]],
              flat_weights: List[torch.Tensor], *, has_biases: bool, num_layers: int, dropout: float, training: bool,
              bidirectional: bool, batch_first: bool, proj_size: int = 0, candidate, route=None,
              step_launches: Optional[bool] = None, on_fallback: Optional[Callable[[str], None]] = None):
    """The launches of `lstm` as records, and the fp32 buffers they fill: (records, (y, h_n, c_n)).

    Per layer: the input projection, then the recurrence. An on-chip candidate runs synchronised on CUDA
    (a cooperative launch) when every program of the launch can be resident at once and the driver has not
    refused that launch before (`synchronised_refusal`); otherwise it runs as `fallback_candidate(candidate)`
    and `on_fallback` is called with the reason. With a route (the op's
    call) the on-chip kernels launch through the autotune bridge. Buffers are allocated on the input's
    device, so meta inputs give the plan at any shape (as on the device profile the router reads)."""
    x, hx, _unbatched = _as_batched(input, hx, batch_first)
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1]
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    device = x.device

    h_n = torch.empty(num_layers * directions, B, hidden, device=device, dtype=torch.float32)
    if hx is None:
        c_n = torch.zeros(num_layers * directions, B, hidden, device=device, dtype=torch.float32)
        h0_all = torch.zeros_like(c_n)
    else:
        c_n = hx[1].to(torch.float32).contiguous().clone()
        h0_all = hx[0].to(torch.float32).contiguous()

    onchip = candidate.mode == "onchip"
    synchronised = False
    exchange = None
    if onchip:
        facts = device_facts(device)
        synchronised = recurrence_mode(candidate, hidden=hidden, facts=facts,
                                       step_launches=step_launches) == "synchronised"
        exchange = exchange_buffer(h0_all, num_layers, directions, hidden)
    tuned = None
    if onchip and route is not None and route.candidate is not None and route.candidate.tag() == candidate.tag():
        kernels = tuned_kernels()
        if candidate.tag() in kernels["recurrence"].tags:
            tuned = (kernels, route)

    records: List[Launch] = []
    layer_in = x.to(torch.float32).contiguous()
    for layer in range(num_layers):
        w_ih_cat, w_hh_stack, bias = _layer_weights(flat_weights, has_biases, layer, directions, unit_major=onchip)
        gates = torch.empty(B * T, w_ih_cat.shape[0], device=device, dtype=torch.float32)
        projection = _projection_launch(layer_in, w_ih_cat, bias, gates, candidate, batch=B, seq=T, tuned=tuned)
        y = torch.empty(*layer_in.shape[:2], directions * hidden, device=device, dtype=torch.float32)
        sl = slice(layer * directions, (layer + 1) * directions)
        shape = dict(T=T, B=B, hidden=hidden, directions=directions, batch_first=batch_first)
        if onchip:
            assert exchange is not None   # allocated above for the on-chip mode
            recurrence = _onchip_launches(gates, w_hh_stack, exchange[layer], c_n[sl], y, h_n[sl],
                                          candidate=candidate, synchronised=synchronised,
                                          polls=synchronised and facts.kind == "cuda", tuned=tuned, **shape)
            if synchronised and layer == 0 and facts.kind == "cuda":
                refusal = synchronised_refusal(recurrence[0], facts)
                if refusal is not None:
                    if on_fallback is not None:
                        on_fallback(refusal.reason)
                    fallback = fallback_candidate(candidate)
                    records, outputs = lstm_plan(
                        input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers, dropout=dropout,
                        training=training, bidirectional=bidirectional, batch_first=batch_first,
                        proj_size=proj_size, candidate=fallback)
                    return records, outputs
        else:
            recurrence = _recurrence_launches(gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl],
                                              candidate=candidate, **shape)
        records.append(projection)
        records += recurrence
        layer_in = y
    return records, (layer_in, h_n, c_n)

def launch_count(request, candidate) -> int:
    """Launches of one routed call: per layer the projection, then the recurrence: 1 launch (persistent; on-chip
    synchronised, or its persistent fallback), or one per timestep (stepwise; on-chip where programs do not
    run concurrently and a group has several programs)."""
    fields = request.field_map
    steps = candidate.mode == "stepwise" or (
        candidate.mode == "onchip"
        and recurrence_mode(candidate, hidden=fields["hidden"], facts=device_facts(request.device)) == "step_launches")
    return fields["layers"] * (1 + (fields["seq"] if steps else 1))


def synchronised_onchip_record(candidate, *, batch: int, seq: int, hidden: int, directions: int,
                               batch_first: bool) -> Launch:
    """The record of one layer's synchronised on-chip recurrence on a GPU (one launch over every step, each step
    polling the exchange) at a shape, on meta tensors: what `explain_execution`'s co-residency check reads, and
    what a compile for a GPU arch builds from."""

    def meta_fp32(*shape: int) -> torch.Tensor:
        return torch.empty(shape, device="meta", dtype=torch.float32)

    state = meta_fp32(directions, batch, hidden)
    y_shape = (batch, seq, directions * hidden) if batch_first else (seq, batch, directions * hidden)
    exchange = torch.empty(exchange_shape(directions, batch, hidden), device="meta", dtype=torch.int64)
    return _onchip_launches(meta_fp32(batch * seq, directions * GATES * hidden),
                            meta_fp32(directions, GATES * hidden, _block_k(hidden)), exchange, state,
                            meta_fp32(*y_shape), state, T=seq, B=batch, hidden=hidden, directions=directions,
                            batch_first=batch_first, candidate=candidate, synchronised=True, polls=True,
                            tuned=None)[0]


def explain_execution(request, candidate) -> Optional[str]:
    """How a routed call's recurrence runs on the request's device, and why (rt.explain's `runs` line): the
    on-chip recurrence in one cooperative launch per layer, one launch per step, or the persistent fallback
    with the refusal that sent it there (the check the launcher makes, on a plan built from the request's
    shape)."""
    if candidate.mode != "onchip":
        return f"{candidate.mode} recurrence"
    fields, features = request.field_map, request.feature_map
    facts = device_facts(request.device)
    hidden, batch, seq, directions = fields["hidden"], fields["batch"], fields["seq"], fields["directions"]
    if recurrence_mode(candidate, hidden=hidden, facts=facts) == "step_launches":
        return "on-chip recurrence, one launch per step (programs here run one after another, not at once)"
    if facts.kind != "cuda" or _onchip_parts(hidden, candidate) == 1:
        return "on-chip recurrence, one launch per layer (one program per group: no wait between programs)"

    record = synchronised_onchip_record(candidate, batch=batch, seq=seq, hidden=hidden, directions=directions,
                                        batch_first=features["batch_first"])
    refusal = synchronised_refusal(record, facts)
    if refusal is not None:
        return f"persistent fallback {fallback_candidate(candidate).tag()}: {refusal.reason}"
    return (f"on-chip recurrence, one cooperative launch per layer ({record.ctas} programs, all resident at "
            f"once on {facts.name})")

