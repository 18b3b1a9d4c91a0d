"""Public 2-D ops of the conv family: conv2d with a fused epilogue, linear, stats_pool (TSTP), BN folding.

Each op validates its input (errors name the argument, before any launch), builds a routing
Request from a request spec (`CONV2D_REQUEST`, which linear uses too as a 1x1 conv2d, `STATS_POOL_REQUEST`;
`rlx-triton explain` reads them too) and runs the function of the same name in the backend module the router picks
(`backends/triton/conv2d/`, or `backends/torch_ref/conv2d.py` as the library fallback).

    y = conv2d(x, weight, bias, stride=2, padding=1, residual=r, relu=True)   # NCHW
    stats = stats_pool(frames, weights=masks)      # pyannote StatsPool semantics
    w, b = fold_batchnorm(conv.weight, conv.bias, bn)  # eval BatchNorm -> conv weight and bias
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from rlx_triton.ops._compiled import compiling, options_from, options_text, run_eagerly
from rlx_triton.ops._checks import (FLOAT_DTYPES, InputShapeError, backend_module, call_signature, check_bool,
                                    check_device, check_input_channels, check_int, check_shape, check_tensor,
                                    needs_grad)
from rlx_triton.ops._request_spec import Derived, Feature, Features, Given, RequestSpec, Values, flag
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import routed_call

FAMILY = "conv"


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{name} must be one int (the same along height and width), got {value!r}")
        value = value[0]
    return check_int(name, value, low)


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


# ------------------------------------------------------------------------------------ request specs


def _conv2d_output(f: Values, o: Features) -> tuple:
    """(height, width) of conv2d's output."""
    (kh, kw), padding = o["kernel"], int(o["padding"])
    return (_out_size(f["height"], kh, f["stride"], padding), _out_size(f["width"], kw, f["stride"], padding))


def _conv2d_too_small(f: Values, o: Features) -> Optional[str]:
    out_h, out_w = _conv2d_output(f, o)
    if out_h < 1 or out_w < 1:
        kh, kw = o["kernel"]
        return (f"height x width = {f['height']}x{f['width']} is smaller than the kernel {kh}x{kw} with "
                f"padding={o['padding']}")
    return None


def _conv2d_tokens(f: Values, o: Features) -> int:
    out_h, out_w = _conv2d_output(f, o)
    return out_h * out_w


CONV2D_REQUEST = RequestSpec(
    FAMILY, "conv2d",
    given=(Given("batch"), Given("c_in"), Given("c_out"),
           Given("height", meaning="input height"), Given("width", meaning="input width"),
           Given("stride", 1, "F.conv2d's default")),
    derived=(Derived("length", lambda f, o: f["height"] * f["width"], "height x width", ("height", "width"),
                     "input pixels"),
             Derived("taps", lambda f, o: o["kernel"][0] * o["kernel"][1], "kernel height x width", ("kernel",)),
             Derived("tokens", _conv2d_tokens,
                     "((height + 2 x padding - kernel height) // stride + 1) x (the same for width)",
                     ("height", "width", "stride", "kernel", "padding"), "output pixels")),
    # a 3x3 kernel that keeps the size: the ResNet trunk's convolution
    features={"kernel": Feature((3, 3)), "padding": Feature(1), "residual": flag(False), "relu": flag(False),
              "requires_grad": flag(False)},
    checks=(_conv2d_too_small,),
)

STATS_POOL_REQUEST = RequestSpec(
    FAMILY, "stats_pool",
    given=(Given("batch"), Given("c_in"), Given("length")),
    derived=(Derived("c_out", lambda f, o: 2 * f["c_in"], "2 x c_in", ("c_in",),
                     "mean and standard deviation of each channel"),
             Derived("taps", lambda f, o: 1, "1", (), "pooling"),
             Derived("stride", lambda f, o: 1, "1", (), "pooling"),
             Derived("tokens", lambda f, o: 1, "1", (), "one statistics row per sequence")),
    features={"weighted": flag(False), "requires_grad": flag(False)},
)


