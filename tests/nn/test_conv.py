"""rt.nn.SincNet.from_pyannote shares pyannote's parameters and gives its forward; rt.nn.Conv1d is a
drop-in nn.Conv1d: the same errors for a wrong input, float64 after .double(), and weights that are
inference tensors or are edited in place between calls."""
import copy

import pytest
import torch
import torch.nn as nn

import rlx_triton as rt
from rlx_triton.nn.conv import Conv1d, SincNet
from rlx_triton.ops.conv import ConvEpilogue
from tests.reference.conv import assert_matches_float64, conv1d_float64, random_sincnet, sincnet_float64

BACKENDS = ["torch", "triton"]


def test_public_names():
    assert rt.nn.SincNet is SincNet and rt.nn.Conv1d is Conv1d


def test_from_pyannote_shares_parameters_and_state_dict_keys():
    module = random_sincnet()
    rlx = SincNet.from_pyannote(module)
    assert list(rlx.state_dict()) == list(module.state_dict())
    ours = dict(rlx.named_parameters())
    for name, param in module.named_parameters():
        assert ours[name] is param                      # the same nn.Parameter, not a copy
    assert "conv1d.0.filterbank.low_hz_" in ours and "conv1d.0.filterbank.band_hz_" in ours
    rlx.load_state_dict(random_sincnet(seed=1).state_dict())
    assert torch.equal(module.norm1d[2].bias, random_sincnet(seed=1).norm1d[2].bias)


def test_forward_on_triton_matches_the_pyannote_module():
    module = random_sincnet()
    rlx = SincNet.from_pyannote(module)
    wav = torch.randn(1, 1, 3200)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out = rlx(wav)
    with torch.no_grad():
        ref = module(wav)
    assert out.shape == ref.shape
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-4


def test_sincnet_follows_weight_updates():
    module = random_sincnet()
    rlx = SincNet.from_pyannote(module)
    wav = torch.randn(1, 1, 3200)
    with torch.no_grad(), rt.use_backend("torch"):
        before = rlx(wav)
        module.conv1d[0].filterbank.band_hz_.mul_(1.5)   # shared parameter, changed in place
        after = rlx(wav)
        assert not torch.equal(before, after)
        assert torch.equal(after, module(wav))


def test_sincnet_training_falls_back_to_torch_and_has_gradients():
    module = random_sincnet()
    rlx = SincNet.from_pyannote(module)
    rlx(torch.randn(1, 1, 3200)).sum().backward()
    assert module.conv1d[0].filterbank.low_hz_.grad is not None


def test_from_pyannote_refuses_what_it_does_not_reproduce():
    module = random_sincnet()
    module.streaming = True
    with pytest.raises(ValueError, match="streaming"):
        SincNet.from_pyannote(module)
    module = random_sincnet()
    module.norm1d[1] = nn.InstanceNorm1d(60, affine=False)
    with pytest.raises(ValueError, match="InstanceNorm1d"):
        SincNet.from_pyannote(module)
    with pytest.raises(ValueError, match="not a pyannote SincNet"):
        SincNet.from_pyannote(nn.Linear(2, 2))


def test_conv1d_from_torch_shares_weights_and_matches():
    torch_conv = nn.Conv1d(7, 11, 5, stride=2, padding=2, dilation=1)
    conv = Conv1d.from_torch(torch_conv)
    assert conv.weight is torch_conv.weight and conv.bias is torch_conv.bias
    x = torch.randn(2, 7, 80)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out = conv(x)
    assert torch.allclose(out, torch_conv(x), rtol=1e-5, atol=1e-5)


def test_conv1d_with_a_fused_epilogue():
    torch_conv = nn.Conv1d(7, 11, 5)
    conv = Conv1d.from_torch(torch_conv, epilogue=ConvEpilogue(pool=3, negative_slope=0.01))
    x = torch.randn(1, 7, 80)
    with torch.no_grad(), rt.use_backend("triton", strict=True):
        out = conv(x)
    ref = conv1d_float64(x, torch_conv.weight, torch_conv.bias, pool=3, negative_slope=0.01)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_conv1d_grouped_runs_torch_forward():
    torch_conv = nn.Conv1d(4, 8, 3, groups=2, padding_mode="reflect", padding=1)
    conv = Conv1d.from_torch(torch_conv)
    x = torch.randn(1, 4, 20)
    assert torch.equal(conv(x), torch_conv(x))


