"""rlx_triton.nn conv2d modules as drop-ins for WeSpeaker's layers (eval mode, BatchNorm folded)."""
import pytest
import torch
from torch import nn

import rlx_triton as rt
from rlx_triton.nn.conv2d import BasicBlock, Bottleneck, Conv2d, Projection, StatsPool
from tests.reference import wespeaker_models as ref
from tests.reference.conv2d import assert_close_ref


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


def test_weight_is_stored_tap_major_and_moves_with_the_module():
    conv = Conv2d(torch.randn(6, 4, 3, 3))
    assert conv.weight.stride() == (4, 1, 3 * 6 * 4, 6 * 4)  # memory (kh, kw, c_out, c_in)
    assert conv.to(torch.float32).weight.stride(1) == 1
    assert_close_ref(conv(torch.ones(1, 4, 3, 3)), torch.nn.functional.conv2d(torch.ones(1, 4, 3, 3).double(),
                     conv.weight.double()), torch.float32, 36)
