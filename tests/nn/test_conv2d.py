"""rlx_triton.nn conv2d modules as drop-ins for WeSpeaker's layers (eval mode, BatchNorm folded): they
keep the stock parameters and state_dict keys, fold again when a source changes, run float64 after
.double(), take inference-tensor weights and raise torch's error for a wrong input."""
import copy

import pytest
import torch
from torch import nn

import rlx_triton as rt
from rlx_triton.nn.conv2d import BasicBlock, Bottleneck, Conv2d, FoldedBatchNorm2d, Projection, StatsPool
from tests.reference import wespeaker_models as ref
from tests.reference.conv2d import assert_close_ref

BACKENDS = ["torch", "triton"]


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_conv2d_from_torch_folds_batchnorm_and_fuses_relu(backend):
    conv, bn = nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(6)
    ref.randomize(nn.Sequential(conv, bn))
    x = torch.randn(2, 3, 9, 8)
    module = Conv2d.from_torch(conv, bn=bn, relu=True)
    with rt.use_backend(backend, strict=True), torch.no_grad():
        _close(module(x), torch.relu(bn(conv(x))))


def test_conv2d_rejects_what_it_does_not_implement():
    with pytest.raises(ValueError, match="groups=1"):
        Conv2d.from_torch(nn.Conv2d(4, 4, 3, groups=2))
    with pytest.raises(TypeError, match="torch.nn.Conv2d"):
        Conv2d.from_torch(nn.Linear(3, 3))


@pytest.mark.parametrize("block_cls, rlx_cls, args", [
    (ref.BasicBlock, BasicBlock, (4, 4, 1)),      # identity shortcut
    (ref.BasicBlock, BasicBlock, (4, 8, 2)),      # 1x1 stride-2 shortcut
    (ref.Bottleneck, Bottleneck, (8, 4, 2)),
])
def test_residual_blocks_match_pyannote_blocks(block_cls, rlx_cls, args):
    block = ref.randomize(block_cls(*args))
    x = torch.randn(2, args[0], 8, 9)
    with torch.no_grad():
        expected = block(x.clone())
        swapped = rlx_cls.from_torch(block)
        with rt.use_backend("triton", strict=True):
            _close(swapped(x), expected)


def test_blocks_keep_pyannote_frame_geometry():
    block = ref.BasicBlock(4, 8, 2)
    assert BasicBlock.from_torch(ref.randomize(block)).num_frames(101) == block.num_frames(101)


@pytest.mark.parametrize("weighted", [False, True])
def test_stats_pool_replaces_tstp(weighted):
    tstp = ref.TSTP(in_dim=3 * 5)
    frames = torch.randn(2, 3, 5, 17)
    weights = torch.rand(2, 9) if weighted else None
    pool = StatsPool(in_dim=15)
    assert pool.get_out_dim() == tstp.get_out_dim()
    with rt.use_backend("triton", strict=True):
        _close(pool(frames, weights=weights), tstp(frames, weights=weights))


def test_projection_replaces_linear():
    linear = nn.Linear(40, 7)
    x = torch.randn(3, 40)
    with rt.use_backend("triton", strict=True), torch.no_grad():
        _close(Projection.from_torch(linear)(x), linear(x))


def test_modules_explain_their_routes():
    conv = Conv2d(torch.randn(4, 2, 3, 3), torch.randn(4), padding=1, relu=True)
    x = torch.randn(1, 2, 5, 5)
    assert conv.explain(x).op == "conv2d"
    assert StatsPool().explain(torch.randn(1, 2, 3, 4)).op == "stats_pool"
    assert Projection(torch.randn(3, 8)).explain(torch.randn(2, 8)).backend == "triton"


def test_folded_weight_is_stored_tap_major_and_moves_with_the_module():
    conv = Conv2d(torch.randn(6, 4, 3, 3))
    assert conv.folded()[0].stride() == (4, 1, 3 * 6 * 4, 6 * 4)  # memory (kh, kw, c_out, c_in)
    assert conv.to(torch.float32).folded()[0].stride(1) == 1
    assert_close_ref(conv(torch.ones(1, 4, 3, 3)), torch.nn.functional.conv2d(torch.ones(1, 4, 3, 3).double(),
                     conv.weight.double()), torch.float32, 36)


