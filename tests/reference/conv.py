"""References for the 1-D conv family: pyannote's SincNet module tree, float64 conv1d, and the
degenerate waveforms (silence, DC, the shortest valid length, NaN, Inf) every backend must handle.

pyannote.audio and asteroid-filterbanks are not test dependencies, so their SincNet is written out
here with the same structure: class names, attribute names and parameter names (state_dict keys
`wav_norm1d.weight`, `conv1d.0.filterbank.low_hz_`, `conv1d.0.filterbank.band_hz_`, `conv1d.1.weight`,
`norm1d.2.bias`, ...) and the same math, following pyannote/audio/models/blocks/sincnet.py (non-streaming
path) and asteroid_filterbanks/param_sinc_fb.py + enc_dec.py (Encoder, Filterbank, ParamSincFB).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Filterbank(nn.Module):
    """asteroid_filterbanks.enc_dec.Filterbank: n_filters, kernel_size, stride, sample_rate."""

    def __init__(self, n_filters, kernel_size, stride=None, sample_rate=8000.0):
        super().__init__()
        self.n_filters = n_filters
        self.kernel_size = kernel_size
        self.stride = stride if stride else self.kernel_size // 2
        self.n_feats_out = n_filters
        self.sample_rate = sample_rate


class ParamSincFB(Filterbank):
    """asteroid_filterbanks.param_sinc_fb.ParamSincFB: learnable (low_hz_, band_hz_) band-pass pairs,
    each giving a cos (even) and a sin (odd) filter."""

    def __init__(self, n_filters, kernel_size, stride=None, sample_rate=16000.0, min_low_hz=50,
                 min_band_hz=50):
        if kernel_size % 2 == 0:
            kernel_size += 1
        super().__init__(n_filters, kernel_size, stride=stride, sample_rate=sample_rate)
        self.min_low_hz, self.min_band_hz = min_low_hz, min_band_hz
        self.half_kernel = self.kernel_size // 2
        self.cutoff = int(n_filters // 2)
        self.n_feats_out = 2 * self.cutoff
        self._initialize_filters()
        window_ = np.hamming(self.kernel_size)[: self.half_kernel]
        n_ = 2 * np.pi * (torch.arange(-self.half_kernel, 0.0).view(1, -1) / self.sample_rate)
        self.register_buffer("window_", torch.from_numpy(window_).float())
        self.register_buffer("n_", n_)

    def _initialize_filters(self):
        low_hz = 30
        high_hz = self.sample_rate / 2 - (self.min_low_hz + self.min_band_hz)
        mel = np.linspace(self.to_mel(low_hz), self.to_mel(high_hz), self.n_filters // 2 + 1,
                          dtype="float32")
        hz = self.to_hz(mel)
        self.low_hz_ = nn.Parameter(torch.from_numpy(hz[:-1]).view(-1, 1))
        self.band_hz_ = nn.Parameter(torch.from_numpy(np.diff(hz)).view(-1, 1))

    def filters(self):
        low = self.min_low_hz + torch.abs(self.low_hz_)
        high = torch.clamp(low + self.min_band_hz + torch.abs(self.band_hz_), self.min_low_hz,
                           self.sample_rate / 2)
        cos_filters = self.make_filters(low, high, filt_type="cos")
        sin_filters = self.make_filters(low, high, filt_type="sin")
        return torch.cat([cos_filters, sin_filters], dim=0)

    def make_filters(self, low, high, filt_type="cos"):
        band = (high - low)[:, 0]
        ft_low = torch.matmul(low, self.n_)
        ft_high = torch.matmul(high, self.n_)
        if filt_type == "cos":
            bp_left = ((torch.sin(ft_high) - torch.sin(ft_low)) / (self.n_ / 2)) * self.window_
            bp_center = 2 * band.view(-1, 1)
            bp_right = torch.flip(bp_left, dims=[1])
        else:
            bp_left = ((torch.cos(ft_low) - torch.cos(ft_high)) / (self.n_ / 2)) * self.window_
            bp_center = torch.zeros_like(band.view(-1, 1))
            bp_right = -torch.flip(bp_left, dims=[1])
        band_pass = torch.cat([bp_left, bp_center, bp_right], dim=1)
        band_pass = band_pass / (2 * band[:, None])
        return band_pass.view(self.n_filters // 2, 1, self.kernel_size)

    @staticmethod
    def to_mel(hz):
        return 2595 * np.log10(1 + hz / 700)

    @staticmethod
    def to_hz(mel):
        return 700 * (10 ** (mel / 2595) - 1)


class Encoder(nn.Module):
    """asteroid_filterbanks.enc_dec.Encoder (as_conv1d, (batch, 1, time) input)."""

    def __init__(self, filterbank, is_pinv=False, as_conv1d=True, padding=0):
        super().__init__()
        self.filterbank = filterbank
        self.sample_rate = getattr(filterbank, "sample_rate", None)
        self.stride = self.filterbank.stride
        self.is_pinv = is_pinv
        self.as_conv1d = as_conv1d
        self.n_feats_out = self.filterbank.n_feats_out
        self.padding = padding

    def forward(self, waveform):
        return F.conv1d(waveform, self.filterbank.filters(), stride=self.stride, padding=self.padding)


class SincNet(nn.Module):
    """pyannote.audio.models.blocks.sincnet.SincNet (streaming=False)."""

    def __init__(self, sample_rate: int = 16000, stride: int = 1, streaming: bool = False):
        super().__init__()
        self.sample_rate = sample_rate
        self.stride = stride
        self.streaming = streaming
        self.wav_norm1d = nn.InstanceNorm1d(1, affine=True)
        self.conv1d = nn.ModuleList()
        self.pool1d = nn.ModuleList()
        self.norm1d = nn.ModuleList()
        self.conv1d.append(Encoder(ParamSincFB(80, 251, stride=self.stride, sample_rate=sample_rate,
                                               min_low_hz=50, min_band_hz=50)))
        self.pool1d.append(nn.MaxPool1d(3, stride=3, padding=0, dilation=1))
        self.norm1d.append(nn.InstanceNorm1d(80, affine=True))
        self.conv1d.append(nn.Conv1d(80, 60, 5, stride=1))
        self.pool1d.append(nn.MaxPool1d(3, stride=3, padding=0, dilation=1))
        self.norm1d.append(nn.InstanceNorm1d(60, affine=True))
        self.conv1d.append(nn.Conv1d(60, 60, 5, stride=1))
        self.pool1d.append(nn.MaxPool1d(3, stride=3, padding=0, dilation=1))
        self.norm1d.append(nn.InstanceNorm1d(60, affine=True))

    def forward(self, waveforms):
        outputs = self.wav_norm1d(waveforms)
        for c, (conv1d, pool1d, norm1d) in enumerate(zip(self.conv1d, self.pool1d, self.norm1d)):
            outputs = conv1d(outputs)
            if c == 0:
                outputs = torch.abs(outputs)
            outputs = F.leaky_relu(norm1d(pool1d(outputs)))
        return outputs


def random_sincnet(stride: int = 10, seed: int = 0) -> SincNet:
    """A SincNet with every parameter moved off its init (norm affines, conv weights, sinc bands)."""
    g = torch.Generator().manual_seed(seed)
    m = SincNet(stride=stride)
    with torch.no_grad():
        fb = m.conv1d[0].filterbank
        fb.low_hz_.mul_(1 + 0.2 * torch.rand(fb.low_hz_.shape, generator=g))
        fb.band_hz_.mul_(1 + 0.2 * torch.rand(fb.band_hz_.shape, generator=g))
        for norm in [m.wav_norm1d, *m.norm1d]:
            norm.weight.copy_(1 + 0.3 * torch.randn(norm.weight.shape, generator=g))
            norm.bias.copy_(0.3 * torch.randn(norm.bias.shape, generator=g))
        for conv in m.conv1d[1:]:
            conv.weight.copy_(0.1 * torch.randn(conv.weight.shape, generator=g))
            conv.bias.copy_(0.1 * torch.randn(conv.bias.shape, generator=g))
    return m.eval()


def sincnet_float64(module: SincNet, waveforms: torch.Tensor) -> torch.Tensor:
    """The module's forward in float64 (a float64 copy; sinc filters built in float64 too)."""
    import copy

    m64 = copy.deepcopy(module).double()
    with torch.no_grad():
        return m64(waveforms.double())


