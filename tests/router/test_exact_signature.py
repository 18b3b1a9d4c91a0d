"""The exact-signature route cache of the lstm, segdense, conv (conv1d, sincnet, conv2d, linear, stats_pool) and
fbank ops: a call whose signature repeats is neither validated nor routed again, and a change of any part of
the signature (shape, dtype, autograd, grad mode, an option, the backend choice, strict mode) routes again."""
import contextlib
import importlib

import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from rlx_triton.ops import conv, conv2d, lstm, segdense
from rlx_triton.ops._checks import call_signature
from rlx_triton.router import clear_route_cache, recording_routes


def _tensor(*shape, dtype=torch.float32, grad=False):
    return torch.randn(*shape, dtype=dtype).requires_grad_(grad)


# each family: (dtype, batch, grad, option) -> (op, args, kwargs); `option` changes one option of the call
def _lstm(dtype=torch.float32, batch=1, grad=False, option=False):
    module = torch.nn.LSTM(4, 8).to(dtype).requires_grad_(False)  # the input alone asks for autograd
    return lstm.lstm, (_tensor(3, batch, 4, dtype=dtype, grad=grad), None, module._flat_weights), \
        dict(batch_first=option)


def _segdense(dtype=torch.float32, batch=1, grad=False, option=False):
    return segdense.segdense, (_tensor(batch, 3, 8, dtype=dtype, grad=grad), [_tensor(6, 8, dtype=dtype)],
                               [_tensor(6, dtype=dtype)], _tensor(3, 6, dtype=dtype), None), \
        dict(activation="sigmoid" if option else "log_softmax")


def _conv1d(dtype=torch.float32, batch=1, grad=False, option=False):
    return conv.conv1d, (_tensor(batch, 2, 9, dtype=dtype, grad=grad), _tensor(3, 2, 3, dtype=dtype)), \
        dict(padding=1 if option else 0)


def _sincnet(dtype=torch.float32, batch=1, grad=False, option=False):
    def ones(n):
        return torch.ones(n, dtype=dtype)

    return conv.sincnet, (_tensor(batch, 1, 40, dtype=dtype, grad=grad), _tensor(4, 1, 5, dtype=dtype), ones(1),
                          ones(1), [], [], [ones(4)], [ones(4)]), dict(stride=1, pool=2 if option else 3)


def _conv2d(dtype=torch.float32, batch=1, grad=False, option=False):
    return conv2d.conv2d, (_tensor(batch, 2, 5, 5, dtype=dtype, grad=grad), _tensor(3, 2, 3, 3, dtype=dtype)), \
        dict(padding=1, relu=option)


def _linear(dtype=torch.float32, batch=1, grad=False, option=False):  # option: with a bias
    return conv2d.linear, (_tensor(batch, 8, dtype=dtype, grad=grad), _tensor(4, 8, dtype=dtype),
                           _tensor(4, dtype=dtype) if option else None), {}


def _stats_pool(dtype=torch.float32, batch=1, grad=False, option=False):  # option: weighted frames
    return conv2d.stats_pool, (_tensor(batch, 4, 6, dtype=dtype, grad=grad),
                               torch.rand(batch, 6, dtype=dtype) if option else None), {}


def _fbank(dtype=torch.float32, batch=1, grad=False, option=False):
    return rt.fbank, (_tensor(batch, 1, 800, dtype=dtype, grad=grad),), dict(num_mel_bins=12 if option else 10)


FAMILIES = {"lstm": _lstm, "segdense": _segdense, "conv1d": _conv1d, "sincnet": _sincnet, "conv2d": _conv2d,
            "linear": _linear, "stats_pool": _stats_pool, "fbank": _fbank}

# part -> (first call: make() keywords, context), (second call: make() keywords, context)
PARTS = {
    "shape": ((dict(), contextlib.nullcontext), (dict(batch=2), contextlib.nullcontext)),
    "dtype": ((dict(), contextlib.nullcontext), (dict(dtype=torch.float64), contextlib.nullcontext)),
    "requires_grad": ((dict(), contextlib.nullcontext), (dict(grad=True), contextlib.nullcontext)),
    "grad_mode": ((dict(grad=True), torch.no_grad), (dict(grad=True), torch.enable_grad)),
    "option": ((dict(), contextlib.nullcontext), (dict(option=True), contextlib.nullcontext)),
    "backend": ((dict(), contextlib.nullcontext), (dict(), lambda: rt.use_backend("metal"))),
    "strict": ((dict(), contextlib.nullcontext), (dict(), lambda: rt.use_backend("torch", strict=True))),
}