def _conv2d_request(x, weight, bias=None, *, stride=1, padding=0, residual=None, relu=False) -> Request:
    check_tensor("x", x, (3, 4), CONV2D_REQUEST.dtypes, "(batch, c_in, height, width) or (c_in, height, width)")
    check_tensor("weight", weight, (4,), FLOAT_DTYPES, "(c_out, c_in, kh, kw)")
    check_device("weight", weight, x, "the input")
    stride = _check_int("stride", stride, 1)
    padding = _check_int("padding", padding, 0)
    check_input_channels(x, weight, channel_dim=x.dim() - 3)
    batch, c_in, height, width = x.shape if x.dim() == 4 else (1, *x.shape)
    c_out, _, kh, kw = weight.shape
    out_h, out_w = _out_size(height, kh, stride, padding), _out_size(width, kw, stride, padding)
    if out_h < 1 or out_w < 1:
        raise ValueError(f"x of spatial size {height}x{width} is smaller than the kernel {kh}x{kw} "
                         f"with padding={padding}")
    if bias is not None:
        check_tensor("bias", bias, (1,), FLOAT_DTYPES, f"(c_out={c_out},)")
        check_device("bias", bias, x, "the input")
        check_shape("bias", bias, (c_out,))
    if residual is not None:
        out_shape = (batch, c_out, out_h, out_w)[4 - x.dim():]
        check_tensor("residual", residual, (x.dim(),), FLOAT_DTYPES,
                     "(batch, c_out, out_h, out_w)" if x.dim() == 4 else "(c_out, out_h, out_w)")
        check_device("residual", residual, x, "the input")
        if tuple(residual.shape) != out_shape:
            raise ValueError(f"residual must have the output's shape {out_shape}, got {tuple(residual.shape)}")
    check_bool("relu", relu)
    return CONV2D_REQUEST.make(
        {"batch": batch, "c_in": c_in, "c_out": c_out, "height": height, "width": width, "stride": stride},
        {"kernel": (kh, kw), "padding": padding, "residual": residual is not None, "relu": relu,
         "requires_grad": needs_grad(x, weight, bias, residual)},
        tensor=x)


@routed_op(_conv2d_request)
def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           stride: int = 1, padding: int = 0, residual: Optional[torch.Tensor] = None,
           relu: bool = False) -> torch.Tensor:
    """relu?(torch.nn.functional.conv2d(x, weight, bias, stride, padding) + residual) for NCHW x, or
    CHW x (one image, as torch takes it; residual then CHW too).

    The output has x's dtype; the kernels accumulate in fp32 (true fp32 unless an approved
    candidate says otherwise). A call whose signature (shapes, dtypes, devices, autograd, options) repeats
    an earlier one is not validated or routed again.
    """
    if compiling():
        if needs_grad(x, weight, bias, residual):
            return run_eagerly(conv2d, x, weight, bias, stride=stride, padding=padding, residual=residual, relu=relu)
        return _conv2d_op(x, weight, bias, residual, options_text(stride=stride, padding=padding, relu=relu))
    signature = call_signature("conv2d", (x, weight, bias, residual), (stride, padding, relu))
    r = routed_call(signature, lambda: _conv2d_request(x, weight, bias, stride=stride, padding=padding,
                                                       residual=residual, relu=relu),
                    lambda: (conv2d, (x, weight, bias),
                             {"stride": stride, "padding": padding, "residual": residual, "relu": relu}))
    unbatched = x.dim() == 3
    if unbatched:
        x, residual = x.unsqueeze(0), None if residual is None else residual.unsqueeze(0)
    out = backend_module(r).conv2d(x, weight, bias, stride=_check_int("stride", stride, 1),
                          padding=_check_int("padding", padding, 0), residual=residual, relu=relu,
                          candidate=r.candidate, route=r)
    return out.squeeze(0) if unbatched else out


