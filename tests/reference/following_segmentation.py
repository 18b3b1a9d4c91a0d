"""A pyannote.audio segmentation model with no weights whose output follows the audio: local speakers by pitch.

A PyanNet with random weights at its default initialisation finds one segment per file, which cannot tell a
diarization from another. `PitchSegmentation` is a pyannote `Model` (powerset specifications: 3 local speakers,
at most 2 at once, like segmentation-3.0) whose frames (64 ms, every 20 ms) are classified from their
spectrum: silence below an energy floor, otherwise the local speaker whose fundamental-frequency band
(70-120, 120-165, 165-260 Hz) holds the most energy, and an overlap of two when the second band holds at least
half as much. On `synthetic_recording` (speakers at 95, 140, 185 and 230 Hz taking turns) that gives many
turns and several speakers, deterministically. Importing this module imports pyannote.audio.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from pyannote.audio.core.model import Model  # type: ignore
from pyannote.audio.core.task import Problem, Resolution, Specifications  # type: ignore

SAMPLE_RATE = 16000
FRAME = 1024          # samples per analysis frame (15.6 Hz per FFT bin)
HOP = 320             # 20 ms between frames
BANDS_HZ = ((70.0, 120.0), (120.0, 165.0), (165.0, 260.0))
SPEECH_POWER = 1e-4   # mean square of a frame above which someone speaks (the recording's noise is 4e-6)
OVERLAP_SHARE = 0.5   # second band's energy over the first's from which both speak
# powerset classes of 3 speakers, at most 2 at once, in pyannote's order
POWERSET = ((), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2))


class PitchSegmentation(Model):
    def __init__(self, duration: float = 10.0):
        super().__init__(sample_rate=SAMPLE_RATE, num_channels=1)
        self.specifications = Specifications(problem=Problem.MONO_LABEL_CLASSIFICATION, resolution=Resolution.FRAME,
                                             duration=duration, classes=["speaker#1", "speaker#2", "speaker#3"],
                                             powerset_max_classes=2, permutation_invariant=True)
        frequencies = torch.fft.rfftfreq(FRAME, 1.0 / SAMPLE_RATE)
        bands = torch.stack([((frequencies >= low) & (frequencies < high)).float() for low, high in BANDS_HZ], 1)
        self.register_buffer("bands", bands, persistent=False)
        self.register_buffer("window", torch.hann_window(FRAME), persistent=False)
        index = {speakers: i for i, speakers in enumerate(POWERSET)}
        single = torch.tensor([index[(s,)] for s in range(3)])
        pair = torch.tensor([[index[tuple(sorted((a, b)))] if a != b else index[(a,)] for b in range(3)]
                             for a in range(3)])
        self.register_buffer("single", single, persistent=False)
        self.register_buffer("pair", pair, persistent=False)

    def num_frames(self, num_samples: int) -> int:
        return max(0, 1 + (num_samples - FRAME) // HOP)

    def receptive_field_size(self, num_frames: int = 1) -> int:
        return FRAME + (num_frames - 1) * HOP

    def receptive_field_center(self, frame: int = 0) -> int:
        return frame * HOP + FRAME // 2

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        """(batch, 1, samples) -> (batch, frames, 7) powerset log-probabilities."""
        frames = waveforms[:, 0].unfold(-1, FRAME, HOP)                       # (batch, frames, FRAME)
        power = frames.pow(2).mean(-1)
        spectrum = torch.fft.rfft(frames * self.window).abs().pow(2)
        energy = spectrum @ self.bands                                         # (batch, frames, 3)
        ranked = energy.argsort(-1, descending=True)
        top, second = ranked[..., 0], ranked[..., 1]
        both = energy.gather(-1, second[..., None])[..., 0] >= OVERLAP_SHARE * energy.gather(-1, top[..., None])[..., 0]
        label = torch.where(both, self.pair[top, second], self.single[top])
        label = torch.where(power > SPEECH_POWER, label, torch.zeros_like(label))
        return F.log_softmax(8.0 * F.one_hot(label, len(POWERSET)).to(waveforms.dtype), dim=-1)
