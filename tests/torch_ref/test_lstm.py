"""The library fallback of the lstm family is nn.LSTM's forward, including what the kernel refuses."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from rlx_triton.backends.torch_ref import lstm as ref_lstm
from tests.reference.lstm import LSTM_DEGENERATE_CASES, check_lstm_degenerate_case


def run(module, x, hx=None):
    return ref_lstm.lstm(x, hx, module._flat_weights, has_biases=module.bias, num_layers=module.num_layers,
                         dropout=module.dropout, training=module.training, bidirectional=module.bidirectional,
                         batch_first=module.batch_first, proj_size=module.proj_size)


def assert_same(got, want):
    out, (h, c) = got
    want_out, (want_h, want_c) = want
    if hasattr(out, "batch_sizes"):
        out, want_out = out.data, want_out.data
    assert torch.equal(out, want_out) and torch.equal(h, want_h) and torch.equal(c, want_c)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_equals_nn_lstm(batch_first, with_state):
    module = torch.nn.LSTM(4, 6, 2, bidirectional=True, batch_first=batch_first).eval()
    x = torch.randn(3, 5, 4)
    hx = (torch.randn(4, 3 if batch_first else 5, 6), torch.randn(4, 3 if batch_first else 5, 6)) if with_state else None
    assert_same(run(module, x, hx), module(x, hx))


def test_proj_size_and_unbatched_input():
    module = torch.nn.LSTM(4, 6, 1, proj_size=3).eval()
    x = torch.randn(5, 4)
    assert_same(run(module, x), module(x))


def test_packed_sequence_with_unsorted_lengths_and_state():
    module = torch.nn.LSTM(3, 5, 1, bidirectional=True, batch_first=True).eval()
    x = torch.randn(3, 4, 3)
    packed = pack_padded_sequence(x, torch.tensor([2, 4, 3]), batch_first=True, enforce_sorted=False)
    hx = (torch.randn(2, 3, 5), torch.randn(2, 3, 5))
    assert_same(run(module, packed, hx), module(packed, hx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(LSTM_DEGENERATE_CASES))
def test_degenerate_inputs_match_float64(case, dtype):
    def launch(module, x, hx):
        module = module.to(dtype)
        return run(module, x.to(dtype), tuple(s.to(dtype) for s in hx))

    check_lstm_degenerate_case(launch, case, rtol=1e-5 if dtype == torch.float32 else 1e-12)
