"""The library fallback of the segdense family computes pyannote's head (float64 reference)."""
from __future__ import annotations

import pytest
import torch

from rlx_triton.backends.torch_ref import segdense as ref_segdense
from tests.reference.segdense import (SEGDENSE_DEGENERATE_CASES, check_segdense_degenerate_case, random_head,
                                      segdense_float64)


@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("hidden", [[], [16, 16]], ids=["0-linear", "2-linear"])
def test_matches_float64(activation, hidden):
    x = torch.randn(2, 7, 12)
    head = random_head(12, hidden, 7)
    got = ref_segdense.segdense(x, *head, activation=activation)
    torch.testing.assert_close(got.double(), segdense_float64(x, *head, activation), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("activation", ["log_softmax", "sigmoid", "none"])
@pytest.mark.parametrize("case", list(SEGDENSE_DEGENERATE_CASES))
def test_degenerate_inputs_match_float64(case, activation, dtype):
    def launch(x, weights, biases, wc, bc, act):
        cast = [w.to(dtype) for w in weights], [b.to(dtype) for b in biases], wc.to(dtype), bc.to(dtype)
        return ref_segdense.segdense(x.to(dtype), *cast, activation=act)

    check_segdense_degenerate_case(launch, case, activation, rtol=1e-5 if dtype == torch.float32 else 1e-12)
