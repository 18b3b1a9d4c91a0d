"""Metal launcher of the 1-D conv family (metal/conv.metal): Conv1d with a fused bias | abs |
max-pool | leaky ReLU epilogue, instance norm + leaky ReLU, and pyannote's SincNet built from them.

Same function names and signatures as backends/triton/conv/ (`conv1d`, `sincnet`).
Candidate -> launch: tg_size -> threadgroup size (multiple of 32); conv1d_pool runs one thread per
output element (threads = groups * group_size covers them, the shader bounds-checks), the norm one
threadgroup per (batch, channel) row. tile_*, stages, precision and fuse_epilogue do not change
the Metal kernels (the epilogue is always fused; math is always fp32).
SincNet = 5 launches with float32 intermediates: waveform norm -> sinc conv|abs|pool -> norm+leaky
-> [conv+bias|pool -> norm+leaky] per Conv1d block.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from rlx_triton.backends.metal import candidates as _candidates
from rlx_triton.backends.metal import library
from rlx_triton.router.coverage import Coverage

FAMILY = "conv"
KERNEL_ARGUMENTS = {
    "conv1d_pool": ("x:T", "weight:float32", "bias:float32", "out:T", "batch:long", "c_in:long", "c_out:long",
                    "length_in:long", "taps:long", "stride:long", "padding:long", "dilation:long", "conv_len:long",
                    "pool_size:long", "pool_stride:long", "length_out:long", "has_bias:long", "apply_abs:long",
                    "negative_slope:float"),
    "instance_norm_act": ("x:T", "gamma:float32", "beta:float32", "out:T", "channels:long", "length:long",
                          "has_affine:long", "eps:float", "negative_slope:float"),
}

COVERAGE = Coverage(
    ops=frozenset({"sincnet", "conv1d"}),
    devices=frozenset({"mps"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"batch": (1, 1 << 20), "c_in": (1, 1 << 16), "c_out": (1, 1 << 16), "taps": (1, 4096),
            "stride": (1, 4096)},
    features={
        "groups": frozenset({1}),
        "padding_mode": frozenset({"zeros"}),
        "pool": frozenset(range(1, 17)),
        "abs": frozenset({True, False}),
        "leaky": frozenset({True, False}),
        "blocks": frozenset(range(0, 65)),
        "requires_grad": frozenset({False}),
        "streaming": frozenset({False}),
        "sample_rate": frozenset({16000}),
    },
)
APPROVALS = _candidates.approvals(FAMILY)
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def conv_output_length(length: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


def _group_size(candidate) -> int:
    return library.group_size_for(int(_candidates.field(candidate, "tg_size", 128)))


def _empty_float(device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.float32, device=device)


def conv1d_pool(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], *, stride: int = 1,
                padding: int = 0, dilation: int = 1, pool: int = 1, apply_abs: bool = False,
                negative_slope: Optional[float] = None, candidate=None) -> torch.Tensor:
    """(B, C_in, L) -> (B, C_out, conv_len // pool): conv, bias, |.|, max-pool (kernel = stride = pool), leaky."""
    batch, c_in, length_in = x.shape
    c_out, _, taps = weight.shape
    conv_len = conv_output_length(length_in, taps, stride, padding, dilation)
    length_out = conv_len // pool
    out = torch.empty((batch, c_out, max(length_out, 0)), dtype=x.dtype, device=x.device)
    group_size = _group_size(candidate)
    library.dispatch(
        FAMILY, "conv1d_pool", x.dtype, KERNEL_ARGUMENTS["conv1d_pool"],
        groups=library.groups_for(out.numel(), group_size), group_size=group_size,
        x=x.contiguous(), weight=weight.detach().to(device=x.device, dtype=torch.float32).contiguous(),
        bias=(_empty_float(x.device) if bias is None
              else bias.detach().to(device=x.device, dtype=torch.float32).contiguous()),
        out=out, batch=batch, c_in=c_in, c_out=c_out, length_in=length_in, taps=taps, stride=int(stride),
        padding=int(padding), dilation=int(dilation), conv_len=conv_len, pool_size=int(pool),
        pool_stride=int(pool), length_out=length_out, has_bias=int(bias is not None), apply_abs=int(apply_abs),
        negative_slope=1.0 if negative_slope is None else float(negative_slope))
    return out


def instance_norm_act(x: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor], *,
                      eps: float = 1e-5, negative_slope: Optional[float] = None, candidate=None) -> torch.Tensor:
    """InstanceNorm1d (biased variance over the last dim, optional affine) then leaky ReLU (None: none)."""
    batch, channels, length = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    affine = gamma is not None
    library.dispatch(
        FAMILY, "instance_norm_act", x.dtype, KERNEL_ARGUMENTS["instance_norm_act"],
        groups=batch * channels, group_size=_group_size(candidate), x=x.contiguous(),
        gamma=(gamma.detach().to(device=x.device, dtype=torch.float32).contiguous() if gamma is not None
               else _empty_float(x.device)),
        beta=(beta.detach().to(device=x.device, dtype=torch.float32).contiguous()
              if affine and beta is not None else torch.zeros(channels, dtype=torch.float32, device=x.device)),
        out=out, channels=channels, length=length, has_affine=int(affine), eps=float(eps),
        negative_slope=1.0 if negative_slope is None else float(negative_slope))
    return out


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate, route=None):
    """F.conv1d (groups=1) on a (B, C_in, L) input, then the optional epilogue
    (epilogue.abs, epilogue.pool, epilogue.negative_slope: bias -> |x| -> max-pool -> leaky ReLU); the
    route is not used (no autotuning on Metal)."""
    return conv1d_pool(input, weight, bias, stride=int(stride), padding=int(padding), dilation=int(dilation),
                       pool=1 if epilogue is None else int(epilogue.pool),
                       apply_abs=False if epilogue is None else bool(epilogue.abs),
                       negative_slope=None if epilogue is None else epilogue.negative_slope, candidate=candidate)


def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights: Sequence[torch.Tensor],
            conv_biases, norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
            candidate, route=None):
    """pyannote SincNet forward (non-streaming) on (B, 1, T) waveforms -> (B, C, frames)."""
    h = waveforms.to(torch.float32)
    h = instance_norm_act(h, wav_norm_weight, wav_norm_bias, eps=eps, candidate=candidate)
    h = conv1d_pool(h, sinc_filters, None, stride=sinc_stride, pool=pool, apply_abs=True, candidate=candidate)
    h = instance_norm_act(h, norm_weights[0], norm_biases[0], eps=eps, negative_slope=negative_slope,
                          candidate=candidate)
    for block, (weight, bias) in enumerate(zip(conv_weights, conv_biases), start=1):
        h = conv1d_pool(h, weight, bias, pool=pool, candidate=candidate)
        h = instance_norm_act(h, norm_weights[block], norm_biases[block], eps=eps, negative_slope=negative_slope,
                              candidate=candidate)
    return h.to(waveforms.dtype)
