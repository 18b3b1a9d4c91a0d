"""pyannote.audio's SpeakerDiarization pipeline built offline with random weights, and a synthetic recording.

`speaker_diarization(...)` builds SpeakerDiarization(segmentation=<PyanNet>, embedding=<WeSpeakerResNet34>,
plda=<PLDA>, clustering="AgglomerativeClustering") with no download: a PyanNet with powerset
specifications (3 local speakers, at most 2 at a time) and a WeSpeaker ResNet34 (full size, or a narrow
trunk for tests), both with random weights in eval mode, and a PLDA made from random npz files (agglomerative
clustering does not use it, but the pipeline requires one). pyannote.audio must be installed.

`synthetic_recording(seconds)` is a multi-speaker recording: speakers with their own pitch and timbre take
turns, with overlaps and silences, as a {"waveform": (1, samples), "sample_rate": 16000} file dict (no media
decoding involved).
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

SAMPLE_RATE = 16000


def pyannote_audio_missing() -> Optional[str]:
    """Why pyannote.audio cannot be used here (None when it can)."""
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")   # its default posts telemetry
    try:
        import pyannote.audio.pipelines  # noqa: F401  # type: ignore
    except ImportError as error:
        return (f"pyannote.audio is not importable ({error}); "
                "install it with: sh tests/integrations/install_pyannote_pipeline.sh python")
    return None


def _randomize(model: nn.Module, seed: int) -> nn.Module:
    from tests.reference.wespeaker_models import randomize

    with torch.no_grad():
        return randomize(model, seed=seed)


def segmentation_model(duration: float = 10.0, seed: int = 0, lstm_hidden: int = 128, lstm_layers: int = 4):
    """A PyanNet (SincNet stride 10, BiLSTM, 2 linear layers) with powerset specifications, random weights.
    The classifier's bias favours speech over silence, so that a random model finds speakers."""
    from pyannote.audio.core.task import Problem, Resolution, Specifications  # type: ignore
    from pyannote.audio.models.segmentation import PyanNet  # type: ignore

    torch.manual_seed(seed)
    model = PyanNet(sincnet={"stride": 10},
                    lstm={"hidden_size": lstm_hidden, "num_layers": lstm_layers, "bidirectional": True,
                          "monolithic": True, "dropout": 0.0},
                    linear={"hidden_size": 128, "num_layers": 2}, sample_rate=SAMPLE_RATE, num_channels=1)
    model.specifications = Specifications(problem=Problem.MONO_LABEL_CLASSIFICATION, resolution=Resolution.FRAME,
                                          duration=duration, classes=["speaker#1", "speaker#2", "speaker#3"],
                                          powerset_max_classes=2, permutation_invariant=True)
    model.build()
    with torch.no_grad():
        model.classifier.weight.mul_(8.0)                 # decisive frames: speakers change with the input
        model.classifier.bias.copy_(torch.tensor([-1.0, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0]))
    return model.eval()


def embedding_model(seed: int = 0, m_channels: int = 32, blocks=(3, 4, 6, 3)):
    """pyannote's WeSpeakerResNet34 with random weights (its trunk narrowed to m_channels and `blocks`)."""
    from pyannote.audio.models.embedding import WeSpeakerResNet34  # type: ignore
    from pyannote.audio.models.embedding.wespeaker.resnet import BasicBlock, ResNet  # type: ignore

    model = WeSpeakerResNet34()
    if m_channels != 32 or tuple(blocks) != (3, 4, 6, 3):
        model.resnet = ResNet(BasicBlock, list(blocks), m_channels=m_channels, feat_dim=80, embed_dim=256,
                              pooling_func="TSTP", two_emb_layer=False)
    return _randomize(model, seed)


def random_plda(folder: Path, dimension: int = 256, lda_dimension: int = 128, seed: int = 0):
    """A PLDA from random (well-conditioned) transform and PLDA npz files written to `folder`."""
    from pyannote.audio.core.plda import PLDA  # type: ignore

    rng = np.random.default_rng(seed)
    transform, plda = folder / "xvec_transform.npz", folder / "plda.npz"
    np.savez(transform, mean1=rng.normal(size=dimension), mean2=rng.normal(size=lda_dimension),
             lda=rng.normal(size=(dimension, lda_dimension)) / math.sqrt(dimension))
    tr = np.eye(lda_dimension) + 0.1 * rng.normal(size=(lda_dimension, lda_dimension))
    np.savez(plda, mu=rng.normal(size=lda_dimension), tr=tr, psi=1.0 + rng.random(lda_dimension))
    return PLDA(transform, plda, lda_dimension=lda_dimension)


