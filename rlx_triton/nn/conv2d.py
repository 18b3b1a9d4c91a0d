"""Drop-in modules for ResNet speaker-embedding trunks (WeSpeaker): Conv2d with BatchNorm folded in,
residual blocks, statistics pooling (TSTP) and the embedding projection, all on rlx_triton.ops.conv2d.

    conv = Conv2d.from_torch(block.conv1, bn=block.bn1, relu=True)   # conv -> bn -> relu, one kernel
    block = BasicBlock.from_torch(resnet.layer1[0])                   # pyannote/WeSpeaker BasicBlock
    pool = StatsPool()                                                 # pyannote StatsPool / TSTP
    seg_1 = Projection.from_torch(resnet.seg_1)                        # Linear(5120, 256)

Modules are inference-only (BatchNorm is folded with its running statistics, as in eval mode).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from rlx_triton.ops import conv2d as ops


def _single(value, name: str) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{name} must be the same along height and width, got {value!r}")
        return int(value[0])
    return int(value)


class Conv2d(nn.Module):
    """y = relu?(conv2d(x, weight, bias, stride, padding) + residual), NCHW, one kernel launch.

    The weight is stored tap-major in memory (shape (c_out, c_in, kh, kw), memory (kh, kw, c_out, c_in),
    c_in contiguous) so the kernel's [c_out, c_in] weight tile of one tap loads coalesced.
    """

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *, stride: int = 1,
                 padding: int = 0, relu: bool = False):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            raise ValueError(f"weight must be a 4-D tensor (c_out, c_in, kh, kw), got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        packed = weight.detach().float().permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)
        self.register_buffer("weight", packed)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        self.stride = _single(stride, "stride")
        self.padding = _single(padding, "padding")
        self.relu = bool(relu)

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d] = None, relu: bool = False) -> "Conv2d":
        """From an nn.Conv2d (groups=1, dilation=1, zero padding), with an eval BatchNorm2d folded in."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv must be a torch.nn.Conv2d, got {type(conv).__name__}")
        if conv.groups != 1 or tuple(conv.dilation) != (1, 1) or conv.padding_mode != "zeros":
            raise ValueError(f"conv must have groups=1, dilation=1 and zero padding, got {conv}")
        if isinstance(conv.padding, str):
            raise ValueError(f"conv must have an integer padding, got padding={conv.padding!r}")
        weight, bias = conv.weight, conv.bias
        if bn is not None:
            weight, bias = ops.fold_batchnorm(weight, bias, bn)
        return cls(weight, bias, stride=conv.stride, padding=conv.padding, relu=relu)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        return ops.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                          residual=residual, relu=self.relu)

    def explain(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """The Route forward(x, residual) takes, without running it."""
        from rlx_triton.router import explain

        return explain(ops.conv2d, x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                       residual=residual, relu=self.relu)

    def extra_repr(self) -> str:
        c_out, c_in, kh, kw = self.weight.shape
        return (f"{c_in}, {c_out}, kernel_size=({kh}, {kw}), stride={self.stride}, padding={self.padding}, "
                f"bias={self.bias is not None}, relu={self.relu}")


class Projection(nn.Module):
    """nn.Linear's forward for the embedding head (e.g. TSTP 5120 -> 256), on the conv2d op."""

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.register_buffer("weight", weight.detach().float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_torch(cls, linear: nn.Linear) -> "Projection":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = ops.linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.reshape(*lead, self.weight.shape[0])

    def explain(self, x: torch.Tensor):
        """The Route forward(x) takes, without running it."""
        from rlx_triton.router import explain

        return explain(ops.linear, x.reshape(-1, x.shape[-1]), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}"


class StatsPool(nn.Module):
    """pyannote's StatsPool (and WeSpeaker's TSTP): temporal mean and unbiased std, concatenated.

    sequences (batch, features, frames) -> (batch, 2 * features); 4-D input (batch, dimension,
    channel, frames), as TSTP receives it, is flattened to (batch, dimension * channel, frames).
    weights (batch, frames) or (batch, speakers, frames) weight the frames as pyannote does
    (nearest-interpolated to the number of frames); with speakers the output is
    (batch, speakers, 2 * features).
    """

    def __init__(self, in_dim: int = 0):
        super().__init__()
        self.in_dim = in_dim

    def get_out_dim(self) -> int:
        self.out_dim = self.in_dim * 2
        return self.out_dim

    @staticmethod
    def _flat(sequences):
        if isinstance(sequences, torch.Tensor) and sequences.dim() == 4:
            batch, dimension, channel, frames = sequences.shape
            return sequences.reshape(batch, dimension * channel, frames)
        return sequences

    def forward(self, sequences: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        return ops.stats_pool(self._flat(sequences), weights=weights)

    def explain(self, sequences: torch.Tensor, weights: Optional[torch.Tensor] = None):
        """The Route forward(sequences, weights) takes, without running it."""
        from rlx_triton.router import explain

        return explain(ops.stats_pool, self._flat(sequences), weights)


class _Block(nn.Module):
    """What the residual blocks share: convs conv1..conv{_depth} (BatchNorm folded, ReLU fused), an
    optional shortcut conv, and the residual add + ReLU fused into the last conv. pyannote's
    num_frames / receptive-field methods are taken from the original block class (they read only
    `self.stride`)."""

    _depth = 0        # number of convs (conv1, conv2, ...)
    _geometry = None  # the original block class

    def __init__(self, convs, shortcut: Optional[Conv2d], stride: int):
        super().__init__()
        for i, conv in enumerate(convs, 1):
            setattr(self, f"conv{i}", conv)
        self.shortcut = shortcut
        self.stride = stride

    @classmethod
    def from_torch(cls, block: nn.Module):
        convs = [Conv2d.from_torch(getattr(block, f"conv{i}"), bn=getattr(block, f"bn{i}"), relu=True)
                 for i in range(1, cls._depth + 1)]
        new = cls(*convs, cls._shortcut(block), int(getattr(block, "stride", 1)))
        new._geometry = type(block)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.shortcut is None else self.shortcut(x)
        for i in range(1, self._depth):
            x = getattr(self, f"conv{i}")(x)
        return getattr(self, f"conv{self._depth}")(x, residual=identity)

    def num_frames(self, num_samples: int) -> int:
        return self._geometry.num_frames(self, num_samples)

    def receptive_field_size(self, num_frames: int = 1) -> int:
        return self._geometry.receptive_field_size(self, num_frames)

    def receptive_field_center(self, frame: int = 0) -> int:
        return self._geometry.receptive_field_center(self, frame)

    @staticmethod
    def _shortcut(block) -> Optional[Conv2d]:
        shortcut = getattr(block, "shortcut", None)
        if shortcut is None or len(shortcut) == 0:
            return None
        return Conv2d.from_torch(shortcut[0], bn=shortcut[1])


class BasicBlock(_Block):
    """WeSpeaker's BasicBlock (two 3x3 convs with BatchNorm, shortcut, ReLU) in two or three launches:
    conv1+bn1+relu, [shortcut conv+bn], conv2+bn2+shortcut add+relu."""

    expansion = 1
    _depth = 2

    def __init__(self, conv1: Conv2d, conv2: Conv2d, shortcut: Optional[Conv2d], stride: int):
        super().__init__((conv1, conv2), shortcut, stride)


class Bottleneck(_Block):
    """WeSpeaker's Bottleneck (1x1, 3x3, 1x1 convs, expansion 4) with BatchNorm folded and the
    residual add + ReLU fused into the last conv."""

    expansion = 4
    _depth = 3

    def __init__(self, conv1: Conv2d, conv2: Conv2d, conv3: Conv2d, shortcut: Optional[Conv2d], stride: int):
        super().__init__((conv1, conv2, conv3), shortcut, stride)


__all__ = ["BasicBlock", "Bottleneck", "Conv2d", "Projection", "StatsPool"]
