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

# The request carries the padded FFT size, not the frame length (window_size is not a launch field): where the
# padded size is 512, the frame is taken as torchaudio's default 25 ms at 16 kHz (400 samples, pyannote's and
# WeSpeaker's), else as the padded size itself (no zero padding)
_ASSUMED_FRAME = {512: 400}


def library_kernels(request, profile) -> list:
    """The kernels `fbank` above launches on a GPU for a routed fbank request, one per eager torch op in the
    order the function runs them (rlx_triton.backends.torch_ref.library_kernel.LibraryKernel), priced by the
    models of rlx_triton.perf.library: the DC-offset mean and its subtraction (reading the strided frames
    gathers each waveform sample from memory once, the overlap being L2 hits), pre-emphasis as cat, multiply and
    subtract, the window, the zero padding, cuFFT's rfft (rlx_triton.perf.library.fft), abs and pow, the mel
    product (one cuBLAS SGEMM of frames x bins, TF32 off as pyannote runs it: rlx_triton.perf.library.gemm),
    the log floor (its epsilon made a device tensor by torch.tensor on every call: a host-to-device copy) and
    log, with use_energy the log energy and the concatenation, with subtract_mean the mean over frames and its
    subtraction. Not in the request, so assumed: a pre-emphasis coefficient other than 0 (torchaudio's 0.97),
    the frame length (_ASSUMED_FRAME), input_scale 1 (a scaled call adds one multiply over the waveform) and,
    with use_energy, torchaudio's energy_floor of 1 (one more copy and max)."""
    from rlx_triton.perf.library import Unmodelled
    from rlx_triton.perf.library.eager import ELEMENT_BYTES, elementwise, host_copy, reduction
    from rlx_triton.perf.library.fft import rfft_kernels
    from rlx_triton.perf.library.gemm import gemm_kernels

    if request.dtype not in ("float32", "float16", "bfloat16"):
        raise Unmodelled(f"the fbank library path in {request.dtype} (float64 FFT and GEMM) is not modelled")
    fields, features = request.field_map, request.feature_map
    batch, samples, frames = fields["batch"], fields["samples"], fields["frames"]
    padded, bins = fields["window"], fields["bins"]
    frame = _ASSUMED_FRAME.get(padded, padded)
    size = 4                                     # computed in fp32
    rows = batch * frames
    wave = batch * samples * size
    frame_bytes = rows * frame * size
    spectrum = padded // 2 + 1
    kernels = []
    if request.dtype != "float32":
        kernels.append(elementwise("waveform cast to fp32", batch * samples * ELEMENT_BYTES[request.dtype], wave))
    if not features.get("snip_edges", True):
        kernels += [elementwise("flip (reflected edges)", wave, wave), elementwise("cat (reflected edges)", 2 * wave,
                                                                                   2 * wave)]
    source = wave                                # the first op over the strided frames reads the waveform once
    if features.get("dither"):
        kernels += [elementwise("randn (dither)", 0, frame_bytes), elementwise("* dither", frame_bytes, frame_bytes),
                    elementwise("+ noise", source + frame_bytes, frame_bytes)]
        source = frame_bytes
    if features.get("remove_dc_offset", True):
        kernels += [reduction("frame mean (DC offset)", source, rows * size, rows * frame),
                    elementwise("- mean", source + rows * size, frame_bytes, rows * frame)]
        source = frame_bytes

    def log_energy(over: int) -> list:
        energy = rows * size
        return [elementwise("pow(2)", over, over), reduction("sum (energy)", over, energy),
                host_copy("torch.tensor(epsilon) to the device", size), elementwise("max(energy, eps)", energy, energy),
                elementwise("log (energy)", energy, energy), host_copy("torch.tensor(log energy_floor)", size),
                elementwise("max(log energy, floor)", energy, energy)]

    if features.get("use_energy") and features.get("raw_energy", True):
        kernels += log_energy(source)
    kernels += [elementwise("pre-emphasis cat (replicate pad)", source, frame_bytes),
                elementwise("pre-emphasis * coefficient", frame_bytes, frame_bytes, rows * frame),
                elementwise("pre-emphasis subtraction", source + frame_bytes, frame_bytes, rows * frame),
                elementwise("window multiply", frame_bytes + frame * size, frame_bytes, rows * frame)]
    padded_bytes = rows * padded * size
    if padded != frame:
        kernels.append(elementwise("zero pad to the FFT size", frame_bytes, padded_bytes))
    if features.get("use_energy") and not features.get("raw_energy", True):
        kernels += log_energy(padded_bytes)
    kernels += rfft_kernels(rows, padded, "fp32", profile, label="rfft")
    magnitudes = rows * spectrum * size
    kernels.append(elementwise("abs (complex magnitude)", 2 * magnitudes, magnitudes, 3 * rows * spectrum))
    if features.get("use_power", True):
        kernels.append(elementwise("pow(2)", magnitudes, magnitudes, rows * spectrum))
    kernels += gemm_kernels(rows, bins, spectrum, "fp32", profile, label="mel matmul (cuBLAS SGEMM, TF32 off)")
    mel = rows * bins * size
    if features.get("use_log_fbank", True):
        kernels += [host_copy("torch.tensor(epsilon) to the device", size), elementwise("max(mel, eps)", mel, mel),
                    elementwise("log", mel, mel)]
    columns = bins + int(bool(features.get("use_energy")))
    features_bytes = rows * columns * size
    if features.get("use_energy"):
        kernels.append(elementwise("energy column concatenation", mel + rows * size, features_bytes))
    if features.get("subtract_mean"):
        kernels += [reduction("mean over frames", features_bytes, batch * columns * size, rows * columns),
                    elementwise("mean subtraction", features_bytes + batch * columns * size, features_bytes,
                                rows * columns)]
    return kernels