def speaker_diarization(duration: float = 10.0, *, small: bool = False, embedding_batch_size: int = 1,
                        segmentation_batch_size: int = 1, exclude_overlap: bool = False, step: float = 0.1,
                        threshold: float = 0.3, seed: int = 0, segmentation=None,
                        clustering: str = "AgglomerativeClustering", fa: float = 0.07, fb: float = 0.8):
    """SpeakerDiarization with random PyanNet, WeSpeakerResNet34 and PLDA, agglomerative clustering, the
    default hyper-parameters instantiated (clustering `threshold`: random trunks give close embeddings,
    so it is lower than for trained ones). small: narrow models (tests); else
    pyannote's sizes. step: the segmentation step as a share of the chunk duration (pyannote's default 0.1).
    segmentation: a segmentation model to use instead of the PyanNet. clustering: "VBxClustering" runs
    pyannote's AHC + VBx with the random PLDA (threshold, fa and fb its hyper-parameters)."""
    from pyannote.audio.pipelines import SpeakerDiarization  # type: ignore

    if segmentation is None:
        segmentation = (segmentation_model(duration, seed, lstm_hidden=16, lstm_layers=1) if small
                        else segmentation_model(duration, seed))
    embedding = embedding_model(seed, m_channels=4, blocks=(1, 1, 1, 1)) if small else embedding_model(seed)
    with tempfile.TemporaryDirectory() as folder:
        plda = random_plda(Path(folder), seed=seed)
    pipeline = SpeakerDiarization(segmentation=segmentation, embedding=embedding, plda=plda,
                                  clustering=clustering, segmentation_step=step,
                                  embedding_batch_size=embedding_batch_size,
                                  segmentation_batch_size=segmentation_batch_size,
                                  embedding_exclude_overlap=exclude_overlap)
    parameters = ({"threshold": threshold, "Fa": fa, "Fb": fb} if clustering == "VBxClustering"
                  else {"method": "centroid", "min_cluster_size": 2, "threshold": threshold})
    pipeline.instantiate({"segmentation": {"min_duration_off": 0.0}, "clustering": parameters})
    return pipeline


def synthetic_recording(seconds: float, num_speakers: int = 4, seed: int = 0, uri: str = "synthetic") -> dict:
    """A file dict of `seconds` of speakers taking turns of 0.5 to 3 s, about a fifth of the turns overlapping
    the next one, short silences between some; each speaker a harmonic voice of its own pitch and timbre."""
    rng = np.random.default_rng(seed)
    samples = int(round(seconds * SAMPLE_RATE))
    t = np.arange(samples) / SAMPLE_RATE
    waveform = 0.002 * rng.normal(size=samples)
    voices = []
    for speaker in range(num_speakers):
        f0 = 95.0 + 45.0 * speaker
        phase = 2 * np.pi * (f0 * t + 2.0 * np.sin(2 * np.pi * (1.5 + 0.4 * speaker) * t))
        timbre = rng.uniform(0.2, 1.0, size=14)
        voices.append(sum(timbre[h - 1] / h * np.sin(h * phase) for h in range(1, 15)))
    start = 0.0
    while start < seconds:
        speaker = int(rng.integers(num_speakers))
        length = float(rng.uniform(0.5, 3.0))
        begin, end = int(start * SAMPLE_RATE), min(samples, int((start + length) * SAMPLE_RATE))
        envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t[begin:end]) ** 2   # syllable-rate modulation
        waveform[begin:end] += 0.15 * envelope * voices[speaker][begin:end]
        overlap = rng.random() < 0.2
        start += length * (0.7 if overlap else 1.0) + (0.0 if overlap else float(rng.uniform(0.0, 0.6)))
    return {"waveform": torch.from_numpy(waveform.astype(np.float32))[None], "sample_rate": SAMPLE_RATE, "uri": uri}
