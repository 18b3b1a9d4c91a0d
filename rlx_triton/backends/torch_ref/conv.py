"""Library fallback of the 1-D conv family: pyannote's SincNet stage and Conv1d with epilogues, in torch.

Same function names and signatures as rlx_triton/backends/triton/conv/ (candidate and route are ignored).
It runs the exact module sequence of pyannote (instance_norm, conv1d, abs, max_pool1d, leaky_relu),
so it is differentiable and matches the pyannote module bit for bit on the same device.
"""
from __future__ import annotations

import torch.nn.functional as F

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate=None,
           route=None):
    """F.conv1d (groups=1), then epilogue: |x| if epilogue.abs, max-pool(pool, pool), leaky ReLU."""
    y = F.conv1d(input, weight, bias, stride=stride, padding=padding, dilation=dilation)
    if epilogue is None:
        return y
    if epilogue.abs:
        y = y.abs()
    if epilogue.pool > 1:
        y = F.max_pool1d(y, epilogue.pool, epilogue.pool)
    if epilogue.negative_slope is not None:
        y = F.leaky_relu(y, epilogue.negative_slope)
    return y


def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
            norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
            candidate=None, route=None):
    """pyannote SincNet forward (non-streaming) on (B, 1, T) waveforms -> (B, C, frames)."""
    h = F.instance_norm(waveforms, weight=wav_norm_weight, bias=wav_norm_bias, eps=eps)
    h = F.conv1d(h, sinc_filters, stride=sinc_stride).abs()
    h = F.max_pool1d(h, pool, pool)
    h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[0], bias=norm_biases[0], eps=eps), negative_slope)
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        h = F.max_pool1d(F.conv1d(h, w, b), pool, pool)
        h = F.leaky_relu(F.instance_norm(h, weight=norm_weights[i + 1], bias=norm_biases[i + 1], eps=eps),
                         negative_slope)
    return h


# ---------------------------------------------------------------------------------------------------
# the library path's kernels, for `rlx-triton perf`'s library path estimate and the router's speed decision

# pyannote's SincNet conv blocks (pyannote.audio models/blocks/sincnet.py): Conv1d(80, 60, 5), Conv1d(60, 60, 5).
# The sincnet request carries neither their channels nor their taps (not launch fields): the channels are
# pyannote's, the taps the one size per block that gives the request's output frames (else pyannote's 5)
PYANNOTE_BLOCK_CHANNELS = 60
PYANNOTE_BLOCK_TAPS = 5


def _conv_out(length: int, taps: int, stride: int = 1) -> int:
    return (length - taps) // stride + 1


def _block_taps(length: int, pool: int, blocks: int, frames: int) -> int:
    """The kernel size of SincNet's conv blocks that turns `length` pooled sinc outputs into `frames`."""
    for taps in [PYANNOTE_BLOCK_TAPS] + list(range(1, 64)):
        out = length
        for _ in range(blocks):
            out = _conv_out(out, taps) // pool
        if out == frames:
            return taps
    return PYANNOTE_BLOCK_TAPS


def _stage_kernels(name: str, batch: int, c_in: int, c_out: int, length: int, taps: int, stride: int, *,
                   bias: bool, absolute: bool, pool: int, norm: bool, leaky: bool, profile) -> tuple:
    """The eager kernels of conv1d -> [bias] -> [abs] -> [max_pool1d] -> [instance_norm] -> [leaky_relu], and the
    pooled output length."""
    from rlx_triton.perf.library.conv import convolution_kernels
    from rlx_triton.perf.library.eager import elementwise

    out = _conv_out(length, taps, stride)
    values = batch * c_out * out * 4
    kernels = convolution_kernels(batch, c_in, c_out, length, out, (1, taps), stride, "fp32", profile,
                                  label=f"{name} conv1d (cuDNN, TF32 off)")
    if bias:
        kernels.append(elementwise(f"{name} bias add (after cudnn_convolution)", values + c_out * 4, values))
    if absolute:
        kernels.append(elementwise(f"{name} abs", values, values))
    if pool > 1:
        pooled = out // pool
        # on CUDA max_pool1d runs max_pool1d_with_indices (aten MaxPooling.cpp): it also writes int64 indices
        kernels.append(elementwise(f"{name} max_pool1d (with int64 indices)", values,
                                   batch * c_out * pooled * (4 + 8), batch * c_out * pooled * pool))
        out = pooled
    values = batch * c_out * out * 4
    if norm:
        kernels += instance_norm_kernels(f"{name} instance_norm", batch, c_out, out)
    if leaky:
        kernels.append(elementwise(f"{name} leaky_relu", values, values, 2 * batch * c_out * out))
    return kernels, out


