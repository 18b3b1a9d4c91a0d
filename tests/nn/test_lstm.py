"""rlx_triton.nn.LSTM is a drop-in nn.LSTM: from_torch shares the Parameter objects and state_dict
keys, forward equals nn.LSTM (Triton kernel under no_grad, torch for autograd and training dropout)."""
from __future__ import annotations

import contextlib

import pytest
import torch

import rlx_triton as rt
from rlx_triton.nn import LSTM


@pytest.fixture
def source():
    return torch.nn.LSTM(5, 8, 2, bidirectional=True, batch_first=True).eval()


def test_from_torch_shares_parameters_and_state_dict_keys(source):
    fast = LSTM.from_torch(source)
    # nn.LSTM's attributes and repr, but no nn.LSTM instance: torch.compile refuses those (tests/test_compile.py)
    assert not isinstance(fast, torch.nn.LSTM)
    for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional",
                 "proj_size"):
        assert getattr(fast, name) == getattr(source, name), name
    assert repr(fast) == repr(source)
    assert [[p is q for p, q in zip(mine, theirs)] for mine, theirs in zip(fast.all_weights, source.all_weights)] \
        == [[True] * 4] * 4
    assert list(fast.state_dict()) == list(source.state_dict())
    for (name, p), (_, q) in zip(fast.named_parameters(), source.named_parameters()):
        assert p is q, name
    with torch.no_grad():
        source.weight_hh_l1.add_(1.0)
    assert torch.equal(fast.weight_hh_l1, source.weight_hh_l1)
    fast.load_state_dict(source.state_dict())


def test_forward_equals_nn_lstm_on_the_triton_kernel(source):
    fast = LSTM.from_torch(source)
    x = torch.randn(2, 3, 5)
    hx = (torch.randn(4, 2, 8), torch.randn(4, 2, 8))
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out, (h, c) = fast(x, hx)
    want, (want_h, want_c) = source(x, hx)
    for got, ref in ((out, want), (h, want_h), (c, want_c)):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert fast.explain(x, hx).backend == "torch"       # grad mode on
    with torch.no_grad():
        assert fast.explain(x, hx).backend == "triton"


def test_weights_converted_after_construction_are_the_ones_forward_reads():
    """.double() (like .to() and load_state_dict) replaces the parameters: forward reads the new ones."""
    fast = LSTM(3, 4, 2, batch_first=True).double()
    stock = torch.nn.LSTM(3, 4, 2, batch_first=True).double()
    stock.load_state_dict(fast.state_dict())
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fast(x)[0], stock(x)[0], rtol=0, atol=0)


def test_constructed_directly_and_trained_through_torch():
    fast = LSTM(3, 4, 2, dropout=0.5).train()
    x = torch.randn(5, 2, 3)
    assert fast.explain(x).backend == "torch"
    out, _ = fast(x)
    out.sum().backward()
    assert fast.weight_ih_l0.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("run_mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize("built", ["outside", "inside"], ids=["built_outside", "built_in_inference_mode"])
def test_inference_and_no_grad_with_weights_built_either_way(built, run_mode, dtype):
    """Weights created inside torch.inference_mode are inference tensors; float32 runs the kernel, float64
    runs torch (no kernel covers it) and gives torch's values; a weight edited in place is seen."""
    with torch.inference_mode() if built == "inside" else contextlib.nullcontext():
        torch.manual_seed(0)
        source = torch.nn.LSTM(5, 8, 2, bidirectional=True, batch_first=True).eval().to(dtype)
        fast = LSTM.from_torch(source)
    x = torch.randn(2, 3, 5, dtype=dtype)
    with run_mode(), rt.use_backend("triton", strict=dtype == torch.float32):
        route = fast.explain(x)
        out, (h, c) = fast(x)
        want, (want_h, want_c) = source(x)
        if built == "outside":
            source.weight_ih_l0.mul_(0.5)
            edited, _ = fast(x)
            assert torch.allclose(edited, source(x)[0], rtol=1e-5, atol=1e-5)
    assert route.backend == ("triton" if dtype == torch.float32 else "torch")
    for got, ref in ((out, want), (h, want_h), (c, want_c)):
        assert got.dtype == dtype
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
