"""A module tree with pyannote.audio's PyanNet structure, for tests (pyannote.audio is not installed here).

Class names, attribute names and forward follow pyannote.audio 3.x/4.x
(`pyannote/audio/models/segmentation/PyanNet.py`, `models/blocks/sincnet.py`) and
asteroid-filterbanks (`Encoder`, `ParamSincFB`): SincNet (wav_norm1d, conv1d, pool1d, norm1d),
lstm (one multi-layer nn.LSTM when monolithic, else a ModuleList of one-layer LSTMs with `dropout`
between them), linear (ModuleList of nn.Linear, absent when linear num_layers is 0), classifier
and activation built from the task specifications (powerset -> LogSoftmax, multi-label -> Sigmoid).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from itertools import combinations
from typing import List, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class AttributeDict(dict):
    """Lightning's hparams container: a dict with attribute access."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as error:
            raise AttributeError(key) from error

    def __setattr__(self, key, value):
        self[key] = value


class Problem(Enum):
    BINARY_CLASSIFICATION = 0
    MONO_LABEL_CLASSIFICATION = 1
    MULTI_LABEL_CLASSIFICATION = 2
    REPRESENTATION = 3
    REGRESSION = 4


@dataclass
class Specifications:
    problem: Problem
    classes: List[str]
    powerset_max_classes: Optional[int] = None
    duration: float = 10.0

    @property
    def powerset(self) -> bool:
        return self.powerset_max_classes is not None

    @property
    def num_powerset_classes(self) -> int:
        return sum(math.comb(len(self.classes), k) for k in range(self.powerset_max_classes + 1))


class Filterbank(nn.Module):
    def __init__(self, n_filters, kernel_size, stride=None, sample_rate=8000.0):
        super().__init__()
        self.n_filters = n_filters
        self.kernel_size = kernel_size
        self.stride = stride if stride else kernel_size // 2
        self.n_feats_out = n_filters
        self.sample_rate = sample_rate


