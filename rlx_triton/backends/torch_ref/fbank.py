"""Kaldi log-mel filterbank in plain torch: the library fallback of the fbank family.

It computes what `torchaudio.compliance.kaldi.fbank` computes, step for step, batched over rows of a
(B, T) waveform. This module also owns what every fbank backend shares: the per-option-set constants
(analysis window, mel matrix, DFT basis), built exactly as torchaudio builds them and cached per option
set with functools.lru_cache. The options themselves (`FbankOptions`, the torchaudio keywords validated
once) are the op's, declared in rlx_triton/ops/fbank.py; `FbankOptions` is importable from here too,
where every backend reads it. torchaudio is not needed at run time.
"""
from __future__ import annotations

import functools
import math
import torch

from rlx_triton.ops.fbank import WINDOW_TYPES, FbankOptions
from rlx_triton.router.coverage import Coverage

# numeric_limits<float>::epsilon(): torchaudio's floor for mel energies and the raw log energy
EPSILON = torch.finfo(torch.float32).eps

COVERAGE = Coverage.everything()
APPROVALS: dict = {}

# The request features (FbankOptions) a kernel covers when it implements every option but dither: the
# `features` of the Triton and Metal COVERAGE.
KERNEL_FEATURES = {
    "window_type": frozenset(WINDOW_TYPES),
    "snip_edges": frozenset({True, False}),
    "dither": frozenset({False}),  # random per-sample noise: torch fallback
    "use_power": frozenset({True, False}),
    "use_log_fbank": frozenset({True, False}),
    "use_energy": frozenset({True, False}),
    "raw_energy": frozenset({True, False}),
    "htk_compat": frozenset({True, False}),
    "subtract_mean": frozenset({True, False}),
    "remove_dc_offset": frozenset({True, False}),
    "vtln": frozenset({True, False}),
    "requires_grad": frozenset({False}),  # forward-only kernels: autograd runs on the torch path
}


# ---------------------------------------------------------------------------------------------
# per-option-set constants, exactly as torchaudio builds them (cached)

def _window_function(window_type: str, window_size: int, blackman_coeff: float, dtype: torch.dtype) -> torch.Tensor:
    if window_type == "hanning":
        return torch.hann_window(window_size, periodic=False, dtype=dtype)
    if window_type == "hamming":
        return torch.hamming_window(window_size, periodic=False, alpha=0.54, beta=0.46, dtype=dtype)
    if window_type == "povey":
        return torch.hann_window(window_size, periodic=False, dtype=dtype).pow(0.85)
    if window_type == "rectangular":
        return torch.ones(window_size, dtype=dtype)
    a = 2 * math.pi / (window_size - 1)
    n = torch.arange(window_size, dtype=dtype)
    return (blackman_coeff - 0.5 * torch.cos(a * n) + (0.5 - blackman_coeff) * torch.cos(2 * a * n)).to(dtype)