def conv1d_float64(x, weight, bias=None, stride=1, padding=0, dilation=1, *, abs_=False, pool=1,
                   negative_slope=None):
    """float64 conv1d -> (+bias) -> |.| -> max-pool(pool, pool) -> leaky ReLU."""
    y = F.conv1d(x.double(), weight.double(), None if bias is None else bias.double(),
                 stride=stride, padding=padding, dilation=dilation)
    if abs_:
        y = y.abs()
    if pool > 1:
        y = F.max_pool1d(y, pool, pool)
    if negative_slope is not None:
        y = F.leaky_relu(y, negative_slope)
    return y


# the shortest waveform pyannote's SincNet takes: two output frames (torch's instance_norm refuses one)
SINCNET_MIN_SAMPLES = 1261
FP32_UNIT_ROUNDOFF = 2.0 ** -24


def degenerate_waveforms(samples: int = 2000) -> dict:
    """name -> ((batch, 1, samples) float32 waveforms, relative tolerance against float64).

    zeros / dc: exactly constant rows, which every normalisation must map to exactly beta (float64's
    answer); shortest: SINCNET_MIN_SAMPLES samples, a constant row and a noise row (its last norm sees
    two frames and divides by their difference: 1e-3); nan / inf: one non-finite sample in row 0, which
    makes all of row 0 NaN (torch's instance_norm), row 1 unaffected; dc_offset_signal: 100 + 0.02 *
    noise, a genuine signal on a large offset (fp32 holds it only to u * 100, and normalizing divides
    by its std 0.02: any fp32 implementation, torch's included, carries up to ~u * 100 / 0.02 of
    relative error, so the tolerance is 1e-4 + 16 u * 5000 = 1.6e-3; flattening it would be an O(1) error)."""
    gen = torch.Generator().manual_seed(1)
    noise = torch.randn(2, 1, samples, generator=gen)
    nan = noise.clone()
    nan[0, 0, samples // 3] = float("nan")
    inf = noise.clone()
    inf[0, 0, samples // 2] = float("inf")
    shortest = torch.cat([torch.full((1, 1, SINCNET_MIN_SAMPLES), 0.25),
                          torch.randn(1, 1, SINCNET_MIN_SAMPLES, generator=gen)])
    kappa = 100 / 0.02
    return {
        "zeros": (torch.zeros(2, 1, samples), 1e-4),
        "dc": (torch.tensor([0.5, -100.0]).view(2, 1, 1).expand(2, 1, samples).contiguous(), 1e-4),
        "shortest": (shortest, 1e-3),
        "nan": (nan, 1e-4),
        "inf": (inf, 1e-4),
        "dc_offset_signal": (100 + 0.02 * noise, 1e-4 + 16 * FP32_UNIT_ROUNDOFF * kappa),
    }


def assert_matches_float64(out: torch.Tensor, ref: torch.Tensor, rtol: float, reduced: int = 1) -> None:
    """out against a float64 reference: NaN and +-Inf exactly where the reference has them, finite values
    within rtol with atol = rtol * max |finite reference| * sqrt(reduced)."""
    ref = ref.double()
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=rtol * max(scale, 1e-30) * max(1, reduced) ** 0.5,
                               equal_nan=True)