def _conv_bn(c_in=3, c_out=6):
    conv, bn = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out)
    ref.randomize(nn.Sequential(conv, bn))
    return conv, bn


def test_conv2d_keeps_the_convs_tensors_and_its_state_dict():
    conv, bn = _conv_bn()
    module = Conv2d.from_torch(conv, bn=bn, relu=True)
    assert module.weight is conv.weight and list(module.state_dict()) == ["weight"]
    folded_bn = module.bn
    assert isinstance(folded_bn, FoldedBatchNorm2d) and folded_bn.weight is bn.weight
    assert folded_bn.running_var is bn.running_var
    x = torch.randn(1, 3, 5, 5)
    assert folded_bn(x) is x                       # applied by the conv: an identity where it is registered


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv2d_folds_again_after_in_place_edits(backend):
    conv, bn = _conv_bn()
    module = Conv2d.from_torch(conv, bn=bn, relu=True)
    x = torch.randn(2, 3, 6, 7)
    with torch.no_grad(), rt.use_backend(backend, strict=True):
        module(x)
        bn.running_var.mul_(4.0)
        bn.bias.add_(0.5)
        conv.weight.mul_(-1.0)
        _close(module(x), torch.relu(bn(conv(x))))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_conv2d_built_in_inference_mode_runs_and_folds_again_on_load(backend, mode):
    """Inference-tensor weights have no version counter: a load_state_dict (inside inference mode, the only
    place torch lets them change in place) refolds through the load hook."""
    with torch.inference_mode():
        conv, bn = _conv_bn()
        block = nn.Sequential(conv, bn)
        module = Conv2d.from_torch(conv, bn=bn, relu=True)
        holder = nn.Module()
        holder.conv, holder.bn = module, module.bn
    x = torch.randn(2, 3, 6, 7)
    other_conv, other_bn = _conv_bn()
    context = torch.inference_mode() if mode == "inference_mode" else torch.no_grad()
    with context, rt.use_backend(backend, strict=True):
        _close(module(x), torch.relu(block(x)))
        with torch.inference_mode():
            holder.load_state_dict({"conv.weight": other_conv.weight.detach().clone(),
                                    **{f"bn.{k}": v.clone() for k, v in other_bn.state_dict().items()}})
        _close(module(x), torch.relu(other_bn(other_conv(x))))


def test_wrong_input_channels_raise_like_nn_conv2d():
    conv, bn = _conv_bn()
    x = torch.randn(1, 5, 6, 6)
    with pytest.raises(RuntimeError) as torch_error:
        conv(x)
    with pytest.raises(type(torch_error.value)) as ours:
        Conv2d.from_torch(conv, bn=bn)(x)
    assert str(ours.value) == str(torch_error.value)


def test_a_conv_with_its_batchnorm_converts_as_one_module():
    conv, bn = _conv_bn()
    module = Conv2d.from_torch(conv, bn=bn, relu=True).double()
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    with torch.no_grad():
        y = module(x)
    assert y.dtype == torch.float64 and module.bn.running_var.dtype == torch.float64
    torch.testing.assert_close(y, torch.relu(bn.double()(conv.double()(x))), rtol=1e-12, atol=1e-12)


def test_float64_blocks_give_the_float64_blocks_values():
    block = ref.randomize(ref.BasicBlock(4, 8, 2))
    swapped = BasicBlock.from_torch(copy.deepcopy(block)).double()
    block = block.double()
    x = torch.randn(2, 4, 8, 9, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(swapped(x), block(x.clone()), rtol=1e-12, atol=1e-12)
    assert swapped.conv1.folded()[0].dtype == torch.float64


def test_blocks_keep_the_stock_state_dict():
    block = ref.randomize(ref.BasicBlock(4, 8, 2))
    keys = list(block.state_dict())
    swapped = BasicBlock.from_torch(block)
    assert list(swapped.state_dict()) == keys
    other = ref.randomize(ref.BasicBlock(4, 8, 2), seed=5)
    swapped.load_state_dict(other.state_dict())
    x = torch.randn(2, 4, 8, 9)
    with torch.no_grad(), rt.use_backend("torch"):
        _close(swapped(x), other(x.clone()))
