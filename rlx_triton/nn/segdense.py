"""rlx_triton.nn.SegDense: pyannote's segmentation head (linears + leaky ReLU, classifier, activation) as one op.

    head = SegDense.from_pyannote(model)       # shares model.linear[i] and model.classifier parameters
    scores = head(lstm_outputs)                # == model.activation(model.classifier(leaky(linear(...))))
"""
from __future__ import annotations

from typing import Iterable, Optional, Union

import torch
from torch import nn

from rlx_triton.ops import segdense as segdense_op


def activation_name(activation: nn.Module) -> Optional[str]:
    """"log_softmax" / "sigmoid" / "none" for the final activations pyannote builds, else None."""
    if isinstance(activation, nn.LogSoftmax) and activation.dim in (-1, None):
        return "log_softmax"
    if isinstance(activation, nn.Sigmoid):
        return "sigmoid"
    if isinstance(activation, nn.Identity):
        return "none"
    return None


class SegDense(nn.Module):
    """Dense head: for each Linear `leaky_relu(linear(x))`, then `classifier`, then the activation.

    The classifier's parameters are this module's `weight` and `bias` (the same Parameter objects),
    so a model whose `classifier` becomes a SegDense keeps its state_dict keys. The linears are
    registered as `linear` unless `register_linears=False` (then the owner keeps them registered).
    (..., in_features) -> (..., classes), in the parameters' dtype.

    Example (`from_pyannote` reads a PyanNet's `linear`, `classifier` and `activation`; a module with
    those three stands in for one here):
        >>> import torch, rlx_triton as rt
        >>> from torch import nn
        >>> model = nn.Module()
        >>> model.linear = nn.ModuleList([nn.Linear(256, 128), nn.Linear(128, 128)])
        >>> model.classifier, model.activation = nn.Linear(128, 7), nn.LogSoftmax(dim=-1)
        >>> head = rt.nn.SegDense.from_pyannote(model)     # shares the parameters
        >>> head(torch.randn(2, 589, 256)).shape           # the LSTM's frames -> powerset log-probabilities
        torch.Size([2, 589, 7])
        >>> head.weight is model.classifier.weight
        True
    """

    linear: nn.ModuleList
    _linears: nn.ModuleList

    def __init__(self, linears: Union[nn.ModuleList, Iterable[nn.Linear]], classifier: nn.Linear, activation: str = "log_softmax",
                 *, register_linears: bool = True):
        super().__init__()
        if activation not in segdense_op.ACTIVATIONS:
            raise ValueError(f"SegDense: activation must be one of {segdense_op.ACTIVATIONS}, got {activation!r}")
        if not isinstance(classifier, nn.Linear):
            raise TypeError(f"SegDense: classifier must be an nn.Linear, got {type(classifier).__name__}")
        modules = linears if isinstance(linears, nn.ModuleList) else nn.ModuleList(list(linears))
        for i, linear in enumerate(modules):
            if not isinstance(linear, nn.Linear):
                raise TypeError(f"SegDense: linears[{i}] must be an nn.Linear, got {type(linear).__name__}")
        if register_linears:
            self.linear = modules
        else:
            object.__setattr__(self, "_linears", modules)
        self.weight = classifier.weight
        self.bias = classifier.bias
        self.in_features = classifier.in_features
        self.out_features = classifier.out_features
        self.activation = activation

    @classmethod
    def from_pyannote(cls, model: nn.Module, *, register_linears: bool = True) -> "SegDense":
        """The head of a pyannote PyanNet (attributes `linear` (optional), `classifier`, `activation`)."""
        classifier = getattr(model, "classifier", None)
        if not isinstance(classifier, nn.Linear):
            raise TypeError("SegDense.from_pyannote: model must have an nn.Linear `classifier` "
                            "(a built pyannote PyanNet)")
        name = activation_name(getattr(model, "activation", nn.Identity()))
        if name is None:
            raise ValueError(f"SegDense.from_pyannote: model.activation {type(model.activation).__name__} is not "
                             "LogSoftmax(dim=-1), Sigmoid or Identity")
        linears = getattr(model, "linear", None)
        return cls(linears if linears is not None else nn.ModuleList(), classifier, name,
                   register_linears=register_linears)

    @property
    def linears(self) -> nn.ModuleList:
        return self.linear if "linear" in self._modules else self._linears

    def _args(self, x):
        linears = list(self.linears._modules.values())  # not iter(): the owner's list may hide its items
        return (x, [l.weight for l in linears], [l.bias for l in linears], self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return segdense_op.segdense(*self._args(x), activation=self.activation)

    def explain(self, x: torch.Tensor):
        """The Route forward(x) takes, without running it."""
        from rlx_triton.router import explain

        return explain(segdense_op.segdense, *self._args(x), activation=self.activation)

    def extra_repr(self) -> str:
        return (f"layers={len(self.linears)}, in_features={self.in_features}, classes={self.out_features}, "
                f"activation={self.activation}")
