"""Float64 reference for Kaldi fbank, following torchaudio.compliance.kaldi.fbank step by step.

Written independently of rlx_triton: one waveform row at a time, plain loops where torchaudio uses
strided views. Everything runs in float64 except the mel weights, which torchaudio defines with
float64 band edges and float32 per-bin values; they are built that way here and then upcast, so the
reference states torchaudio's output without float32 rounding in the signal path.
Also holds the test signals shared by the fbank tests.
"""
from __future__ import annotations

import math

import torch

EPS = 1.1920928955078125e-07
WINDOWS = ("hamming", "hanning", "povey", "rectangular", "blackman")

DEFAULTS = dict(
    blackman_coeff=0.42, channel=-1, dither=0.0, energy_floor=1.0, frame_length=25.0, frame_shift=10.0,
    high_freq=0.0, htk_compat=False, low_freq=20.0, min_duration=0.0, num_mel_bins=23,
    preemphasis_coefficient=0.97, raw_energy=True, remove_dc_offset=True, round_to_power_of_two=True,
    sample_frequency=16000.0, snip_edges=True, subtract_mean=False, use_energy=False, use_log_fbank=True,
    use_power=True, vtln_high=-500.0, vtln_low=100.0, vtln_warp=1.0, window_type="povey",
)

# option sets of real models
POVEY_23 = {}  # torchaudio / Kaldi defaults: 23 bins, povey window
WESPEAKER_80 = dict(num_mel_bins=80, frame_length=25, frame_shift=10, round_to_power_of_two=True, snip_edges=True,
                    dither=0.0, sample_frequency=16000, window_type="hamming", use_energy=False)
NO_SNIP = dict(snip_edges=False, num_mel_bins=40)


