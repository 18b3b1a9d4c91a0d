"""rt.integrations.pyannote.optimize on WeSpeaker ResNet embedding models (pyannote's structure, restated in
tests/reference/wespeaker_models.py): recognised by structure, swapped in place, same embeddings, the
stock state_dict (stock checkpoints load after optimize), float64 after .double(), and runs under
torch.inference_mode() as pyannote's Inference does, with weights built outside or inside it."""
import copy

import pytest
import torch
from torch import nn

import rlx_triton as rt
from rlx_triton.integrations import pyannote
from rlx_triton.integrations._wespeaker import is_wespeaker_model, is_wespeaker_trunk, optimize_wespeaker
from rlx_triton.nn.conv2d import BasicBlock, Bottleneck, Conv2d, FoldedBatchNorm2d, Projection, StatsPool
from tests.cuda_sync import assert_steady_state_never_syncs
from tests.reference.conv2d import rel_err
from tests.reference.fbank import speech_like
from tests.reference.wespeaker_models import randomize, tiny_wespeaker

SAMPLES = 4000  # 0.25 s at 16 kHz: 23 fbank frames, enough for three stride-2 stages
SHORT = 2000    # 11 fbank frames (2 after three stride-2 stages): the checkpoint and inference-mode cases


def _waveforms(batch=2, samples=SAMPLES):
    return speech_like(samples, batch=batch).float().unsqueeze(1)  # (batch, channel, samples)


@pytest.fixture(scope="module")
def stock_and_optimized():
    stock = tiny_wespeaker(m_channels=4, num_mel_bins=16)
    optimized = copy.deepcopy(stock)
    assert pyannote.optimize(optimized) is optimized
    return stock, optimized


def test_recognised_by_structure_only():
    model = tiny_wespeaker()
    assert is_wespeaker_model(model) and is_wespeaker_trunk(model.resnet)
    assert not is_wespeaker_model(model.resnet) and not is_wespeaker_trunk(nn.Sequential(nn.Conv2d(1, 1, 3)))
    renamed = type("NotAResNet", (nn.Module,), {})()
    assert not is_wespeaker_trunk(renamed)


def test_optimize_swaps_front_end_trunk_pooling_and_projection(stock_and_optimized):
    _, model = stock_and_optimized
    resnet = model.resnet
    assert isinstance(resnet.conv1, Conv2d) and isinstance(resnet.bn1, FoldedBatchNorm2d)
    assert resnet.bn1.weight is resnet.conv1.bn.weight
    assert all(isinstance(block, BasicBlock) for layer in (resnet.layer1, resnet.layer2, resnet.layer3,
                                                            resnet.layer4) for block in layer)
    assert isinstance(resnet.pool, StatsPool) and isinstance(resnet.seg_1, Projection)
    assert "rlx_front_end" in model._modules
    assert resnet.num_frames(101) == tiny_wespeaker().resnet.num_frames(101)


def test_optimize_wespeaker_lists_the_swapped_paths():
    swapped = optimize_wespeaker(tiny_wespeaker())
    assert swapped[:2] == ["compute_fbank", "resnet.conv1"]
    assert "resnet.layer3.5" in swapped and swapped[-2:] == ["resnet.pool", "resnet.seg_1"]
    with pytest.raises(TypeError, match="not a WeSpeaker"):
        optimize_wespeaker(nn.Linear(2, 2))


def test_embeddings_match_with_the_torch_fallback(stock_and_optimized):
    stock, optimized = stock_and_optimized
    wav = _waveforms()
    with torch.no_grad():
        expected = stock(wav)
        with rt.use_backend("torch"):
            got = optimized(wav)
    assert got.shape == expected.shape == (2, 256)
    assert rel_err(got, expected) < 1e-4


def test_embeddings_match_with_triton_kernels_in_the_interpreter(stock_and_optimized):
    stock, optimized = stock_and_optimized
    wav = _waveforms()
    with torch.no_grad():
        expected = stock(wav)
        with rt.use_backend("triton", strict=True):
            got = optimized(wav)
    assert rel_err(got, expected) < 1e-4


def test_masked_embeddings_match_through_forward_embedding(stock_and_optimized):
    """pyannote's pipeline path: forward_frames once, then forward_embedding(weights=speaker masks)."""
    stock, optimized = stock_and_optimized
    wav = _waveforms()
    masks = (torch.rand(2, 3, 59) > 0.4).float()  # (batch, speakers, segmentation frames)
    with torch.no_grad():
        frames = stock.forward_frames(wav)  # the trunk is checked above; here the weighted pooling + projection
        expected = stock.forward_embedding(frames, weights=masks)
        with rt.use_backend("triton", strict=True):
            got = optimized.forward_embedding(frames, weights=masks)
    assert got.shape == (2, 3, 256)
    assert rel_err(got, expected) < 1e-4


def test_explain_lists_the_routes_of_every_swapped_module(stock_and_optimized):
    _, optimized = stock_and_optimized
    routes = pyannote.explain(optimized, _waveforms(batch=1))
    assert "rlx_front_end" in routes and "resnet.conv1" in routes and "resnet.seg_1" in routes
    assert routes["resnet.pool"].op == "stats_pool"
    assert routes["resnet.layer2.0.conv2"].backend == "triton"