def test_conv1d_with_wrong_input_channels_raises_like_nn_conv1d():
    torch_conv = nn.Conv1d(3, 4, 3)
    x = torch.randn(1, 5, 10)
    with pytest.raises(RuntimeError) as torch_error:
        torch_conv(x)
    with pytest.raises(type(torch_error.value), match=r"expected input\[1, 5, 10\] to have 3 channels") as ours:
        Conv1d.from_torch(torch_conv)(x)
    assert str(ours.value) == str(torch_error.value)


def test_sincnet_with_wrong_input_channels_raises_like_pyannote():
    module = random_sincnet()
    wav = torch.randn(1, 2, 2000)
    with pytest.raises(ValueError) as pyannote_error:       # its InstanceNorm1d(1) sees 2 channels
        module(wav)
    with pytest.raises(type(pyannote_error.value), match="waveforms .* expected 1 channel, got 2"):
        SincNet.from_pyannote(module)(wav)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sincnet_follows_in_place_weight_updates(backend):
    module = random_sincnet()
    rlx = SincNet.from_pyannote(module)
    wav = torch.randn(1, 1, 2000)
    with torch.no_grad(), rt.use_backend(backend, strict=True):
        before = rlx(wav)
        module.conv1d[0].filterbank.band_hz_.mul_(1.5)   # shared parameters, changed in place
        module.conv1d[1].weight.mul_(-1.0)
        after = rlx(wav)
    assert not torch.allclose(before, after, atol=1e-3)
    assert_matches_float64(after, sincnet_float64(module, wav), 1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("built", ["outside", "inside"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_sincnet_with_weights_built_inside_or_outside_inference_mode(backend, built, mode):
    """pyannote's Inference runs models inside torch.inference_mode(); a model built there has
    inference-tensor weights (no version counter). Both run, in inference mode and under no_grad, and
    an in-place edit inside inference mode between calls is seen."""
    with torch.inference_mode(built == "inside"):
        module = random_sincnet()
        rlx = SincNet.from_pyannote(module)
    wav = torch.randn(1, 1, 2000)
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context, rt.use_backend(backend, strict=True):
        out = rlx(wav)
    assert_matches_float64(out, sincnet_float64(module, wav), 1e-4)
    with torch.inference_mode(), rt.use_backend(backend, strict=True):
        module.norm1d[2].bias.add_(1.0)
        edited = rlx(wav)
    assert_matches_float64(edited, sincnet_float64(module, wav), 1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("built", ["outside", "inside"])
def test_conv1d_with_weights_built_inside_or_outside_inference_mode(backend, built):
    with torch.inference_mode(built == "inside"):
        torch_conv = nn.Conv1d(7, 11, 5, padding=2)
        conv = Conv1d.from_torch(torch_conv, epilogue=ConvEpilogue(pool=2, negative_slope=0.01))
    x = torch.randn(2, 7, 40)
    with torch.inference_mode(), rt.use_backend(backend, strict=True):
        first = conv(x)
        torch_conv.weight.mul_(2.0)
        torch_conv.bias.mul_(2.0)
        second = conv(x)
    ref = conv1d_float64(x, torch_conv.weight, torch_conv.bias, 1, 2, 1, pool=2, negative_slope=0.01)
    assert_matches_float64(second, ref, 1e-5, reduced=35)
    assert_matches_float64(first, ref / 2, 1e-5, reduced=35)   # leaky ReLU is positively homogeneous


def test_float64_modules_give_the_float64_modules_values():
    module = random_sincnet()
    rlx = SincNet.from_pyannote(copy.deepcopy(module)).double()
    wav = torch.randn(1, 1, 2000, dtype=torch.float64)
    torch_conv = nn.Conv1d(7, 11, 5, padding=2).double()
    x = torch.randn(2, 7, 40, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(rlx(wav), module.double()(wav))
        assert torch.equal(Conv1d.from_torch(torch_conv)(x), torch_conv(x))
