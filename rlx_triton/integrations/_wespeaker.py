"""WeSpeaker ResNet speaker-embedding models (pyannote's WeSpeakerResNet34 and siblings) on rlx kernels.

Recognised by structure, never by importing pyannote: a model with a `resnet` trunk (conv1, bn1,
layer1..layer4 of BasicBlock/Bottleneck blocks, a TSTP pool, seg_1) and a kaldi-fbank front end
(`_fbank`, a functools.partial of torchaudio's kaldi.fbank, and `compute_fbank`). The swap, in place:

- front end: `compute_fbank` -> rlx_triton.nn.Fbank (x32768, kaldi fbank with the model's own options,
  mean over frames subtracted), when the model centers over the whole input (fbank_centering_span None);
- trunk: conv1+bn1(+ReLU) and every block's convs -> rlx Conv2d with BatchNorm folded, residual add and
  ReLU fused into the block's last conv (rlx BasicBlock / Bottleneck);
- pooling: TSTP -> rlx StatsPool (one kernel, frame weights as in forward_embedding(weights=...));
- projection: seg_1 -> rlx Projection.

BatchNorm is folded with its running statistics, so the swapped model computes eval-mode outputs.
The swapped model keeps the stock state_dict: the same keys and the same parameter and buffer objects
(every BatchNorm stays where it was, as a FoldedBatchNorm2d whose forward is the identity), so a stock
checkpoint loads into it (strict load_state_dict; the convs fold again on load) and its state_dict
loads into a stock model.

    from rlx_triton.integrations import pyannote
    pyannote.optimize(model)                 # finds WeSpeaker models through the recogniser table
    pyannote.explain(model, waveforms)       # {module path: Route} for the swapped modules
    optimize_wespeaker(model)                # the same swap, returning the swapped module paths
"""
from __future__ import annotations

import functools
import types
import warnings
from typing import TYPE_CHECKING, Any, List, Optional

import torch
from torch import nn

from rlx_triton.nn.conv2d import BasicBlock, Bottleneck, Conv2d, FoldedBatchNorm2d, Projection, StatsPool

if TYPE_CHECKING:
    from rlx_triton.nn.fbank import Fbank

# ---------------------------------------------------------------------------------------------
# Recognition (structure only)
# ---------------------------------------------------------------------------------------------


def _is_conv_bn(conv, bn) -> bool:
    return (isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and bn.track_running_stats
            and conv.groups == 1 and tuple(conv.dilation) == (1, 1) and conv.padding_mode == "zeros"
            and not isinstance(conv.padding, str))


def _is_shortcut(shortcut) -> bool:
    if not isinstance(shortcut, nn.Sequential):
        return False
    return len(shortcut) == 0 or (len(shortcut) == 2 and _is_conv_bn(shortcut[0], shortcut[1]))


def _is_basic_block(block) -> bool:
    return (type(block).__name__ == "BasicBlock" and _is_conv_bn(block._modules.get("conv1"), block._modules.get("bn1"))
            and _is_conv_bn(block._modules.get("conv2"), block._modules.get("bn2"))
            and "conv3" not in block._modules and _is_shortcut(block._modules.get("shortcut")))


def _is_bottleneck(block) -> bool:
    return (type(block).__name__ == "Bottleneck"
            and all(_is_conv_bn(block._modules.get(f"conv{i}"), block._modules.get(f"bn{i}")) for i in (1, 2, 3))
            and _is_shortcut(block._modules.get("shortcut")))


def _is_rlx_block(block) -> bool:
    return isinstance(block, (BasicBlock, Bottleneck))


def is_wespeaker_trunk(module: Optional[nn.Module]) -> bool:
    """WeSpeaker's `ResNet`: conv1/bn1 stem, layer1..layer4 of residual blocks, pool, seg_1 Linear."""
    if type(module).__name__ != "ResNet" or not isinstance(module, nn.Module):
        return False
    mods = module._modules
    stem_ok = (_is_conv_bn(mods.get("conv1"), mods.get("bn1"))
               or isinstance(mods.get("conv1"), Conv2d) and isinstance(mods.get("bn1"), FoldedBatchNorm2d))
    layers = [mods.get(f"layer{i}") for i in (1, 2, 3, 4)]
    layers_ok = all(isinstance(layer, nn.Sequential) and len(layer) > 0
                    and all(_is_basic_block(b) or _is_bottleneck(b) or _is_rlx_block(b) for b in layer)
                    for layer in layers)
    seg_ok = isinstance(mods.get("seg_1"), (nn.Linear, Projection))
    return stem_ok and layers_ok and seg_ok and isinstance(mods.get("pool"), nn.Module)


def _fbank_partial(model):
    fb = getattr(model, "_fbank", None)
    if isinstance(fb, functools.partial) and getattr(fb.func, "__name__", "") == "fbank":
        return fb
    return None


def is_wespeaker_model(module: nn.Module) -> bool:
    """pyannote's BaseWeSpeakerResNet subclasses: a WeSpeaker `resnet` trunk plus the fbank front end."""
    return (isinstance(module, nn.Module) and is_wespeaker_trunk(module._modules.get("resnet"))
            and callable(getattr(module, "compute_fbank", None)))


# ---------------------------------------------------------------------------------------------
# Swaps
# ---------------------------------------------------------------------------------------------