def test_bottleneck_siblings_are_swapped_too():
    stock = tiny_wespeaker(m_channels=4, num_mel_bins=16, bottleneck=True)
    optimized = copy.deepcopy(stock)
    pyannote.optimize(optimized)
    assert isinstance(optimized.resnet.layer1[0], Bottleneck)
    wav = _waveforms(batch=1)
    with torch.no_grad(), rt.use_backend("torch"):
        assert rel_err(optimized(wav), stock(wav)) < 1e-4


def test_a_running_average_front_end_stays_with_the_model():
    """fbank_centering_span set: the model's own compute_fbank is kept, the trunk is still swapped."""
    stock = tiny_wespeaker()
    stock.hparams.fbank_centering_span = 0.1
    optimized = copy.deepcopy(stock)
    swapped = optimize_wespeaker(optimized)
    assert "compute_fbank" not in swapped and "rlx_front_end" not in optimized._modules
    wav = _waveforms(batch=1)
    with torch.no_grad(), rt.use_backend("torch"):
        assert rel_err(optimized(wav), stock(wav)) < 1e-4


def test_a_bare_trunk_inside_another_module_is_found():
    holder = nn.Module()
    holder.embedding = randomize(tiny_wespeaker().resnet)
    pyannote.optimize(holder)
    assert isinstance(holder.embedding.layer1[0], BasicBlock)


BACKENDS = ["torch", "triton"]


def test_optimized_model_keeps_the_stock_state_dict(stock_and_optimized):
    stock, optimized = stock_and_optimized
    stock_state, state = stock.state_dict(), optimized.state_dict()
    assert list(state) == list(stock_state)
    assert all(torch.equal(state[key], stock_state[key]) for key in stock_state)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stock_checkpoint_loads_strictly_after_optimize(backend):
    """load_state_dict(stock checkpoint) into an optimized model: strict, and the convs fold the new
    BatchNorm statistics, so the embeddings are the checkpoint's."""
    optimized = pyannote.optimize(tiny_wespeaker())
    checkpoint = tiny_wespeaker(seed=3)
    optimized.load_state_dict(checkpoint.state_dict())
    wav = _waveforms(batch=1, samples=SHORT)
    with torch.no_grad():
        expected = checkpoint(wav)
        with rt.use_backend(backend, strict=True):
            got = optimized(wav)
    assert rel_err(got, expected) < 1e-4


def test_an_optimized_state_dict_loads_into_a_stock_model():
    optimized = pyannote.optimize(tiny_wespeaker(seed=3))
    stock = tiny_wespeaker()
    stock.load_state_dict(optimized.state_dict())
    wav = _waveforms(batch=1, samples=SHORT)
    with torch.no_grad(), rt.use_backend("torch"):
        assert rel_err(stock(wav), optimized(wav)) < 1e-4


def test_float64_after_optimize_gives_the_stock_float64_values(stock_and_optimized):
    stock, optimized = stock_and_optimized
    stock64, optimized64 = copy.deepcopy(stock).double(), copy.deepcopy(optimized).double()
    wav = _waveforms(batch=1).double()
    with torch.no_grad():
        got, expected = optimized64(wav), stock64(wav)
    assert got.dtype == torch.float64 and rel_err(got, expected) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("built", ["outside", "inside"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_embeddings_under_inference_mode_with_weights_built_outside_or_inside_it(backend, built, mode):
    """pyannote's Inference runs the embedding model inside torch.inference_mode(); a model loaded there has
    inference-tensor weights (no version counter)."""
    with torch.inference_mode(built == "inside"):
        stock = tiny_wespeaker()
        optimized = pyannote.optimize(copy.deepcopy(stock))
    wav = _waveforms(batch=1, samples=SHORT)
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context:
        expected = stock(wav)
        with rt.use_backend(backend, strict=True):
            got = optimized(wav)
    assert rel_err(got, expected) < 1e-4


@pytest.mark.gpu
def test_a_steady_state_embedding_forward_never_syncs_with_the_host():
    """The full-width trunk (its Winograd layers' in-kernel check for non-finite tiles included) after a warm-up
    forward: no .item(), no host copy, no blocking call."""
    from tests.reference.wespeaker_models import WeSpeakerResNet34

    torch.backends.cudnn.allow_tf32 = False
    model = pyannote.optimize(randomize(WeSpeakerResNet34()).cuda())
    wav = _waveforms(batch=2, samples=32000).cuda()
    with torch.inference_mode():
        assert_steady_state_never_syncs(lambda: model(wav))


@pytest.mark.gpu
def test_full_width_resnet34_matches_on_cuda_with_tf32_off():
    """The real geometry (m_channels 32, 80 bins, blocks 3/4/6/3) on a GPU: 2 chunks of 2 s."""
    from tests.reference.wespeaker_models import WeSpeakerResNet34

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stock = randomize(WeSpeakerResNet34()).cuda()
    optimized = pyannote.optimize(copy.deepcopy(stock))
    wav = _waveforms(batch=2, samples=32000).cuda()
    with torch.no_grad():
        expected = stock(wav)
        with rt.use_backend("triton", strict=True):
            got = optimized(wav)
    assert rel_err(got.cpu(), expected.cpu()) < 1e-4