def instance_norm_kernels(name: str, batch: int, channels: int, length: int) -> list:
    """F.instance_norm with affine weights (aten Normalization.cpp instance_norm): weight and bias repeated per
    instance (two small kernels), then batch_norm in training mode over (1, batch x channels, length): a
    statistics pass reading the input and a normalisation pass reading it again and writing the output."""
    from rlx_triton.perf.library.eager import elementwise, reduction

    values = batch * channels * length * 4
    per_instance = batch * channels * 4
    return [elementwise(f"{name} weight repeat", channels * 4, per_instance),
            elementwise(f"{name} bias repeat", channels * 4, per_instance),
            reduction(f"{name} statistics (batch_norm training)", values, 2 * per_instance, 3 * batch * channels * length),
            elementwise(f"{name} normalisation", values + 4 * per_instance, values, 2 * batch * channels * length)]


def library_kernels(request, profile) -> list:
    """The kernels the functions above run on a GPU for a routed request, eager op by eager op, for the library
    path estimate and the router's speed decision (rlx_triton.backends.torch_ref.library_kernel.LibraryKernel),
    priced by rlx_triton.perf.library's models: cuDNN's convolution (fp32 with TF32 off and cudnn.benchmark, as
    the sincnet bench's baseline runs it), the bias as its own add (torch's cudnn path), abs, max_pool1d (which
    writes indices on CUDA), InstanceNorm1d as batch_norm's two passes, leaky_relu.

    - sincnet: the waveform's instance_norm, the sinc conv (filters cached per weight version: no filter
      construction per call), abs, pool, instance_norm, leaky_relu, then each conv block (pyannote's channels:
      PYANNOTE_BLOCK_CHANNELS) with bias, pool, instance_norm, leaky_relu;
    - conv1d: the conv with a bias (assumed: the request does not say), then the epilogue the request names."""
    from rlx_triton.perf.library import Unmodelled

    if request.dtype != "float32":
        raise Unmodelled(f"the conv family's 1-D library path in {request.dtype} is not modelled (float32 is)")
    fields, features = request.field_map, request.feature_map
    batch, length, stride, taps = fields["batch"], fields["length"], fields["stride"], fields["taps"]
    pool = int(features.get("pool", 3 if request.op == "sincnet" else 1))
    if request.op == "sincnet":
        blocks = int(features.get("blocks", 2))
        kernels = instance_norm_kernels("waveform", batch, 1, length)
        stage, out = _stage_kernels("sinc", batch, 1, fields["c_out"], length, taps, stride, bias=False,
                                    absolute=True, pool=pool, norm=True, leaky=True, profile=profile)
        kernels += stage
        block_taps = _block_taps(out, pool, blocks, fields["tokens"])
        channels = fields["c_out"]
        for block in range(blocks):
            stage, out = _stage_kernels(f"block {block}", batch, channels, PYANNOTE_BLOCK_CHANNELS, out, block_taps,
                                        1, bias=True, absolute=False, pool=pool, norm=True, leaky=True,
                                        profile=profile)
            kernels += stage
            channels = PYANNOTE_BLOCK_CHANNELS
        return kernels
    kernels, _ = _stage_kernels("conv", batch, fields["c_in"], fields["c_out"], length, taps, stride, bias=True,
                                absolute=bool(features.get("abs")), pool=pool, norm=False,
                                leaky=bool(features.get("leaky")), profile=profile)
    return kernels
