"""Kaldi log-mel filterbank as one fused Triton kernel per tile of frames, plus the fbank routing data.

Each frames kernel takes BLOCK_F frames of one waveform (grid: frame tiles x batch) and does framing
(both snip_edges modes, Kaldi's [2,1,0,0,1,2] reflection when snip_edges=False), the optional input
scale (WeSpeaker's x32768), DC removal, the log energy (raw or after the window), pre-emphasis, the
window, the real DFT as matrix products in true fp32 (tl.dot input_precision "ieee", or "tf32x3" on
tensor cores; never plain tf32), power or magnitude, the mel projection, the log floor and the output
column order (energy first, or last with htk_compat). Which DFT runs depends on the candidate's
precision and the DFT size N (`runs_split`):

- `_fbank_split_kernel`, the two-stage DFT on tensor cores, for "tf32x3" candidates wherever
  N = N1 * N2 with N1 <= 16 and N2 <= 64 (`split_factors`: every power of two up to 1024, and 400, 200,
  320, 480, ...). With n = N2 * n1 + n2 and k = k1 + N1 * k2:
  X[k] = sum_n2 W_N2^(n2 k2) W_N^(n2 k1) sum_n1 x[N2 n1 + n2] W_N1^(n1 k1), so a step of SUB_F frames
  is one product with the N1-point DFT matrix (rows k1, columns (frame, n2)), an elementwise twiddle,
  and one complex product with the N2-point DFT matrix (rows k2 < N / (2 N1), columns (k1, frame)),
  which leaves the power spectrum in natural bin order (row k2 * N1 + k1 = bin k). At N = 512 that
  is about 100 K FLOPs per frame against 410 K for the dense DFT. Each step's spectra go to a scratch
  tile (global memory the program itself reads back, from L2), and the mel projection is then one
  product over the whole tile, (BLOCK_F frames x bins) @ (bins x mel), reduced BLOCK_K bins at a time:
  the mel matrix is read once per tile of frames, the DFT matrices once per program.
- `_fbank_frames_kernel`, the dense DFT (frames @ cos/sin basis, BLOCK_K bins at a time, each reduced
  over the window in WINDOW_STEP steps and folded straight into the mel accumulator), for "ieee"
  candidates and the sizes the two-stage DFT does not factor. Its basis is exact (a float32 hi/lo pair
  of the float64 value), which makes it the path closest to float64; the frames are never stored: each
  slice is rebuilt in registers where a product needs it.

With subtract_mean (torchaudio's option, and the WeSpeaker front end's CMN) the frames kernel also
writes per-column sums of every group of PARTIAL_FRAMES frames; `_fbank_cmn_kernel` adds up a row's
group sums and subtracts the mean from its tile of features, one read and one write of them (the mean
needs every frame of a row, which no single program holds).

Accuracy: the dense DFT basis is float64 split into a float32 (hi, lo) pair, so the basis carries no
rounding; the two-stage DFT's matrices and twiddles are float64 rounded once to float32, and its
tf32x3 products carry each operand to about 2^-22. Pre-emphasis is computed as (x[j] - x[j-1]) +
(1 - c) * (x[j-1] - mean), which cancels the large common part exactly. Against float64 both kernels'
features are about as close as torchaudio's own float32 rfft path; at bins some 90 dB below their
frame's peak (where every float32 path loses digits) the tf32x3 DFT's error is about twice float32's
(tests/triton/test_fbank.py, with the interpreter's dots rounded as tensor cores round "tf32x3").

Window and mel matrix come from rlx_triton.backends.torch_ref.fbank, built exactly as torchaudio
builds them; all constants are cached per option set and device. dither > 0 is not covered here:
torchaudio draws independent noise per frame sample, so the router sends such calls to the torch
fallback (the `dither` feature below), as it does for calls that need autograd.

The launcher states its launches as records (`fbank_plan`, executed by `launches.run`); the two-stage
kernel runs through the autotune bridge when called with the router's route (key: frames bucket, batch
bucket, mel bins and the DFT factors).
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.torch_ref import fbank as _ref
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.device_cache import device_constants
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.fbank import DEFAULT_VARIANT, FbankCandidate, FbankVariant
from rlx_triton.router.coverage import Coverage

MAX_WINDOW = 1024  # largest padded DFT length covered (the cached basis is 4 x window x window / 2 floats)
MAX_BINS = 128  # mel bins (padded to a power of two) accumulated per frame row
# window samples per tl.dot step of the DFT: the frames are rebuilt in registers step by step (the
# whole 512-sample frame as one dot operand lowers to far too much unrolled code for fp32 dots)
WINDOW_STEP = 16
MAX_SPLIT_N2 = 64  # longest second stage of the two-stage DFT (its padded length bounds the registers)
MAX_TILE_FRAMES = 128  # largest tile_frames (the planner's bound): the spectra scratch is padded to it
PARTIAL_FRAMES = 16  # frames per group sum of the CMN statistics: the smallest tile_frames
STEP_SAMPLES_PER_THREAD = 8  # padded frame samples per thread in one step of the two-stage DFT
CMN_BLOCK_F = 128  # frames per program of the CMN pass
CMN_STEP_F = 16  # frames per step of a CMN program
CMN_BLOCK_G = 16  # group sums per step of the CMN pass's mean
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
def _store_group_sums(partial_row, values, tile_start, frames, frame_mask, num_frames, col0,
                      NUM_COLS: tl.constexpr, BLOCK_F: tl.constexpr, C: tl.constexpr, GROUP: tl.constexpr):
    """Per-column sums of every GROUP frames of a (BLOCK_F, C) tile of features, at columns col0 .. col0 + C
    of the row's group sums (frames past the end count zero; columns past NUM_COLS are not written)."""
    values = tl.where(frame_mask[:, None], values, 0.0)
    sums = tl.sum(tl.reshape(values, (BLOCK_F // GROUP, GROUP, C)), axis=1)
    groups = tile_start // GROUP + tl.arange(0, BLOCK_F // GROUP)
    cols = col0 + tl.arange(0, C)
    mask = (groups * GROUP < num_frames)[:, None] & (cols < NUM_COLS)[None, :]
    tl.store(partial_row + groups[:, None].to(tl.int64) * NUM_COLS + cols[None, :], sums, mask=mask)


@triton.jit
def _store_log_energy(out_rows, energy, frame_mask, log_energy_floor, ENERGY_COL: tl.constexpr,
                      ENERGY_FLOOR: tl.constexpr):
    """log(max(energy, eps)), floored at log(energy_floor) when that is set, into the energy column."""
    eps = 1.1920928955078125e-07
    log_energy = tl.log(tl.maximum(energy, eps, propagate_nan=tl.PropagateNan.ALL))
    if ENERGY_FLOOR:
        log_energy = tl.maximum(log_energy, log_energy_floor, propagate_nan=tl.PropagateNan.ALL)
    tl.store(out_rows + ENERGY_COL, log_energy, mask=frame_mask)


@triton.jit
def _finish_mel(acc, out_rows, partial_row, tile_start, frames, frame_mask, num_frames, mel0,
                NUM_MEL: tl.constexpr, MEL_COL0: tl.constexpr, NUM_COLS: tl.constexpr, BLOCK_F: tl.constexpr,
                C: tl.constexpr, USE_LOG: tl.constexpr, PARTIALS: tl.constexpr, PARTIAL_FRAMES: tl.constexpr):
    """Mel bins mel0 .. mel0 + C of a tile of frames, (BLOCK_F, C): log floor, store, and (with PARTIALS)
    their group sums."""
    # the floors keep NaN (torch.max(x, eps) propagates it, so a frame that holds a NaN or Inf sample is
    # NaN in torchaudio); tl.maximum's default would replace NaN by the floor
    eps = 1.1920928955078125e-07
    if USE_LOG:
        acc = tl.log(tl.maximum(acc, eps, propagate_nan=tl.PropagateNan.ALL))
    mel_cols = mel0 + tl.arange(0, C)
    mel_valid = mel_cols < NUM_MEL
    tl.store(out_rows[:, None] + MEL_COL0 + mel_cols[None, :], acc, mask=frame_mask[:, None] & mel_valid[None, :])
    if PARTIALS:
        acc = tl.where(mel_valid[None, :], acc, 0.0)
        _store_group_sums(partial_row, acc, tile_start, frames, frame_mask, num_frames, MEL_COL0 + mel0, NUM_COLS,
                          BLOCK_F, C, PARTIAL_FRAMES)


@triton.jit
def _store_energy_sums(out_rows, partial_row, tile_start, frame_mask, num_frames, ENERGY_COL: tl.constexpr,
                       NUM_COLS: tl.constexpr, BLOCK_F: tl.constexpr, PARTIAL_FRAMES: tl.constexpr):
    """Group sums of the log-energy column of a tile, read back from the output this program wrote."""
    # written by other threads of this program: the barrier makes their stores visible
    tl.debug_barrier()
    energy = tl.load(out_rows + ENERGY_COL, mask=frame_mask, other=0.0)
    groups = tile_start // PARTIAL_FRAMES + tl.arange(0, BLOCK_F // PARTIAL_FRAMES)
    sums = tl.sum(tl.reshape(energy, (BLOCK_F // PARTIAL_FRAMES, PARTIAL_FRAMES)), axis=1)
    tl.store(partial_row + groups.to(tl.int64) * NUM_COLS + ENERGY_COL, sums, mask=groups * PARTIAL_FRAMES < num_frames)


@triton.jit
def _fbank_frames_kernel(
    wave_ptr, window_ptr, basis_ptr, melt_ptr, out_ptr, partial_ptr,
    num_samples, num_frames,
    stride_wave_b, stride_out_b, stride_out_f, stride_partial_b,
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
    NUM_COLS: tl.constexpr,  # output columns (NUM_MEL + USE_ENERGY)
    BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr,
    SNIP_EDGES: tl.constexpr, REMOVE_DC: tl.constexpr, PREEMPH: tl.constexpr,
    RAW_ENERGY: tl.constexpr, USE_ENERGY: tl.constexpr, ENERGY_FLOOR: tl.constexpr,
    USE_POWER: tl.constexpr, USE_LOG: tl.constexpr, SCALE_INPUT: tl.constexpr,
    PARTIALS: tl.constexpr,  # write per-column sums of every PARTIAL_FRAMES frames (subtract_mean)
    PARTIAL_FRAMES: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_f = tl.program_id(0)
    pid_b = tl.program_id(1)

    tile_start = pid_f * BLOCK_F
    frames = tile_start + tl.arange(0, BLOCK_F)
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

    out_rows = out_ptr + pid_b.to(tl.int64) * stride_out_b + frames.to(tl.int64) * stride_out_f
    partial_row = partial_ptr + pid_b.to(tl.int64) * stride_partial_b
    _finish_mel(acc, out_rows, partial_row, tile_start, frames, frame_mask, num_frames, 0, NUM_MEL, MEL_COL0,
                NUM_COLS, BLOCK_F, MEL_P, USE_LOG, PARTIALS, PARTIAL_FRAMES)
    if USE_ENERGY:
        _store_log_energy(out_rows, energy, frame_mask, log_energy_floor, ENERGY_COL, ENERGY_FLOOR)
        if PARTIALS:
            _store_energy_sums(out_rows, partial_row, tile_start, frame_mask, num_frames, ENERGY_COL, NUM_COLS,
                               BLOCK_F, PARTIAL_FRAMES)


@triton.jit
def _load_split_frames(wave_row, start, frame_mask, sample, sample_mask, num_samples, input_scale,
                       SNIP_EDGES: tl.constexpr, SCALE_INPUT: tl.constexpr):
    """(N1P, SUB_F, N2P) samples: [n1, f, n2] is sample `sample[n1, n2]` of frame f (0 outside the frame)."""
    mask = frame_mask[None, :, None] & sample_mask[:, None, :]
    pos = start[None, :, None] + sample[:, None, :]
    if not SNIP_EDGES:
        pos = _reflect(pos, num_samples)
    x = tl.load(wave_row + pos, mask=mask, other=0.0).to(tl.float32)
    if SCALE_INPUT:
        x = x * input_scale
    return x


@triton.jit(do_not_specialize=["frames_bucket", "batch_bucket"])
def _fbank_split_kernel(
    wave_ptr, window_ptr, stage1_ptr, twiddle_ptr, stage2_ptr, mel_ptr, spectra_ptr, out_ptr, partial_ptr,
    num_samples, num_frames,
    stride_wave_b, stride_spectra_b, stride_out_b, stride_out_f, stride_partial_b,
    frame_shift, reflect_pad,
    input_scale, one_minus_preemph, log_energy_floor,
    frames_bucket, batch_bucket,  # next powers of two of frames and batch: the autotune key, unused by the body
    WIN: tl.constexpr,  # samples per frame (window_size)
    N1: tl.constexpr, N2: tl.constexpr,  # the DFT size N = N1 * N2 (padded_window_size)
    N1P: tl.constexpr, N2P: tl.constexpr,  # N1, N2 padded to powers of two (>= 8)
    K2P: tl.constexpr,  # second-stage bins computed: ceil(N / 2 / N1), padded to a power of two (>= 16)
    NUM_MEL: tl.constexpr, MEL_COL0: tl.constexpr, ENERGY_COL: tl.constexpr, NUM_COLS: tl.constexpr,
    MEL_A: tl.constexpr, MEL_B: tl.constexpr,  # mel column blocks: MEL_A + MEL_B >= NUM_MEL (MEL_B may be 0)
    BLOCK_F: tl.constexpr,  # frames per program
    BLOCK_K: tl.constexpr,  # bins per step of the mel product
    STEP_SAMPLES: tl.constexpr,  # padded samples per DFT step (SUB_F frames): bounds the registers it holds
    SNIP_EDGES: tl.constexpr, REMOVE_DC: tl.constexpr, PREEMPH: tl.constexpr,
    RAW_ENERGY: tl.constexpr, USE_ENERGY: tl.constexpr, ENERGY_FLOOR: tl.constexpr,
    USE_POWER: tl.constexpr, USE_LOG: tl.constexpr, SCALE_INPUT: tl.constexpr,
    PARTIALS: tl.constexpr, PARTIAL_FRAMES: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_f = tl.program_id(0)
    pid_b = tl.program_id(1)
    FRAME_P: tl.constexpr = N1P * N2P
    SUB_F: tl.constexpr = BLOCK_F if STEP_SAMPLES // FRAME_P >= BLOCK_F else (
        1 if STEP_SAMPLES // FRAME_P < 1 else STEP_SAMPLES // FRAME_P)
    BINS: tl.constexpr = K2P * N1P  # spectrum rows; row k2 * N1P + k1 holds bin k1 + N1 * k2

    tile_start = pid_f * BLOCK_F
    wave_row = wave_ptr + pid_b.to(tl.int64) * stride_wave_b
    spectra_tile = spectra_ptr + pid_b.to(tl.int64) * stride_spectra_b + tile_start.to(tl.int64) * BINS
    out_row = out_ptr + pid_b.to(tl.int64) * stride_out_b

    # frame sample n = N2 * n1 + n2 sits at [n1, n2]; samples past the window (zero padding to N) are masked
    n1 = tl.arange(0, N1P)
    n2 = tl.arange(0, N2P)
    sample = n1[:, None] * N2 + n2[None, :]
    sample_mask = (n1 < N1)[:, None] & (n2 < N2)[None, :] & (sample < WIN)
    previous_sample = tl.maximum(sample - 1, 0)  # x[-1] := x[0] (replicate pad)
    window = tl.load(window_ptr + sample, mask=sample_mask, other=0.0)

    # the DFT matrices (float64 rounded once to float32; padding rows and columns are zero), read once
    k1 = tl.arange(0, N1P)
    k2 = tl.arange(0, K2P)
    stage1_offsets = k1[:, None] * N1P + n1[None, :]
    stage1_re = tl.load(stage1_ptr + stage1_offsets)  # cos(2 pi n1 k1 / N1)
    stage1_im = tl.load(stage1_ptr + N1P * N1P + stage1_offsets)  # -sin(...)
    twiddle_offsets = k1[:, None] * N2P + n2[None, :]
    twiddle_re = tl.load(twiddle_ptr + twiddle_offsets)[:, None, :]  # cos(2 pi n2 k1 / N)
    twiddle_im = tl.load(twiddle_ptr + N1P * N2P + twiddle_offsets)[:, None, :]  # -sin(...)
    stage2_offsets = k2[:, None] * N2P + n2[None, :]
    stage2_re = tl.load(stage2_ptr + stage2_offsets)  # cos(2 pi n2 k2 / N2)
    stage2_im = tl.load(stage2_ptr + K2P * N2P + stage2_offsets)  # -sin(...)
    stage2_neg_im = tl.load(stage2_ptr + 2 * K2P * N2P + stage2_offsets)  # +sin(...)
    bins = tl.arange(0, BINS)

    for f0 in range(0, BLOCK_F, SUB_F):
        steps = f0 + tl.arange(0, SUB_F)
        frames = tile_start + steps
        frame_mask = frames < num_frames
        start = frames * frame_shift - reflect_pad
        x = _load_split_frames(wave_row, start, frame_mask, sample, sample_mask, num_samples, input_scale,
                               SNIP_EDGES, SCALE_INPUT)
        mean = tl.zeros((SUB_F,), dtype=tl.float32)
        if REMOVE_DC:
            mean = tl.sum(tl.sum(x, axis=2), axis=0) / WIN
        if USE_ENERGY:
            if RAW_ENERGY:
                raw = tl.where(sample_mask[:, None, :], x - mean[None, :, None], 0.0)
                energy = tl.sum(tl.sum(raw * raw, axis=2), axis=0)
        if PREEMPH:
            previous = _load_split_frames(wave_row, start, frame_mask, previous_sample, sample_mask, num_samples,
                                          input_scale, SNIP_EDGES, SCALE_INPUT)
            # (x[j] - mean) - c * (x[j-1] - mean) with the large common part cancelled before rounding
            # (see _load_frames_chunk)
            x = (x - previous) + one_minus_preemph * (previous - mean[None, :, None])
        else:
            x = x - mean[None, :, None]
        x = tl.where(sample_mask[:, None, :] & frame_mask[None, :, None], x * window[:, None, :], 0.0)
        if USE_ENERGY:
            if not RAW_ENERGY:
                energy = tl.sum(tl.sum(x * x, axis=2), axis=0)
            _store_log_energy(out_row + frames.to(tl.int64) * stride_out_f, energy, frame_mask, log_energy_floor,
                              ENERGY_COL, ENERGY_FLOOR)

        # stage 1, transposed: a[k1, (f, n2)] = sum_n1 W_N1^(n1 k1) x[f, N2 n1 + n2]
        x = tl.reshape(x, (N1P, SUB_F * N2P))
        a_re = tl.reshape(tl.dot(stage1_re, x, input_precision=PRECISION), (N1P, SUB_F, N2P))
        a_im = tl.reshape(tl.dot(stage1_im, x, input_precision=PRECISION), (N1P, SUB_F, N2P))
        # twiddle W_N^(n2 k1), then rows (k1, f) and columns n2, transposed for stage 2
        t_re = tl.trans(tl.reshape(a_re * twiddle_re - a_im * twiddle_im, (N1P * SUB_F, N2P)))
        t_im = tl.trans(tl.reshape(a_re * twiddle_im + a_im * twiddle_re, (N1P * SUB_F, N2P)))
        # stage 2, transposed: y[k2, (k1, f)] = sum_n2 W_N2^(n2 k2) t[(k1, f), n2]
        y_re = tl.dot(stage2_re, t_re, input_precision=PRECISION)
        y_re = tl.dot(stage2_neg_im, t_im, y_re, input_precision=PRECISION)
        y_im = tl.dot(stage2_re, t_im, input_precision=PRECISION)
        y_im = tl.dot(stage2_im, t_re, y_im, input_precision=PRECISION)
        spectrum = y_re * y_re + y_im * y_im
        if not USE_POWER:
            spectrum = tl.sqrt_rn(spectrum)
        # row k2 * N1P + k1 holds bin k1 + N1 * k2; the scratch tile is frame-major
        spectrum = tl.reshape(spectrum, (BINS, SUB_F))
        tl.store(spectra_tile + steps[None, :].to(tl.int64) * BINS + bins[:, None], spectrum)

    # the tile's spectra were written by every thread of the program; each reads all of them back
    tl.debug_barrier()
    tile_frames = tl.arange(0, BLOCK_F)
    # the mel bins in two power-of-two column blocks (80 = 64 + 16), so no product runs on padding columns
    mel_a = tl.arange(0, MEL_A)
    acc_a = tl.zeros((BLOCK_F, MEL_A), dtype=tl.float32)
    if MEL_B > 0:
        mel_b = MEL_A + tl.arange(0, MEL_B)
        acc_b = tl.zeros((BLOCK_F, MEL_B), dtype=tl.float32)
    for k0 in range(0, BINS, BLOCK_K):
        chunk = k0 + tl.arange(0, BLOCK_K)
        spectra = tl.load(spectra_tile + tile_frames[:, None].to(tl.int64) * BINS + chunk[None, :])
        # (BLOCK_K, mel) blocks of the mel matrix, stored mel-major
        acc_a = tl.dot(spectra, tl.load(mel_ptr + mel_a[None, :] * BINS + chunk[:, None]), acc_a,
                       input_precision=PRECISION)
        if MEL_B > 0:
            acc_b = tl.dot(spectra, tl.load(mel_ptr + mel_b[None, :] * BINS + chunk[:, None]), acc_b,
                           input_precision=PRECISION)

    frames = tile_start + tile_frames
    frame_mask = frames < num_frames
    out_rows = out_row + frames.to(tl.int64) * stride_out_f
    partial_row = partial_ptr + pid_b.to(tl.int64) * stride_partial_b
    _finish_mel(acc_a, out_rows, partial_row, tile_start, frames, frame_mask, num_frames, 0, NUM_MEL, MEL_COL0,
                NUM_COLS, BLOCK_F, MEL_A, USE_LOG, PARTIALS, PARTIAL_FRAMES)
    if MEL_B > 0:
        _finish_mel(acc_b, out_rows, partial_row, tile_start, frames, frame_mask, num_frames, MEL_A, NUM_MEL,
                    MEL_COL0, NUM_COLS, BLOCK_F, MEL_B, USE_LOG, PARTIALS, PARTIAL_FRAMES)
    if USE_ENERGY:
        if PARTIALS:
            _store_energy_sums(out_rows, partial_row, tile_start, frame_mask, num_frames, ENERGY_COL, NUM_COLS,
                               BLOCK_F, PARTIAL_FRAMES)


@triton.jit
def _fbank_cmn_kernel(
    out_ptr, partial_ptr, num_frames, num_groups,
    stride_out_b, stride_out_f, stride_partial_b,
    NUM_COLS: tl.constexpr, BLOCK_F: tl.constexpr, STEP_F: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Subtract, per waveform and column, the mean over frames from a tile of BLOCK_F frames (in place);
    the mean is the sum of the row's group sums (written by the frames kernel) over the frames."""
    pid_f = tl.program_id(0)
    pid_b = tl.program_id(1)
    cols = tl.arange(0, BLOCK_C)
    col_mask = cols < NUM_COLS
    partial_row = partial_ptr + pid_b.to(tl.int64) * stride_partial_b

    total = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for g0 in range(0, num_groups, BLOCK_G):
        groups = g0 + tl.arange(0, BLOCK_G)
        mask = (groups < num_groups)[:, None] & col_mask[None, :]
        offsets = groups.to(tl.int64)[:, None] * NUM_COLS + cols[None, :]
        total += tl.sum(tl.load(partial_row + offsets, mask=mask, other=0.0), axis=0)
    mean = total / num_frames

    base = out_ptr + pid_b.to(tl.int64) * stride_out_b
    for f0 in range(0, BLOCK_F, STEP_F):
        frames = pid_f * BLOCK_F + f0 + tl.arange(0, STEP_F)
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


@device_constants
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


@device_constants
def _mel_transposed(options: FbankOptions, device: torch.device) -> torch.Tensor:
    """(NFREQ_P, MEL_P) float32: torchaudio's mel weights, transposed and zero padded."""
    weights = _ref.mel_banks(options)  # (num_mel_bins, N/2) float32
    nfreq_p = _pow2(options.padded_window_size // 2)
    mel_p = _pow2(options.num_mel_bins)
    melt = torch.zeros(nfreq_p, mel_p, dtype=torch.float32)
    melt[: weights.shape[1], : weights.shape[0]] = weights.T
    return melt.contiguous().to(device)


@device_constants
def _window(options: FbankOptions, device: torch.device) -> torch.Tensor:
    return _ref.window_function(options, torch.float32).contiguous().to(device)


@functools.lru_cache(maxsize=64)
def split_factors(dft_size: int) -> Optional[Tuple[int, int]]:
    """(N1, N2) with N1 * N2 = dft_size, N1 <= 16 and N2 <= 64 for the two-stage DFT, or None when there is
    none (the dense DFT runs then). Of several, the one with the least padded work (N1 and N2 padded to
    powers of two), then the larger N1 (the shorter second stage)."""
    best = None
    for n1 in range(16, 1, -1):
        n2, remainder = divmod(dft_size, n1)
        if remainder or n2 > MAX_SPLIT_N2:
            continue
        padded = _pow2(n1, 8) * _pow2(n2, 8)
        if best is None or padded < best[0]:
            best = (padded, n1, n2)
    return None if best is None else (best[1], best[2])


def runs_split(candidate, options: FbankOptions) -> bool:
    """Whether `candidate` runs the two-stage DFT on this option set: tf32x3 candidates do wherever the DFT
    size factors; ieee candidates keep the dense DFT with the exact (hi, lo) basis, the path closest to
    float64 (and to torchaudio's own float32 numbers), which also runs where TF32 tensor cores are missing."""
    return candidate.precision == "tf32x3" and split_factors(options.padded_window_size) is not None


def _mel_blocks(num_mel_bins: int) -> Tuple[int, int]:
    """The two-stage kernel's mel column blocks: the largest power of two <= num_mel_bins, then the rest padded
    to a power of two (>= 8), or 0 (80 = 64 + 16, 23 = 16 + 8, 128 = 128 + 0)."""
    first = 1 << (num_mel_bins.bit_length() - 1)
    rest = num_mel_bins - first
    return first, (0 if rest == 0 else _pow2(rest, 8))


def _split_sizes(dft_size: int) -> Dict[str, int]:
    """The two-stage kernel's DFT constexprs: N1, N2, their padded sizes and the second-stage bins."""
    n1, n2 = split_factors(dft_size)
    return dict(N1=n1, N2=n2, N1P=_pow2(n1, 8), N2P=_pow2(n2, 8), K2P=_pow2(triton.cdiv(dft_size // 2, n1)))


def _dft_matrix(rows: int, rows_p: int, cols: int, cols_p: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(cos, -sin) of 2*pi*r*c/size for r < rows, c < cols in float64 (r*c reduced mod size), zero padded."""
    r = torch.arange(rows_p, dtype=torch.int64)[:, None]
    c = torch.arange(cols_p, dtype=torch.int64)[None, :]
    angle = (2.0 * math.pi / size) * ((r * c) % size).to(torch.float64)
    valid = (r < rows) & (c < cols)
    return torch.where(valid, torch.cos(angle), 0.0), torch.where(valid, -torch.sin(angle), 0.0)


@device_constants
def _split_dft(dft_size: int, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 (rounded once from float64) matrices of the two-stage DFT: stage 1 (2, N1P, N1P) [k1, n1]
    planes cos, -sin of 2*pi*n1*k1/N1; twiddles (2, N1P, N2P) [k1, n2] of 2*pi*n2*k1/N; stage 2
    (3, K2P, N2P) [k2, n2] planes cos, -sin, +sin of 2*pi*n2*k2/N2 for the bins k2 < ceil(N / 2 / N1)."""
    sizes = _split_sizes(dft_size)
    n1, n2, n1p, n2p, k2p = (sizes[key] for key in ("N1", "N2", "N1P", "N2P", "K2P"))
    stage1 = torch.stack(_dft_matrix(n1, n1p, n1, n1p, n1))
    twiddle = torch.stack(_dft_matrix(n1, n1p, n2, n2p, dft_size))
    cos2, sin2 = _dft_matrix(triton.cdiv(dft_size // 2, n1), k2p, n2, n2p, n2)
    stage2 = torch.stack((cos2, sin2, -sin2))
    return tuple(t.to(torch.float32).contiguous().to(device) for t in (stage1, twiddle, stage2))


@device_constants
def _split_mel(options: FbankOptions, device: torch.device) -> torch.Tensor:
    """(MEL_A + MEL_B, K2P * N1P) float32: torchaudio's mel weights with column k2 * N1P + k1 holding bin
    k1 + N1 * k2 (the two-stage kernel's spectrum rows); padding rows, columns and bins >= N/2 are zero."""
    sizes = _split_sizes(options.padded_window_size)
    n1, n1p, k2p = sizes["N1"], sizes["N1P"], sizes["K2P"]
    weights = _ref.mel_banks(options)  # (num_mel_bins, N/2) float32
    k2 = torch.arange(k2p)[:, None]
    k1 = torch.arange(n1p)[None, :]
    bins = (k1 + n1 * k2).reshape(-1)
    valid = ((k1 < n1) & (k1 + n1 * k2 < weights.shape[1])).reshape(-1)
    mel = torch.zeros(sum(_mel_blocks(options.num_mel_bins)), k2p * n1p, dtype=torch.float32)
    mel[: weights.shape[0], valid] = weights[:, bins[valid]]
    return mel.contiguous().to(device)


# ---------------------------------------------------------------------------------------------
# launcher

def _check_precision(candidate) -> None:
    if candidate.precision not in _UNITS:
        raise ValueError(f"fbank candidate precision must be 'ieee' or 'tf32x3', got {candidate.precision!r}")


def _meta(candidate, options: FbankOptions) -> Dict[str, object]:
    """FbankCandidate -> the dense kernel's meta-parameters: tile_frames -> BLOCK_F, tile_freq -> BLOCK_K
    (capped by the bins computed), tg_size // 32 -> num_warps, stages -> num_stages, precision -> tl.dot
    input_precision."""
    _check_precision(candidate)
    nfreq_p = _pow2(options.padded_window_size // 2)
    return dict(
        BLOCK_F=max(16, int(candidate.tile_frames)),
        BLOCK_K=min(max(16, int(candidate.tile_freq)), nfreq_p),
        PRECISION=candidate.precision,
        num_warps=max(1, int(candidate.tg_size) // 32),
        num_stages=int(candidate.stages),
    )


def _split_meta(candidate) -> Dict[str, object]:
    """FbankCandidate -> the two-stage kernel's meta-parameters (independent of the shape, so each candidate
    is one autotune config): tile_frames -> BLOCK_F, tile_freq -> BLOCK_K (bins per step of the mel
    product), tg_size -> num_warps and STEP_SAMPLES (STEP_SAMPLES_PER_THREAD per thread), stages ->
    num_stages, precision -> tl.dot input_precision."""
    _check_precision(candidate)
    return dict(
        BLOCK_F=max(PARTIAL_FRAMES, int(candidate.tile_frames)),
        BLOCK_K=max(16, int(candidate.tile_freq)),
        STEP_SAMPLES=STEP_SAMPLES_PER_THREAD * int(candidate.tg_size),
        PRECISION=candidate.precision,
        num_warps=max(1, int(candidate.tg_size) // 32),
        num_stages=int(candidate.stages),
    )


def _split_config(candidate) -> triton.Config:
    meta = _split_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _option_constexprs(options: FbankOptions) -> Dict[str, object]:
    """Constexprs fixed by the option set that both frames kernels take."""
    energy_first = options.use_energy and not options.htk_compat
    return dict(
        WIN=options.window_size,
        NUM_MEL=options.num_mel_bins,
        MEL_COL0=1 if energy_first else 0,
        ENERGY_COL=0 if energy_first else options.num_mel_bins,
        NUM_COLS=options.num_columns,
        SNIP_EDGES=options.snip_edges,
        REMOVE_DC=options.remove_dc_offset,
        PREEMPH=options.preemphasis_coefficient != 0.0,
        RAW_ENERGY=options.raw_energy,
        USE_ENERGY=options.use_energy,
        ENERGY_FLOOR=options.energy_floor != 0.0,
        USE_POWER=options.use_power,
        USE_LOG=options.use_log_fbank,
        SCALE_INPUT=options.input_scale != 1.0,
        PARTIALS=options.subtract_mean,
        PARTIAL_FRAMES=PARTIAL_FRAMES,
    )


def _constexprs(options: FbankOptions) -> Dict[str, object]:
    """The dense kernel's constexprs fixed by the option set (everything but the candidate's tiling)."""
    return dict(WIN_P=_window_padded(options.window_size), WIN_CHUNK=WINDOW_STEP,
                NFREQ_P=_pow2(options.padded_window_size // 2), MEL_P=_pow2(options.num_mel_bins),
                **_option_constexprs(options))


def _split_constexprs(options: FbankOptions) -> Dict[str, object]:
    """The two-stage kernel's constexprs fixed by the option set."""
    mel_a, mel_b = _mel_blocks(options.num_mel_bins)
    return dict(**_split_sizes(options.padded_window_size), MEL_A=mel_a, MEL_B=mel_b, **_option_constexprs(options))


_tuned_split_kernel = None
# Autotune key: frames and batch buckets, mel bins and the DFT factors (never raw lengths, never tensors).
_TUNE_KEY = ["frames_bucket", "batch_bucket", "NUM_MEL", "N1", "N2"]


def tuned_split_kernel():
    """`_fbank_split_kernel` under the autotune bridge, with a config per approved candidate."""
    global _tuned_split_kernel
    if _tuned_split_kernel is None:
        from rlx_triton.backends.triton.autotune import TunedKernel

        candidates = [c for c in plan_candidates("fbank") if c.tag() in APPROVALS and c.precision == "tf32x3"]
        _tuned_split_kernel = TunedKernel(_fbank_split_kernel, candidates, _split_config, key=_TUNE_KEY)
    return _tuned_split_kernel


def _common_args(wave, out, partials, options: FbankOptions) -> Dict[str, object]:
    """The frames kernels' scalar arguments by name, in the dense kernel's parameter order."""
    num_samples = wave.shape[1]
    return dict(
        num_samples=num_samples, num_frames=options.num_frames(num_samples),
        stride_wave_b=wave.stride(0), stride_out_b=out.stride(0), stride_out_f=out.stride(1),
        stride_partial_b=partials.stride(0),
        frame_shift=options.window_shift, reflect_pad=0 if options.snip_edges else options.reflect_pad,
        input_scale=float(options.input_scale), one_minus_preemph=1.0 - float(options.preemphasis_coefficient),
        log_energy_floor=math.log(options.energy_floor) if options.energy_floor > 0 else 0.0,
    )


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _dense_record(wave, out, partials, options: FbankOptions, candidate) -> Launch:
    """`_fbank_frames_kernel` over (frame tiles, batch). FLOPs: the dots as executed (padded tiles:
    BLOCK_F frames x NFREQ_P bins x WIN_P samples, four basis planes; the mel dot over MEL_P columns)
    plus the power spectrum."""
    device = wave.device
    meta = _meta(candidate, options)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    constexprs = _constexprs(options)
    window = _window(options, device)
    basis = _dft_basis(options.window_size, options.padded_window_size, device)
    melt = _mel_transposed(options, device)
    batch = wave.shape[0]
    common = _common_args(wave, out, partials, options)
    tiles = triton.cdiv(common["num_frames"], meta["BLOCK_F"])
    padded_frames = batch * tiles * meta["BLOCK_F"]
    win_p, nfreq_p, mel_p = constexprs["WIN_P"], constexprs["NFREQ_P"], constexprs["MEL_P"]
    flops = (2 * 4 * padded_frames * nfreq_p * win_p + 2 * padded_frames * nfreq_p * mel_p
             + 3 * padded_frames * nfreq_p)
    args = (wave, window, basis, melt, out, partials) + tuple(common.values())
    return Launch(_fbank_frames_kernel, (tiles, batch), args, meta=dict(**constexprs, **meta),
                  num_warps=num_warps, num_stages=num_stages,
                  bytes_read=_bytes(wave) + _bytes(window, basis, melt),
                  bytes_written=_bytes(out) + (_bytes(partials) if options.subtract_mean else 0),
                  flops=flops, unit=_UNITS[candidate.precision])


def split_flops(options: FbankOptions, candidate, padded_frames: int) -> int:
    """FLOPs of the two-stage kernel over `padded_frames` frames (whole tiles), as executed on padded
    tiles: per frame the stage-1 products (2 x N1P x N1P x N2P, cos and sin), the twiddle (6 per
    element), the complex stage-2 product (4 x 2 x K2P x N2P x N1P) and the power (3 per bin); per
    frame the mel product over BINS x (MEL_A + MEL_B)."""
    sizes = _split_sizes(options.padded_window_size)
    n1p, n2p, k2p = sizes["N1P"], sizes["N2P"], sizes["K2P"]
    bins = k2p * n1p
    per_frame = (2 * 2 * n1p * n1p * n2p + 6 * n1p * n2p + 4 * 2 * k2p * n2p * n1p + 3 * bins
                 + 2 * bins * sum(_mel_blocks(options.num_mel_bins)))
    return padded_frames * per_frame


def _split_record(wave, out, partials, options: FbankOptions, candidate, route) -> Launch:
    """`_fbank_split_kernel` over (frame tiles, batch), through the autotune bridge when the candidate is one
    of its configs. Bytes: the waveform rows, the DFT matrices and mel matrix once, the features (and group
    sums) written, and the spectra scratch written and read back (global traffic, although L2 serves it)."""
    device = wave.device
    constexprs = _split_constexprs(options)
    window = _window(options, device)
    stage1, twiddle, stage2 = _split_dft(options.padded_window_size, device)
    mel = _split_mel(options, device)
    batch = wave.shape[0]
    common = _common_args(wave, out, partials, options)
    num_frames = common["num_frames"]
    bins = constexprs["K2P"] * constexprs["N1P"]
    # padded to the largest tile, so every candidate's tiles fit whichever one the autotuner runs
    spectra = torch.empty(batch, triton.cdiv(num_frames, MAX_TILE_FRAMES) * MAX_TILE_FRAMES * bins,
                          device=device, dtype=torch.float32)
    args = (wave, window, stage1, twiddle, stage2, mel, spectra, out, partials,
            common["num_samples"], num_frames, common["stride_wave_b"], spectra.stride(0), common["stride_out_b"],
            common["stride_out_f"], common["stride_partial_b"], common["frame_shift"], common["reflect_pad"],
            common["input_scale"], common["one_minus_preemph"], common["log_energy_floor"],
            triton.next_power_of_2(num_frames), triton.next_power_of_2(batch))
    meta = _split_meta(candidate)
    tiles = triton.cdiv(num_frames, meta["BLOCK_F"])
    padded_frames = batch * tiles * meta["BLOCK_F"]
    scratch = padded_frames * bins * 4
    counts = dict(bytes_read=_bytes(wave) + _bytes(window, stage1, twiddle, stage2, mel) + scratch,
                  bytes_written=_bytes(out) + (_bytes(partials) if options.subtract_mean else 0) + scratch,
                  flops=split_flops(options, candidate, padded_frames), unit=_UNITS[candidate.precision])
    tuned = tuned_split_kernel()
    if candidate.tag() in tuned.tags:
        def grid(config_meta):
            return (triton.cdiv(num_frames, config_meta["BLOCK_F"]), batch)

        return Launch.tuned(tuned, candidate, grid, args, constexprs, route=route, **counts)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return Launch(_fbank_split_kernel, (tiles, batch), args, meta=dict(**constexprs, **meta), num_warps=num_warps,
                  num_stages=num_stages, **counts)


def _cmn_record(out, partials, num_frames: int) -> Launch:
    """`_fbank_cmn_kernel` over (frame tiles, batch): the group sums once, the features read and written."""
    batch, _, num_cols = out.shape
    groups = partials.shape[1]
    return Launch(_fbank_cmn_kernel, (triton.cdiv(num_frames, CMN_BLOCK_F), batch),
                  (out, partials, num_frames, groups, out.stride(0), out.stride(1), partials.stride(0)),
                  meta=dict(NUM_COLS=num_cols, BLOCK_F=CMN_BLOCK_F, STEP_F=CMN_STEP_F, BLOCK_C=_pow2(num_cols),
                            BLOCK_G=CMN_BLOCK_G),
                  num_warps=4, num_stages=3, bytes_read=_bytes(out, partials), bytes_written=_bytes(out),
                  flops=out.numel() + partials.numel())


def fbank_plan(waveform: torch.Tensor, options: FbankOptions, *, candidate,
               route=None) -> Tuple[List[Launch], torch.Tensor]:
    """The launches of `fbank` as records, and the output they fill (on the waveform's device; meta
    tensors give the plan at any shape without running anything).

    Records: the frames kernel over (frame tiles, batch) (`_fbank_split_kernel` where the DFT size
    factors, `split_factors`, else `_fbank_frames_kernel`), then `_fbank_cmn_kernel` with subtract_mean.
    Bytes are the global traffic each launch needs, each byte once; FLOPs are the products as executed
    on padded tiles (see `_dense_record`, `split_flops`), on the unit of the candidate's precision; the
    per-sample framing arithmetic is not counted.
    """
    if options.dither != 0.0:
        raise ValueError("fbank: the triton kernel covers dither=0 only; dither > 0 runs on the torch fallback")
    _check_precision(candidate)
    # rows may be strided (e.g. channel 0 of a (B, C, T) batch); samples inside a row must be adjacent
    wave = waveform if waveform.stride(-1) == 1 else waveform.contiguous()
    batch, num_samples = wave.shape
    num_frames = options.num_frames(num_samples)
    out = torch.empty(batch, num_frames, options.num_columns, device=wave.device, dtype=torch.float32)
    if batch == 0 or num_frames <= 0:
        return [], out
    if options.subtract_mean:
        partials = torch.empty(batch, triton.cdiv(num_frames, PARTIAL_FRAMES), options.num_columns,
                               device=wave.device, dtype=torch.float32)
    else:
        partials = out  # not written (PARTIALS is off); stands in for the pointer
    if runs_split(candidate, options):
        plan = [_split_record(wave, out, partials, options, candidate, route)]
    else:
        plan = [_dense_record(wave, out, partials, options, candidate)]
    if options.subtract_mean:
        plan.append(_cmn_record(out, partials, num_frames))
    return plan, out


def fbank(waveform: torch.Tensor, options: FbankOptions, *, candidate, route=None) -> torch.Tensor:
    """(B, T) waveform (float32/float16/bfloat16) -> (B, frames, num_mel_bins + use_energy) float32.

    The caller (rlx_triton.ops.fbank) has validated the shape: T holds at least one window and
    min_duration is met. dither must be 0 (the router sends dither > 0 to the torch fallback). With the
    router's `route` the two-stage kernel runs through the autotune bridge (the routed candidate is
    injected; a cold bucket may be tuned among the approved candidates where tuning is on).
    """
    plan, out = fbank_plan(waveform, options, candidate=candidate, route=route)
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
# (tests/reference/fbank.py) over the approval option sets (80-bin WeSpeaker with x32768 and CMN and
# 40-bin snip_edges=False with energy, both two-stage DFTs at N = 512; 23 bins at a 134-point dense DFT)
# on speech-like signals, with the interpreter's dots rounded as tensor cores round "tf32x3"
# (tests/reference/tensor_cores.py). tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval
# re-measures it.
APPROVAL_BOUND = {"ieee": 3e-5, "tf32x3": 3e-5}
_WHERE = "interpreter, tests/triton/test_fbank.py::test_every_candidate_runs_and_holds_its_approval"

APPROVALS = approvals_by_precision("fbank", APPROVAL_BOUND, _WHERE)
# GPUs with TF32 tensor cores run the two-stage DFT in tf32x3 on 64-frame tiles (no spills on sm_80 or sm_90,
# in either frames kernel)
RECIPES: Dict[str, str] = {"sm80": FbankVariant.TF32X3_F64_Q32.tag(), "sm90": FbankVariant.TF32X3_F64_Q32.tag()}
SPEED_EVIDENCE: Dict[str, str] = {}

_AUDIT_OPTIONS = FbankOptions(num_mel_bins=80, window_type="hamming", input_scale=32768.0, subtract_mean=True)
_OPTION_CONSTEXPRS = ("WIN", "NUM_MEL", "MEL_COL0", "ENERGY_COL", "NUM_COLS", "SNIP_EDGES", "REMOVE_DC",
                      "PREEMPH", "RAW_ENERGY", "USE_ENERGY", "ENERGY_FLOOR", "USE_POWER", "USE_LOG", "SCALE_INPUT",
                      "PARTIALS", "PARTIAL_FRAMES")
_FRAMES_SIGNATURE = {
    "num_samples": "i32", "num_frames": "i32", "stride_wave_b": "i32", "stride_out_b": "i32", "stride_out_f": "i32",
    "stride_partial_b": "i32", "frame_shift": "i32", "reflect_pad": "i32",
    "input_scale": "fp32", "one_minus_preemph": "fp32", "log_energy_floor": "fp32",
}


def _audit_meta(candidate: FbankCandidate, dtype: str) -> Dict[str, object]:
    """The dense kernel at the WeSpeaker front end's options (80 bins, 400-sample hamming window)."""
    return dict(**_constexprs(_AUDIT_OPTIONS), **_meta(candidate, _AUDIT_OPTIONS))


def _audit_split_meta(candidate: FbankCandidate, dtype: str) -> Dict[str, object]:
    """The two-stage kernel at the WeSpeaker front end's options (512 = 16 x 32)."""
    return dict(**_split_constexprs(_AUDIT_OPTIONS), **_split_meta(candidate))


def _audit_kernels() -> list:
    candidates = tuple(variant.candidate() for variant in FbankVariant)
    split_candidates = tuple(c for c in candidates if c.precision == "tf32x3")
    return [AuditSpec(
        name="fbank_frames",
        family="fbank",
        kernel=_fbank_frames_kernel,
        signature={
            "wave_ptr": "*{dt}", "window_ptr": "*fp32", "basis_ptr": "*fp32", "melt_ptr": "*fp32", "out_ptr": "*fp32",
            "partial_ptr": "*fp32", **_FRAMES_SIGNATURE,
            **{name: "constexpr" for name in ("WIN_P", "WIN_CHUNK", "NFREQ_P", "MEL_P", "BLOCK_F", "BLOCK_K",
                                              "PRECISION")
               + _OPTION_CONSTEXPRS},
        },
        meta=_audit_meta,
        candidates=candidates,
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32", "fp16", "bf16"),
        expects_mma=lambda candidate, dtype: candidate.precision == "tf32x3",
    ), AuditSpec(
        name="fbank_split",
        family="fbank",
        kernel=_fbank_split_kernel,
        signature={
            "wave_ptr": "*{dt}", "window_ptr": "*fp32", "stage1_ptr": "*fp32", "twiddle_ptr": "*fp32",
            "stage2_ptr": "*fp32", "mel_ptr": "*fp32", "spectra_ptr": "*fp32", "out_ptr": "*fp32",
            "partial_ptr": "*fp32", **_FRAMES_SIGNATURE, "stride_spectra_b": "i32",
            "frames_bucket": "i32", "batch_bucket": "i32",
            **{name: "constexpr" for name in ("N1", "N2", "N1P", "N2P", "K2P", "MEL_A", "MEL_B", "BLOCK_F", "BLOCK_K",
                                              "STEP_SAMPLES", "PRECISION") + _OPTION_CONSTEXPRS},
        },
        meta=_audit_split_meta,
        candidates=split_candidates,
        default=FbankVariant.TF32X3_F64_Q32.candidate(),  # the sm_80 / sm_90 recipe
        dtypes=("fp32", "fp16", "bf16"),
        expects_mma=lambda candidate, dtype: candidate.precision == "tf32x3",
    ), AuditSpec(
        name="fbank_cmn",
        family="fbank",
        kernel=_fbank_cmn_kernel,
        signature={"out_ptr": "*fp32", "partial_ptr": "*fp32", "num_frames": "i32", "num_groups": "i32",
                   "stride_out_b": "i32", "stride_out_f": "i32", "stride_partial_b": "i32",
                   **{name: "constexpr" for name in ("NUM_COLS", "BLOCK_F", "STEP_F", "BLOCK_C", "BLOCK_G")}},
        meta=lambda candidate, dtype: dict(NUM_COLS=80, BLOCK_F=CMN_BLOCK_F, STEP_F=CMN_STEP_F, BLOCK_C=128,
                                           BLOCK_G=CMN_BLOCK_G,
                                           num_warps=4, num_stages=3),
        candidates=(DEFAULT_VARIANT.candidate(),),
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32",),
        expects_mma=False,
    )]


AUDIT_KERNELS = _audit_kernels()
