"""Library fallback for the segdense family: pyannote's dense head written with torch.nn.functional."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: Dict[str, Approval] = {}
RECIPES: Dict[str, str] = {}
SPEED_EVIDENCE: Dict[str, str] = {}


def segdense(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
             classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor], *,
             activation: str, candidate=None) -> torch.Tensor:
    """leaky_relu(linear) for each (weight, bias), then the classifier and the final activation."""
    out = x
    for weight, bias in zip(weights, biases):
        out = F.leaky_relu(F.linear(out, weight, bias))
    out = F.linear(out, classifier_weight, classifier_bias)
    if activation == "log_softmax":
        return torch.log_softmax(out, dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(out)
    return out
