"""Kaldi log-mel filterbank in plain torch: the library fallback of the fbank family.

It computes what `torchaudio.compliance.kaldi.fbank` computes, step for step, batched over rows of a
(B, T) waveform. This module also owns what every fbank backend shares: `FbankOptions` (the
torchaudio keywords, validated once, with errors naming the option) and the per-option-set
constants (analysis window, mel matrix, DFT basis), built exactly as torchaudio builds them and
cached per option set with functools.lru_cache. torchaudio is not needed at run time.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields

import torch

from rlx_triton.router.coverage import Coverage

WINDOW_TYPES = ("hamming", "hanning", "povey", "rectangular", "blackman")
# numeric_limits<float>::epsilon(): torchaudio's floor for mel energies and the raw log energy
EPSILON = torch.finfo(torch.float32).eps
MILLISECONDS_TO_SECONDS = 0.001

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


def _next_power_of_2(x: int) -> int:
    return 1 if x == 0 else 2 ** (x - 1).bit_length()


def _fail(option: str, message: str):
    raise ValueError(f"fbank: {option} {message}")


@dataclass(frozen=True)
class FbankOptions:
    """Every keyword of torchaudio.compliance.kaldi.fbank with its default, plus one rlx extension.

    `input_scale` (rlx extension, default 1.0) multiplies the waveform before anything else: the
    WeSpeaker front end uses 32768 (int16 range), which is exact in float32 (a power of two).
    Construction validates every option and raises ValueError naming the offending option.
    """

    blackman_coeff: float = 0.42
    channel: int = -1
    dither: float = 0.0
    energy_floor: float = 1.0
    frame_length: float = 25.0
    frame_shift: float = 10.0
    high_freq: float = 0.0
    htk_compat: bool = False
    low_freq: float = 20.0
    min_duration: float = 0.0
    num_mel_bins: int = 23
    preemphasis_coefficient: float = 0.97
    raw_energy: bool = True
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    sample_frequency: float = 16000.0
    snip_edges: bool = True
    subtract_mean: bool = False
    use_energy: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    vtln_high: float = -500.0
    vtln_low: float = 100.0
    vtln_warp: float = 1.0
    window_type: str = "povey"
    input_scale: float = 1.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" or isinstance(f.default, bool):
                if not isinstance(value, bool):
                    _fail(f.name, f"must be a bool, got {value!r}")
            elif f.name == "window_type":
                if value not in WINDOW_TYPES:
                    _fail("window_type", f"must be one of {WINDOW_TYPES}, got {value!r}")
            elif f.name in ("channel", "num_mel_bins"):
                if isinstance(value, bool) or not isinstance(value, int):
                    _fail(f.name, f"must be an int, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    _fail(f.name, f"must be a finite number, got {value!r}")
        if self.sample_frequency <= 0:
            _fail("sample_frequency", f"must be greater than zero, got {self.sample_frequency}")
        if self.window_shift <= 0:
            _fail("frame_shift", f"gives a window shift of {self.window_shift} samples; it must be at least 1 "
                  f"(sample_frequency * frame_shift / 1000)")
        if self.window_size < 2:
            _fail("frame_length", f"gives a window of {self.window_size} samples; it must be at least 2 "
                  f"(sample_frequency * frame_length / 1000)")
        if self.padded_window_size % 2 != 0:
            _fail("frame_length", f"gives an odd FFT size {self.padded_window_size}; use round_to_power_of_two "
                  f"or change frame_length")
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            _fail("preemphasis_coefficient", f"must be in [0, 1], got {self.preemphasis_coefficient}")
        if self.num_mel_bins <= 3:
            _fail("num_mel_bins", f"must be at least 4 (torchaudio needs more than 3 mel bins), got {self.num_mel_bins}")
        if self.channel < -1:
            _fail("channel", f"must be -1 (mono / batch rows) or a channel index >= 0, got {self.channel}")
        if self.dither < 0:
            _fail("dither", f"must be >= 0, got {self.dither}")
        if self.energy_floor < 0:
            _fail("energy_floor", f"must be >= 0 (0 disables the floor), got {self.energy_floor}")
        if self.min_duration < 0:
            _fail("min_duration", f"must be >= 0, got {self.min_duration}")
        nyquist = 0.5 * self.sample_frequency
        if not 0.0 <= self.low_freq < nyquist:
            _fail("low_freq", f"must be in [0, nyquist={nyquist}), got {self.low_freq}")
        high = self.effective_high_freq
        if not 0.0 < high <= nyquist:
            _fail("high_freq", f"gives {high} Hz, outside (0, nyquist={nyquist}] (values <= 0 are offsets from nyquist)")
        if not self.low_freq < high:
            _fail("high_freq", f"gives {high} Hz, not above low_freq={self.low_freq}")
        if self.vtln_warp <= 0:
            _fail("vtln_warp", f"must be greater than zero, got {self.vtln_warp}")
        if self.vtln_warp != 1.0:
            vtln_high = self.effective_vtln_high
            if not self.low_freq < self.vtln_low < high:
                _fail("vtln_low", f"must lie strictly between low_freq={self.low_freq} and high_freq={high}, "
                      f"got {self.vtln_low}")
            if not 0.0 < vtln_high < high:
                _fail("vtln_high", f"gives {vtln_high} Hz, outside (0, high_freq={high}) "
                      f"(negative values are offsets from nyquist)")
            if not self.vtln_low < vtln_high:
                _fail("vtln_high", f"gives {vtln_high} Hz, not above vtln_low={self.vtln_low}")
            if not self.vtln_low * max(1.0, self.vtln_warp) > self.low_freq:
                _fail("vtln_low", "times max(1, vtln_warp) must stay above low_freq")
            if not vtln_high * min(1.0, self.vtln_warp) < high:
                _fail("vtln_high", "times min(1, vtln_warp) must stay below high_freq")

    # derived sizes, as torchaudio computes them
    @property
    def window_shift(self) -> int:
        return int(self.sample_frequency * self.frame_shift * MILLISECONDS_TO_SECONDS)

    @property
    def window_size(self) -> int:
        return int(self.sample_frequency * self.frame_length * MILLISECONDS_TO_SECONDS)

    @property
    def padded_window_size(self) -> int:
        return _next_power_of_2(self.window_size) if self.round_to_power_of_two else self.window_size

    @property
    def effective_high_freq(self) -> float:
        return self.high_freq + 0.5 * self.sample_frequency if self.high_freq <= 0.0 else self.high_freq

    @property
    def effective_vtln_high(self) -> float:
        return self.vtln_high + 0.5 * self.sample_frequency if self.vtln_high < 0.0 else self.vtln_high

    @property
    def num_columns(self) -> int:
        """Output features per frame: the mel bins, plus the log energy column with use_energy."""
        return self.num_mel_bins + int(self.use_energy)

    @property
    def reflect_pad(self) -> int:
        """Samples reflected in front of the waveform when snip_edges=False (negative: samples trimmed)."""
        return self.window_size // 2 - self.window_shift // 2

    def num_frames(self, num_samples: int) -> int:
        if self.snip_edges:
            return 1 + (num_samples - self.window_size) // self.window_shift
        return (num_samples + self.window_shift // 2) // self.window_shift

    def too_short(self, num_samples: int) -> bool:
        """torchaudio returns an empty tensor for signals shorter than min_duration."""
        return num_samples < self.min_duration * self.sample_frequency


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
    from rlx_triton.perf.roofline import LibraryKernel

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
