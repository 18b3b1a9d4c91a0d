"""A module tree with pyannote.audio's PyanNet structure, for tests (pyannote.audio is not installed here).

Class names, attribute names and forward follow pyannote.audio 3.x/4.x
(`pyannote/audio/models/segmentation/PyanNet.py`, `models/blocks/sincnet.py`) and
asteroid-filterbanks (`Encoder`, `ParamSincFB`): SincNet (wav_norm1d, conv1d, pool1d, norm1d; the
tree written out in tests/reference/conv.py), lstm (one multi-layer nn.LSTM when monolithic, else a
ModuleList of one-layer LSTMs with `dropout` between them), linear (ModuleList of nn.Linear, absent when linear num_layers is 0), classifier
and activation built from the task specifications (powerset -> LogSoftmax, multi-label -> Sigmoid).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import List, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.reference.conv import SincNet


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
