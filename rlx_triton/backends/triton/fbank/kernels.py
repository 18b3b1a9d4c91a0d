"""The fbank kernels (@triton.jit code only): Kaldi log-mel filterbank as one fused Triton kernel per tile of frames.

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
"""
from __future__ import annotations

import triton
import triton.language as tl


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