@pytest.fixture
def routed():
    """Counts the calls that reach the router (a remembered signature does not), on the torch backend."""
    route_module = importlib.import_module("rlx_triton.router.route")
    calls = []
    original = route_module.route

    def counting(request, choice=None, call=None):
        calls.append(request)
        return original(request, choice, call)

    clear_route_cache()
    route_module.route = counting
    try:
        with rt.use_backend("torch"):
            yield calls
    finally:
        route_module.route = original
        clear_route_cache()


def _call(make, **keywords):
    op, args, kwargs = make(**keywords)
    return op(*args, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_repeated_call_is_routed_once_and_recorded_once_per_call(routed, family):
    with recording_routes() as routes:
        for _ in range(3):
            _call(FAMILIES[family])  # new tensors each time, the same signature
    assert len(routed) == 1
    assert len(routes) == 3 and len({route.backend for route in routes}) == 1


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_change_of_a_signature_part_routes_the_call_again(routed, family, part):
    (first, first_context), (second, second_context) = PARTS[part]
    with first_context():
        _call(FAMILIES[family], **first)
    assert len(routed) == 1
    with second_context():
        _call(FAMILIES[family], **second)
        assert len(routed) == 2
        _call(FAMILIES[family], **second)  # and that signature is remembered in turn
    assert len(routed) == 2


def test_an_option_of_another_type_is_validated_again(routed):
    op, args, _ = _lstm()
    op(*args, batch_first=True)
    with pytest.raises(TypeError, match="batch_first must be a bool"):
        op(*args, batch_first=1)  # 1 == True, but not a valid flag


def test_a_call_that_fails_validation_is_not_remembered(routed):
    op, (x, weights, biases, classifier, bias), kwargs = _segdense()
    for _ in range(2):
        with pytest.raises(ValueError, match="in_features"):
            op(x[..., :5], weights, biases, classifier, bias, **kwargs)
    assert routed == []


def test_no_signature_is_taken_while_torch_compile_traces(monkeypatch):
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _, args, kwargs = _segdense()
    assert call_signature("segdense", args, kwargs.values()) is None


def test_a_compiled_call_is_routed_when_the_graph_runs_and_its_signature_remembered(routed):
    """Under torch.compile the op's custom op runs the eager op when the graph runs (ops/_compiled.py): the first
    run routes, a repeated run finds the remembered signature."""
    op, args, kwargs = _segdense()
    compiled = torch.compile(lambda *tensors: op(*tensors, **kwargs), fullgraph=True, backend="eager")
    with torch.no_grad():
        compiled(*args)
        compiled(*args)
    assert len(routed) == 1


def test_packed_sequences_are_routed_every_time(routed):
    op, (x, _, weights), _ = _lstm()
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(3, 2, 4), torch.tensor([3, 2]))
    for _ in range(2):
        op(packed, None, weights)
    assert len(routed) == 2


def test_a_remembered_signature_computes_on_the_values_of_each_call(routed):
    with torch.inference_mode():  # inference tensors: no version counter, edited in place
        op, (x, weights, biases, classifier, bias), kwargs = _segdense()
        op(x, weights, biases, classifier, bias, **kwargs)
        weights[0].mul_(-2.0)
        out = op(x, weights, biases, classifier, bias, **kwargs)
        expected = torch.log_softmax(F.linear(F.leaky_relu(F.linear(x.double(), weights[0].double(),
                                                                    biases[0].double())), classifier.double()), -1)
    assert len(routed) == 1
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_a_remembered_signature_takes_inputs_of_any_layout(routed):
    op, (x, weight), kwargs = _conv2d()
    op(x, weight, **kwargs)
    transposed = x.transpose(2, 3)  # the same shape, other strides
    out = op(transposed, weight, **kwargs)
    assert len(routed) == 1
    expected = F.conv2d(transposed.double(), weight.double(), padding=1)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5 * 18)
