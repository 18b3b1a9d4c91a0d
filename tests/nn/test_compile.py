"""torch.compile(fullgraph=True) of every rt.nn module and of the optimized pyannote models (PyanNet,
WeSpeakerResNet34): one graph, no break, and the eager module's outputs, on the torch path and with the Triton
kernels forced (the interpreter), for the eager and aot_eager backends; inductor for the LSTM, whose graph is its
custom op alone (inductor's C++ build of the torch arithmetic around other modules' ops costs tens of seconds on
the CI machine; tests/ops/test_compile.py runs inductor on the ops). torch._dynamo.config.allow_rnn stays False.
The checks are tests/compile_checks.py's."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

import rlx_triton as rt
from rlx_triton.integrations import pyannote
from rlx_triton.perf.stock_models import randomize
from tests.compile_checks import assert_compiled_equals_eager, assert_one_graph
from tests.reference import wespeaker_models as wespeaker
from tests.reference.conv import random_sincnet
from tests.reference.pyannote_models import make_pyannet


def _seeded(build):
    """A case's make(): the module built once, inputs drawn from a fixed seed on every call."""
    module = {}

    def make():
        if "built" not in module:
            torch.manual_seed(0)
            module["built"] = build()
        fn, shapes = module["built"]
        generator = torch.Generator().manual_seed(1)
        return fn, tuple(torch.randn(shape, generator=generator) for shape in shapes)

    return make


def _block(kind: str):
    stock = randomize(wespeaker.BasicBlock(4, 8, stride=2) if kind == "basic" else wespeaker.Bottleneck(8, 2))
    fast = (rt.nn.BasicBlock if kind == "basic" else rt.nn.Bottleneck).from_torch(stock)
    return fast, [(2, 4 if kind == "basic" else 8, 6, 7)]


def _pyannet():
    model = pyannote.optimize(make_pyannet())
    return model, [(1, 1, 1300)]   # two output frames


def _wespeaker():
    model = pyannote.optimize(wespeaker.tiny_wespeaker(num_mel_bins=8))   # 8 bins: 1 after three stride-2 stages
    return model, [(1, 1, 2000)]   # 11 fbank frames: 2 after the three stride-2 stages


CASES = {
    "Fbank": _seeded(lambda: (rt.nn.Fbank.wespeaker(num_mel_bins=8), [(1, 1, 800)])),
    "SincNet": _seeded(lambda: (rt.nn.SincNet.from_pyannote(random_sincnet()), [(1, 1, 1300)])),
    "Conv1d": _seeded(lambda: (rt.nn.Conv1d.from_torch(nn.Conv1d(4, 6, 3)), [(2, 4, 20)])),
    "Conv2d": _seeded(lambda: (rt.nn.Conv2d.from_torch(nn.Conv2d(3, 4, 3, padding=1, bias=False),
                                                       randomize(nn.BatchNorm2d(4)), relu=True), [(2, 3, 6, 7)])),
    "StatsPool": _seeded(lambda: (rt.nn.StatsPool(), [(2, 8, 5)])),
    "Projection": _seeded(lambda: (rt.nn.Projection.from_torch(nn.Linear(8, 4)), [(3, 8)])),
    "BasicBlock": _seeded(lambda: _block("basic")),
    "Bottleneck": _seeded(lambda: _block("bottleneck")),
    "LSTM": _seeded(lambda: (rt.nn.LSTM(8, 16, num_layers=2, bidirectional=True, batch_first=True).eval(),
                             [(2, 5, 8)])),
    "SegDense": _seeded(lambda: (rt.nn.SegDense(nn.ModuleList([nn.Linear(8, 6)]), nn.Linear(6, 5)), [(2, 3, 8)])),
    "PyanNet": _seeded(_pyannet),
    "WeSpeakerResNet34": _seeded(_wespeaker),
}


def test_every_rt_nn_module_has_a_case():
    assert set(rt.nn.__all__) <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_one_graph_without_a_break(name):
    assert_one_graph(CASES[name])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", CASES)
def test_compiled_module_gives_the_eager_outputs(name, backend):
    assert_compiled_equals_eager(name, CASES[name], backend)
    assert torch._dynamo.config.allow_rnn is False


def test_compiled_lstm_on_inductor_gives_the_eager_outputs():
    assert_compiled_equals_eager("LSTM", CASES["LSTM"], "inductor")


def test_compiled_module_under_inference_mode_gives_the_eager_outputs():
    """torch.inference_mode around the compiled and the eager calls (pyannote's Inference runs models so)."""
    assert_compiled_equals_eager("SegDense under inference_mode", CASES["SegDense"], "aot_eager",
                                 grad_mode=torch.inference_mode)


def test_a_compiled_module_routes_each_call_under_the_backend_choice_in_force_then():
    """The route is decided when the compiled graph runs, not baked in while tracing: the same compiled LSTM runs
    the kernel in one use_backend block and torch's LSTM in another (recorded per call)."""
    from rlx_triton.router import recording_routes

    torch._dynamo.reset()
    lstm = rt.nn.LSTM(4, 8, batch_first=True).eval()
    compiled = torch.compile(copy.deepcopy(lstm), fullgraph=True, backend="eager")
    x = torch.randn(2, 3, 4)
    with torch.no_grad(), recording_routes() as routes:
        with rt.use_backend("triton", strict=True):
            compiled(x)
        with rt.use_backend("torch"):
            compiled(x)
    assert [route.backend for route in routes] == ["triton", "torch"]


def test_a_call_autograd_records_runs_torch_eagerly_and_gives_gradients():
    """Autograd calls leave the graph (the kernels are forward-only): the compiled module's gradients are torch's."""
    torch._dynamo.reset()
    lstm = rt.nn.LSTM(4, 8, batch_first=True)
    compiled = torch.compile(lstm, backend="aot_eager")
    x = torch.randn(2, 3, 4, requires_grad=True)
    compiled(x)[0].sum().backward()
    want = x.grad.clone()
    x.grad = None
    lstm(x)[0].sum().backward()
    torch.testing.assert_close(want, x.grad, rtol=1e-6, atol=1e-6)
