"""The public segdense op: validation names the argument; covered calls run the Triton kernel;
autograd falls back to torch with a typed reason."""
from __future__ import annotations

import re

import pytest
import torch

import rlx_triton as rt
from rlx_triton.ops.segdense import segdense
from tests.reference.segdense import random_head, segdense_float64


def test_covered_call_runs_the_triton_kernel():
    x, head = torch.randn(2, 5, 12), random_head(12, [8, 8], 7)
    with rt.use_backend("triton", strict=True):
        got = segdense(x, *head, activation="log_softmax")
    torch.testing.assert_close(got.double(), segdense_float64(x, *head, "log_softmax"), rtol=1e-5, atol=1e-5)
    assert rt.explain(segdense, x, *head, activation="sigmoid").backend == "triton"


def test_autograd_goes_to_torch():
    x, head = torch.randn(3, 12), random_head(12, [8], 3)
    head[0][0].requires_grad_(True)
    route = rt.explain(segdense, x, *head, activation="sigmoid")
    assert route.backend == "torch" and "requires_grad" in str(route.skipped_reasons["triton"])
    segdense(x, *head, activation="sigmoid").sum().backward()
    assert head[0][0].grad is not None


def test_bad_input_errors_name_the_op_and_the_argument():
    x, (ws, bs, wc, bc) = torch.randn(3, 12), random_head(12, [8], 3)
    with pytest.raises(TypeError, match=r"^segdense: .*x"):
        segdense([1.0], ws, bs, wc, bc)
    with pytest.raises(ValueError, match=r"^segdense: .*weights\[0\]"):
        segdense(x, [torch.randn(8, 12, 1)], bs, wc, bc)
    with pytest.raises(ValueError, match=r"^segdense: .*biases\[0\]"):
        segdense(x, ws, [torch.zeros(5)], wc, bc)
    with pytest.raises(ValueError, match=r"^segdense: .*classifier_weight"):
        segdense(x, ws, bs, torch.randn(3, 12), bc)
    with pytest.raises(ValueError, match=r"^segdense: .*classifier_bias"):
        segdense(x, ws, bs, wc, torch.zeros(4))
    with pytest.raises(ValueError, match=r"^segdense: .*activation"):
        segdense(x, ws, bs, wc, bc, activation="softmax")
    with pytest.raises(ValueError, match=r"^segdense: .*biases"):
        segdense(x, ws, [], wc, bc)


@pytest.mark.parametrize("linear_layers", [2, 0])
def test_input_that_does_not_fit_the_head_blames_x_with_torchs_exception_type(linear_layers):
    ws, bs, wc, bc = random_head(12, [8] * linear_layers, 3)
    x = torch.randn(3, 11)
    with pytest.raises(Exception) as from_torch:
        segdense_float64(x, ws, bs, wc, bc, "sigmoid")
    first = "weights[0]" if linear_layers else "classifier_weight"
    with pytest.raises(type(from_torch.value), match=rf"x.size\(-1\) .*{re.escape(first)}. Expected 12, got 11") as caught:
        segdense(x, ws, bs, wc, bc, activation="sigmoid")
    assert isinstance(caught.value, ValueError)
