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


# ------------------------------------------------------------------------------- degenerate inputs
# pyannote's head (12 -> 8 -> 8 -> 7 classes) on (2, 5, 12) frames. name -> (edit(x, weights), expect):
# a NaN stays in its frame (every class of that frame is NaN after log-softmax), a NaN weight reaches
# every frame, +-Inf features saturate or turn to NaN exactly as torch's linear / leaky ReLU / activation
# do; silence and constant frames give finite scores.
NAN, INF = float("nan"), float("inf")


def _set(tensor, index, value):
    tensor[index] = value


SEGDENSE_DEGENERATE_CASES = {
    "zeros": (lambda x, w: x.zero_(), "finite"),
    "constants": (lambda x, w: x.fill_(0.5), "finite"),
    "single_frame": (None, "finite"),
    "nan_in_a_frame": (lambda x, w: _set(x, (1, 3, 4), NAN), "nan"),
    "inf_in_a_frame": (lambda x, w: _set(x, (0, 2, 7), INF), "nan"),
    "neg_inf_in_a_frame": (lambda x, w: _set(x, (0, 0, 0), -INF), "nan"),
    "nan_in_a_weight": (lambda x, w: _set(w[0][1], (2, 5), NAN), "nan"),
}


def segdense_degenerate_inputs(name: str, seed: int = 0):
    """(x, (weights, biases, classifier_weight, classifier_bias), expect) of one case, float32."""
    edit, expect = SEGDENSE_DEGENERATE_CASES[name]
    torch.manual_seed(seed)
    x = torch.randn(1, 1, 12) if name == "single_frame" else torch.randn(2, 5, 12)
    head = random_head(12, [8, 8], 7)
    if edit is not None:
        edit(x, head)
    return x, head, expect


def check_segdense_degenerate_case(launch, name: str, activation: str, *, rtol: float):
    """Runs `launch(x, weights, biases, classifier_weight, classifier_bias, activation)` on one case and
    compares with segdense_float64: NaN and Inf exactly where it has them, its values elsewhere."""
    x, head, expect = segdense_degenerate_inputs(name)
    out = launch(x, *head, activation)
    expected = segdense_float64(x, *head, activation)
    torch.testing.assert_close(out.double(), expected, rtol=rtol, atol=rtol * 4, equal_nan=True)
    if expect == "nan":
        assert out.isnan().any()
    else:
        assert out.isfinite().all()
    return out