@torch.library.custom_op("rlx_triton::conv2d", mutates_args=())
def _conv2d_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
               options: str) -> torch.Tensor:
    """conv2d under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return conv2d(x, weight, bias, residual=residual, **options_from(options)).contiguous()


@_conv2d_op.register_fake
def _conv2d_fake(x, weight, bias, residual, options):
    values = options_from(options)
    _conv2d_request(x, weight, bias, residual=residual, **values)
    stride, padding = _check_int("stride", values["stride"], 1), _check_int("padding", values["padding"], 0)
    kh, kw = weight.shape[2], weight.shape[3]
    spatial = (_out_size(x.shape[-2], kh, stride, padding), _out_size(x.shape[-1], kw, stride, padding))
    return x.new_empty((*x.shape[:-3], weight.shape[0], *spatial))


def _linear_request(x, weight, bias=None) -> Request:
    check_tensor("x", x, (2,), CONV2D_REQUEST.dtypes, "(rows, in_features)")
    check_tensor("weight", weight, (2,), FLOAT_DTYPES, "(out_features, in_features)")
    check_device("weight", weight, x, "the input")
    if weight.shape[1] != x.shape[1]:
        # torch's F.linear raises RuntimeError ("mat1 and mat2 shapes cannot be multiplied")
        raise InputShapeError(f"x of shape {tuple(x.shape)} has {x.shape[1]} features, but weight of size "
                              f"{list(weight.shape)} expects in_features={weight.shape[1]}")
    if bias is not None:
        check_tensor("bias", bias, (1,), FLOAT_DTYPES, f"(out_features={weight.shape[0]},)")
        check_device("bias", bias, x, "the input")
        check_shape("bias", bias, (weight.shape[0],))
    rows, in_features = x.shape
    # one pixel per row under a 1x1 kernel
    return CONV2D_REQUEST.make(
        {"batch": rows, "c_in": in_features, "c_out": weight.shape[0], "height": 1, "width": 1, "stride": 1},
        {"kernel": (1, 1), "padding": 0, "residual": False, "relu": False,
         "requires_grad": needs_grad(x, weight, bias)},
        tensor=x)


@routed_op(_linear_request)
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """torch.nn.functional.linear for 2-D x: the embedding projection, run as a 1x1 conv2d (a repeated call
    signature is not validated or routed again)."""
    if compiling():
        return run_eagerly(linear, x, weight, bias) if needs_grad(x, weight, bias) else _linear_op(x, weight, bias)
    r = routed_call(call_signature("linear", (x, weight, bias)), lambda: _linear_request(x, weight, bias),
                    lambda: (linear, (x, weight, bias), {}))
    return backend_module(r).linear(x, weight, bias, candidate=r.candidate, route=r)


@torch.library.custom_op("rlx_triton::linear", mutates_args=())
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """linear under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return linear(x, weight, bias).contiguous()


@_linear_op.register_fake
def _linear_fake(x, weight, bias):
    _linear_request(x, weight, bias)
    return x.new_empty((x.shape[0], weight.shape[0]))


def _pool_weights(x: torch.Tensor, weights: Optional[torch.Tensor]):
    """pyannote's weight handling: (B, T') or (B, S, T'), nearest-interpolated to x's T frames."""
    if weights is None:
        return None, False
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"weights must be a torch.Tensor (batch, frames) or (batch, speakers, frames), "
                        f"got {type(weights).__name__}")
    if weights.dim() not in (2, 3):
        raise ValueError(f"weights must be (batch, frames) or (batch, speakers, frames), got shape "
                         f"{tuple(weights.shape)}")
    check_device("weights", weights, x, "the input")
    if weights.shape[0] != x.shape[0]:
        raise ValueError(f"weights must have batch={x.shape[0]}, got shape {tuple(weights.shape)}")
    has_speakers = weights.dim() == 3
    w = weights if has_speakers else weights.unsqueeze(1)
    if w.shape[2] != x.shape[2]:
        w = F.interpolate(w, size=x.shape[2], mode="nearest")
    return w, has_speakers


