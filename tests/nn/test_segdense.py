"""rlx_triton.nn.SegDense: pyannote's head as one module sharing the model's parameters."""
from __future__ import annotations

import contextlib

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("run_mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize("built", ["outside", "inside"], ids=["built_outside", "built_in_inference_mode"])
def test_inference_and_no_grad_with_weights_built_either_way(built, run_mode, dtype):
    """A model loaded inside torch.inference_mode has inference-tensor weights; float32 runs the kernel,
    float64 runs torch and gives torch's values; a weight edited in place is seen by the next call."""
    with torch.inference_mode() if built == "inside" else contextlib.nullcontext():
        model = make_pyannet(hidden=8, linear_hidden=8).to(dtype)
        head = SegDense.from_pyannote(model)
    x = torch.randn(2, 5, 16, dtype=dtype)
    x[1, 2, 3] = float("nan")  # one frame of silence gone wrong: NaN there, torch's values elsewhere
    with run_mode(), rt.use_backend("triton", strict=dtype == torch.float32):
        route = head.explain(x)
        got = head(x)
        expected = head_reference(model, x)
        if built == "outside":
            model.classifier.weight.mul_(0.5)
            torch.testing.assert_close(head(x), head_reference(model, x), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert route.backend == ("triton" if dtype == torch.float32 else "torch") and got.dtype == dtype
    assert got[1, 2].isnan().all() and not got[0].isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
