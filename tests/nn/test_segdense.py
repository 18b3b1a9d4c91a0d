"""rlx_triton.nn.SegDense: pyannote's head as one module sharing the model's parameters."""
from __future__ import annotations

import pytest
import torch

import rlx_triton as rt
from rlx_triton.nn import SegDense
from tests.reference.pyannote_models import make_pyannet


def head_reference(model, x):
    for linear in getattr(model, "linear", []):
        x = torch.nn.functional.leaky_relu(linear(x))
    return model.activation(model.classifier(x))


@pytest.mark.parametrize("powerset,linear_layers", [(True, 2), (False, 1), (True, 0)],
                         ids=["powerset-2linear", "multilabel-1linear", "powerset-0linear"])
def test_from_pyannote_equals_the_model_head(powerset, linear_layers):
    model = make_pyannet(hidden=8, linear_layers=linear_layers, linear_hidden=8, powerset=powerset)
    head = SegDense.from_pyannote(model)
    assert head.weight is model.classifier.weight
    assert head.activation == ("log_softmax" if powerset else "sigmoid")
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        got = head(x)
    torch.testing.assert_close(got, head_reference(model, x), rtol=1e-5, atol=1e-5)


def test_unknown_activation_is_refused():
    model = make_pyannet(hidden=8, linear_hidden=8)
    model.activation = torch.nn.Softmax(dim=-1)
    with pytest.raises(ValueError, match="activation"):
        SegDense.from_pyannote(model)
