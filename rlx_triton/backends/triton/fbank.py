"""Kaldi log-mel filterbank as one fused Triton kernel per tile of frames, plus the fbank routing data.

`_fbank_frames_kernel` takes BLOCK_F frames of one waveform (grid: frame tiles x batch) and does:
framing (both snip_edges modes, Kaldi's [2,1,0,0,1,2] reflection when snip_edges=False), the
optional input scale (WeSpeaker's x32768), DC removal, the log energy (raw or after the window),
pre-emphasis, the window, the real DFT as `tl.dot` against a precomputed cos/sin basis in true fp32
(input_precision "ieee" or "tf32x3", never plain tf32), power or magnitude, the mel projection (a
second `tl.dot`), the log floor and the output column order (energy first, or last with htk_compat).
The frames are never stored: each WINDOW_STEP-sample slice is rebuilt in registers from the
waveform where a dot needs it (pass 1 sums the frame means, pass 2 the energies, pass 3 runs the
DFT, BLOCK_K bins at a time, folding each bin chunk's power straight into the mel accumulator).
`_fbank_cmn_kernel` is the tiny second pass for subtract_mean (the mean over frames per column),
which torchaudio's subtract_mean and the WeSpeaker front end's CMN both are.

Accuracy: the DFT basis is float64 split into a float32 (hi, lo) pair, so the basis carries no
rounding; pre-emphasis is computed as (x[j] - x[j-1]) + (1 - c) * (x[j-1] - mean), which cancels the
large common part exactly. Against float64 the kernel's features are as close as torchaudio's own
float32 rfft path, or closer (tests/triton/test_fbank.py).

Window and mel matrix come from rlx_triton.backends.torch_ref.fbank, built exactly as torchaudio
builds them; all constants are cached per option set and device. dither > 0 is not covered here:
torchaudio draws independent noise per frame sample, so the router sends such calls to the torch
fallback (the `dither` feature below), as it does for calls that need autograd.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.backends.torch_ref import fbank as _ref
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.fbank import DEFAULT_VARIANT, FbankCandidate, FbankVariant
from rlx_triton.router.coverage import Coverage

MAX_WINDOW = 1024  # largest padded DFT length covered (the cached basis is 4 x window x window / 2 floats)
MAX_BINS = 128  # mel bins (padded to a power of two) accumulated per frame row
# window samples per tl.dot step of the DFT: the frames are rebuilt in registers step by step (the
# whole 512-sample frame as one dot operand lowers to far too much unrolled code for fp32 dots)
WINDOW_STEP = 16
# the unit that executes a candidate's dots (rlx_triton.devices.UNITS)
_UNITS = {"ieee": "fp32_fma", "tf32x3": "tf32x3"}

COVERAGE = Coverage(
    ops=frozenset({"fbank"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"bins": (4, MAX_BINS), "window": (2, MAX_WINDOW), "samples": (1, 2**31 - 2 * MAX_WINDOW)},
    features=_ref.KERNEL_FEATURES,
    weight_features=frozenset(),
)


# ---------------------------------------------------------------------------------------------
# kernels

@triton.jit
def _reflect(pos, num_samples):
    """Kaldi reflection [2, 1, 0, 0, 1, 2]: index -1 reads sample 0, index T reads sample T - 1."""
    pos = tl.where(pos < 0, -pos - 1, pos)
    return tl.where(pos >= num_samples, 2 * num_samples - 1 - pos, pos)


@triton.jit
def _load_frames_chunk(wave_row, frames, frame_mask, start, c0, num_samples, mean, window_ptr, input_scale,
                       one_minus_preemph, WIN: tl.constexpr, WIN_CHUNK: tl.constexpr, SNIP_EDGES: tl.constexpr,
                       PREEMPH: tl.constexpr, SCALE_INPUT: tl.constexpr, WINDOWED: tl.constexpr):
    """Columns c0 .. c0 + WIN_CHUNK of BLOCK_F frames: framed, scaled, DC-free, pre-emphasized, windowed.

    WINDOWED=False stops after DC removal (the raw-energy input). Columns past WIN and frames past
    the end are zero.
    """
    cols = c0 + tl.arange(0, WIN_CHUNK)
    col_mask = cols < WIN
    tile_mask = frame_mask[:, None] & col_mask[None, :]
    pos = start[:, None] + cols[None, :]
    if not SNIP_EDGES:
        pos = _reflect(pos, num_samples)
    x = tl.load(wave_row + pos, mask=tile_mask, other=0.0).to(tl.float32)
    if SCALE_INPUT:
        x = x * input_scale
    if WINDOWED:
        if PREEMPH:
            # previous sample, column j - 1, with x[-1] := x[0] (replicate pad)
            prev_pos = start[:, None] + tl.maximum(cols - 1, 0)[None, :]
            if not SNIP_EDGES:
                prev_pos = _reflect(prev_pos, num_samples)
            prev = tl.load(wave_row + prev_pos, mask=tile_mask, other=0.0).to(tl.float32)
            if SCALE_INPUT:
                prev = prev * input_scale
            # (x[j] - mean) - c * (x[j-1] - mean), rearranged as (x[j] - x[j-1]) + (1 - c) * (x[j-1] - mean):
            # the large common part cancels exactly before rounding, so the low-frequency bins (which
            # pre-emphasis attenuates by ~30 dB) keep their precision
            x = (x - prev) + one_minus_preemph * (prev - mean[:, None])
        else:
            x = x - mean[:, None]
        window = tl.load(window_ptr + cols, mask=col_mask, other=0.0)
        x = x * window[None, :]
    else:
        x = x - mean[:, None]
    return tl.where(tile_mask, x, 0.0)


@triton.jit
def _fbank_frames_kernel(
    wave_ptr, window_ptr, basis_ptr, melt_ptr, out_ptr,
    num_samples, num_frames,
    stride_wave_b, stride_out_b, stride_out_f,
    frame_shift, reflect_pad,
    input_scale, one_minus_preemph, log_energy_floor,
    WIN: tl.constexpr,  # samples per frame (window_size)
    WIN_P: tl.constexpr,  # WIN padded to a multiple of WIN_CHUNK: the DFT reduction length
    WIN_CHUNK: tl.constexpr,  # window samples per tl.dot step
    NFREQ_P: tl.constexpr,  # DFT bins computed (padded_window_size // 2, padded to a power of two)
    NUM_MEL: tl.constexpr,  # mel bins written
    MEL_P: tl.constexpr,  # NUM_MEL padded to a power of two (>= 16)
    MEL_COL0: tl.constexpr,  # output column of mel bin 0 (1 when the energy comes first)
    ENERGY_COL: tl.constexpr,  # output column of the log energy
    BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    SNIP_EDGES: tl.constexpr, REMOVE_DC: tl.constexpr, PREEMPH: tl.constexpr,
    RAW_ENERGY: tl.constexpr, USE_ENERGY: tl.constexpr, ENERGY_FLOOR: tl.constexpr,
    USE_POWER: tl.constexpr, USE_LOG: tl.constexpr, SCALE_INPUT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_f = tl.program_id(0)
    pid_b = tl.program_id(1)
    eps = 1.1920928955078125e-07  # numeric_limits<float>::epsilon()

    frames = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    frame_mask = frames < num_frames
    # the row offset is int64 (a batch of long waveforms passes 2^31 samples); offsets inside one row
    # stay int32 (coverage caps samples per row below 2^31)
    wave_row = wave_ptr + pid_b.to(tl.int64) * stride_wave_b
    start = frames * frame_shift - reflect_pad

    # pass 1: the frame means (DC offset)
    zero = tl.zeros((BLOCK_F,), dtype=tl.float32)
    mean = zero
    if REMOVE_DC:
        total = tl.zeros((BLOCK_F,), dtype=tl.float32)
        for c0 in range(0, WIN_P, WIN_CHUNK):
            chunk = _load_frames_chunk(wave_row, frames, frame_mask, start, c0, num_samples, zero, window_ptr,
                                       input_scale, one_minus_preemph, WIN, WIN_CHUNK, SNIP_EDGES, PREEMPH,
                                       SCALE_INPUT, False)
            total += tl.sum(chunk, axis=1)
        mean = total / WIN

    # pass 2 (with use_energy): the log energy, before (raw) or after pre-emphasis and window
    if USE_ENERGY:
        energy = tl.zeros((BLOCK_F,), dtype=tl.float32)
        for c0 in range(0, WIN_P, WIN_CHUNK):
            chunk = _load_frames_chunk(wave_row, frames, frame_mask, start, c0, num_samples, mean, window_ptr,
                                       input_scale, one_minus_preemph, WIN, WIN_CHUNK, SNIP_EDGES, PREEMPH,
                                       SCALE_INPUT, not RAW_ENERGY)
            energy += tl.sum(chunk * chunk, axis=1)

    # pass 3: real DFT by chunks of BLOCK_K bins (each reduced over the window in WIN_CHUNK steps),
    # every chunk's power folded straight into the mel accumulator
    PLANE: tl.constexpr = WIN_P * NFREQ_P
    mel_cols = tl.arange(0, MEL_P)
    acc = tl.zeros((BLOCK_F, MEL_P), dtype=tl.float32)
    for k0 in range(0, NFREQ_P, BLOCK_K):
        bins = k0 + tl.arange(0, BLOCK_K)
        re = tl.zeros((BLOCK_F, BLOCK_K), dtype=tl.float32)
        im = tl.zeros((BLOCK_F, BLOCK_K), dtype=tl.float32)
        for c0 in range(0, WIN_P, WIN_CHUNK):
            x = _load_frames_chunk(wave_row, frames, frame_mask, start, c0, num_samples, mean, window_ptr,
                                   input_scale, one_minus_preemph, WIN, WIN_CHUNK, SNIP_EDGES, PREEMPH,
                                   SCALE_INPUT, True)
            basis_rows = c0 + tl.arange(0, WIN_CHUNK)
            basis_offsets = basis_rows[:, None] * NFREQ_P + bins[None, :]
            # each basis is a float32 pair (hi, lo) with hi + lo = the float64 value to ~1e-16
            re = tl.dot(x, tl.load(basis_ptr + basis_offsets), re, input_precision=PRECISION)
            re = tl.dot(x, tl.load(basis_ptr + PLANE + basis_offsets), re, input_precision=PRECISION)
            im = tl.dot(x, tl.load(basis_ptr + 2 * PLANE + basis_offsets), im, input_precision=PRECISION)
            im = tl.dot(x, tl.load(basis_ptr + 3 * PLANE + basis_offsets), im, input_precision=PRECISION)
        spectrum = re * re + im * im
        if not USE_POWER:
            spectrum = tl.sqrt_rn(spectrum)
        melt_tile = tl.load(melt_ptr + bins[:, None] * MEL_P + mel_cols[None, :])
        acc = tl.dot(spectrum, melt_tile, acc, input_precision=PRECISION)

    # the floors keep NaN (torch.max(x, eps) propagates it, so a frame that holds a NaN or Inf sample is
    # NaN in torchaudio); tl.maximum's default would replace NaN by the floor
    if USE_LOG:
        acc = tl.log(tl.maximum(acc, eps, propagate_nan=tl.PropagateNan.ALL))

    out_rows = out_ptr + pid_b.to(tl.int64) * stride_out_b + frames.to(tl.int64) * stride_out_f
    mel_mask = frame_mask[:, None] & (mel_cols < NUM_MEL)[None, :]
    tl.store(out_rows[:, None] + MEL_COL0 + mel_cols[None, :], acc, mask=mel_mask)
    if USE_ENERGY:
        log_energy = tl.log(tl.maximum(energy, eps, propagate_nan=tl.PropagateNan.ALL))
        if ENERGY_FLOOR:
            log_energy = tl.maximum(log_energy, log_energy_floor, propagate_nan=tl.PropagateNan.ALL)
        tl.store(out_rows + ENERGY_COL, log_energy, mask=frame_mask)


@triton.jit
def _fbank_cmn_kernel(
    out_ptr, num_frames, num_cols,
    stride_out_b, stride_out_f,
    BLOCK_F: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Subtract, per waveform and column, the mean over frames (in place)."""
    pid_b = tl.program_id(0)
    pid_c = tl.program_id(1)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < num_cols
    base = out_ptr + pid_b.to(tl.int64) * stride_out_b

    total = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for f0 in range(0, num_frames, BLOCK_F):
        frames = f0 + tl.arange(0, BLOCK_F)
        mask = (frames < num_frames)[:, None] & col_mask[None, :]
        offsets = frames.to(tl.int64)[:, None] * stride_out_f + cols[None, :]
        total += tl.sum(tl.load(base + offsets, mask=mask, other=0.0), axis=0)
    mean = total / num_frames

    for f0 in range(0, num_frames, BLOCK_F):
        frames = f0 + tl.arange(0, BLOCK_F)
        mask = (frames < num_frames)[:, None] & col_mask[None, :]
        offsets = frames.to(tl.int64)[:, None] * stride_out_f + cols[None, :]
        values = tl.load(base + offsets, mask=mask, other=0.0)
        tl.store(base + offsets, values - mean[None, :], mask=mask)


