"""float64 reference of pyannote's dense head: leaky_relu(linear) per layer, classifier, activation."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def segdense_float64(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
                     classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor],
                     activation: str) -> torch.Tensor:
    out = x.double()
    for w, b in zip(weights, biases):
        out = F.leaky_relu(F.linear(out, w.double(), None if b is None else b.double()))
    out = F.linear(out, classifier_weight.double(), None if classifier_bias is None else classifier_bias.double())
    if activation == "log_softmax":
        return torch.log_softmax(out, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(out)
    return out


def random_head(in_features: int, hidden: Sequence[int], classes: int, *, bias: bool = True):
    """Weights like nn.Linear's init: (weights, biases, classifier_weight, classifier_bias)."""
    dims = [in_features, *hidden]
    weights = [torch.randn(o, i) / i ** 0.5 for i, o in zip(dims[:-1], dims[1:])]
    biases = [torch.randn(o) * 0.1 if bias else None for o in dims[1:]]
    return weights, biases, torch.randn(classes, dims[-1]) / dims[-1] ** 0.5, torch.randn(classes) * 0.1
