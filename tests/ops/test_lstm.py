"""The public lstm op: input validation names the argument, covered calls run the Triton kernel and
equal nn.LSTM, and every refusal (autograd, training dropout, proj_size, packed input, hidden > 512,
half dtypes) falls back to torch with a typed reason."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import rlx_triton as rt
from rlx_triton.ops.lstm import lstm


def call(module, x, hx=None, **overrides):
    kwargs = dict(has_biases=module.bias, num_layers=module.num_layers, dropout=module.dropout,
                  training=module.training, bidirectional=module.bidirectional, batch_first=module.batch_first,
                  proj_size=module.proj_size)
    kwargs.update(overrides)
    return x, hx, module._flat_weights, kwargs


def explain(module, x, hx=None, **overrides):
    x, hx, weights, kwargs = call(module, x, hx, **overrides)
    return rt.explain(lstm, x, hx, weights, **kwargs)


@pytest.fixture
def bilstm():
    return torch.nn.LSTM(4, 8, 2, bidirectional=True, batch_first=True).eval()


def test_covered_call_runs_the_triton_kernel_and_equals_nn_lstm(bilstm):
    x = torch.randn(2, 3, 4)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        x, hx, weights, kwargs = call(bilstm, x)
        out, (h, c) = lstm(x, hx, weights, **kwargs)
        want, (want_h, want_c) = bilstm(x)
    for got, ref in ((out, want), (h, want_h), (c, want_c)):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert explain(bilstm, torch.randn(2, 3, 4)).backend == "torch"  # grad mode on: autograd goes to torch


@pytest.mark.parametrize("case,feature", [
    ("grad", "requires_grad"), ("train-dropout", "dropout_active"), ("proj", "proj_size"), ("packed", "packed")])
def test_refusals_go_to_torch_with_a_typed_reason(case, feature):
    module = torch.nn.LSTM(4, 8, 2, bidirectional=True, batch_first=True, dropout=0.5 if case == "train-dropout" else 0.0,
                           proj_size=3 if case == "proj" else 0)
    module.train(case == "train-dropout")
    x = torch.randn(2, 3, 4)
    if case == "packed":
        x = pack_padded_sequence(x, torch.tensor([3, 2]), batch_first=True)
    with torch.set_grad_enabled(case == "grad"):
        route = explain(module, x)
        out = lstm(*call(module, x)[:3], **call(module, x)[3])
    assert route.backend == "torch"
    assert feature in str(route.skipped_reasons["triton"])
    assert (out[0].data if case == "packed" else out[0]).shape[-1] == (3 if case == "proj" else 8) * 2


def test_wide_hidden_and_half_dtypes_are_refused():
    wide = torch.nn.LSTM(2, 513, 1).eval()
    with torch.no_grad():
        assert explain(wide, torch.randn(1, 1, 2)).skipped_reasons["triton"].field == "hidden"
        half = torch.nn.LSTM(2, 4, 1).eval().to(torch.bfloat16)
        assert "dtype" in str(explain(half, torch.randn(1, 1, 2, dtype=torch.bfloat16)).skipped_reasons["triton"])


def test_bad_input_errors_name_the_op_and_the_argument(bilstm):
    x = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"^lstm: .*input"):
        lstm("x", None, bilstm._flat_weights, num_layers=2, bidirectional=True, batch_first=True)
    with pytest.raises(ValueError, match=r"^lstm: .*input"):
        lstm(torch.randn(2, 3, 4, 1), None, bilstm._flat_weights, num_layers=2, bidirectional=True)
    with pytest.raises(ValueError, match=r"^lstm: .*flat_weights"):
        lstm(x, None, bilstm._flat_weights[:4], num_layers=2, bidirectional=True, batch_first=True)
    with pytest.raises(ValueError, match=r"^lstm: .*input.size\(-1\) must be equal to input_size. Expected 4, got 5"):
        lstm(torch.randn(2, 3, 5), None, bilstm._flat_weights, num_layers=2, bidirectional=True, batch_first=True)
    with pytest.raises(ValueError, match=r"^lstm: .*h0"):
        lstm(x, (torch.zeros(4, 3, 8), torch.zeros(4, 2, 8)), bilstm._flat_weights, num_layers=2,
             bidirectional=True, batch_first=True)
    with pytest.raises(ValueError, match=r"^lstm: .*dropout"):
        lstm(x, None, bilstm._flat_weights, num_layers=2, bidirectional=True, batch_first=True, dropout=2.0)
    with pytest.raises(TypeError, match=r"^lstm: .*input dtype \(torch.float64\) does not match the weights' dtype"):
        lstm(x.double(), None, bilstm._flat_weights, num_layers=2, bidirectional=True, batch_first=True)
    mixed = list(bilstm._flat_weights)
    mixed[3] = mixed[3].double()
    with pytest.raises(TypeError, match=r"^lstm: .*flat_weights\[3\]"):
        lstm(x, None, mixed, num_layers=2, bidirectional=True, batch_first=True)
    with pytest.raises(TypeError, match=r"^lstm: .*num_layers"):
        lstm(x, None, bilstm._flat_weights, num_layers=2.0, bidirectional=True, batch_first=True)


@pytest.mark.parametrize("mistake", ["input_size", "unbatched_input_size", "h0_batch", "c0_hidden", "input_dtype"])
def test_the_modules_input_mistakes_raise_torchs_exception_type_naming_the_input(mistake):
    """rt.nn.LSTM blames the input (not the weights) for an input that does not fit the model, with the
    exception type nn.LSTM raises for the same mistake (and a ValueError/TypeError, as every rt check)."""
    module = torch.nn.LSTM(6, 9, 2, bidirectional=True, batch_first=True).eval()
    fast = rt.nn.LSTM.from_torch(module)
    x, hx = torch.randn(2, 5, 6), (torch.randn(4, 2, 9), torch.randn(4, 2, 9))
    x, hx, name = {
        "input_size": (torch.randn(2, 5, 7), None, "input"),
        "unbatched_input_size": (torch.randn(5, 7), None, "input"),
        "h0_batch": (x, (torch.randn(4, 3, 9), hx[1]), "h0"),
        "c0_hidden": (x, (hx[0], torch.randn(4, 2, 8)), "c0"),
        "input_dtype": (x.double(), None, "input dtype"),
    }[mistake]
    with pytest.raises(Exception) as from_torch:
        module(x, hx)
    with torch.no_grad(), pytest.raises(type(from_torch.value), match=name) as from_rt:
        fast(x, hx)
    assert isinstance(from_rt.value, (ValueError, TypeError))
    if mistake.endswith("input_size"):
        assert "Expected 6, got 7" in str(from_rt.value)
