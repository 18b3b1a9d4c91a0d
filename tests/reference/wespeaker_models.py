"""pyannote.audio's WeSpeaker ResNet embedding models, restated for tests (pyannote is not installed).

Module tree, names and forward passes follow pyannote/audio/models/embedding/wespeaker/resnet.py and
__init__.py (TSTP over pyannote's StatsPool, BasicBlock, Bottleneck, ResNet with forward_frames /
forward_embedding, BaseWeSpeakerResNet with `_fbank` = partial(kaldi fbank, ...) and compute_fbank,
WeSpeakerResNet34). Two stand-ins: the kaldi fbank is tests/reference/fbank.py's float64 restatement
of torchaudio's (rounded to float32), and compute_fbank maps it over the batch with a loop where
pyannote uses torch.vmap (the same values). `tiny_wespeaker` builds a narrow sibling (m_channels=4,
16 mel bins) with random weights and non-trivial BatchNorm statistics for interpreter tests.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from rlx_triton.perf.stock_models import randomize  # the bench models' weights, re-exported for the tests
from tests.reference.fbank import fbank64


def fbank(waveform: torch.Tensor, **kwargs) -> torch.Tensor:
    """torchaudio.compliance.kaldi.fbank stand-in: (channels, samples) -> (frames, bins), float32."""
    return fbank64(waveform[0] if waveform.dim() == 2 else waveform, **kwargs).to(waveform.dtype)


def _pool(sequences: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    weights = weights.unsqueeze(dim=1)
    v1 = weights.sum(dim=2) + 1e-8
    mean = torch.sum(sequences * weights, dim=2) / v1
    dx2 = torch.square(sequences - mean.unsqueeze(2))
    v2 = torch.square(weights).sum(dim=2)
    var = torch.sum(dx2 * weights, dim=2) / (v1 - v2 / v1 + 1e-8)
    std = torch.sqrt(var)
    return torch.cat([mean, std], dim=1)


class StatsPool(nn.Module):
    """pyannote.audio.models.blocks.pooling.StatsPool."""

    def forward(self, sequences: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        if weights is None:
            mean = sequences.mean(dim=-1)
            if sequences.shape[-1] > 1:
                std = sequences.std(dim=-1, correction=1)
            else:
                std = torch.zeros_like(mean)
            return torch.cat([mean, std], dim=-1)
        if weights.dim() == 2:
            has_speaker_dimension = False
            weights = weights.unsqueeze(dim=1)
        else:
            has_speaker_dimension = True
        _, _, num_frames = sequences.size()
        _, num_speakers, num_weights = weights.size()
        if num_frames != num_weights:
            weights = F.interpolate(weights, size=num_frames, mode="nearest")
        output = torch.stack([_pool(sequences, weights[:, speaker, :]) for speaker in range(num_speakers)], dim=1)
        if not has_speaker_dimension:
            return output.squeeze(dim=1)
        return output


class TSTP(nn.Module):
    def __init__(self, in_dim=0, **kwargs):
        super().__init__()
        self.in_dim = in_dim
        self.stats_pool = StatsPool()

    def forward(self, features, weights: Optional[torch.Tensor] = None):
        batch, dimension, channel, frames = features.shape  # einops: "b d c f -> b (d c) f"
        features = features.reshape(batch, dimension * channel, frames)
        return self.stats_pool(features, weights=weights)

    def get_out_dim(self):
        self.out_dim = self.in_dim * 2
        return self.out_dim


POOLING_LAYERS = {"TSTP": TSTP}


def _conv1d_num_frames(num_samples, kernel_size, stride, padding, dilation):
    return 1 + (num_samples + 2 * padding - dilation * (kernel_size - 1) - 1) // stride


def _shortcut(in_planes, out_planes, stride):
    """The blocks' shortcut: identity (an empty Sequential), or 1x1 conv + BatchNorm where the shape changes."""
    if stride != 1 or in_planes != out_planes:
        return nn.Sequential(
            nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False),
            nn.BatchNorm2d(out_planes),
        )
    return nn.Sequential()


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.stride = stride
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _shortcut(in_planes, self.expansion * planes, stride)

    @functools.lru_cache
    def num_frames(self, num_samples: int) -> int:
        n = _conv1d_num_frames(num_samples, 3, self.stride, 1, 1)
        return _conv1d_num_frames(n, 3, 1, 1, 1)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.stride = stride
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, self.expansion * planes, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(self.expansion * planes)
        self.shortcut = _shortcut(in_planes, self.expansion * planes, stride)

    @functools.lru_cache
    def num_frames(self, num_samples: int) -> int:
        n = _conv1d_num_frames(num_samples, 1, 1, 0, 1)
        n = _conv1d_num_frames(n, 3, self.stride, 1, 1)
        return _conv1d_num_frames(n, 1, 1, 0, 1)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, m_channels=32, feat_dim=40, embed_dim=128, pooling_func="TSTP",
                 two_emb_layer=True):
        super().__init__()
        self.in_planes = m_channels
        self.feat_dim = feat_dim
        self.embed_dim = embed_dim
        self.stats_dim = int(feat_dim / 8) * m_channels * 8
        self.two_emb_layer = two_emb_layer
        self.conv1 = nn.Conv2d(1, m_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = self._make_layer(block, m_channels, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, m_channels * 2, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, m_channels * 4, num_blocks[2], stride=2)
        self.layer4 = self._make_layer(block, m_channels * 8, num_blocks[3], stride=2)
        self.pool = POOLING_LAYERS[pooling_func](in_dim=self.stats_dim * block.expansion)
        self.pool_out_dim = self.pool.get_out_dim()
        self.seg_1 = nn.Linear(self.pool_out_dim, embed_dim)
        if self.two_emb_layer:
            self.seg_bn_1 = nn.BatchNorm1d(embed_dim, affine=False)
            self.seg_2 = nn.Linear(embed_dim, embed_dim)
        else:
            self.seg_bn_1 = nn.Identity()
            self.seg_2 = nn.Identity()

    def _make_layer(self, block, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for stride in strides:
            layers.append(block(self.in_planes, planes, stride))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    @functools.lru_cache
    def num_frames(self, num_samples: int) -> int:
        num_frames = _conv1d_num_frames(num_samples, 3, 1, 1, 1)
        for layers in [self.layer1, self.layer2, self.layer3, self.layer4]:
            for layer in layers:
                num_frames = layer.num_frames(num_frames)
        return num_frames

    def forward_frames(self, fbank: torch.Tensor) -> torch.Tensor:
        fbank = fbank.permute(0, 2, 1)  # (B,T,F) => (B,F,T)
        fbank = fbank.unsqueeze(dim=1)
        out = F.relu(self.bn1(self.conv1(fbank)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = self.layer4(out)
        return out

    def forward_embedding(self, frames: torch.Tensor, weights: Optional[torch.Tensor] = None):
        stats = self.pool(frames, weights=weights)
        embed_a = self.seg_1(stats)
        if self.two_emb_layer:
            out = F.relu(embed_a)
            out = self.seg_bn_1(out)
            embed_b = self.seg_2(out)
            return embed_a, embed_b
        return torch.tensor(0.0), embed_a

    def forward(self, fbank: torch.Tensor, weights: Optional[torch.Tensor] = None):
        frames = self.forward_frames(fbank)
        return self.forward_embedding(frames, weights=weights)


def ResNet34(feat_dim, embed_dim, pooling_func="TSTP", two_emb_layer=True, m_channels=32):
    return ResNet(BasicBlock, [3, 4, 6, 3], m_channels=m_channels, feat_dim=feat_dim, embed_dim=embed_dim,
                  pooling_func=pooling_func, two_emb_layer=two_emb_layer)


def ResNet152(feat_dim, embed_dim, pooling_func="TSTP", two_emb_layer=True, m_channels=32):
    return ResNet(Bottleneck, [3, 8, 36, 3], m_channels=m_channels, feat_dim=feat_dim, embed_dim=embed_dim,
                  pooling_func=pooling_func, two_emb_layer=two_emb_layer)


class BaseWeSpeakerResNet(nn.Module):
    """pyannote's BaseWeSpeakerResNet (a pyannote Model there; an nn.Module with `hparams` here)."""

    def __init__(self, sample_rate=16000, num_channels=1, num_mel_bins=80, frame_length=25.0, frame_shift=10.0,
                 round_to_power_of_two=True, snip_edges=True, dither=0.0, window_type="hamming", use_energy=False,
                 fbank_centering_span=None):
        super().__init__()
        self.hparams = SimpleNamespace(
            sample_rate=sample_rate, num_channels=num_channels, num_mel_bins=num_mel_bins,
            frame_length=frame_length, frame_shift=frame_shift, dither=dither,
            round_to_power_of_two=round_to_power_of_two, snip_edges=snip_edges, window_type=window_type,
            use_energy=use_energy, fbank_centering_span=fbank_centering_span)
        self._fbank = functools.partial(
            fbank, num_mel_bins=num_mel_bins, frame_length=frame_length,
            round_to_power_of_two=round_to_power_of_two, frame_shift=frame_shift, snip_edges=snip_edges,
            dither=dither, sample_frequency=sample_rate, window_type=window_type, use_energy=use_energy)

    def compute_fbank(self, waveforms: torch.Tensor) -> torch.Tensor:
        waveforms = waveforms * (1 << 15)
        features = torch.stack([self._fbank(w) for w in waveforms])  # pyannote: torch.vmap(self._fbank)
        if self.hparams.fbank_centering_span is None:
            return features - torch.mean(features, dim=1, keepdim=True)
        # center features with a running average
        window_size = int(self.hparams.sample_rate * self.hparams.frame_length * 0.001)
        step_size = int(self.hparams.sample_rate * self.hparams.frame_shift * 0.001)
        kernel_size = _conv1d_num_frames(int(self.hparams.fbank_centering_span * self.hparams.sample_rate),
                                         window_size, step_size, 0, 1)
        return features - F.avg_pool1d(features.transpose(1, 2), kernel_size=2 * (kernel_size // 2) + 1, stride=1,
                                       padding=kernel_size // 2, count_include_pad=False).transpose(1, 2)

    @property
    def dimension(self) -> int:
        return self.resnet.embed_dim

    def forward(self, waveforms: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        fbank_ = self.compute_fbank(waveforms)
        return self.resnet(fbank_, weights=weights)[1]

    def forward_frames(self, waveforms: torch.Tensor) -> torch.Tensor:
        fbank_ = self.compute_fbank(waveforms)
        return self.resnet.forward_frames(fbank_)

    def forward_embedding(self, frames: torch.Tensor, weights: torch.Tensor = None) -> torch.Tensor:
        return self.resnet.forward_embedding(frames, weights=weights)[1]


class WeSpeakerResNet34(BaseWeSpeakerResNet):
    def __init__(self, sample_rate=16000, num_channels=1, num_mel_bins=80, frame_length=25, frame_shift=10,
                 dither=0.0, window_type="hamming", use_energy=False, m_channels=32):
        super().__init__(sample_rate=sample_rate, num_channels=num_channels, num_mel_bins=num_mel_bins,
                         frame_length=frame_length, frame_shift=frame_shift, dither=dither,
                         window_type=window_type, use_energy=use_energy)
        self.resnet = ResNet34(num_mel_bins, 256, pooling_func="TSTP", two_emb_layer=False, m_channels=m_channels)


class WeSpeakerResNet152(BaseWeSpeakerResNet):
    def __init__(self, num_mel_bins=80, m_channels=32, **kwargs):
        super().__init__(num_mel_bins=num_mel_bins, **kwargs)
        self.resnet = ResNet152(num_mel_bins, 256, pooling_func="TSTP", two_emb_layer=False, m_channels=m_channels)


def tiny_wespeaker(m_channels: int = 4, num_mel_bins: int = 16, seed: int = 0, bottleneck: bool = False):
    """A narrow WeSpeakerResNet34 (or ResNet152-structured) sibling with random weights, in eval mode."""
    cls = WeSpeakerResNet152 if bottleneck else WeSpeakerResNet34
    model = cls(num_mel_bins=num_mel_bins, m_channels=m_channels)
    if bottleneck:  # ResNet152 depth is too slow for the interpreter: keep its structure, one block per layer
        model.resnet = ResNet(Bottleneck, [1, 1, 1, 1], m_channels=m_channels, feat_dim=num_mel_bins,
                              embed_dim=256, two_emb_layer=False)
    return randomize(model, seed)