# ---------------------------------------------------------------------------------------------
# per-option-set constants (cached)

def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def _window_padded(window_size: int) -> int:
    """The DFT reduction length: window_size rounded up to a whole number of WINDOW_STEP steps."""
    return triton.cdiv(window_size, WINDOW_STEP) * WINDOW_STEP


@functools.lru_cache(maxsize=32)
def _dft_basis(window_size: int, padded_window_size: int, device: torch.device) -> torch.Tensor:
    """(4, WIN_P, NFREQ_P) float32 planes: cos hi, cos lo, -sin hi, -sin lo of 2*pi*j*k/N.

    The angles and values are float64; hi is the value rounded to float32 and lo the float32 rounding of
    the remainder, so x @ hi + x @ lo carries the basis to ~1e-16 and the DFT's error is that of the
    float32 accumulation alone. Bins 0 .. N/2 - 1 are computed: the Nyquist bin has a zero mel weight
    in every option set. j*k is reduced mod N before the angle is formed.
    """
    win_p = _window_padded(window_size)
    nfreq = padded_window_size // 2
    nfreq_p = _pow2(nfreq)
    j = torch.arange(win_p, dtype=torch.int64)[:, None]
    k = torch.arange(nfreq_p, dtype=torch.int64)[None, :]
    angle = (2.0 * math.pi / padded_window_size) * ((j * k) % padded_window_size).to(torch.float64)
    valid = (j < window_size) & (k < nfreq)
    planes = []
    for value in (torch.cos(angle), -torch.sin(angle)):
        value = torch.where(valid, value, 0.0)
        hi = value.to(torch.float32)
        lo = (value - hi.to(torch.float64)).to(torch.float32)
        planes += [hi, lo]
    return torch.stack(planes).contiguous().to(device)