def speech_like(num_samples: int, batch: int = 1, *, sample_rate: float = 16000.0, seed: int = 0,
                amplitude: float = 0.3) -> torch.Tensor:
    """(batch, num_samples) float64: a few harmonics with a slow vibrato plus white noise, in [-1, 1]."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(num_samples, dtype=torch.float64) / sample_rate
    rows = []
    for b in range(batch):
        f0 = 110.0 + 37.0 * b
        phase = 2 * math.pi * (f0 * t + 3.0 * torch.sin(2 * math.pi * 2.5 * t))
        voiced = sum((1.0 / h) * torch.sin(h * phase) for h in range(1, 12))
        noise = torch.randn(num_samples, dtype=torch.float64, generator=gen)
        rows.append(amplitude * (0.6 * voiced / 3.0 + 0.05 * noise))
    return torch.stack(rows)


def _window(window_type: str, size: int, blackman_coeff: float) -> torch.Tensor:
    n = torch.arange(size, dtype=torch.float64)
    a = 2 * math.pi / (size - 1)
    hann = 0.5 - 0.5 * torch.cos(a * n)
    if window_type == "hanning":
        return hann
    if window_type == "povey":
        return hann.pow(0.85)
    if window_type == "hamming":
        return 0.54 - 0.46 * torch.cos(a * n)
    if window_type == "rectangular":
        return torch.ones(size, dtype=torch.float64)
    return blackman_coeff - 0.5 * torch.cos(a * n) + (0.5 - blackman_coeff) * torch.cos(2 * a * n)


def _mel(f):
    return 1127.0 * (1.0 + f / 700.0).log()


def _inv_mel(m):
    return 700.0 * ((m / 1127.0).exp() - 1.0)


def _warp(low_cut, high_cut, low, high, warp, freq):
    l, h = low_cut * max(1.0, warp), high_cut * min(1.0, warp)
    scale = 1.0 / warp
    sl, sr = (scale * l - low) / (l - low), (high - scale * h) / (high - h)
    res = torch.empty_like(freq)
    res[freq >= h] = high + sr * (freq[freq >= h] - high)
    res[freq < h] = scale * freq[freq < h]
    res[freq < l] = low + sl * (freq[freq < l] - low)
    outside = (freq < low) | (freq > high)
    res[outside] = freq[outside]
    return res


def mel_weights(o: dict, padded: int) -> torch.Tensor:
    """(bins, padded // 2 + 1) float64 from torchaudio's float32 definition (f64 scalars, f32 tensors)."""
    nyq = 0.5 * o["sample_frequency"]
    high = o["high_freq"] + nyq if o["high_freq"] <= 0 else o["high_freq"]
    low = o["low_freq"]
    vtln_high = o["vtln_high"] + nyq if o["vtln_high"] < 0 else o["vtln_high"]
    mlow, mhigh = 1127.0 * math.log(1 + low / 700.0), 1127.0 * math.log(1 + high / 700.0)
    delta = (mhigh - mlow) / (o["num_mel_bins"] + 1)
    i = torch.arange(o["num_mel_bins"]).unsqueeze(1)
    left, center, right = mlow + i * delta, mlow + (i + 1.0) * delta, mlow + (i + 2.0) * delta
    if o["vtln_warp"] != 1.0:
        left, center, right = (_mel(_warp(o["vtln_low"], vtln_high, low, high, o["vtln_warp"], _inv_mel(m)))
                               for m in (left, center, right))
    mel = _mel(o["sample_frequency"] / padded * torch.arange(padded / 2)).unsqueeze(0)
    up, down = (mel - left) / (center - left), (right - mel) / (right - center)
    if o["vtln_warp"] == 1.0:
        w = torch.clamp(torch.minimum(up, down), min=0.0)
    else:
        w = torch.zeros_like(up)
        ui = (mel > left) & (mel <= center)
        di = (mel > center) & (mel < right)
        w[ui], w[di] = up[ui], down[di]
    return torch.nn.functional.pad(w.to(torch.float64), (0, 1))


def fbank64(waveform: torch.Tensor, input_scale: float = 1.0, **kwargs) -> torch.Tensor:
    """One mono waveform (T,) -> (frames, bins [+1]) in float64, torchaudio's algorithm."""
    o = dict(DEFAULTS, **kwargs)
    x = waveform.to(torch.float64).reshape(-1) * input_scale
    fs = o["sample_frequency"]
    shift = int(fs * o["frame_shift"] * 0.001)
    size = int(fs * o["frame_length"] * 0.001)
    padded = 2 ** (size - 1).bit_length() if o["round_to_power_of_two"] else size
    n = x.numel()
    if o["snip_edges"]:
        m = 1 + (n - size) // shift
        src = x
    else:
        m = (n + shift // 2) // shift
        pad = size // 2 - shift // 2
        rev = x.flip(0)
        src = torch.cat((rev[-pad:], x, rev)) if pad > 0 else torch.cat((x[-pad:], rev))
    frames = torch.stack([src[i * shift: i * shift + size] for i in range(m)]) if m > 0 else x.new_zeros(0, size)
    if o["remove_dc_offset"]:
        frames = frames - frames.mean(1, keepdim=True)

    def log_energy(fr):
        e = fr.pow(2).sum(1).clamp_min(EPS).log()
        return e if o["energy_floor"] == 0.0 else e.clamp_min(math.log(o["energy_floor"]))

    if o["raw_energy"]:
        energy = log_energy(frames)
    c = o["preemphasis_coefficient"]
    if c != 0.0:
        prev = torch.cat((frames[:, :1], frames[:, :-1]), 1)
        frames = frames - c * prev
    frames = frames * _window(o["window_type"], size, o["blackman_coeff"])
    frames = torch.nn.functional.pad(frames, (0, padded - size))
    if not o["raw_energy"]:
        energy = log_energy(frames)
    spec = torch.fft.rfft(frames).abs()
    if o["use_power"]:
        spec = spec.pow(2)
    mel = spec @ mel_weights(o, padded).T
    if o["use_log_fbank"]:
        mel = mel.clamp_min(EPS).log()
    if o["use_energy"]:
        e = energy.unsqueeze(1)
        mel = torch.cat((mel, e), 1) if o["htk_compat"] else torch.cat((e, mel), 1)
    if o["subtract_mean"]:
        mel = mel - mel.mean(0, keepdim=True)
    return mel


def fbank64_batch(waveforms: torch.Tensor, input_scale: float = 1.0, **kwargs) -> torch.Tensor:
    """(B, T) -> (B, frames, bins) float64, row by row."""
    return torch.stack([fbank64(row, input_scale, **kwargs) for row in waveforms])


def log_mel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| over log-mel values: on a log scale this is the relative error of the mel energy."""
    return (out.to(torch.float64) - ref).abs().max().item()


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| / max(|ref|, 1): relative for large values, absolute near zero (CMN features)."""
    ref = ref.to(torch.float64)
    return ((out.to(torch.float64) - ref).abs() / ref.abs().clamp_min(1.0)).max().item()


# ------------------------------------------------------------------------------- degenerate inputs
# Waveforms users feed in: silence, a DC offset, exactly one frame, and one NaN / +Inf / -Inf sample
# (a dropout in a decoder or a division by zero upstream). torchaudio gives NaN in every frame whose
# window holds the bad sample (all frames after subtract_mean) and finite features elsewhere.
DEGENERATE_WAVES = ("silence", "constant", "single_frame", "nan_sample", "inf_sample", "neg_inf_sample")
BAD_SAMPLE_AT = 500

# option sets that take a different path through the bad sample: DC removal and pre-emphasis (defaults),
# reflection at both ends, the windowed energy column, neither DC removal nor pre-emphasis nor window
# (the energy of an Inf sample is +Inf there), and the WeSpeaker front end (x32768, CMN over frames).
# At 8 kHz (200-sample frames, 256-point DFT) to keep the interpreter quick.
DEGENERATE_OPTIONS = {
    "povey_defaults": dict(sample_frequency=8000.0),
    "snip_edges_false": dict(sample_frequency=8000.0, snip_edges=False),
    "windowed_energy": dict(sample_frequency=8000.0, use_energy=True, raw_energy=False),
    "no_dc_no_preemphasis": dict(sample_frequency=8000.0, remove_dc_offset=False, preemphasis_coefficient=0.0,
                                 window_type="rectangular", use_energy=True),
    "wespeaker_cmn": dict(sample_frequency=8000.0, num_mel_bins=40, window_type="hamming", input_scale=32768.0,
                          subtract_mean=True),
}


def degenerate_wave(name: str, num_samples: int = 1000, *, frame_samples: int = 200) -> torch.Tensor:
    """(1, T) float64 waveform of one DEGENERATE_WAVES entry (single_frame: T = frame_samples)."""
    if name == "silence":
        return torch.zeros(1, num_samples, dtype=torch.float64)
    if name == "constant":
        return torch.full((1, num_samples), 0.25, dtype=torch.float64)
    if name == "single_frame":
        return speech_like(frame_samples, sample_rate=8000.0)
    wave = speech_like(num_samples, sample_rate=8000.0)
    wave[0, BAD_SAMPLE_AT] = {"nan_sample": math.nan, "inf_sample": math.inf, "neg_inf_sample": -math.inf}[name]
    return wave


def assert_features_match(out: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """NaN and +-Inf exactly where the reference has them; elsewhere rel_error <= tol."""
    ref = ref.to(torch.float64)
    out = out.to(torch.float64)
    assert out.shape == ref.shape
    assert torch.equal(out.isnan(), ref.isnan()), "NaN in other places than the reference"
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()], ref[ref.isinf()])
    finite = ref.isfinite()
    if finite.any():
        assert rel_error(out[finite], ref[finite]) <= tol


def check_degenerate_fbank(launch, options: str, wave_name: str, *, tol: float,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Runs `launch((1, T) wave in dtype, torchaudio keywords) -> features` on one degenerate waveform
    and option set, and compares with fbank64 (assert_features_match)."""
    kwargs = DEGENERATE_OPTIONS[options]
    wave = degenerate_wave(wave_name)
    out = launch(wave.to(dtype), dict(kwargs))
    assert_features_match(out, fbank64_batch(wave, **kwargs), tol)
    return out
