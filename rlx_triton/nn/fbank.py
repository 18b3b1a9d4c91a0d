"""rlx_triton.nn.Fbank: Kaldi filterbank features as an nn.Module, including pyannote's WeSpeaker front end.

    front_end = rlx_triton.nn.Fbank.wespeaker()          # x32768, 80-bin hamming log-mel, CMN over frames
    feats = front_end(waveforms)                         # (B, 1, T) -> (B, frames, 80)

The constructor takes the keywords of torchaudio.compliance.kaldi.fbank (same defaults) plus
`input_scale`; they are validated once, here. The module has no parameters; every call goes
through the router like rlx_triton.fbank (the fused Triton kernel where it covers the call).
"""
from __future__ import annotations

from dataclasses import fields

import torch
from torch import nn

from rlx_triton.ops import fbank as _op


class Fbank(nn.Module):
    """Batched Kaldi fbank: (B, C, T) or (B, T) -> (B, frames, bins); (T,) -> (frames, bins).

    (B, C, T) reads channel `channel` (-1 reads channel 0, as torchaudio); the output keeps its batch
    dimension for every B, including 1.

    Example:
        >>> import torch, rlx_triton as rt
        >>> front_end = rt.nn.Fbank.wespeaker()   # 80 bins, hamming, input x 32768, mean over frames removed
        >>> front_end(torch.randn(4, 1, 16000) * 0.1).shape
        torch.Size([4, 98, 80])
    """

    def __init__(self, *, blackman_coeff: float = 0.42, channel: int = -1, dither: float = 0.0,
                 energy_floor: float = 1.0, frame_length: float = 25.0, frame_shift: float = 10.0,
                 high_freq: float = 0.0, htk_compat: bool = False, low_freq: float = 20.0,
                 min_duration: float = 0.0, num_mel_bins: int = 23, preemphasis_coefficient: float = 0.97,
                 raw_energy: bool = True, remove_dc_offset: bool = True, round_to_power_of_two: bool = True,
                 sample_frequency: float = 16000.0, snip_edges: bool = True, subtract_mean: bool = False,
                 use_energy: bool = False, use_log_fbank: bool = True, use_power: bool = True,
                 vtln_high: float = -500.0, vtln_low: float = 100.0, vtln_warp: float = 1.0,
                 window_type: str = "povey", input_scale: float = 1.0):
        super().__init__()
        self.options = _op.make_options(
            blackman_coeff=blackman_coeff, channel=channel, dither=dither, energy_floor=energy_floor,
            frame_length=frame_length, frame_shift=frame_shift, high_freq=high_freq, htk_compat=htk_compat,
            low_freq=low_freq, min_duration=min_duration, num_mel_bins=num_mel_bins,
            preemphasis_coefficient=preemphasis_coefficient, raw_energy=raw_energy,
            remove_dc_offset=remove_dc_offset, round_to_power_of_two=round_to_power_of_two,
            sample_frequency=sample_frequency, snip_edges=snip_edges, subtract_mean=subtract_mean,
            use_energy=use_energy, use_log_fbank=use_log_fbank, use_power=use_power, vtln_high=vtln_high,
            vtln_low=vtln_low, vtln_warp=vtln_warp, window_type=window_type, input_scale=input_scale)

    @classmethod
    def wespeaker(cls, sample_rate: int = 16000, num_mel_bins: int = 80, frame_length: float = 25.0,
                  frame_shift: float = 10.0) -> "Fbank":
        """pyannote's WeSpeaker ResNet front end (BaseWeSpeakerResNet.compute_fbank with no centering span):
        waveforms x 32768 (1 << 15), kaldi.fbank(num_mel_bins=80, frame_length=25, frame_shift=10,
        round_to_power_of_two=True, snip_edges=True, dither=0, window_type="hamming", use_energy=False),
        then the mean over frames subtracted per bin. 160 000 samples give 998 x 80."""
        return cls(num_mel_bins=num_mel_bins, frame_length=frame_length, frame_shift=frame_shift,
                   round_to_power_of_two=True, snip_edges=True, dither=0.0, sample_frequency=float(sample_rate),
                   window_type="hamming", use_energy=False, input_scale=float(1 << 15), subtract_mean=True)

    @property
    def num_features(self) -> int:
        return self.options.num_columns

    def _op_input(self, waveforms: torch.Tensor) -> torch.Tensor:
        """The waveform the fbank op receives: (T,) as given, (B, T) as (B, 1, T), (B, C, T) as given."""
        if not isinstance(waveforms, torch.Tensor):
            raise TypeError(f"Fbank: waveforms must be a torch.Tensor (B, C, T), (B, T) or (T,), "
                            f"got {type(waveforms).__name__}")
        if waveforms.dim() == 1:
            return waveforms
        if waveforms.dim() == 2:
            waveforms = waveforms.unsqueeze(1)
            if self.options.channel > 0:
                raise ValueError(f"Fbank: channel={self.options.channel} needs (B, C, T) waveforms, got (B, T)")
        if waveforms.dim() != 3:
            raise ValueError(f"Fbank: waveforms must be (B, C, T), (B, T) or (T,), got shape {tuple(waveforms.shape)}")
        return waveforms

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        return _op.fbank(self._op_input(waveforms), **self.options.__dict__)

    def explain(self, waveforms: torch.Tensor):
        """The Route forward(waveforms) takes, without running it."""
        from rlx_triton.router import explain

        return explain(_op.fbank, self._op_input(waveforms), **self.options.__dict__)

    def extra_repr(self) -> str:
        changed = [f"{f.name}={getattr(self.options, f.name)!r}" for f in fields(self.options)
                   if getattr(self.options, f.name) != f.default]
        return ", ".join(changed)
