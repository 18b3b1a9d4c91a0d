"""The stock pyannote models the sincnet, pyannote_segmentation and embedding benches run, with random weights.

pyannote.audio's own modules at the bench shapes (`pip install rlx-triton[pyannote]`): SincNet at stride 10,
PyanNet as segmentation-3.0 builds it (SincNet, a 4-layer bidirectional LSTM of 128, two linear layers of
128, the powerset classifier of 3 speakers, 2 at a time) and WeSpeakerResNet34, whose convolutions, linear
layers and BatchNorms get random weights and non-trivial statistics (`randomize`). `rlx-triton perf` builds its
cases from these and bench/*.py times them, so an installed wheel analyses what a source checkout measures.
Without pyannote.audio each builder raises StockModelUnavailable (bench/ then runs the structural copies of
tests/reference/).
"""
from __future__ import annotations

import torch
from torch import nn

SAMPLE_RATE = 16000
SINCNET_STRIDE = 10


class StockModelUnavailable(RuntimeError):
    """pyannote.audio, which defines the stock models, is not installed."""


def _missing(model: str, error: ImportError) -> StockModelUnavailable:
    return StockModelUnavailable(f"the stock {model} is pyannote.audio's, which could not be imported ({error}); "
                                 f"install it with `pip install rlx-triton[pyannote]`")


@torch.no_grad()
def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random conv/linear weights (variance-preserving) and non-trivial BatchNorm affine + running stats; eval mode."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            fan_in = module.weight[0].numel()
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * (2.0 / fan_in) ** 0.5)
            if module.bias is not None:
                module.bias.copy_(0.1 * torch.randn(module.bias.shape, generator=generator))
        elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
            features = module.num_features
            if module.running_mean is not None and module.running_var is not None:
                module.running_mean.copy_(0.2 * torch.randn(features, generator=generator))
                module.running_var.copy_(0.5 + torch.rand(features, generator=generator))
            if module.affine:
                module.weight.copy_(0.8 + 0.4 * torch.rand(features, generator=generator))
                module.bias.copy_(0.1 * torch.randn(features, generator=generator))
    return model.eval()


def pyannote_sincnet() -> nn.Module:
    """pyannote.audio's SincNet block at 16 kHz, stride 10 (its own initial filters), in eval mode."""
    try:
        from pyannote.audio.models.blocks.sincnet import SincNet
    except ImportError as error:
        raise _missing("SincNet", error) from error
    return SincNet(sample_rate=SAMPLE_RATE, stride=SINCNET_STRIDE).eval()


def pyannet() -> nn.Module:
    """pyannote.audio's PyanNet with segmentation-3.0's hyperparameters and specifications, in eval mode."""
    try:
        from pyannote.audio.core.task import Problem, Resolution, Specifications
        from pyannote.audio.models.segmentation import PyanNet
    except ImportError as error:
        raise _missing("PyanNet", error) from error
    model = PyanNet(sincnet={"stride": SINCNET_STRIDE},
                    lstm={"hidden_size": 128, "num_layers": 4, "bidirectional": True, "monolithic": True,
                          "dropout": 0.0},
                    linear={"hidden_size": 128, "num_layers": 2}, sample_rate=SAMPLE_RATE, num_channels=1)
    model.specifications = Specifications(problem=Problem.MONO_LABEL_CLASSIFICATION, resolution=Resolution.FRAME,
                                          duration=10.0, classes=["speaker#1", "speaker#2", "speaker#3"],
                                          powerset_max_classes=2, permutation_invariant=True)
    model.build()
    return model.eval()


def wespeaker_resnet34() -> nn.Module:
    """pyannote.audio's WeSpeakerResNet34 with random weights (`randomize`), in eval mode."""
    try:
        from pyannote.audio.models.embedding import WeSpeakerResNet34
    except ImportError as error:
        raise _missing("WeSpeakerResNet34", error) from error
    return randomize(WeSpeakerResNet34())
