"""Public segdense op: pyannote's segmentation head (linear + leaky ReLU stack, classifier, activation).

    scores = segdense(lstm_out, [l.weight for l in linears], [l.bias for l in linears],
                      classifier.weight, classifier.bias, activation="log_softmax")

Validates its input (errors name the argument, before any launch), builds a routing Request from its
request spec (`SEGDENSE_REQUEST`, which `rlx-triton explain` reads too) and runs `segdense` of the backend
module the router picks (`backends/triton/segdense/`, or `backends/torch_ref/segdense.py`). Autograd is a typed refusal that falls back to torch.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from rlx_triton.ops._compiled import compiling, options_from, options_text, run_eagerly
from rlx_triton.ops._checks import (InputShapeError, backend_module, call_signature, check_device, check_dtype,
                                    check_is_tensor, check_shape, needs_grad)
from rlx_triton.ops._request_spec import Derived, Feature, Given, RequestSpec, flag
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import routed_call

FAMILY = "segdense"
OP = "segdense"   # the prefix of every error message
ACTIVATIONS = ("none", "sigmoid", "log_softmax")

SEGDENSE_REQUEST = RequestSpec(
    FAMILY, "segdense",
    given=(Given("rows"), Given("in_features"), Given("hidden"), Given("classes")),
    derived=(Derived("tokens", lambda f, o: f["rows"], "= rows", ("rows",)),),
    features={"activation": Feature("log_softmax", ACTIVATIONS), "linear_layers": Feature(2),
              "requires_grad": flag(False)},
)


def _check_matrix(name: str, w, rows_text: str, in_features: int, x: torch.Tensor) -> None:
    check_is_tensor(name, w, f"({rows_text}, {in_features})", op=OP)
    if w.dim() != 2 or w.shape[1] != in_features:
        raise ValueError(f"{OP}: {name} must be ({rows_text}, {in_features}), got shape {tuple(w.shape)}")
    check_device(name, w, x, "x", op=OP)


def _check_bias(name: str, b, size: int, x: torch.Tensor) -> None:
    if b is None:
        return
    check_is_tensor(name, b, f"({size},) or None", op=OP)
    check_shape(name, b, (size,), op=OP)
    check_device(name, b, x, "x", op=OP)


def _segdense_request(x, weights: Sequence[torch.Tensor] = (), biases: Sequence[Optional[torch.Tensor]] = (),
                      classifier_weight=None, classifier_bias=None, *, activation: str = "log_softmax") -> Request:
    check_is_tensor("x", x, "(..., in_features)", op=OP)
    check_dtype("x", x, SEGDENSE_REQUEST.dtypes, "a floating tensor", op=OP)
    if x.dim() < 1:
        raise ValueError(f"{OP}: x must have at least one dimension (..., in_features), got a scalar")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    weights, biases = list(weights), list(biases)
    if len(biases) != len(weights):
        raise ValueError(f"{OP}: biases must hold one entry (tensor or None) per weight: {len(weights)}, "
                         f"got {len(biases)}")
    features = x.shape[-1]
    first_name, first = ("weights[0]", weights[0]) if weights else ("classifier_weight", classifier_weight)
    if isinstance(first, torch.Tensor) and first.dim() == 2 and first.shape[1] != features:
        # x does not fit the head: blame x, with the RuntimeError torch's linear raises for it
        raise InputShapeError(f"{OP}: x.size(-1) must be equal to the in_features of {first_name}. Expected "
                              f"{first.shape[1]}, got {features} (x of shape {tuple(x.shape)})")
    for i, (w, b) in enumerate(zip(weights, biases)):
        _check_matrix(f"weights[{i}]", w, "out_features", features, x)
        _check_bias(f"biases[{i}]", b, w.shape[0], x)
        features = w.shape[0]
    _check_matrix("classifier_weight", classifier_weight, "classes", features, x)
    _check_bias("classifier_bias", classifier_bias, classifier_weight.shape[0], x)

    tensors = [x, *weights, classifier_weight] + [b for b in (*biases, classifier_bias) if b is not None]
    requires_grad = needs_grad(*tensors)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    hidden = max([w.shape[0] for w in weights], default=x.shape[-1])   # widest input of a layer after the first
    given = {"rows": rows, "in_features": x.shape[-1], "hidden": hidden, "classes": classifier_weight.shape[0]}
    feats = {"activation": activation, "linear_layers": len(weights), "requires_grad": requires_grad}
    return SEGDENSE_REQUEST.make(given, feats, tensor=x)


@routed_op(_segdense_request)
def segdense(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[Optional[torch.Tensor]],
             classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor] = None, *,
             activation: str = "log_softmax") -> torch.Tensor:
    """(..., in_features) -> (..., classes): leaky_relu(linear) per layer, classifier, activation.

    A call whose signature (shapes, dtypes, devices, autograd, activation) repeats an earlier one is not
    validated or routed again."""
    if compiling():
        if needs_grad(x, *weights, *biases, classifier_weight, classifier_bias):
            return run_eagerly(segdense, x, weights, biases, classifier_weight, classifier_bias, activation=activation)
        return _segdense_op(x, list(weights), list(biases), classifier_weight, classifier_bias,
                            options_text(activation=activation))
    signature = call_signature(OP, (x, weights, biases, classifier_weight, classifier_bias), (activation,))
    r = routed_call(signature, lambda: _segdense_request(x, weights, biases, classifier_weight, classifier_bias,
                                                         activation=activation),
                    lambda: (segdense, (x, weights, biases, classifier_weight, classifier_bias),
                             {"activation": activation}))
    return backend_module(r).segdense(x, list(weights), list(biases), classifier_weight, classifier_bias,
                             activation=activation, candidate=r.candidate)


@torch.library.custom_op("rlx_triton::segdense", mutates_args=())
def _segdense_op(x: torch.Tensor, weights: List[torch.Tensor], biases: List[Optional[torch.Tensor]],
                 classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor],
                 options: str) -> torch.Tensor:
    """segdense under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return segdense(x, weights, biases, classifier_weight, classifier_bias, **options_from(options)).contiguous()


@_segdense_op.register_fake
def _segdense_fake(x, weights, biases, classifier_weight, classifier_bias, options):
    _segdense_request(x, weights, biases, classifier_weight, classifier_bias, **options_from(options))
    return x.new_empty((*x.shape[:-1], classifier_weight.shape[0]))
