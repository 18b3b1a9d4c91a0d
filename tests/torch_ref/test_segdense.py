"""The library fallback of the segdense family computes pyannote's head (float64 reference)."""
from __future__ import annotations

import pytest
import torch

from rlx_triton.backends.torch_ref import segdense as ref_segdense
from tests.reference.segdense import random_head, segdense_float64


@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("hidden", [[], [16, 16]], ids=["0-linear", "2-linear"])
def test_matches_float64(activation, hidden):
    x = torch.randn(2, 7, 12)
    head = random_head(12, hidden, 7)
    got = ref_segdense.segdense(x, *head, activation=activation)
    torch.testing.assert_close(got.double(), segdense_float64(x, *head, activation), rtol=1e-5, atol=1e-5)