class ParamSincFB(Filterbank):
    """asteroid_filterbanks.ParamSincFB: 40 learnable (low, band) pairs -> 40 cos + 40 sin band-pass filters."""

    def __init__(self, n_filters, kernel_size, stride=None, sample_rate=16000.0, min_low_hz=50, min_band_hz=50):
        if kernel_size % 2 == 0:
            kernel_size += 1
        super().__init__(n_filters, kernel_size, stride=stride, sample_rate=sample_rate)
        self.min_low_hz, self.min_band_hz = min_low_hz, min_band_hz
        self.half_kernel = self.kernel_size // 2
        self.cutoff = int(n_filters // 2)
        self.n_feats_out = 2 * self.cutoff
        low_hz, high_hz = 30, self.sample_rate / 2 - (min_low_hz + min_band_hz)
        mel = np.linspace(2595 * np.log10(1 + low_hz / 700), 2595 * np.log10(1 + high_hz / 700),
                          n_filters // 2 + 1, dtype="float32")
        hz = 700 * (10 ** (mel / 2595) - 1)
        self.low_hz_ = nn.Parameter(torch.from_numpy(hz[:-1]).view(-1, 1))
        self.band_hz_ = nn.Parameter(torch.from_numpy(np.diff(hz)).view(-1, 1))
        window_ = np.hamming(self.kernel_size)[: self.half_kernel]
        n_ = 2 * np.pi * (torch.arange(-self.half_kernel, 0.0).view(1, -1) / self.sample_rate)
        self.register_buffer("window_", torch.from_numpy(window_).float())
        self.register_buffer("n_", n_)

    def filters(self):
        low = self.min_low_hz + torch.abs(self.low_hz_)
        high = torch.clamp(low + self.min_band_hz + torch.abs(self.band_hz_), self.min_low_hz, self.sample_rate / 2)
        return torch.cat([self.make_filters(low, high, "cos"), self.make_filters(low, high, "sin")], dim=0)

    def make_filters(self, low, high, filt_type):
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
        band_pass = torch.cat([bp_left, bp_center, bp_right], dim=1) / (2 * band[:, None])
        return band_pass.view(self.n_filters // 2, 1, self.kernel_size)


class Encoder(nn.Module):
    """asteroid_filterbanks.Encoder: conv1d of the waveform with the filterbank's filters."""

    def __init__(self, filterbank, is_pinv=False, as_conv1d=True, padding=0):
        super().__init__()
        self.filterbank = filterbank
        self.sample_rate = getattr(filterbank, "sample_rate", None)
        self.stride = filterbank.stride
        self.is_pinv = is_pinv
        self.as_conv1d = as_conv1d
        self.n_feats_out = filterbank.n_feats_out
        self.padding = padding

    def forward(self, waveform):
        return F.conv1d(waveform, self.filterbank.filters(), stride=self.stride, padding=self.padding)


class SincNet(nn.Module):
    def __init__(self, sample_rate: int = 16000, stride: int = 1):
        super().__init__()
        self.sample_rate = sample_rate
        self.stride = stride
        self.wav_norm1d = nn.InstanceNorm1d(1, affine=True)
        self.conv1d = nn.ModuleList()
        self.pool1d = nn.ModuleList()
        self.norm1d = nn.ModuleList()
        self.conv1d.append(Encoder(ParamSincFB(80, 251, stride=stride, sample_rate=sample_rate,
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


class PyanNet(nn.Module):
    """SincNet > LSTM > Feed forward > Classifier, as pyannote.audio defines it (Model base left out)."""

    SINCNET_DEFAULTS = {"stride": 10}
    LSTM_DEFAULTS = {"hidden_size": 128, "num_layers": 2, "bidirectional": True, "monolithic": True, "dropout": 0.0}
    LINEAR_DEFAULTS = {"hidden_size": 128, "num_layers": 2}

    def __init__(self, sincnet=None, lstm=None, linear=None, sample_rate=16000, num_channels=1):
        super().__init__()
        sincnet = {**self.SINCNET_DEFAULTS, **(sincnet or {})}
        sincnet["sample_rate"] = sample_rate
        lstm = {**self.LSTM_DEFAULTS, **(lstm or {})}
        lstm["batch_first"] = True
        linear = {**self.LINEAR_DEFAULTS, **(linear or {})}
        self.hparams = AttributeDict(sincnet=sincnet, lstm=lstm, linear=linear, sample_rate=sample_rate,
                                     num_channels=num_channels)
        self.sincnet = SincNet(**self.hparams.sincnet)
        if lstm["monolithic"]:
            multi_layer_lstm = dict(lstm)
            del multi_layer_lstm["monolithic"]
            self.lstm = nn.LSTM(60, **multi_layer_lstm)
        else:
            num_layers = lstm["num_layers"]
            if num_layers > 1:
                self.dropout = nn.Dropout(p=lstm["dropout"])
            one_layer_lstm = dict(lstm)
            one_layer_lstm["num_layers"] = 1
            one_layer_lstm["dropout"] = 0.0
            del one_layer_lstm["monolithic"]
            self.lstm = nn.ModuleList([
                nn.LSTM(60 if i == 0 else lstm["hidden_size"] * (2 if lstm["bidirectional"] else 1), **one_layer_lstm)
                for i in range(num_layers)])
        if linear["num_layers"] < 1:
            return
        lstm_out_features = lstm["hidden_size"] * (2 if lstm["bidirectional"] else 1)
        sizes = [lstm_out_features] + [linear["hidden_size"]] * linear["num_layers"]
        self.linear = nn.ModuleList([nn.Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:])])

    @property
    def dimension(self) -> int:
        specs = self.specifications
        return specs.num_powerset_classes if specs.powerset else len(specs.classes)

    def default_activation(self) -> nn.Module:
        problem = self.specifications.problem
        if problem in (Problem.BINARY_CLASSIFICATION, Problem.MULTI_LABEL_CLASSIFICATION):
            return nn.Sigmoid()
        if problem == Problem.MONO_LABEL_CLASSIFICATION:
            return nn.LogSoftmax(dim=-1)
        return nn.Identity()

    def build(self):
        if self.hparams.linear["num_layers"] > 0:
            in_features = self.hparams.linear["hidden_size"]
        else:
            in_features = self.hparams.lstm["hidden_size"] * (2 if self.hparams.lstm["bidirectional"] else 1)
        self.classifier = nn.Linear(in_features, self.dimension)
        self.activation = self.default_activation()

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        outputs = self.sincnet(waveforms)
        if self.hparams.lstm["monolithic"]:
            outputs, _ = self.lstm(outputs.transpose(1, 2))       # batch feature frame -> batch frame feature
        else:
            outputs = outputs.transpose(1, 2)
            for i, lstm in enumerate(self.lstm):
                outputs, _ = lstm(outputs)
                if i + 1 < self.hparams.lstm["num_layers"]:
                    outputs = self.dropout(outputs)
        if self.hparams.linear["num_layers"] > 0:
            for linear in self.linear:
                outputs = F.leaky_relu(linear(outputs))
        return self.activation(self.classifier(outputs))


def make_pyannet(*, hidden: int = 16, lstm_layers: int = 2, bidirectional: bool = True, monolithic: bool = True,
                 linear_layers: int = 2, linear_hidden: int = 16, powerset: bool = True) -> PyanNet:
    """A built PyanNet with random weights: powerset (3 speakers, 2 per frame: 7 classes, LogSoftmax)
    or multi-label (3 speakers, Sigmoid)."""
    model = PyanNet(lstm={"hidden_size": hidden, "num_layers": lstm_layers, "bidirectional": bidirectional,
                          "monolithic": monolithic, "dropout": 0.0},
                    linear={"hidden_size": linear_hidden, "num_layers": linear_layers})
    classes = ["speaker#1", "speaker#2", "speaker#3"]
    if powerset:
        model.specifications = Specifications(Problem.MONO_LABEL_CLASSIFICATION, classes, powerset_max_classes=2)
    else:
        model.specifications = Specifications(Problem.MULTI_LABEL_CLASSIFICATION, classes)
    model.build()
    return model.eval()


class Inference:
    """The part of pyannote.audio's Inference a pipeline holds: `model`."""

    def __init__(self, model):
        self.model = model


class SpeakerDiarization:
    """The part of pyannote.audio's SpeakerDiarization pipeline `optimize` walks: `_segmentation.model`."""

    def __init__(self, model):
        self._segmentation = Inference(model)
        self.segmentation_batch_size = 32
