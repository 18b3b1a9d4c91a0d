"""Launch plans of the 2-D convolutions: candidate -> meta-parameters, the launch records with their byte
and FLOP models, the tf32x3 split weights and the autotune bridge.

Launch plans: `conv2d_plan`, `linear_plan` and `stats_pool_plan` build the records
(rlx_triton/backends/triton/launches.py) their launchers run, from meta tensors too; a routed fused
conv2d is a `Launch.tuned` record of the autotune bridge stating the route's config. FLOPs are those the
dots execute on full tiles; bytes are the minimum traffic. `launch_count(request, candidate)` states
the number of launches.

Candidate mapping (the planner's `ConvCandidate`): tile_pos -> BLOCK_P output pixels per program,
tile_co -> BLOCK_CO output channels, tile_k -> BLOCK_K input channels per step of the reduction,
which walks the kh x kw taps and, per tap, c_in in BLOCK_K chunks,
tg_size // 32 -> num_warps, stages -> num_stages, precision -> `tl.dot(input_precision=...)` ("ieee",
"tf32") or the split GEMM ("tf32x3"), fuse_epilogue -> epilogue in the GEMM kernel vs `_bias_act_kernel`.
A routed fused call goes through the autotune bridge; built-in recipes per layer geometry (RECIPES,
recipe_key) give a first forward its tiles without tuning.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.conv.launch import all_candidates
from rlx_triton.backends.triton.conv.weights import cached_weight, split_halves
from rlx_triton.backends.triton.conv2d.kernels import _bias_act_kernel, _conv2d_kernel, _stats_pool_kernel
from rlx_triton.backends.triton.conv2d.routing import APPROVALS
from rlx_triton.backends.triton.launches import Launch


def _meta(candidate) -> dict:
    """ConvCandidate -> meta-parameters of `_conv2d_kernel` (see the module docstring)."""
    return dict(
        BLOCK_P=int(candidate.tile_pos),
        BLOCK_CO=int(candidate.tile_co),
        BLOCK_K=int(candidate.tile_k),
        PRECISION=str(candidate.precision),
        num_warps=max(1, int(candidate.tg_size) // 32),
        num_stages=int(candidate.stages),
    )


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


# Layers with fewer input channels than the smallest BLOCK_K fold the taps into the reduction chunk.
FOLD_TAPS_BELOW = 16
# tf32x3 3x3 stride-1 layers with at least this many input channels run Winograd F(2, 3) (winograd_applies)
WINOGRAD_MIN_C_IN = 16
# what runs a launch's FLOPs: tf32x3 candidates issue three TF32 products per fp32 product (`_tf32.dot_split3`)
CONV2D_UNIT_OF_PRECISION = {"ieee": "fp32_fma", "tf32": "tf32", "tf32x3": "tf32x3"}
# FLOPs per element of the unfused epilogue (bias, residual, ReLU) and, per frame and feature (and
# speaker), of the two pooling passes: shift + sum, then centre + square-add (weighted: one more multiply each)
_EPILOGUE_FLOPS = 3
_POOL_FLOPS = {False: 6, True: 8}


def _config(candidate) -> triton.Config:
    meta = _meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


# Autotune key: layer geometry and the batch bucket (never raw pixel counts, never tensors).
_TUNE_KEY = ["batch_bucket", "c_in", "c_out", "out_h", "out_w", "stride", "KH", "KW"]
_tuned_kernel = None


def tuned_kernel():
    """`_conv2d_kernel` under the autotune bridge, with a config per approved fused-epilogue candidate."""
    global _tuned_kernel
    if _tuned_kernel is None:
        from rlx_triton.backends.triton.autotune import TunedKernel

        candidates = [c for c in all_candidates() if c.fuse_epilogue and c.tag() in APPROVALS]
        _tuned_kernel = TunedKernel(_conv2d_kernel, candidates, _config, key=_TUNE_KEY)
    return _tuned_kernel


def split_weights(weight: torch.Tensor) -> torch.Tensor:
    """The (c_out, c_in, kh, kw) weight for the tf32x3 GEMM: `split_halves` of its (c_out, kh * kw * c_in) form,
    k = tap * c_in + ci; cached per weight version."""
    return cached_weight(weight, lambda w: split_halves(w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)), "conv2d_split")


def winograd_weights(weight: torch.Tensor) -> torch.Tensor:
    """The (c_out, c_in, 3, 3) weight for `_winograd_tf32x3`: each kernel row's Winograd F(2, 3) transform
    U_0 = g0, U_1 = (g0 + g1 + g2) / 2, U_2 = (g0 - g1 + g2) / 2, U_3 = g2, computed in float64 and rounded
    once, as `split_halves` of its (c_out, 12 * c_in) form, k = (kh * 4 + j) * c_in + ci; cached per weight
    version."""
    def make(w):
        g = w.double()
        g0, g1, g2 = g[..., 0], g[..., 1], g[..., 2]                      # (c_out, c_in, kh)
        u = torch.stack((g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2), dim=-1)   # (c_out, c_in, kh, j)
        return split_halves(u.permute(0, 2, 3, 1).reshape(w.shape[0], -1).float())

    return cached_weight(weight, make, "conv2d_winograd")


def winograd_applies(c_in: int, kh: int, kw: int, stride: int) -> bool:
    """Whether a tf32x3 launch runs Winograd F(2, 3) (`_winograd_tf32x3`): 3x3 kernels at stride 1 over
    at least WINOGRAD_MIN_C_IN input channels."""
    return kh == 3 and kw == 3 and stride == 1 and c_in >= WINOGRAD_MIN_C_IN


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


def igemm_flops(grid, meta, c_in: int, kh: int, kw: int, fold_taps: bool, winograd: bool = False) -> int:
    """FLOPs the dots of a `_conv2d_kernel` launch execute: every program walks the whole reduction in
    BLOCK_K steps on a full BLOCK_CO x BLOCK_P tile (masked lanes included); with Winograd, per kernel row
    four products of a BLOCK_P / 2 (pairs) x BLOCK_CO tile."""
    programs = 1
    for g in grid:
        programs *= g
    block_k = meta["BLOCK_K"]
    if winograd:
        return 2 * programs * kh * triton.cdiv(c_in, block_k) * block_k * 4 * (meta["BLOCK_P"] // 2) * meta["BLOCK_CO"]
    steps = triton.cdiv(c_in * kh * kw, block_k) if fold_taps else kh * kw * triton.cdiv(c_in, block_k)
    return 2 * programs * steps * block_k * meta["BLOCK_P"] * meta["BLOCK_CO"]


def conv2d_plan(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                stride: int = 1, padding: int = 0, residual: Optional[torch.Tensor] = None,
                relu: bool = False, candidate, route=None):
    """(records, out) of `conv2d`: the implicit GEMM (through the autotune bridge for a routed fused
    call), then the epilogue pass for an unfused candidate; no records for an empty output."""
    batch, c_in, height, width = x.shape
    c_out, _, kh, kw = weight.shape
    out_h = _out_size(height, kh, stride, padding)
    out_w = _out_size(width, kw, stride, padding)
    x = x.contiguous()  # the weight keeps its strides: nn.Conv2d stores it tap-major (c_in contiguous)
    out = torch.empty((batch, c_out, out_h, out_w), device=x.device, dtype=x.dtype)
    if out.numel() == 0:
        return [], out
    residual = residual.contiguous() if residual is not None else None
    fused = bool(candidate.fuse_epilogue)
    gemm_out = out if fused else torch.empty(out.shape, device=x.device, dtype=torch.float32)
    n_pixels = batch * out_h * out_w
    tuned = tuned_kernel() if (route is not None and fused) else None
    tuned = tuned if tuned is not None and candidate.tag() in tuned.tags else None
    # the split weights, for a tf32x3 launch or a tuned one (whose configs include tf32x3 candidates)
    split = tuned is not None or candidate.precision == "tf32x3"
    w_split = split_weights(weight) if split else weight
    fold_taps = c_in < FOLD_TAPS_BELOW
    winograd = split and winograd_applies(c_in, kh, kw, stride)
    w_wino = winograd_weights(weight) if winograd else w_split
    args = (x, weight, w_split, w_wino,
            bias if (fused and bias is not None) else weight,
            residual if (fused and residual is not None) else gemm_out,
            gemm_out,
            batch, c_in, height, width, c_out, out_h, out_w, stride, padding,
            weight.stride(0), weight.stride(1), weight.stride(2), weight.stride(3),
            triton.next_power_of_2(batch))
    flags = dict(KH=kh, KW=kw, FOLD_TAPS=fold_taps, WINOGRAD=winograd, HAS_BIAS=fused and bias is not None,
                 HAS_RESIDUAL=fused and residual is not None, APPLY_RELU=fused and relu)
    tf32x3 = candidate.precision == "tf32x3"
    weight_bytes = (_nbytes(w_wino) if winograd else _nbytes(w_split)) if tf32x3 else _nbytes(weight)
    epilogue_bytes = _nbytes(bias) + _nbytes(residual) if fused else 0
    counts: Dict[str, Any] = dict(bytes_read=_nbytes(x) + weight_bytes + epilogue_bytes, bytes_written=_nbytes(gemm_out),
                                  unit=CONV2D_UNIT_OF_PRECISION[candidate.precision])

    def runs_winograd(meta) -> bool:
        return winograd and meta["PRECISION"] == "tf32x3"

    def grid_for(meta):
        if runs_winograd(meta):   # pairs of pixels along each output row
            pairs = batch * out_h * triton.cdiv(out_w, 2)
            return (triton.cdiv(pairs, meta["BLOCK_P"] // 2), triton.cdiv(c_out, meta["BLOCK_CO"]))
        return (triton.cdiv(n_pixels, meta["BLOCK_P"]), triton.cdiv(c_out, meta["BLOCK_CO"]))

    def flops_of(meta) -> int:
        return igemm_flops(grid_for(meta), meta, c_in, kh, kw, fold_taps, runs_winograd(meta))

    if tuned is not None:
        config = tuned.config_of(candidate).kwargs
        gemm = Launch.tuned(tuned, candidate, grid_for, args, flags, route=route, flops=flops_of(config), **counts)
    else:
        meta = _meta(candidate)
        num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
        gemm = Launch(_conv2d_kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=num_warps,
                      num_stages=num_stages, flops=flops_of(meta), **counts)
    if fused:
        return [gemm], out
    n = out.numel()
    block = 1024
    epilogue = Launch(
        _bias_act_kernel, (triton.cdiv(n, block),),
        (gemm_out, bias if bias is not None else gemm_out, residual if residual is not None else gemm_out, out,
         n, c_out, out_h * out_w),
        meta=dict(HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, APPLY_RELU=relu, BLOCK=block),
        num_warps=4, bytes_read=_nbytes(gemm_out) + _nbytes(bias) + _nbytes(residual), bytes_written=_nbytes(out),
        flops=_EPILOGUE_FLOPS * n)
    return [gemm, epilogue], out


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           stride: int = 1, padding: int = 0, residual: Optional[torch.Tensor] = None,
           relu: bool = False, candidate, route=None) -> torch.Tensor:
    """relu?(conv2d(x, weight, bias, stride, padding) + residual) for NCHW x; output in x's dtype.

    `weight` is (c_out, c_in, kh, kw), usually already folded with its BatchNorm; `residual` has the
    output's shape. The caller (ops/conv2d.py) has validated shapes, dtypes and devices. With the
    router's `route` the launch goes through the autotune bridge (the routed candidate is injected; a
    cold bucket may be tuned among the approved candidates where tuning is on); without it the
    candidate is launched directly.
    """
    plan, out = conv2d_plan(x, weight, bias, stride=stride, padding=padding, residual=residual, relu=relu,
                            candidate=candidate, route=route)
    launches.run(plan)
    return out


def linear_plan(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                candidate, route=None):
    """(records, out) of `linear`: a 1x1 convolution over one pixel."""
    rows, in_features = x.shape
    plan, y = conv2d_plan(x.reshape(rows, in_features, 1, 1), weight.reshape(weight.shape[0], in_features, 1, 1),
                          bias, candidate=candidate, route=route)
    return plan, y.reshape(rows, weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
           candidate, route=None) -> torch.Tensor:
    """x @ weight.T + bias for 2-D x (rows, in_features): a 1x1 convolution over one pixel."""
    plan, out = linear_plan(x, weight, bias, candidate=candidate, route=route)
    launches.run(plan)
    return out


_POOL_BLOCK_D = 32


def stats_pool_plan(x: torch.Tensor, weights: Optional[torch.Tensor] = None, *, candidate=None, route=None):
    """(records, out) of `stats_pool`; no records for an empty output."""
    batch, features, frames = x.shape
    x = x.contiguous()
    num_speakers = 1 if weights is None else weights.shape[1]
    out = torch.empty((batch, num_speakers, 2 * features), device=x.device, dtype=x.dtype)
    result = out if weights is not None else out[:, 0]
    if out.numel() == 0:
        return [], result
    w = weights.contiguous() if weights is not None else x
    block_d = _POOL_BLOCK_D
    block_t = 64 if frames >= 64 else max(16, triton.next_power_of_2(frames))
    record = Launch(
        _stats_pool_kernel, (batch * num_speakers, triton.cdiv(features, block_d)),
        (x, w, out, features, frames, num_speakers),
        meta=dict(HAS_WEIGHTS=weights is not None, BLOCK_D=block_d, BLOCK_T=block_t), num_warps=4,
        bytes_read=_nbytes(x) + (_nbytes(w) if weights is not None else 0), bytes_written=_nbytes(out),
        flops=_POOL_FLOPS[weights is not None] * x.numel() * num_speakers)
    return [record], result


def stats_pool(x: torch.Tensor, weights: Optional[torch.Tensor] = None, *, candidate=None,
               route=None) -> torch.Tensor:
    """TSTP / pyannote StatsPool of x (batch, features, frames): (batch, 2F), or (batch, S, 2F) for
    weights (batch, S, frames) already interpolated to `frames` (ops/conv2d.py does that). The pooling
    has no tuned parameters: `candidate` and `route` are accepted for the family's common signature."""
    plan, out = stats_pool_plan(x, weights, candidate=candidate, route=route)
    launches.run(plan)
    return out


def launch_count(request, candidate) -> int:
    """Launches `conv2d` / `linear` (op "conv2d") and `stats_pool` run for a routed request."""
    fields = request.field_map
    if fields["batch"] == 0 or fields["c_out"] == 0 or fields["tokens"] == 0:
        return 0
    if request.op == "stats_pool":
        return 1 if fields["c_in"] else 0
    return 1 if candidate.fuse_epilogue else 2
