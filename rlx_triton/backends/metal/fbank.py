"""Metal launcher of the fbank family (metal/fbank.metal): Kaldi-compatible log-mel filterbank.

Same function name and signature as backends/torch_ref/fbank.py (`fbank(waveform, options, *,
candidate)`), whose FbankOptions, analysis window and mel banks (built exactly as torchaudio builds
them) it reuses. The shader does one frame per threadgroup: framing (both snip_edges modes),
DC removal, log energy, pre-emphasis, window, a direct DFT against a float64-rounded twiddle
table, power or magnitude, mel projection and log floor, all in fp32. The input scale
(FbankOptions.input_scale), energy column placement and subtract_mean run as torch ops around it.
Candidate -> launch: tg_size -> threads per frame (multiple of 32); tile_frames, tile_freq, stages
and precision do not change the Metal kernel (one frame per threadgroup, fp32 DFT).
"""
from __future__ import annotations

import functools
import math

import torch

from rlx_triton.backends.metal import candidates as _candidates
from rlx_triton.backends.metal import library
from rlx_triton.backends.torch_ref import fbank as _ref
from rlx_triton.router.coverage import Coverage

FAMILY = "fbank"
MAX_FFT = 1024  # the shader's threadgroup frame buffers
KERNEL_ARGUMENTS = {
    "fbank_frames": ("wave:T", "window:float32", "twiddle_cos:float32", "twiddle_sin:float32", "mel:float32",
                     "out:T", "log_energy:float32", "samples:long", "frames:long", "window_size:long",
                     "fft_size:long", "shift:long", "pad:long", "num_mel:long", "remove_dc_offset:long",
                     "raw_energy:long", "use_power:long", "use_log_fbank:long", "preemphasis:float",
                     "epsilon:float", "log_energy_floor:float"),
}

COVERAGE = Coverage(
    ops=frozenset({"fbank"}),
    devices=frozenset({"mps"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"bins": (1, 1024), "window": (2, MAX_FFT)},
    features=_ref.KERNEL_FEATURES,
)
APPROVALS = _candidates.approvals(FAMILY)
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


@functools.lru_cache(maxsize=16)
def twiddles(fft_size: int):
    """(cos, sin) of 2*pi*j/fft_size for j < fft_size, computed in float64 and rounded once to float32."""
    phase = torch.arange(fft_size, dtype=torch.float64) * (2.0 * math.pi / fft_size)
    return torch.cos(phase).to(torch.float32), torch.sin(phase).to(torch.float32)


@functools.lru_cache(maxsize=16)
def _constants_cpu(options: "_ref.FbankOptions"):
    fft_size = options.padded_window_size
    window = _ref.window_function(options, torch.float32).contiguous()
    mel = torch.nn.functional.pad(_ref.mel_banks(options).to(torch.float32), (0, 1)).contiguous()
    cos, sin = twiddles(fft_size)
    return window, cos, sin, mel


def shader_constants(options: "_ref.FbankOptions", device) -> tuple:
    """(window, twiddle_cos, twiddle_sin, mel (num_mel, fft/2 + 1)) float32 on the device."""
    return tuple(t.to(device) for t in _constants_cpu(options))


def fbank(waveform: torch.Tensor, options: "_ref.FbankOptions", *, candidate=None, route=None) -> torch.Tensor:
    """(B, T) waveform -> (B, frames, num_mel_bins + use_energy) Kaldi filterbank features (`route`, the
    router's decision, is accepted for the family's common signature)."""
    if options.dither != 0.0:
        raise ValueError("fbank: dither must be 0.0 on the Metal path (random noise runs in the torch fallback)")
    out_dtype = waveform.dtype
    wave = waveform
    if options.input_scale != 1.0:
        wave = wave.to(torch.float32) * options.input_scale
    wave = wave.contiguous()
    batch, samples = wave.shape
    frames = options.num_frames(samples)
    num_mel = options.num_mel_bins
    window, cos, sin, mel = shader_constants(options, wave.device)
    features = torch.empty((batch, frames, num_mel), dtype=wave.dtype, device=wave.device)
    log_energy = torch.empty((batch, frames), dtype=torch.float32, device=wave.device)
    floor = math.log(options.energy_floor) if options.energy_floor > 0.0 else float("-inf")
    library.dispatch(
        FAMILY, "fbank_frames", wave.dtype, KERNEL_ARGUMENTS["fbank_frames"],
        groups=batch * frames, group_size=library.group_size_for(int(_candidates.field(candidate, "tg_size", 256))),
        wave=wave, window=window, twiddle_cos=cos, twiddle_sin=sin, mel=mel, out=features, log_energy=log_energy,
        samples=samples, frames=frames, window_size=options.window_size, fft_size=options.padded_window_size,
        shift=options.window_shift, pad=0 if options.snip_edges else options.reflect_pad, num_mel=num_mel,
        remove_dc_offset=int(options.remove_dc_offset), raw_energy=int(options.raw_energy),
        use_power=int(options.use_power), use_log_fbank=int(options.use_log_fbank),
        preemphasis=float(options.preemphasis_coefficient), epsilon=float(_ref.EPSILON), log_energy_floor=floor)
    if options.use_energy:
        energy = log_energy.to(features.dtype).unsqueeze(-1)
        features = torch.cat((features, energy), -1) if options.htk_compat else torch.cat((energy, features), -1)
    if options.subtract_mean:
        features = features - features.mean(dim=-2, keepdim=True)
    return features.to(out_dtype)