@functools.lru_cache(maxsize=32)
def _mel_transposed(options: FbankOptions, device: torch.device) -> torch.Tensor:
    """(NFREQ_P, MEL_P) float32: torchaudio's mel weights, transposed and zero padded."""
    weights = _ref.mel_banks(options)  # (num_mel_bins, N/2) float32
    nfreq_p = _pow2(options.padded_window_size // 2)
    mel_p = _pow2(options.num_mel_bins)
    melt = torch.zeros(nfreq_p, mel_p, dtype=torch.float32)
    melt[: weights.shape[1], : weights.shape[0]] = weights.T
    return melt.contiguous().to(device)


@functools.lru_cache(maxsize=32)
def _window(options: FbankOptions, device: torch.device) -> torch.Tensor:
    return _ref.window_function(options, torch.float32).contiguous().to(device)


# ---------------------------------------------------------------------------------------------
# launcher

def _meta(candidate, options: FbankOptions) -> Dict[str, object]:
    """FbankCandidate -> meta-parameters: tile_frames -> BLOCK_F, tile_freq -> BLOCK_K (capped by the
    bins computed), tg_size // 32 -> num_warps, stages -> num_stages, precision -> tl.dot input_precision."""
    if candidate.precision not in ("ieee", "tf32x3"):
        raise ValueError(f"fbank candidate precision must be 'ieee' or 'tf32x3', got {candidate.precision!r}")
    nfreq_p = _pow2(options.padded_window_size // 2)
    return dict(
        BLOCK_F=max(16, int(candidate.tile_frames)),
        BLOCK_K=min(max(16, int(candidate.tile_freq)), nfreq_p),
        PRECISION=candidate.precision,
        num_warps=max(1, int(candidate.tg_size) // 32),
        num_stages=int(candidate.stages),
    )


def _constexprs(options: FbankOptions) -> Dict[str, object]:
    """Constexprs fixed by the option set (everything but the candidate's tiling)."""
    energy_first = options.use_energy and not options.htk_compat
    return dict(
        WIN=options.window_size,
        WIN_P=_window_padded(options.window_size),
        WIN_CHUNK=WINDOW_STEP,
        NFREQ_P=_pow2(options.padded_window_size // 2),
        NUM_MEL=options.num_mel_bins,
        MEL_P=_pow2(options.num_mel_bins),
        MEL_COL0=1 if energy_first else 0,
        ENERGY_COL=0 if energy_first else options.num_mel_bins,
        SNIP_EDGES=options.snip_edges,
        REMOVE_DC=options.remove_dc_offset,
        PREEMPH=options.preemphasis_coefficient != 0.0,
        RAW_ENERGY=options.raw_energy,
        USE_ENERGY=options.use_energy,
        ENERGY_FLOOR=options.energy_floor != 0.0,
        USE_POWER=options.use_power,
        USE_LOG=options.use_log_fbank,
        SCALE_INPUT=options.input_scale != 1.0,
    )


_CMN_BLOCK_F = 32


def _cmn_block_cols(num_columns: int) -> int:
    return 16 if num_columns <= 16 else 32


def fbank_plan(waveform: torch.Tensor, options: FbankOptions, *, candidate) -> Tuple[List[Launch], torch.Tensor]:
    """The launches of `fbank` as records, and the output they fill (on the waveform's device; meta
    tensors give the plan at any shape without running anything).

    Records: `_fbank_frames_kernel` over (frame tiles, batch), then `_fbank_cmn_kernel` with
    subtract_mean. Bytes are the global traffic each launch needs, each byte once: the waveform rows,
    the window, DFT basis and mel matrix, and the features written (the CMN pass reads and writes them).
    FLOPs are the dots as executed (padded tiles: BLOCK_F frames x NFREQ_P bins x WIN_P samples, four
    basis planes; the mel dot over MEL_P columns) plus the power spectrum, on the unit of the
    candidate's precision; the per-sample framing arithmetic is not counted.
    """
    if options.dither != 0.0:
        raise ValueError("fbank: the triton kernel covers dither=0 only; dither > 0 runs on the torch fallback")
    # rows may be strided (e.g. channel 0 of a (B, C, T) batch); samples inside a row must be adjacent
    wave = waveform if waveform.stride(-1) == 1 else waveform.contiguous()
    batch, num_samples = wave.shape
    num_frames = options.num_frames(num_samples)
    out = torch.empty(batch, num_frames, options.num_columns, device=wave.device, dtype=torch.float32)
    if batch == 0 or num_frames <= 0:
        return [], out
    device = wave.device
    meta = _meta(candidate, options)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    constexprs = _constexprs(options)
    window = _window(options, device)
    basis = _dft_basis(options.window_size, options.padded_window_size, device)
    melt = _mel_transposed(options, device)
    tiles = triton.cdiv(num_frames, meta["BLOCK_F"])
    padded_frames = batch * tiles * meta["BLOCK_F"]
    win_p, nfreq_p, mel_p = constexprs["WIN_P"], constexprs["NFREQ_P"], constexprs["MEL_P"]
    dft_flops = 2 * 4 * padded_frames * nfreq_p * win_p
    mel_flops = 2 * padded_frames * nfreq_p * mel_p + 3 * padded_frames * nfreq_p
    out_bytes = out.numel() * out.element_size()
    plan = [Launch(
        _fbank_frames_kernel, (tiles, batch),
        (wave, window, basis, melt, out,
         num_samples, num_frames,
         wave.stride(0), out.stride(0), out.stride(1),
         options.window_shift, 0 if options.snip_edges else options.reflect_pad,
         float(options.input_scale), 1.0 - float(options.preemphasis_coefficient),
         math.log(options.energy_floor) if options.energy_floor > 0 else 0.0),
        meta=dict(**constexprs, **meta), num_warps=num_warps, num_stages=num_stages,
        bytes_read=batch * num_samples * wave.element_size() + sum(
            t.numel() * t.element_size() for t in (window, basis, melt)),
        bytes_written=out_bytes, flops=dft_flops + mel_flops, unit=_UNITS[candidate.precision])]
    if options.subtract_mean:
        cmn_cols = _cmn_block_cols(options.num_columns)
        plan.append(Launch(
            _fbank_cmn_kernel, (batch, triton.cdiv(options.num_columns, cmn_cols)),
            (out, num_frames, options.num_columns, out.stride(0), out.stride(1)),
            meta=dict(BLOCK_F=_CMN_BLOCK_F, BLOCK_C=cmn_cols), num_warps=1, num_stages=3,
            bytes_read=out_bytes, bytes_written=out_bytes, flops=2 * out.numel()))
    return plan, out


def fbank(waveform: torch.Tensor, options: FbankOptions, *, candidate) -> torch.Tensor:
    """(B, T) waveform (float32/float16/bfloat16) -> (B, frames, num_mel_bins + use_energy) float32.

    The caller (rlx_triton.ops.fbank) has validated the shape: T holds at least one window and
    min_duration is met. dither must be 0 (the router sends dither > 0 to the torch fallback).
    """
    plan, out = fbank_plan(waveform, options, candidate=candidate)
    launches.run(plan)
    return out


def launch_count(request, candidate) -> int:
    """Launches `fbank` makes for a routed request (a waveform that meets min_duration): the frames
    kernel, plus the CMN pass with subtract_mean; none for an empty batch or no frames."""
    fields, features = request.field_map, request.feature_map
    if fields.get("batch", 0) == 0 or fields.get("frames", 0) <= 0:
        return 0
    return 1 + int(bool(features.get("subtract_mean", False)))


# ---------------------------------------------------------------------------------------------
# routing data

# Largest relative error of the features, |out - ref| / max(|ref|, 1), against the float64 reference
# (tests/reference/fbank.py) over the approval option sets (80-bin WeSpeaker with x32768 and CMN,
# 40-bin snip_edges=False with energy) on a speech-like signal; measured <= 1.2e-5 in the interpreter.
# tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval re-measures it.
APPROVAL_BOUND = {"ieee": 3e-5, "tf32x3": 3e-5}
_WHERE = "interpreter, tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval"

APPROVALS = approvals_by_precision("fbank", APPROVAL_BOUND, _WHERE)
RECIPES: Dict[str, str] = {}
SPEED_EVIDENCE: Dict[str, str] = {}


def _audit_meta(candidate: FbankCandidate, dtype: str) -> Dict[str, object]:
    """Constexprs of the WeSpeaker front end (80 bins, 400-sample hamming window, 512-point DFT)."""
    options = FbankOptions(num_mel_bins=80, window_type="hamming", input_scale=32768.0, subtract_mean=True)
    return dict(**_constexprs(options), **_meta(candidate, options))


def _audit_kernels() -> list:
    return [AuditSpec(
        name="fbank_frames",
        family="fbank",
        kernel=_fbank_frames_kernel,
        signature={
            "wave_ptr": "*{dt}", "window_ptr": "*fp32", "basis_ptr": "*fp32", "melt_ptr": "*fp32", "out_ptr": "*fp32",
            "num_samples": "i32", "num_frames": "i32",
            "stride_wave_b": "i32", "stride_out_b": "i32", "stride_out_f": "i32",
            "frame_shift": "i32", "reflect_pad": "i32",
            "input_scale": "fp32", "one_minus_preemph": "fp32", "log_energy_floor": "fp32",
            **{name: "constexpr" for name in (
                "WIN", "WIN_P", "WIN_CHUNK", "NFREQ_P", "NUM_MEL", "MEL_P", "MEL_COL0", "ENERGY_COL", "BLOCK_F", "BLOCK_K",
                "SNIP_EDGES", "REMOVE_DC", "PREEMPH", "RAW_ENERGY", "USE_ENERGY", "ENERGY_FLOOR", "USE_POWER",
                "USE_LOG", "SCALE_INPUT", "PRECISION")},
        },
        meta=_audit_meta,
        candidates=tuple(variant.candidate() for variant in FbankVariant),
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32", "fp16", "bf16"),
        expects_mma=lambda candidate, dtype: candidate.precision == "tf32x3",
    ), AuditSpec(
        name="fbank_cmn",
        family="fbank",
        kernel=_fbank_cmn_kernel,
        signature={"out_ptr": "*fp32", "num_frames": "i32", "num_cols": "i32", "stride_out_b": "i32",
                   "stride_out_f": "i32", "BLOCK_F": "constexpr", "BLOCK_C": "constexpr"},
        meta=lambda candidate, dtype: dict(BLOCK_F=32, BLOCK_C=32, num_warps=1, num_stages=1),
        candidates=(DEFAULT_VARIANT.candidate(),),
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32",),
        expects_mma=False,
    )]


AUDIT_KERNELS = _audit_kernels()
