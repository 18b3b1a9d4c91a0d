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
