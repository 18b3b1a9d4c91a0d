"""rt.integrations.pyannote: optimize() recognises PyanNet by structure and swaps in rlx modules in
place (same outputs within 1e-4 with the torch fallback and with the Triton kernels forced, same
state_dict keys, shared parameters, float64 after .double(), under torch.inference_mode() with weights
built outside or inside it); unknown models are unchanged; pipelines are walked; explain() reports
the route of every swapped module; other modules register recognisers."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import rlx_triton as rt
from rlx_triton.integrations import pyannote
from rlx_triton.nn import LSTM, SegDense
from tests.cuda_sync import assert_steady_state_never_syncs
from tests.reference.pyannote_models import SpeakerDiarization, make_pyannet

SAMPLES = 2000   # the shortest audio the tiny tests need: 4 output frames


def waveforms(batch=2):
    return torch.randn(batch, 1, SAMPLES)


def test_optimized_pyannet_gives_the_same_output_with_the_torch_fallback():
    model = make_pyannet()
    x = waveforms()
    with torch.no_grad():
        want = model(x)
        keys = list(model.state_dict())
        params = {name: p for name, p in model.named_parameters()}
        assert pyannote.optimize(model) is model
        with rt.use_backend("torch"):
            got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert isinstance(model.lstm, LSTM) and isinstance(model.classifier, SegDense)
    assert list(model.state_dict()) == keys
    assert all(p is params[name] for name, p in model.named_parameters())


def test_optimized_pyannet_gives_the_same_output_on_the_triton_kernels():
    model = make_pyannet()
    x = waveforms()
    with torch.no_grad():
        want = model(x)
        pyannote.optimize(model)
        with rt.use_backend("triton", strict=True):
            got = model(x)
    assert got.shape == (2, 4, 7)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("monolithic", [True, False], ids=["monolithic", "layer-list"])
def test_lstm_stack_forms_and_the_multilabel_head(monolithic):
    model = make_pyannet(hidden=8, monolithic=monolithic, linear_layers=1, linear_hidden=8, powerset=False)
    feats = torch.randn(2, 3, 60)
    with torch.no_grad():
        want = model.classifier(torch.nn.functional.leaky_relu(model.linear[0](
            model.lstm(feats)[0] if monolithic else model.lstm[1](model.lstm[0](feats)[0])[0])))
        want = model.activation(want)
        pyannote.optimize(model)
        lstms = [model.lstm] if monolithic else list(model.lstm)
        assert all(isinstance(m, LSTM) for m in lstms)
        with rt.use_backend("triton", strict=True):
            out = feats
            for m in lstms:
                out = m(out)[0]
            got = model.activation(model.classifier(out))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_optimize_is_idempotent_and_handles_a_head_without_linear_layers():
    model = make_pyannet(hidden=8, linear_layers=0, powerset=False)
    x = waveforms(1)
    with torch.no_grad():
        want = model(x)
        pyannote.optimize(pyannote.optimize(model))
        assert type(model.lstm) is LSTM
        assert isinstance(model.classifier, SegDense) and model.classifier.activation == "sigmoid"
        with rt.use_backend("torch"):
            got = model(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_every_module_of_an_optimized_model_keeps_the_models_mode(training):
    from tests.reference.wespeaker_models import tiny_wespeaker

    models = [make_pyannet(), tiny_wespeaker()]
    for model in models:
        model.train(training)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a trunk in training mode warns that its BatchNorms are folded
            optimized = rt.integrations.pyannote.optimize(model)
        modes = {name: module.training for name, module in optimized.named_modules(remove_duplicate=False)}
        assert set(modes.values()) == {training}, [name for name, mode in modes.items() if mode != training]


def test_unknown_models_and_modules_are_unchanged():
    plain = torch.nn.Sequential(torch.nn.LSTM(3, 4), torch.nn.Linear(4, 2))
    assert pyannote.optimize(plain) is plain
    assert type(plain[0]) is torch.nn.LSTM and type(plain[1]) is torch.nn.Linear
    assert pyannote.optimize(object()) is not None


def test_a_pipeline_has_every_model_it_holds_optimized():
    model = make_pyannet(hidden=8, linear_hidden=8)
    pipeline = SpeakerDiarization(model)
    assert pyannote.optimize(pipeline) is pipeline
    assert isinstance(pipeline._segmentation.model.lstm, LSTM)


def test_explain_reports_each_swapped_module_route():
    model = pyannote.optimize(make_pyannet(hidden=8, linear_hidden=8))
    with rt.use_backend("torch"):
        routes = pyannote.explain(model, waveforms(1))
    assert {"sincnet", "lstm", "classifier"} <= set(routes)
    assert all(route.backend == "torch" for route in routes.values())


def test_registered_recognisers_run_first_and_see_every_module():
    seen = []

    class Marker(torch.nn.Module):
        pass

    def swap(module):
        seen.append(module)
        return torch.nn.Identity()

    pyannote.register_recogniser("test-marker", lambda m: isinstance(m, Marker), swap)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(Marker()))
        pyannote.optimize(model)
        assert isinstance(model[1][0], torch.nn.Identity) and len(seen) == 1
        assert "test-marker" in [r.name for r in pyannote.recognisers()]
    finally:
        pyannote._RECOGNISERS.pop("test-marker")
    with pytest.raises(ValueError):
        pyannote.register_recogniser("", lambda m: False, lambda m: m)


def test_float64_after_optimize_gives_the_stock_float64_values():
    model = make_pyannet()
    stock = copy.deepcopy(model).double()
    optimized = pyannote.optimize(model).double()
    x = waveforms().double()
    with torch.no_grad():
        got, want = optimized(x), stock(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("built", ["outside", "inside"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_segmentation_under_inference_mode_with_weights_built_outside_or_inside_it(backend, built, mode):
    """pyannote's Inference runs the segmentation model inside torch.inference_mode(); a model loaded there
    has inference-tensor weights (no version counter)."""
    with torch.inference_mode(built == "inside"):
        model = make_pyannet(hidden=8, linear_hidden=8)
        optimized = pyannote.optimize(copy.deepcopy(model))
    x = waveforms(1)
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        want = model(x)
        with rt.use_backend(backend, strict=True):
            got = optimized(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_segmentation_3_0_shape_on_cuda_after_optimize():
    """10 s chunks, 4-layer BiLSTM: the optimized model's routed kernels match the stock model (TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = make_pyannet(hidden=128, lstm_layers=4, linear_hidden=128).cuda()
    x = torch.randn(4, 1, 160000, device="cuda")
    with torch.no_grad():
        want = model(x)
        pyannote.optimize(model)
        routes = pyannote.explain(model, x)
        got = model(x)
    assert routes["lstm"].backend == "triton" and routes["classifier"].backend == "triton"
    assert got.shape == (4, 589, 7)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_a_steady_state_segmentation_forward_never_syncs_with_the_host():
    torch.backends.cuda.matmul.allow_tf32 = False
    model = pyannote.optimize(make_pyannet(hidden=128, lstm_layers=4, linear_hidden=128).cuda())
    x = torch.randn(2, 1, 32000, device="cuda")
    with torch.inference_mode():
        assert_steady_state_never_syncs(lambda: model(x))


