"""Library fallback of the conv family's 2-D ops: conv2d (+bias, residual, ReLU), linear, stats_pool.

Same function names and signatures as `backends/triton/conv2d/`; `candidate` and `route` are ignored here.
Half-precision inputs are computed in fp32 and rounded once, like the Triton kernels do.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: dict = {}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           stride: int = 1, padding: int = 0, residual: Optional[torch.Tensor] = None,
           relu: bool = False, candidate=None, route=None) -> torch.Tensor:
    """relu?(F.conv2d(x, weight, bias, stride, padding) + residual), returned in x's dtype."""
    dtype = _compute_dtype(x)
    y = F.conv2d(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype),
                 stride=stride, padding=padding)
    if residual is not None:
        y = y + residual.to(dtype)
    if relu:
        y = torch.relu(y)
    return y.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           candidate=None, route=None) -> torch.Tensor:
    """F.linear(x, weight, bias) for 2-D x, returned in x's dtype."""
    dtype = _compute_dtype(x)
    y = F.linear(x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return y.to(x.dtype)


def stats_pool(x: torch.Tensor, weights: Optional[torch.Tensor] = None, *, candidate=None,
               route=None) -> torch.Tensor:
    """Mean and unbiased std over the last axis of x (batch, features, frames), pyannote's StatsPool.

    weights (batch, speakers, frames), already at x's frame rate, give (batch, speakers, 2 * features).
    """
    dtype = _compute_dtype(x)
    seq = x.to(dtype)
    if weights is None:
        mean = seq.mean(dim=-1)
        if seq.shape[-1] > 1:
            std = seq.std(dim=-1, correction=1)
        else:
            std = torch.zeros_like(mean)
        return torch.cat([mean, std], dim=-1).to(x.dtype)
    w = weights.to(dtype).unsqueeze(2)  # (batch, speakers, 1, frames)
    seq = seq.unsqueeze(1)  # (batch, 1, features, frames)
    v1 = w.sum(dim=3) + 1e-8
    mean = torch.sum(seq * w, dim=3) / v1
    dx2 = torch.square(seq - mean.unsqueeze(3))
    v2 = torch.square(w).sum(dim=3)
    var = torch.sum(dx2 * w, dim=3) / (v1 - v2 / v1 + 1e-8)
    return torch.cat([mean, torch.sqrt(var)], dim=-1).to(x.dtype)


def library_kernels(request) -> list:
    """The kernels the functions above run on a GPU for a routed request, for the library path estimate
    (rlx_triton.perf.roofline.LibraryKernel), fp32 with TF32 off as the benches and pyannote run them:
    conv2d (and linear, a 1x1 conv2d request): cuDNN's convolution with its bias, then the residual add and the
    ReLU as the separate elementwise kernels eager torch runs; stats_pool without weights: the mean, the standard
    deviation (each reading the sequences once) and their concatenation."""
    from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel

    fields, features = request.field_map, request.feature_map
    batch, c_in, c_out = fields["batch"], fields["c_in"], fields["c_out"]
    size = 8 if request.dtype == "float64" else 4
    if request.op == "stats_pool":
        sequences = batch * c_in * fields["length"] * size
        stats = batch * c_in * size
        if features.get("weighted"):   # weights: products and sums per speaker, as the function's steps
            return [LibraryKernel("weighted mean and variance", 3 * sequences, 2 * stats, 6 * batch * c_in
                                  * fields["length"]), LibraryKernel("concatenation", 2 * stats, 2 * stats)]
        return [LibraryKernel("mean", sequences, stats, batch * c_in * fields["length"]),
                LibraryKernel("std", sequences, stats, 3 * batch * c_in * fields["length"]),
                LibraryKernel("concatenation", 2 * stats, 2 * stats)]
    taps, tokens = fields["taps"], fields["tokens"]
    output = batch * c_out * tokens * size
    kernels = [LibraryKernel("convolution (cuDNN, TF32 off)" if taps > 1 or fields["length"] > 1 else
                             "linear (cuBLAS SGEMM, TF32 off)",
                             (batch * c_in * fields["length"] + c_out * c_in * taps + c_out) * size, output,
                             2 * batch * c_out * tokens * c_in * taps)]
    if features.get("residual"):
        kernels.append(LibraryKernel("residual add", 2 * output, output, batch * c_out * tokens))
    if features.get("relu"):
        kernels.append(LibraryKernel("relu", output, output, batch * c_out * tokens))
    return kernels
