"""Drop-in modules for ResNet speaker-embedding trunks (WeSpeaker): Conv2d with BatchNorm folded in,
residual blocks, statistics pooling (TSTP) and the embedding projection, all on rlx_triton.ops.conv2d.

    conv = Conv2d.from_torch(block.conv1, bn=block.bn1, relu=True)   # conv -> bn -> relu, one kernel
    block = BasicBlock.from_torch(resnet.layer1[0])                   # pyannote/WeSpeaker BasicBlock
    pool = StatsPool()                                                 # pyannote StatsPool / TSTP
    seg_1 = Projection.from_torch(resnet.seg_1)                        # Linear(5120, 256)

Modules are inference-only: BatchNorm is applied with its running statistics (eval mode), and no
gradient flows through the folded weights.

State and checkpoints: each module keeps the parameters and buffers of the torch modules it stands
for, as the same objects under the same state_dict keys. Conv2d holds the conv's own `weight` (and
`bias`); a folded BatchNorm stays registered where the stock model has it (a block's `bn1`, a
shortcut's `1`) as a FoldedBatchNorm2d: the same parameters and buffers, an identity forward, since
the conv before it applies it. So a stock checkpoint loads into a swapped model strictly, and a
swapped model's state_dict loads into a stock one.

The (weight, bias) the kernel reads are derived and not saved: folded in float64
(ops.conv2d.fold_batchnorm), stored tap-major, and folded again when a source changes: a new dtype or
device (.to(), .double()), an in-place update (version counters: optimizer steps, copy_), or a
load_state_dict into the conv or its BatchNorm (a load hook; this also covers inference tensors).
Inference tensors (a model built inside torch.inference_mode()) have no version counter, and torch
lets them change in place only inside inference mode: such an edit other than load_state_dict is not
seen until one of the other events happens.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Optional, Sequence, Tuple, Type, TypeVar, Union

import torch
from torch import nn

from rlx_triton.ops import conv2d as ops
from rlx_triton.ops._compiled import compiling


def _single(value, name: str) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{name} must be the same along height and width, got {value!r}")
        return int(value[0])
    return int(value)


def _count_load(module: Union["Conv2d", "FoldedBatchNorm2d"], incompatible_keys: Any) -> None:
    """load_state_dict post hook: marks the module's tensors as reloaded (the fold cache keys on it)."""
    module._loads += 1


def _tensor_key(t: Optional[torch.Tensor]):
    """What identifies a tensor's current contents: storage, dtype, device and, except for inference
    tensors (which have none), the version counter that every in-place update bumps."""
    if t is None:
        return None
    return (t.data_ptr(), t.dtype, t.device, tuple(t.shape), None if t.is_inference() else t._version)


