"""rt.explain on what a new user passes it: an op without its call, a model that runs no rlx module."""
import warnings

import pytest
import torch

import rlx_triton as rt


@pytest.mark.parametrize("op, first_argument", [
    (rt.fbank, "waveform"), (rt.sdpa_decode, "query"), (rt.scaled_dot_product_attention, "query"),
    (rt.flash_attn_with_kvcache, "q"),
])
def test_an_op_without_its_call_is_a_type_error_naming_the_public_op(op, first_argument):
    with pytest.raises(TypeError) as caught:
        rt.explain(op)
    message = str(caught.value)
    assert message.startswith(f"explain: {op.__name__}() missing a required argument: '{first_argument}'")
    assert "_request" not in message


def test_a_call_with_an_unknown_keyword_names_the_op_too():
    with pytest.raises(TypeError, match=r"^explain: fbank\(\) got an unexpected keyword argument 'bins'"):
        rt.explain(rt.fbank, torch.zeros(1600), bins=80)


@pytest.mark.parametrize("model", [torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())])
def test_a_model_without_rlx_modules_warns_and_says_what_to_do(model):
    with pytest.warns(UserWarning, match="runs no rlx_triton module") as caught:
        routes = rt.explain(model, torch.randn(2, 3))
    assert routes == {}
    assert "rt.integrations.pyannote.optimize(model)" in str(caught[0].message)


def test_a_model_with_rlx_modules_explains_them_without_a_warning():
    model = torch.nn.Sequential(rt.nn.LSTM(3, 5, batch_first=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        routes = rt.explain(model, torch.randn(2, 4, 3))
    assert list(routes) == ["0"] and routes["0"].op == "lstm"


class _DescribedForward:
    """An installed instance `forward` (as a CUDA-graph replay is) that describes itself to explain."""

    def __init__(self, module):
        self.module = module
        self.ran_while_explaining = []

    def __call__(self, *args):
        from rlx_triton.explaining import explaining_now

        self.ran_while_explaining.append(explaining_now())
        return type(self.module).forward(self.module, *args)

    def explain_forward(self, path, inputs, kwargs, called_directly):
        return {f"{path}#note": ("note", called_directly, tuple(tuple(x.shape) for x in inputs))}


def test_an_installed_forward_describes_itself_and_runs_knowing_it_is_explained():
    model = torch.nn.Sequential(rt.nn.LSTM(3, 5, batch_first=True))
    forward = _DescribedForward(model)
    model.forward = forward
    routes = rt.explain(model, torch.randn(2, 4, 3))
    assert routes["#note"] == ("note", True, ((2, 4, 3),))
    assert routes["0"].op == "lstm"
    assert forward.ran_while_explaining == [True]
    model(torch.randn(2, 4, 3))
    assert forward.ran_while_explaining == [True, False]


def test_the_pyannote_explain_of_a_model_is_the_generic_one_and_warns_alike():
    from rlx_triton.integrations import pyannote

    model = torch.nn.Sequential(rt.nn.LSTM(3, 5, batch_first=True))
    x = torch.randn(2, 4, 3)
    with rt.use_backend("torch"):
        assert pyannote.explain(model, x) == rt.explain(model, x)
    with pytest.warns(UserWarning, match="nothing was routed"):
        assert pyannote.explain(torch.nn.Linear(3, 4), torch.randn(2, 3)) == {}
