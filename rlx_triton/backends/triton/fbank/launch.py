"""Fbank launches: per-option-set constants (DFT bases, mel banks, windows, cached per device), candidate ->
meta-parameters, the launch records with their byte and FLOP model, and the autotune bridge.

The launcher states its launches as records (`fbank_plan`, executed by `launches.run`); the two-stage
kernel runs through the autotune bridge when called with the router's route (key: frames bucket, batch
bucket, mel bins and the DFT factors).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
import triton

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.torch_ref import fbank as _ref
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.device_cache import device_constants
from rlx_triton.backends.triton.fbank.kernels import _fbank_cmn_kernel, _fbank_frames_kernel, _fbank_split_kernel
from rlx_triton.backends.triton.fbank.routing import APPROVALS
from rlx_triton.backends.triton.launches import Launch

# kernel meta-parameters, constexprs or scalar arguments by name: ints, floats, strings and flags
KernelArgs = Dict[str, Any]

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
    factors = split_factors(dft_size)
    assert factors is not None, f"no two-stage split of a {dft_size}-point DFT (runs_split says where one runs)"
    n1, n2 = factors
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
    def on_device(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float32).contiguous().to(device)

    return on_device(stage1), on_device(twiddle), on_device(stage2)


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


def _meta(candidate, options: FbankOptions) -> KernelArgs:
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


def _split_meta(candidate) -> KernelArgs:
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


def _option_constexprs(options: FbankOptions) -> KernelArgs:
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


def _constexprs(options: FbankOptions) -> KernelArgs:
    """The dense kernel's constexprs fixed by the option set (everything but the candidate's tiling)."""
    return dict(WIN_P=_window_padded(options.window_size), WIN_CHUNK=WINDOW_STEP,
                NFREQ_P=_pow2(options.padded_window_size // 2), MEL_P=_pow2(options.num_mel_bins),
                **_option_constexprs(options))


def _split_constexprs(options: FbankOptions) -> KernelArgs:
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


def _common_args(wave, out, partials, options: FbankOptions) -> KernelArgs:
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
