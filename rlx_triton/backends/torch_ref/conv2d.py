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


def library_kernels(request, profile) -> list:
    """The kernels the functions above run on a GPU for a routed request, for the library path estimate and the
    router's speed decision (rlx_triton.backends.torch_ref.library_kernel.LibraryKernel), priced by the models of
    rlx_triton.perf.library. fp32 with TF32 off, as the benches and pyannote run it (bench/common.py fp32_setup,
    pyannote's fix_reproducibility), and cudnn.benchmark on, as the embedding bench's baseline runs it (cuDNN's
    fastest algorithm per shape). Half-precision requests add the casts to fp32 and back these functions make.

    - conv2d: cuDNN's convolution (rlx_triton.perf.library.conv), then the bias as its own kernel (torch's
      cudnn path adds it with `output.add_(bias)` after cudnn_convolution: aten/native/Convolution.cpp), the
      residual add and the ReLU as the separate elementwise kernels eager torch runs. The request does not say
      whether a bias is given: the conv family's ResNet convs carry their folded BatchNorm's, so one is assumed;
    - linear (a 1x1 conv2d request of one pixel): F.linear of 2-D x is addmm, one cuBLASLt GEMM with the bias in
      its epilogue (rlx_triton.perf.library.gemm: split-K where the rows are few, as for seg_1's 32 rows);
    - stats_pool: the mean, the standard deviation (each one reduction over the frames) and their concatenation;
      with weights, every product, sum and division of the function is its own kernel (the request carries no
      speaker count: one speaker is assumed)."""
    from rlx_triton.perf.library import Unmodelled
    from rlx_triton.perf.library.conv import convolution_kernels
    from rlx_triton.perf.library.eager import ELEMENT_BYTES, elementwise, reduction
    from rlx_triton.perf.library.gemm import gemm_kernels

    if request.dtype not in ("float32", "float16", "bfloat16"):
        raise Unmodelled(f"the conv family's library path in {request.dtype} is not modelled")
    fields, features = request.field_map, request.feature_map
    batch, c_in, c_out = fields["batch"], fields["c_in"], fields["c_out"]
    size = 4                                    # these functions compute in fp32
    given = ELEMENT_BYTES[request.dtype]
    half = given != size

    def cast(name: str, elements: int, to_fp32: bool = True) -> list:
        if not half:
            return []
        read, written = (given, size) if to_fp32 else (size, given)
        return [elementwise(f"{name} cast", elements * read, elements * written)]

    if request.op == "stats_pool":
        frames = fields["length"]
        values = batch * c_in * frames
        stats = batch * c_in * size
        kernels = cast("input", values)
        if features.get("weighted"):
            weights = batch * frames             # one speaker
            products = values * size
            kernels += cast("weights", weights)
            kernels += [
                reduction("weight sum", weights * size, batch * size), elementwise("+ 1e-8", batch * size, batch * size),
                elementwise("x * w", products + weights * size, products, values),
                reduction("sum of x * w", products, stats, values), elementwise("mean = / v1", stats + batch * size,
                                                                               stats),
                elementwise("x - mean", products + stats, products, values),
                elementwise("square", products, products, values),
                elementwise("w squared", weights * size, weights * size, weights),
                reduction("sum of w squared", weights * size, batch * size),
                elementwise("dx2 * w", products + weights * size, products, values),
                reduction("sum of dx2 * w", products, stats, values)]
            kernels += [elementwise(name, 2 * batch * size, batch * size) for name in ("v2 / v1", "v1 - v2 / v1",
                                                                                         "+ 1e-8")]
            kernels += [elementwise("var = / denominator", stats + batch * size, stats),
                        elementwise("sqrt", stats, stats), elementwise("concatenation", 2 * stats, 2 * stats)]
        else:
            kernels += [reduction("mean", values * size, stats, values),
                        reduction("std (one Welford pass)", values * size, stats, 3 * values),
                        elementwise("concatenation", 2 * stats, 2 * stats)]
        return kernels + cast("output", 2 * batch * c_in, to_fp32=False)
    taps, pixels, length = fields["taps"], fields["tokens"], fields["length"]
    outputs = batch * c_out * pixels
    inputs = batch * c_in * length
    if taps == 1 and length == 1:   # linear: one pixel per row
        kernels = cast("x", inputs) + cast("weight", c_out * c_in) + cast("bias", c_out)
        kernels += gemm_kernels(batch, c_out, c_in, "fp32", profile,
                                read_bytes=(inputs + c_out * c_in + c_out) * size, written_bytes=outputs * size,
                                label="linear (addmm: cuBLASLt, bias in the epilogue, TF32 off)")
        return kernels + cast("output", outputs, to_fp32=False)
    kernel = tuple(features.get("kernel", (3, 3)))
    output = outputs * size
    kernels = cast("x", inputs) + cast("weight", c_out * c_in * taps) + cast("bias", c_out)
    kernels += convolution_kernels(batch, c_in, c_out, length, pixels, kernel, fields["stride"], "fp32", profile,
                                   label="conv2d (TF32 off, cudnn.benchmark)")
    kernels.append(elementwise("bias add (output.add_ after cudnn_convolution)", output + c_out * size, output,
                               outputs))
    if features.get("residual"):
        kernels += cast("residual", outputs)
        kernels.append(elementwise("residual add", 2 * output, output, outputs))
    if features.get("relu"):
        kernels.append(elementwise("relu", output, output, outputs))
    return kernels + cast("output", outputs, to_fp32=False)
