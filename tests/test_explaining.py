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


# ---- rt.explain_as: the routes on a named GPU, from a machine without one --------------------------------------

def _decode_call():
    q = torch.randn(1, 32, 1, 128, dtype=torch.float16)
    k = torch.randn(1, 8, 512, 128, dtype=torch.float16)
    return q, k


def test_explain_as_routes_a_call_as_on_the_named_gpu_without_touching_the_arguments():
    q, k = _decode_call()
    route = rt.explain_as("h200", rt.sdpa_decode, q, k, k)
    assert route.family == "sdpa_decode" and route.request.device.type == "meta"
    assert route.decided_by in ("estimated", "default") and q.device.type == "cpu"
    assert route.skipped_reasons.get("triton") is None or route.skipped_reasons["triton"].kind == "slower"


def test_explain_as_an_unknown_device_names_the_choices():
    with pytest.raises(ValueError, match="unknown device 'h300'"):
        rt.explain_as("h300", rt.fbank, torch.randn(1600))


def test_explain_as_a_model_copies_it_to_meta_and_leaves_the_model_as_it_was():
    model = torch.nn.Sequential(rt.nn.LSTM(3, 5, batch_first=True))
    routes = rt.explain_as("a100", model, torch.randn(2, 4, 3))
    assert list(routes) == ["0"] and routes["0"].op == "lstm" and routes["0"].request.device.type == "meta"
    assert next(model.parameters()).device.type == "cpu"


# a process without TRITON_INTERPRET compiles the kernels' launches for the GPU and prices both sides
ESTIMATED_DECODE = """
import torch, rlx_triton as rt
q, k = torch.randn(1, 32, 1, 128, dtype=torch.float16), torch.randn(1, 8, 512, 128, dtype=torch.float16)
route = rt.explain_as("h200", rt.sdpa_decode, q, k, k)
times = {t.backend: t.time_us for t in route.timings}
assert route.decided_by == "estimated", str(route)
assert set(times) == {"triton", "torch"} and all(t > 0 for t in times.values()), times
assert [t.backend for t in route.timings if t.chosen] == [route.backend]
assert ("decided by estimated" in str(route)) and ("us estimated" in str(route))

# an optimized pyannote segmentation model: each rlx module's route weighed against the library op
from rlx_triton.integrations import pyannote
from rlx_triton.perf import stock_models
model = pyannote.optimize(stock_models.pyannet())
routes = rt.explain_as("h200", model, torch.randn(2, 1, 32000))
assert set(routes) == {"sincnet", "lstm", "classifier"}, sorted(routes)
for path, module_route in routes.items():
    assert module_route.decided_by == "estimated", str(module_route)
    assert {t.backend for t in module_route.timings} == {"triton", "torch"}, (path, module_route.timings)
    assert sum(t.chosen for t in module_route.timings) == 1
print("ok", route.backend, times)
"""


def test_explain_as_estimates_the_kernel_and_the_library_of_a_call_and_of_a_model_where_the_kernels_compile(tmp_path):
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    # read from stdin, as a user's script without a __main__ guard: nothing may start a process of its own
    result = subprocess.run([sys.executable, "-"], input=ESTIMATED_DECODE, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok") and "Traceback" not in result.stderr, result.stderr[-2000:]