def _kernel_dtype(weight: torch.Tensor) -> torch.dtype:
    """The folded weights' dtype: float64 for float64 models (torch runs them), else float32 (the kernels
    accumulate in fp32 whatever the activation dtype)."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


class FoldedBatchNorm2d(nn.BatchNorm2d):
    """A BatchNorm2d that the rlx Conv2d before it applies (folded into its weights): the same
    parameters, buffers and state_dict keys as the BatchNorm2d it stands for; its forward is the identity."""

    _loads: int

    @classmethod
    def from_torch(cls, bn: nn.BatchNorm2d) -> "FoldedBatchNorm2d":
        """Shares `bn`'s parameters and buffers (no copy)."""
        if isinstance(bn, cls):
            return bn
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"FoldedBatchNorm2d.from_torch: bn must be a torch.nn.BatchNorm2d, got {type(bn).__name__}")
        new = cls(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                  track_running_stats=bn.track_running_stats, device="meta")
        new._parameters.update(bn._parameters)
        new._buffers.update(bn._buffers)
        new.train(bn.training)
        return new

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loads = 0
        self.register_load_state_dict_post_hook(_count_load)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Conv2d(nn.Module):
    """y = relu?(conv2d(x, weight, bias, stride, padding) + residual), NCHW, one kernel launch, with an
    optional eval BatchNorm `bn` folded into the weight and bias the kernel reads.

    `weight` and `bias` are the conv's own tensors (registered as parameters when they are
    nn.Parameters, else as buffers), so the state_dict is the conv's; `bn` is not registered here (its
    owner keeps it). The kernel reads `folded()`: float64-folded, stored tap-major in memory (shape
    (c_out, c_in, kh, kw), memory (kh, kw, c_out, c_in), c_in contiguous) so the kernel's [c_out, c_in]
    weight tile of one tap loads coalesced, refolded whenever a source changes.

    Example:
        >>> import torch, rlx_triton as rt
        >>> conv, bn = torch.nn.Conv2d(32, 32, 3, padding=1, bias=False), torch.nn.BatchNorm2d(32).eval()
        >>> fused = rt.nn.Conv2d.from_torch(conv, bn, relu=True)   # relu(bn(conv(x))) in one launch
        >>> fused(torch.randn(2, 32, 20, 50)).shape
        torch.Size([2, 32, 20, 50])
    """

    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    bn: Optional[FoldedBatchNorm2d]
    _loads: int
    _folded: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]
    _folded_key: Optional[Hashable]

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                 stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0, relu: bool = False,
                 bn: Optional[nn.BatchNorm2d] = None):
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 4:
            raise ValueError(f"Conv2d: weight must be a 4-D tensor (c_out, c_in, kh, kw), got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        if bn is not None and not isinstance(bn, (nn.BatchNorm2d)):
            raise TypeError(f"Conv2d: bn must be a torch.nn.BatchNorm2d or None, got {type(bn).__name__}")
        for name, value in (("weight", weight), ("bias", bias)):
            if isinstance(value, nn.Parameter) or (value is None and isinstance(weight, nn.Parameter)):
                self.register_parameter(name, value)
            else:
                self.register_buffer(name, value)
        # not registered here: the module that owns this conv registers it where the stock model has
        # its BatchNorm (blocks, the ResNet stem), so the state_dict keys stay the stock ones
        object.__setattr__(self, "bn", None if bn is None else FoldedBatchNorm2d.from_torch(bn))
        self.stride = _single(stride, "stride")
        self.padding = _single(padding, "padding")
        self.relu = bool(relu)
        self._loads = 0
        self._folded = None
        self._folded_key = None
        self.register_load_state_dict_post_hook(_count_load)

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d] = None, relu: bool = False) -> "Conv2d":
        """From an nn.Conv2d (groups=1, dilation=1, zero padding), sharing its weight and bias, with an
        eval BatchNorm2d folded in."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"Conv2d.from_torch: conv must be a torch.nn.Conv2d, got {type(conv).__name__}")
        if conv.groups != 1 or tuple(conv.dilation) != (1, 1) or conv.padding_mode != "zeros":
            raise ValueError(f"Conv2d.from_torch: conv must have groups=1, dilation=1 and zero padding, got {conv}")
        if isinstance(conv.padding, str):
            raise ValueError(f"Conv2d.from_torch: conv must have an integer padding, got padding={conv.padding!r}")
        new = cls(conv.weight, conv.bias, stride=conv.stride, padding=conv.padding, relu=relu, bn=bn)
        return new.train(conv.training)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> "Conv2d":
        # the BatchNorm moves with the conv that applies it (.to(), .double(), ...); where its owner also
        # registers it, the second conversion finds it converted already
        super()._apply(fn, recurse)
        if self.bn is not None:
            self.bn._apply(fn, recurse)
        return self

    def _sources(self) -> tuple:
        bn = self.bn
        stats = () if bn is None else (bn.weight, bn.bias, bn.running_mean, bn.running_var)
        return (self.weight, self.bias, *stats)

    def folded(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(weight, bias) with the BatchNorm folded in, tap-major, folded again when a source changed."""
        bn_loads = getattr(self.bn, "_loads", 0)
        key = (self._loads, bn_loads, None if self.bn is None else self.bn.eps,
               tuple(_tensor_key(t) for t in self._sources()))
        if key != self._folded_key:
            # built as normal tensors even inside inference mode: the cache outlives the call
            with torch.inference_mode(False):
                folded = self._fold()
            self._folded, self._folded_key = folded, key
            return folded
        assert self._folded is not None  # set with _folded_key
        return self._folded

    def _fold(self) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(weight, bias) with the BatchNorm folded in, tap-major, computed now (no cache)."""
        with torch.no_grad():
            dtype = _kernel_dtype(self.weight)
            if self.bn is not None:
                weight, bias = ops.fold_batchnorm(self.weight, self.bias, self.bn)
            else:
                weight = self.weight.detach().to(dtype)
                bias = None if self.bias is None else self.bias.detach().to(dtype)
            weight = weight.permute(2, 3, 0, 1).contiguous().permute(2, 3, 0, 1)
            bias = None if bias is None else bias.contiguous()
        return weight, bias

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        # torch.compile traces the fold into the graph (the cache's key reads storage pointers and versions,
        # which a traced tensor has not): the compiled forward folds on every call, with the same arithmetic
        weight, bias = self._fold() if compiling() else self.folded()
        return ops.conv2d(x, weight, bias, stride=self.stride, padding=self.padding, residual=residual,
                          relu=self.relu)

    def explain(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        """The Route forward(x, residual) takes, without running it."""
        from rlx_triton.router import explain

        weight, bias = self.folded()
        return explain(ops.conv2d, x, weight, bias, stride=self.stride, padding=self.padding,
                       residual=residual, relu=self.relu)

    def extra_repr(self) -> str:
        c_out, c_in, kh, kw = self.weight.shape
        return (f"{c_in}, {c_out}, kernel_size=({kh}, {kw}), stride={self.stride}, padding={self.padding}, "
                f"bias={self.bias is not None}, relu={self.relu}, batchnorm_folded={self.bn is not None}")


class Projection(nn.Module):
    """nn.Linear's forward for the embedding head (e.g. TSTP 5120 -> 256), on the conv2d op. Holds the
    Linear's weight and bias themselves (shared, same state_dict keys). (..., in_features) ->
    (..., out_features).

    Example:
        >>> import torch, rlx_triton as rt
        >>> linear = torch.nn.Linear(512, 256)
        >>> seg_1 = rt.nn.Projection.from_torch(linear)
        >>> seg_1(torch.randn(2, 512)).shape
        torch.Size([2, 256])
        >>> sorted(seg_1.state_dict()) == sorted(linear.state_dict())
        True
    """

    weight: torch.Tensor
    bias: Optional[torch.Tensor]

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        super().__init__()
        for name, value in (("weight", weight), ("bias", bias)):
            if isinstance(value, nn.Parameter) or (value is None and isinstance(weight, nn.Parameter)):
                self.register_parameter(name, value)
            else:
                self.register_buffer(name, value)

    @classmethod
    def from_torch(cls, linear: nn.Linear) -> "Projection":
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Projection.from_torch: linear must be a torch.nn.Linear, got {type(linear).__name__}")
        return cls(linear.weight, linear.bias).train(linear.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        y = ops.linear(x.reshape(-1, x.shape[-1]), self.weight.detach(), _detached(self.bias))
        return y.reshape(*lead, self.weight.shape[0])

    def explain(self, x: torch.Tensor):
        """The Route forward(x) takes, without running it."""
        from rlx_triton.router import explain

        return explain(ops.linear, x.reshape(-1, x.shape[-1]), self.weight.detach(), _detached(self.bias))

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}"


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


class StatsPool(nn.Module):
    """pyannote's StatsPool (and WeSpeaker's TSTP): temporal mean and unbiased std, concatenated.

    sequences (batch, features, frames) -> (batch, 2 * features); 4-D input (batch, dimension,
    channel, frames), as TSTP receives it, is flattened to (batch, dimension * channel, frames).
    weights (batch, frames) or (batch, speakers, frames) weight the frames as pyannote does
    (nearest-interpolated to the number of frames); with speakers the output is
    (batch, speakers, 2 * features).

    Example:
        >>> import torch, rlx_triton as rt
        >>> rt.nn.StatsPool()(torch.randn(2, 256, 50)).shape   # (batch, features, frames) -> mean and std
        torch.Size([2, 512])
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
    optional shortcut conv, and the residual add + ReLU fused into the last conv. The folded BatchNorms
    stay registered as bn1..bn{_depth} and shortcut.1 (FoldedBatchNorm2d), so the block's state_dict
    keys are the stock block's. pyannote's num_frames / receptive-field methods are taken from the
    original block class (they read only `self.stride`)."""

    _depth = 0        # number of convs (conv1, conv2, ...)
    _geometry: Any = None  # the original block class (pyannote's or WeSpeaker's, untyped here)
    explains_submodules = True  # explain() reports each conv's route, not one route for the block

    def __init__(self, convs: Sequence[Conv2d], shortcut: Optional[Conv2d], stride: int):
        super().__init__()
        for i, conv in enumerate(convs, 1):
            setattr(self, f"conv{i}", conv)
            if conv.bn is not None:
                setattr(self, f"bn{i}", conv.bn)
        if isinstance(shortcut, Conv2d):
            self.shortcut = nn.Sequential(shortcut, *([] if shortcut.bn is None else [shortcut.bn]))
        else:
            self.shortcut = nn.Sequential() if shortcut is None else shortcut
        self.stride = stride

    @classmethod
    def from_torch(cls: Type[_BlockT], block: nn.Module) -> _BlockT:
        convs = [Conv2d.from_torch(getattr(block, f"conv{i}"), bn=getattr(block, f"bn{i}"), relu=True)
                 for i in range(1, cls._depth + 1)]
        # each block class takes its _depth convs as separate arguments, then the shortcut and the stride
        build: Callable[..., _BlockT] = cls
        new = build(*convs, cls._shortcut(block), int(getattr(block, "stride", 1)))
        new._geometry = type(block)
        return new.train(block.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.shortcut(x)   # an empty shortcut is the identity; shortcut.1 is folded into .0
        for i in range(1, self._depth):
            x = getattr(self, f"conv{i}")(x)
        return getattr(self, f"conv{self._depth}")(x, residual=identity)

    def explain(self, x: torch.Tensor) -> dict:
        """{conv path: Route} for every conv forward(x) runs (it runs once, under no_grad)."""
        from rlx_triton.integrations.pyannote import explain

        return explain(self, x)

    def num_frames(self, num_samples: int) -> int:
        return self._geometry.num_frames(self, num_samples)

    def receptive_field_size(self, num_frames: int = 1) -> int:
        return self._geometry.receptive_field_size(self, num_frames)

    def receptive_field_center(self, frame: int = 0) -> int:
        return self._geometry.receptive_field_center(self, frame)

    @staticmethod
    def _shortcut(block: nn.Module) -> Optional[Conv2d]:
        shortcut = getattr(block, "shortcut", None)
        if shortcut is None or len(shortcut) == 0:
            return None
        return Conv2d.from_torch(shortcut[0], bn=shortcut[1])


_BlockT = TypeVar("_BlockT", bound=_Block)


class BasicBlock(_Block):
    """WeSpeaker's BasicBlock (two 3x3 convs with BatchNorm, shortcut, ReLU) in two or three launches:
    conv1+bn1+relu, [shortcut conv+bn], conv2+bn2+shortcut add+relu. `from_torch(block)` takes an eval
    block with conv1/bn1, conv2/bn2, shortcut (empty, or 1x1 conv + BatchNorm) and stride.

    Example (a block with WeSpeaker's layout, BasicBlock(32, 64, stride=2), built by hand):
        >>> import torch, rlx_triton as rt
        >>> from torch import nn
        >>> block = nn.Module()
        >>> block.conv1, block.bn1 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64)
        >>> block.conv2, block.bn2 = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        >>> block.shortcut = nn.Sequential(nn.Conv2d(32, 64, 1, stride=2, bias=False), nn.BatchNorm2d(64))
        >>> block.stride = 2
        >>> fast = rt.nn.BasicBlock.from_torch(block.eval())   # BatchNorms folded, the stock state_dict keys
        >>> fast(torch.randn(2, 32, 20, 50)).shape
        torch.Size([2, 64, 10, 25])
        >>> sorted(fast.state_dict()) == sorted(block.state_dict())
        True
    """

    expansion = 1
    _depth = 2

    def __init__(self, conv1: Conv2d, conv2: Conv2d, shortcut: Optional[Conv2d], stride: int):
        super().__init__((conv1, conv2), shortcut, stride)


class Bottleneck(_Block):
    """WeSpeaker's Bottleneck (1x1, 3x3, 1x1 convs, expansion 4) with BatchNorm folded and the
    residual add + ReLU fused into the last conv. `from_torch(block)` takes an eval block with
    conv1/bn1, conv2/bn2 (the strided 3x3), conv3/bn3, shortcut (empty, or 1x1 conv + BatchNorm) and stride.

    Example (a block with WeSpeaker's layout, Bottleneck(16, 8): 16 -> 32 channels, built by hand):
        >>> import torch, rlx_triton as rt
        >>> from torch import nn
        >>> block = nn.Module()
        >>> block.conv1, block.bn1 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        >>> block.conv2, block.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        >>> block.conv3, block.bn3 = nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32)
        >>> block.shortcut = nn.Sequential(nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32))
        >>> block.stride = 1
        >>> fast = rt.nn.Bottleneck.from_torch(block.eval())
        >>> fast(torch.randn(2, 16, 10, 25)).shape
        torch.Size([2, 32, 10, 25])
    """

    expansion = 4
    _depth = 3

    def __init__(self, conv1: Conv2d, conv2: Conv2d, conv3: Conv2d, shortcut: Optional[Conv2d], stride: int):
        super().__init__((conv1, conv2, conv3), shortcut, stride)


__all__ = ["BasicBlock", "Bottleneck", "Conv2d", "FoldedBatchNorm2d", "Projection", "StatsPool"]