def _stats_pool_request(sequences, weights=None) -> Request:
    check_tensor("sequences", sequences, (3,), STATS_POOL_REQUEST.dtypes, "(batch, features, frames)")
    if sequences.shape[2] < 1:
        raise ValueError(f"sequences must have at least one frame, got shape {tuple(sequences.shape)}")
    w, _ = _pool_weights(sequences, weights)
    batch, features, frames = sequences.shape
    return STATS_POOL_REQUEST.make(
        {"batch": batch * (1 if w is None else w.shape[1]), "c_in": features, "length": frames},
        {"weighted": w is not None, "requires_grad": needs_grad(sequences, weights)},
        tensor=sequences)


@routed_op(_stats_pool_request)
def stats_pool(sequences: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Concatenated temporal mean and unbiased std, as pyannote's `StatsPool.forward(sequences, weights)`.

    sequences (batch, features, frames) -> (batch, 2 * features); with weights (batch, frames) the
    same shape, with weights (batch, speakers, frames) -> (batch, speakers, 2 * features). A repeated call
    signature is not validated or routed again.
    """
    if compiling():
        if needs_grad(sequences, weights):
            return run_eagerly(stats_pool, sequences, weights)
        return _stats_pool_op(sequences, weights)
    r = routed_call(call_signature("stats_pool", (sequences, weights)),
                    lambda: _stats_pool_request(sequences, weights), lambda: (stats_pool, (sequences, weights), {}))
    w, has_speakers = _pool_weights(sequences, weights)
    out = backend_module(r).stats_pool(sequences, None if w is None else w.to(sequences.dtype), candidate=r.candidate,
                              route=r)
    if w is not None and not has_speakers:
        out = out[:, 0]
    return out


@torch.library.custom_op("rlx_triton::stats_pool", mutates_args=())
def _stats_pool_op(sequences: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
    """stats_pool under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return stats_pool(sequences, weights).contiguous()


@_stats_pool_op.register_fake
def _stats_pool_fake(sequences, weights):
    _stats_pool_request(sequences, weights)
    batch, features = sequences.shape[0], 2 * sequences.shape[1]
    return sequences.new_empty((batch, weights.shape[1], features) if weights is not None and weights.dim() == 3
                               else (batch, features))


def fold_batchnorm(weight: torch.Tensor, bias: Optional[torch.Tensor], bn) -> tuple:
    """Fold an eval-mode BatchNorm{1,2}d into the preceding conv or linear: returns (weight, bias),
    float64 for a float64 weight, else float32 (the kernels' weight dtype).

    bn(conv(x) + b) = conv'(x) + b' with w' = w * gamma / sqrt(var + eps) per output channel and
    b' = (b - mean) * gamma / sqrt(var + eps) + beta, computed in float64 and rounded once, so a
    zero-variance channel (running_var 0) folds to gamma / sqrt(eps) exactly as eval BatchNorm divides.
    """
    if not isinstance(bn, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
        raise TypeError(f"bn must be a torch.nn.BatchNorm1d/2d, got {type(bn).__name__}")
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("bn must track running statistics (track_running_stats=True) to be folded")
    if bn.num_features != weight.shape[0]:
        raise ValueError(f"bn has {bn.num_features} features but weight has {weight.shape[0]} output channels")
    w = weight.detach().double()
    b = bias.detach().double() if bias is not None else torch.zeros(w.shape[0], dtype=torch.float64,
                                                                     device=w.device)
    mean = bn.running_mean.detach().double()
    var = bn.running_var.detach().double()
    gamma = bn.weight.detach().double() if bn.weight is not None else torch.ones_like(mean)
    beta = bn.bias.detach().double() if bn.bias is not None else torch.zeros_like(mean)
    scale = gamma / torch.sqrt(var + bn.eps)
    w_folded = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    b_folded = (b - mean) * scale + beta
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    return w_folded.to(dtype).contiguous(), b_folded.to(dtype).contiguous()