@functools.lru_cache(maxsize=64)
def window_function(options: FbankOptions, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The analysis window (window_size,) on CPU, computed in `dtype` as torchaudio does."""
    return _window_function(options.window_type, options.window_size, options.blackman_coeff, dtype)


def _mel_scale(freq: torch.Tensor) -> torch.Tensor:
    return 1127.0 * (1.0 + freq / 700.0).log()


def _inverse_mel_scale(mel: torch.Tensor) -> torch.Tensor:
    return 700.0 * ((mel / 1127.0).exp() - 1.0)


def _vtln_warp_freq(low_cut: float, high_cut: float, low_freq: float, high_freq: float, warp: float,
                    freq: torch.Tensor) -> torch.Tensor:
    l = low_cut * max(1.0, warp)
    h = high_cut * min(1.0, warp)
    scale = 1.0 / warp
    scale_left = (scale * l - low_freq) / (l - low_freq)
    scale_right = (high_freq - scale * h) / (high_freq - h)
    res = torch.empty_like(freq)
    outside = torch.lt(freq, low_freq) | torch.gt(freq, high_freq)
    before_l = torch.lt(freq, l)
    before_h = torch.lt(freq, h)
    after_h = torch.ge(freq, h)
    # the order matters: the regions overlap and later assignments win, as in torchaudio
    res[after_h] = high_freq + scale_right * (freq[after_h] - high_freq)
    res[before_h] = scale * freq[before_h]
    res[before_l] = low_freq + scale_left * (freq[before_l] - low_freq)
    res[outside] = freq[outside]
    return res


@functools.lru_cache(maxsize=64)
def mel_banks(options: FbankOptions) -> torch.Tensor:
    """(num_mel_bins, padded_window_size // 2) float32 triangular weights, torchaudio's get_mel_banks.

    Band edges are Python float64 scalars, the per-bin edges and the FFT-bin mel values are float32
    tensors, exactly as torchaudio computes them (so the weights agree bit for bit).
    """
    num_bins = options.num_mel_bins
    padded = options.padded_window_size
    num_fft_bins = padded / 2
    sample_freq = options.sample_frequency
    low_freq = options.low_freq
    high_freq = options.effective_high_freq
    fft_bin_width = sample_freq / padded
    mel_low = 1127.0 * math.log(1.0 + low_freq / 700.0)
    mel_high = 1127.0 * math.log(1.0 + high_freq / 700.0)
    mel_delta = (mel_high - mel_low) / (num_bins + 1)
    vtln_high = options.effective_vtln_high
    warp = options.vtln_warp

    bin_index = torch.arange(num_bins).unsqueeze(1)
    left_mel = mel_low + bin_index * mel_delta
    center_mel = mel_low + (bin_index + 1.0) * mel_delta
    right_mel = mel_low + (bin_index + 2.0) * mel_delta
    if warp != 1.0:
        def warped(mel):
            return _mel_scale(_vtln_warp_freq(options.vtln_low, vtln_high, low_freq, high_freq, warp,
                                              _inverse_mel_scale(mel)))
        left_mel, center_mel, right_mel = warped(left_mel), warped(center_mel), warped(right_mel)

    mel = _mel_scale(fft_bin_width * torch.arange(num_fft_bins)).unsqueeze(0)
    up_slope = (mel - left_mel) / (center_mel - left_mel)
    down_slope = (right_mel - mel) / (right_mel - center_mel)
    if warp == 1.0:
        return torch.max(torch.zeros(1), torch.min(up_slope, down_slope))
    bins = torch.zeros_like(up_slope)
    up_idx = torch.gt(mel, left_mel) & torch.le(mel, center_mel)
    down_idx = torch.gt(mel, center_mel) & torch.lt(mel, right_mel)
    bins[up_idx] = up_slope[up_idx]
    bins[down_idx] = down_slope[down_idx]
    return bins


@functools.lru_cache(maxsize=64)
def _mel_matrix_on(options: FbankOptions, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(num_mel_bins, padded // 2 + 1): the mel banks right-padded with the zero Nyquist column."""
    weights = mel_banks(options).to(device=device, dtype=dtype)
    return torch.nn.functional.pad(weights, (0, 1), mode="constant", value=0)


@functools.lru_cache(maxsize=64)
def _window_on(options: FbankOptions, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return window_function(options, dtype).to(device)


# ---------------------------------------------------------------------------------------------
# framing and the pipeline

def frame_waveform(waveform: torch.Tensor, options: FbankOptions) -> torch.Tensor:
    """(B, T) -> (B, frames, window_size): torchaudio's _get_strided, batched.

    snip_edges=False reflects the signal at both ends in Kaldi's [2, 1, 0, 0, 1, 2] style.
    """
    size, shift = options.window_size, options.window_shift
    frames = options.num_frames(waveform.shape[-1])
    if not options.snip_edges:
        reversed_waveform = torch.flip(waveform, [-1])
        pad = options.reflect_pad
        if pad > 0:
            waveform = torch.cat((reversed_waveform[:, -pad:], waveform, reversed_waveform), dim=-1)
        else:
            waveform = torch.cat((waveform[:, -pad:], reversed_waveform), dim=-1)
    return waveform.unfold(-1, size, shift)[:, :frames]


def _log_energy(frames: torch.Tensor, options: FbankOptions) -> torch.Tensor:
    eps = torch.tensor(EPSILON, dtype=frames.dtype, device=frames.device)
    log_energy = torch.max(frames.pow(2).sum(-1), eps).log()
    if options.energy_floor == 0.0:
        return log_energy
    return torch.max(log_energy, torch.tensor(math.log(options.energy_floor), dtype=frames.dtype, device=frames.device))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 input computes in float64 (like torchaudio); every other float dtype computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fbank(waveform: torch.Tensor, options: FbankOptions, *, candidate=None, route=None) -> torch.Tensor:
    """(B, T) waveform -> (B, frames, num_mel_bins + use_energy) Kaldi filterbank features.

    `candidate` and `route` are ignored (the library path has no tiling choices). The caller (rlx_triton.ops.fbank)
    has validated the shape: T is at least one window and min_duration is met.
    """
    dtype = compute_dtype(waveform.dtype)
    device = waveform.device
    wave = waveform.to(dtype)
    if options.input_scale != 1.0:
        wave = wave * options.input_scale
    frames = frame_waveform(wave, options)
    if options.dither != 0.0:
        frames = frames + torch.randn(frames.shape, device=device, dtype=dtype) * options.dither
    if options.remove_dc_offset:
        frames = frames - frames.mean(dim=-1, keepdim=True)
    # the log energy is a column only with use_energy (torchaudio computes it always and drops it)
    if options.use_energy and options.raw_energy:
        log_energy = _log_energy(frames, options)
    if options.preemphasis_coefficient != 0.0:
        previous = torch.cat((frames[..., :1], frames[..., :-1]), dim=-1)  # replicate pad: x[-1] := x[0]
        frames = frames - options.preemphasis_coefficient * previous
    frames = frames * _window_on(options, dtype, device)
    padding = options.padded_window_size - options.window_size
    if padding:
        frames = torch.nn.functional.pad(frames, (0, padding), mode="constant", value=0)
    if options.use_energy and not options.raw_energy:
        log_energy = _log_energy(frames, options)

    spectrum = torch.fft.rfft(frames).abs()
    if options.use_power:
        spectrum = spectrum.pow(2.0)
    mel = torch.matmul(spectrum, _mel_matrix_on(options, dtype, device).T)
    if options.use_log_fbank:
        mel = torch.max(mel, torch.tensor(EPSILON, dtype=dtype, device=device)).log()
    if options.use_energy:
        energy = log_energy.unsqueeze(-1)
        mel = torch.cat((mel, energy), dim=-1) if options.htk_compat else torch.cat((energy, mel), dim=-1)
    if options.subtract_mean:
        mel = mel - mel.mean(dim=-2, keepdim=True)
    return mel


# ---------------------------------------------------------------------------------------------
# the library path's kernels, for `rlx-triton perf`'s library path estimate

_ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def library_kernels(request) -> list:
    """The kernels `fbank` above needs on a GPU for a routed fbank request, each with its minimum traffic (every
    byte once) and FLOPs (rlx_triton.perf.roofline.LibraryKernel). The torch ops are grouped as a lean torch
    path would fuse them, so the estimate is a lower bound of this module's launches (it runs several
    elementwise kernels per step): framing with DC removal, pre-emphasis, window and zero padding as one kernel;
    cuFFT's real FFT (2.5 N log2 N FLOPs per frame); the power (or magnitude); the mel matrix product (cuBLAS
    SGEMM with TF32 off, as pyannote runs it); the log floor; with use_energy the log energy and the column
    concatenation; with subtract_mean the mean over frames and its subtraction."""
    from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel

    fields, features = request.field_map, request.feature_map
    batch, samples, frames = fields["batch"], fields["samples"], fields["frames"]
    dft, mel = fields["window"], fields["bins"]
    compute = 8 if request.dtype == "float64" else 4
    rows = batch * frames
    spectrum_bins = dft // 2 + 1
    frames_bytes = rows * dft * compute
    columns = mel + int(bool(features.get("use_energy")))
    features_bytes = rows * columns * compute
    kernels = [
        LibraryKernel("framing + DC removal + pre-emphasis + window + zero pad",
                      batch * samples * _ELEMENT_BYTES.get(request.dtype, 4), frames_bytes, 4 * rows * dft),
        LibraryKernel("rfft (cuFFT)", frames_bytes, rows * spectrum_bins * 2 * compute,
                      int(2.5 * dft * math.log2(dft)) * rows),
        LibraryKernel("power spectrum", rows * spectrum_bins * 2 * compute, rows * spectrum_bins * compute,
                      3 * rows * spectrum_bins),
        LibraryKernel("mel matmul (cuBLAS, TF32 off)", (rows + mel) * spectrum_bins * compute,
                      rows * mel * compute, 2 * rows * spectrum_bins * mel),
    ]
    if features.get("use_log_fbank", True):
        kernels.append(LibraryKernel("log floor + log", rows * mel * compute, rows * mel * compute, 2 * rows * mel))
    if features.get("use_energy"):
        kernels.append(LibraryKernel("log energy", frames_bytes, rows * compute, 2 * rows * dft))
        kernels.append(LibraryKernel("energy column concatenation", features_bytes, features_bytes))
    if features.get("subtract_mean"):
        kernels.append(LibraryKernel("mean over frames", features_bytes, batch * columns * compute, rows * columns))
        kernels.append(LibraryKernel("mean subtraction", features_bytes + batch * columns * compute, features_bytes,
                                     rows * columns))
    return kernels