class WeSpeakerFrontEnd(nn.Module):
    """BaseWeSpeakerResNet.compute_fbank on rlx_triton.nn.Fbank: waveforms (B, C, T) x 32768,
    kaldi fbank with the model's options, minus the mean over frames -> (B, frames, bins)."""

    fbank: "Fbank"

    def __init__(self, fbank_keywords: dict):
        super().__init__()
        from rlx_triton.nn.fbank import Fbank

        options = dict(fbank_keywords)
        options.update(input_scale=float(1 << 15), subtract_mean=True)
        # Fbank has no parameters or buffers; kept out of _modules so `explain` reports this module once.
        object.__setattr__(self, "fbank", Fbank(**options))

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        return self.fbank(waveforms)

    def explain(self, waveforms: torch.Tensor):
        """The Route forward(waveforms) takes, without running it."""
        return self.fbank.explain(waveforms)


def _compute_fbank_rlx(self, waveforms: torch.Tensor) -> torch.Tensor:
    return self.rlx_front_end(waveforms)


def _swap_front_end(model: nn.Module, swapped: List[str], prefix: str) -> None:
    if isinstance(model._modules.get("rlx_front_end"), WeSpeakerFrontEnd):
        return
    fb = _fbank_partial(model)
    hparams = getattr(model, "hparams", None)
    span = getattr(hparams, "fbank_centering_span", None)
    if fb is None or span is not None:
        return  # a running-average centering window stays with the model's own compute_fbank
    try:
        front_end = WeSpeakerFrontEnd(fb.keywords)
    except (ImportError, ValueError, TypeError) as error:
        warnings.warn(f"rlx_triton: WeSpeaker front end left on torch ({error})", stacklevel=3)
        return
    model.rlx_front_end = front_end
    # an instance attribute shadows the class method; forward / forward_frames call self.compute_fbank
    object.__setattr__(model, "compute_fbank", types.MethodType(_compute_fbank_rlx, model))
    swapped.append(f"{prefix}compute_fbank")


def _swap_block(block: nn.Module):
    if _is_rlx_block(block):
        return block
    return Bottleneck.from_torch(block) if _is_bottleneck(block) else BasicBlock.from_torch(block)


def _is_tstp(pool: nn.Module) -> bool:
    stats = pool._modules.get("stats_pool")
    return type(pool).__name__ == "TSTP" and stats is not None and type(stats).__name__ == "StatsPool"


@torch.no_grad()
def swap_trunk(resnet: nn.Module, prefix: str = "") -> List[str]:
    """Swap a WeSpeaker ResNet trunk's stem, blocks, TSTP pooling and seg_1 in place; the swapped paths."""
    if resnet.training:
        warnings.warn("rlx_triton: the WeSpeaker trunk is in training mode; its BatchNorms are folded with "
                      "their running statistics (eval-mode outputs)", stacklevel=3)
    # WeSpeaker's ResNet is read by structure (is_wespeaker_trunk); its parts are not typed here
    trunk: Any = resnet
    swapped: List[str] = []
    if not isinstance(trunk.conv1, Conv2d):
        trunk.conv1 = Conv2d.from_torch(trunk.conv1, bn=trunk.bn1, relu=True)
        # forward keeps F.relu(self.bn1(self.conv1(x))): bn1 stays (same parameters and keys) with an
        # identity forward, since conv1 applies it; the extra ReLU is idempotent
        trunk.bn1 = trunk.conv1.bn
        swapped.append(f"{prefix}conv1")
    for i in (1, 2, 3, 4):
        layer = getattr(trunk, f"layer{i}")
        for j in range(len(layer)):
            if not _is_rlx_block(layer[j]):
                layer[j] = _swap_block(layer[j])
                swapped.append(f"{prefix}layer{i}.{j}")
    if _is_tstp(trunk.pool):
        trunk.pool = StatsPool(in_dim=getattr(trunk.pool, "in_dim", 0))
        swapped.append(f"{prefix}pool")
    if isinstance(trunk.seg_1, nn.Linear):
        trunk.seg_1 = Projection.from_torch(trunk.seg_1)
        swapped.append(f"{prefix}seg_1")
    return swapped


def optimize_wespeaker(model: nn.Module) -> List[str]:
    """Swap rlx modules into a WeSpeaker model (or a bare WeSpeaker ResNet trunk) in place; returns the
    swapped module paths. Raises TypeError for anything else."""
    if is_wespeaker_model(model):
        swapped: List[str] = []
        _swap_front_end(model, swapped, "")
        swapped += swap_trunk(model.get_submodule("resnet"), prefix="resnet.")
        return swapped
    if is_wespeaker_trunk(model):
        return swap_trunk(model)
    raise TypeError(f"model is not a WeSpeaker ResNet model or trunk: {type(model).__name__}")


def _swap_model(model: nn.Module) -> nn.Module:
    optimize_wespeaker(model)
    return model


def _register() -> None:
    from rlx_triton.integrations.pyannote import register_recogniser

    register_recogniser("wespeaker_resnet", is_wespeaker_model, _swap_model)
    register_recogniser("wespeaker_resnet_trunk", is_wespeaker_trunk, _swap_model)


_register()

__all__ = ["WeSpeakerFrontEnd", "is_wespeaker_model", "is_wespeaker_trunk", "optimize_wespeaker", "swap_trunk"]