# ------------------------------------------------------------------------ cuda_graphs=True
def test_cuda_graphs_off_cuda_run_eagerly_and_explain_says_why():
    model = make_pyannet(hidden=8, linear_hidden=8)
    x = waveforms(1)
    with torch.no_grad():
        want = model(x)
        optimized = pyannote.optimize(copy.deepcopy(model), cuda_graphs=True)
        assert isinstance(optimized.forward, pyannote.SegmentationGraphs)
        with rt.use_backend("torch"):
            got = optimized(x)
            routes = pyannote.explain(optimized, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    note = routes["#cuda_graphs"]
    assert note.decision == "eager" and "cpu" in note.reason and note.captured_shapes == ()
    assert {"sincnet", "lstm", "classifier"} <= set(routes)


def test_cuda_graphs_keep_the_state_dict_copy_and_install_once():
    model = make_pyannet(hidden=8, linear_hidden=8)
    keys = list(model.state_dict())
    optimized = pyannote.optimize(model, cuda_graphs=True)
    graphs = optimized.forward
    assert pyannote.optimize(optimized, cuda_graphs=True).forward is graphs      # idempotent
    assert list(optimized.state_dict()) == keys
    clone = copy.deepcopy(optimized)
    assert isinstance(clone.forward, pyannote.SegmentationGraphs) and clone.forward.model is clone
    assert clone.forward.graphs == {}
    with pytest.raises(TypeError, match="cuda_graphs"):
        pyannote.optimize(model, cuda_graphs="yes")


def test_cuda_graphs_reach_the_models_of_a_pipeline():
    pipeline = SpeakerDiarization(make_pyannet(hidden=8, linear_hidden=8))
    pyannote.optimize(pipeline, cuda_graphs=True)
    assert isinstance(pipeline._segmentation.model.forward, pyannote.SegmentationGraphs)


def graphed_segmentation():
    """(stock, optimized with cuda_graphs=True) segmentation-3.0-shaped models on the GPU, TF32 off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stock = make_pyannet(hidden=128, lstm_layers=4, linear_hidden=128).cuda()
    return stock, pyannote.optimize(copy.deepcopy(stock), cuda_graphs=True)


@pytest.mark.gpu
def test_cuda_graphs_capture_the_segmentation_forward_per_shape_and_replay_it():
    """The first call of a shape runs eagerly, the second captures, later ones replay the graph: the same
    values as the stock model; a weight edited in place is captured again; another shape runs eagerly."""
    stock, model = graphed_segmentation()
    x = torch.randn(4, 1, 32000, device="cuda")
    with torch.inference_mode():
        want = stock(x)
        assert pyannote.explain(model, x)["#cuda_graphs"].decision == "eager"
        first = model(x)
        assert pyannote.explain(model, x)["#cuda_graphs"].decision == "capture"
        second = model(x)
        routes = pyannote.explain(model, x)
        assert routes["#cuda_graphs"].decision == "replay" and routes["lstm"].backend == "triton"
        third = model(x.clone())
        for got in (first, second, third):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        other = torch.randn(2, 1, 32000, device="cuda")
        torch.testing.assert_close(model(other), stock(other), rtol=1e-4, atol=1e-4)
    assert len(model.forward.graphs) == 1
    with torch.no_grad():
        for module in (stock, model):
            module.classifier.bias.add_(0.25)
    with torch.inference_mode():
        assert pyannote.explain(model, x)["#cuda_graphs"].decision == "capture"
        torch.testing.assert_close(model(x), stock(x), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_cuda_graphs_capture_grow_allocate_replay_on_memory_of_their_own():
    """A captured segmentation graph replays correctly after a larger forward ran and new tensors took the
    freed memory: nothing it uses was freed, replaced or shared."""
    stock, model = graphed_segmentation()
    x = torch.randn(2, 1, 32000, device="cuda")
    with torch.inference_mode():
        want = stock(x)
        model(x)
        model(x)                                                            # captured
        assert pyannote.explain(model, x)["#cuda_graphs"].decision == "replay"
        big = torch.randn(8, 1, 160000, device="cuda")
        torch.testing.assert_close(model(big), stock(big), rtol=1e-4, atol=1e-4)    # grow
        junk = [torch.full((1 << 22,), float("nan"), device="cuda") for _ in range(8)]   # allocate
        for _ in range(3):
            torch.testing.assert_close(model(x), want, rtol=1e-4, atol=1e-4)          # replay
    assert all(bool(j[:1].isnan().all()) for j in junk)


def test_rt_explain_of_an_optimized_model_is_pyannote_explain():
    model = pyannote.optimize(make_pyannet(hidden=8, linear_hidden=8))
    x = waveforms(1)
    with rt.use_backend("torch"):
        assert rt.explain(model, x) == pyannote.explain(model, x)
