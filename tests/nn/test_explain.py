"""rt.explain and every rt.nn module's `explain`: the route a forward takes, without running it, the same
answer either way; a model holding rt.nn modules gives {module path: Route}."""
import pytest
import torch
import torch.nn as nn

import rlx_triton as rt
from rlx_triton.nn.conv2d import BasicBlock
from tests.reference.conv import random_sincnet
from tests.reference.wespeaker_models import BasicBlock as StockBasicBlock


def test_every_rt_nn_module_has_explain():
    missing = [name for name in rt.nn.__all__ if not callable(getattr(getattr(rt.nn, name), "explain", None))]
    assert missing == []


def _modules_and_inputs():
    torch.manual_seed(0)
    return [
        ("Fbank", rt.nn.Fbank(num_mel_bins=7), torch.randn(2, 1, 800), "fbank"),
        ("SincNet", rt.nn.SincNet.from_pyannote(random_sincnet()), torch.randn(1, 1, 2000), "sincnet"),
        ("Conv1d", rt.nn.Conv1d.from_torch(nn.Conv1d(3, 5, 3)), torch.randn(1, 3, 9), "conv1d"),
        ("Conv2d", rt.nn.Conv2d.from_torch(nn.Conv2d(2, 3, 3, padding=1)), torch.randn(1, 2, 5, 7), "conv2d"),
        ("StatsPool", rt.nn.StatsPool(), torch.randn(2, 3, 7), "stats_pool"),
        ("Projection", rt.nn.Projection.from_torch(nn.Linear(6, 2)), torch.randn(3, 6), "conv2d"),
        ("LSTM", rt.nn.LSTM(3, 4, batch_first=True), torch.randn(1, 7, 3), "lstm"),
        ("SegDense", rt.nn.SegDense([nn.Linear(4, 5)], nn.Linear(5, 3)), torch.randn(2, 7, 4), "segdense"),
    ]


@pytest.mark.parametrize("name, module, x, op", _modules_and_inputs(), ids=lambda v: v if isinstance(v, str) else "")
def test_rt_explain_of_a_module_is_its_explain_and_names_its_op(name, module, x, op):
    with torch.no_grad():
        route = rt.explain(module, x)
        assert route == module.explain(x)
    assert isinstance(route, rt.Route) and route.op == op


def test_conv1d_that_runs_nn_conv1d_forward_explains_the_torch_op():
    conv = rt.nn.Conv1d.from_torch(nn.Conv1d(4, 4, 3, groups=2))
    route = rt.explain(conv, torch.randn(1, 4, 9))
    assert route.backend == "torch" and "groups=2" in route.evidence_detail


def test_a_residual_block_explains_each_conv():
    block = BasicBlock.from_torch(StockBasicBlock(2, 4, stride=2).eval())
    with rt.use_backend("torch"):
        routes = rt.explain(block, torch.randn(1, 2, 6, 6))
    assert sorted(routes) == ["conv1", "conv2", "shortcut.0"]
    assert all(route.op == "conv2d" for route in routes.values())


def test_a_model_holding_rt_nn_modules_gives_a_route_per_module():
    model = nn.Sequential(nn.Linear(3, 3), rt.nn.LSTM(3, 4, batch_first=True))
    routes = rt.explain(model, torch.randn(1, 5, 3))
    assert list(routes) == ["1"] and routes["1"].op == "lstm"


def test_an_op_is_explained_as_before():
    route = rt.explain(rt.fbank, torch.randn(800), num_mel_bins=7)
    assert route.family == "fbank" and route.op == "fbank"


def test_anything_else_is_a_type_error():
    with pytest.raises(TypeError, match="explain: 'len' is not an rlx_triton op or a torch.nn.Module"):
        rt.explain(len, [1])
