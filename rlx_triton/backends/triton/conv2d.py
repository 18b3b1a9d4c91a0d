"""Triton kernels of the conv family for 2-D convolution: the WeSpeaker ResNet trunk and its pooling.

Three kernels, each a launcher with the same name and signature in `backends/torch_ref/conv2d.py`:

- `_conv2d_kernel` — implicit-GEMM convolution of an NCHW input. The GEMM is
  (c_out x c_in*kh*kw) @ (c_in*kh*kw x output pixels); each program owns a BLOCK_CO x BLOCK_P tile
  of the output and walks the reduction in BLOCK_K chunks, gathering the input patch on the fly.
  BatchNorm (eval) is folded into the weights and bias before launch (ops.conv2d.fold_batchnorm); the
  epilogue adds the bias and the residual and applies ReLU in the same kernel
  (`fuse_epilogue=True`) or in `_bias_act_kernel`, a separate elementwise pass.
  tf32x3 candidates (true fp32 on TF32 tensor cores) run `_igemm_tf32x3` instead: pixels x channels
  (the pixels on the MMA's M side, the channel tile on N, fitted to the layer: 32 or 64), the input
  patch split into TF32 halves in registers and the weights split once per weight version
  (split_weights), one 4-term TF32 dot per step (conv.dot_split), so each step's MMA group stays in
  flight while the next tiles load through cp.async. sm_90: both tiles keep one wgmma group in flight
  in the loop (WARPGROUP.DEPBAR.LE gsb0, 0x1 in the SASS); at the trunk's shapes the 64 x 64 x 16 tile
  holds 170-192 registers (2 CTAs/SM) and the 64 x 32 x 16 tile of the 32-channel layers 104 (4 CTAs/SM).
- `_stats_pool_kernel` — TSTP statistics pooling: mean and (unbiased) standard deviation over
  time, optionally weighted by per-frame weights exactly as pyannote's `StatsPool` computes them.
- The 5120 -> 256 projection after the pooling is a 1x1 convolution over one pixel, so `linear`
  launches `_conv2d_kernel` on a (rows, in_features, 1, 1) view.

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

from typing import Optional

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
# the conv family's candidate helpers, shared with the 1-D module (tests and bench use them from here too)
from rlx_triton.backends.triton.conv import (UNIT_OF_PRECISION, aligned_pointers, all_candidates,  # noqa: F401
                                             cached_weight, candidate_tag, default_candidate, dot_split,
                                             make_candidate, split_terms)
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.conv import ConvVariant
from rlx_triton.router.coverage import Coverage

# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------


@triton.jit
def _igemm_tf32x3(x_pixel_base, w_split_ptr, mask_p, ih_base, iw_base, offs_co, mask_co,
                  c_in, height, width,
                  KH: tl.constexpr, KW: tl.constexpr, FOLD_TAPS: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[p, co] = sum_k X[p, k] W[k, co] in true fp32 on TF32 tensor cores.

    Each step is one dot_split: the input patch split in registers, the weights split once per weight
    version (split_weights: (c_out, 4 * KH*KW*c_in), the four terms of k = tap * c_in + ci contiguous,
    K-major as TF32 MMAs read them from shared memory)."""
    k_total = c_in * KH * KW
    plane = height * width
    offs_k = tl.arange(0, BLOCK_K)
    offs_term = tl.arange(0, 4 * BLOCK_K)
    w_rows = w_split_ptr + offs_co.to(tl.int64)[None, :] * (4 * k_total)
    acc = tl.zeros((BLOCK_P, BLOCK_CO), dtype=tl.float32)
    if FOLD_TAPS:
        for k0 in range(0, k_total, BLOCK_K):
            k = k0 + offs_k
            mask_k = k < k_total
            tap = k // c_in
            ci = k % c_in
            ih = ih_base[:, None] + (tap // KW)[None, :]
            iw = iw_base[:, None] + (tap % KW)[None, :]
            inside = (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)  # zero padding
            x_ptrs = x_pixel_base[:, None] + ((ci * plane)[None, :] + ih * width + iw)
            x_tile = tl.load(x_ptrs, mask=mask_p[:, None] & mask_k[None, :] & inside, other=0.0).to(tl.float32)
            w_terms = 4 * k0 + offs_term
            w_tile = tl.load(w_rows + w_terms[:, None], mask=(w_terms < 4 * k_total)[:, None] & mask_co[None, :],
                             other=0.0)
            acc = dot_split(x_tile, w_tile, acc, BLOCK_P, BLOCK_K)
    else:
        n_chunks = tl.cdiv(c_in, BLOCK_K)
        for it in range(0, KH * KW * n_chunks):
            tap = it // n_chunks
            ci0 = (it % n_chunks) * BLOCK_K
            ci = ci0 + offs_k
            ih = ih_base + tap // KW
            iw = iw_base + tap % KW
            mask_pix = mask_p & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)  # zero padding
            x_ptrs = (x_pixel_base + (ih * width + iw))[:, None] + (ci * plane)[None, :]
            x_tile = tl.load(x_ptrs, mask=mask_pix[:, None] & (ci < c_in)[None, :], other=0.0).to(tl.float32)
            w_terms = 4 * ci0 + offs_term
            w_tile = tl.load(w_rows + (4 * tap * c_in + w_terms)[:, None],
                             mask=(w_terms < 4 * c_in)[:, None] & mask_co[None, :], other=0.0)
            acc = dot_split(x_tile, w_tile, acc, BLOCK_P, BLOCK_K)
    return acc


@triton.jit
def _conv2d_kernel(
    x_ptr, w_ptr, w_split_ptr, bias_ptr, res_ptr, out_ptr,
    batch, c_in, height, width,
    c_out, out_h, out_w,
    stride, padding,
    stride_wo, stride_wi, stride_wh, stride_ww,
    batch_bucket,  # next power of two of batch: the autotune key, unused by the body
    KH: tl.constexpr, KW: tl.constexpr, FOLD_TAPS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, APPLY_RELU: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[b, co, oh, ow] = act(sum_{ci,kh,kw} x[b, ci, oh*s-p+kh, ow*s-p+kw] * w[co, ci, kh, kw] + bias[co] + res).

    PRECISION "tf32x3" reads the split weights (w_split_ptr, see split_weights) and runs `_igemm_tf32x3`;
    "ieee" and "tf32" read w_ptr through its strides."""
    pid_p = tl.program_id(0)
    pid_co = tl.program_id(1)

    # Output pixels of this tile, flattened over (batch, out_h, out_w).
    n_pixels = batch * out_h * out_w
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < n_pixels
    b_idx = offs_p // (out_h * out_w)
    pix = offs_p % (out_h * out_w)
    oh = pix // out_w
    ow = pix % out_w
    # int64: batch * c_in * height * width can pass 2^31 for long chunks and wide layers.
    x_pixel_base = x_ptr + b_idx.to(tl.int64) * c_in * height * width

    offs_co = pid_co * BLOCK_CO + tl.arange(0, BLOCK_CO)
    mask_co = offs_co < c_out
    offs_k = tl.arange(0, BLOCK_K)
    plane = height * width
    ih_base = oh * stride - padding
    iw_base = ow * stride - padding
    w_co = w_ptr + offs_co.to(tl.int64) * stride_wo

    if PRECISION == "tf32x3":
        # pixels x channels on the tensor cores, transposed once for the epilogue below
        acc = tl.trans(_igemm_tf32x3(x_pixel_base, w_split_ptr, mask_p, ih_base, iw_base, offs_co, mask_co,
                                     c_in, height, width, KH, KW, FOLD_TAPS, BLOCK_P, BLOCK_CO, BLOCK_K))
    else:
        # The GEMM is computed transposed, acc[co, p] = W[co, k] @ X[k, p], so that output pixels are the
        # fastest axis of every tile: input loads, residual loads and output stores then walk contiguous
        # NCHW memory (a warp covers consecutive pixels of one channel).
        acc = tl.zeros((BLOCK_CO, BLOCK_P), dtype=tl.float32)
        if FOLD_TAPS:
            # Few input channels (the stem has one): the reduction index k = ci * KH * KW + kh * KW + kw runs
            # over channels and taps together, so a BLOCK_K chunk is not mostly padding.
            k_total = c_in * KH * KW
            for k0 in range(0, k_total, BLOCK_K):
                k = k0 + offs_k
                mask_k = k < k_total
                ci = k // (KH * KW)
                kh = (k % (KH * KW)) // KW
                kw = k % KW
                ih = ih_base[None, :] + kh[:, None]
                iw = iw_base[None, :] + kw[:, None]
                inside = (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)  # zero padding
                # Input patch [BLOCK_K, BLOCK_P].
                x_ptrs = x_pixel_base[None, :] + ((ci * plane)[:, None] + ih * width + iw)
                mask_x = mask_k[:, None] & mask_p[None, :] & inside
                x_tile = tl.load(x_ptrs, mask=mask_x, other=0.0).to(tl.float32)
                # Weight tile [BLOCK_CO, BLOCK_K].
                w_ptrs = w_co[:, None] + (ci * stride_wi + kh * stride_wh + kw * stride_ww)[None, :]
                mask_w = mask_co[:, None] & mask_k[None, :]
                w_tile = tl.load(w_ptrs, mask=mask_w, other=0.0).to(tl.float32)
                acc = tl.dot(w_tile, x_tile, acc, input_precision=PRECISION)
        else:
            # One flat loop over (tap, channel chunk): per tap the input row of each output pixel is one
            # address, so the patch gather is a [BLOCK_P] address plus [BLOCK_K] channel offsets. Offsets
            # inside one batch item (c_in * height * width) stay int32; the batch offset is int64 above.
            n_chunks = tl.cdiv(c_in, BLOCK_K)
            for it in range(0, KH * KW * n_chunks):
                tap = it // n_chunks
                ci = (it % n_chunks) * BLOCK_K + offs_k
                kh = tap // KW
                kw = tap % KW
                ih = ih_base + kh
                iw = iw_base + kw
                mask_pix = mask_p & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)  # zero padding
                mask_ci = ci < c_in
                # Input patch [BLOCK_K, BLOCK_P].
                x_ptrs = (ci * plane)[:, None] + (x_pixel_base + (ih * width + iw))[None, :]
                mask_x = mask_ci[:, None] & mask_pix[None, :]
                x_tile = tl.load(x_ptrs, mask=mask_x, other=0.0).to(tl.float32)
                # Weight tile [BLOCK_CO, BLOCK_K].
                w_ptrs = (w_co + (kh * stride_wh + kw * stride_ww))[:, None] + (ci * stride_wi)[None, :]
                mask_w = mask_co[:, None] & mask_ci[None, :]
                w_tile = tl.load(w_ptrs, mask=mask_w, other=0.0).to(tl.float32)
                acc = tl.dot(w_tile, x_tile, acc, input_precision=PRECISION)

    # Epilogue: bias (folded BatchNorm shift), residual, ReLU.
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_co, mask=mask_co, other=0.0).to(tl.float32)
        acc += bias[:, None]
    out_plane = out_h * out_w
    out_offs = offs_co[:, None].to(tl.int64) * out_plane + (b_idx.to(tl.int64) * c_out * out_plane + pix)[None, :]
    mask_out = mask_co[:, None] & mask_p[None, :]
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + out_offs, mask=mask_out, other=0.0).to(tl.float32)
        acc += res
    if APPLY_RELU:
        acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL)   # relu(NaN) is NaN, as in torch
    tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask_out)


@triton.jit
def _bias_act_kernel(
    y_ptr, bias_ptr, res_ptr, out_ptr,
    n_elements, c_out, plane,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, APPLY_RELU: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The unfused epilogue: out = act(y + bias[channel] + res), elementwise over an NCHW tensor."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        channel = (offs // plane) % c_out
        y += tl.load(bias_ptr + channel, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if APPLY_RELU:
        y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _stats_pool_kernel(
    x_ptr, w_ptr, out_ptr,
    features, frames, num_speakers,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """out[b, s, :D] = mean over time, out[b, s, D:] = std over time of x[b, :D, :T].

    Unweighted: torch.mean and torch.std (correction=1; one frame gives std 0, as pyannote does).
    Weighted (w[b, s, t]): v1 = sum w + 1e-8, mean = sum w x / v1,
    var = sum w (x - mean)^2 / (v1 - sum w^2 / v1 + 1e-8), pyannote's `_pool`.
    Two passes over time (mean, then squared deviations) keep the variance free of cancellation, and
    both run on shifted data, x - center with center = the row's first frame (0 if that is infinite):
    an exactly constant row has an exactly zero std (unweighted), and an offset row keeps the digits its
    offset would cancel.
    """
    pid_bs = tl.program_id(0)  # (batch, speaker)
    pid_d = tl.program_id(1)
    b_idx = pid_bs // num_speakers

    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < features
    x_row = x_ptr + (b_idx.to(tl.int64) * features + offs_d.to(tl.int64)) * frames
    w_row = w_ptr + pid_bs.to(tl.int64) * frames
    center = tl.load(x_row, mask=mask_d, other=0.0).to(tl.float32)
    # an infinite first frame would turn the shifted sums into inf - inf: no shift then (torch's mean
    # of a row with -inf is -inf); NaN stays NaN either way
    center = tl.where(tl.abs(center) < float("inf"), center, 0.0)

    # Pass 1: (weighted) sum of x and of the weights.
    sum_x = tl.zeros((BLOCK_D,), dtype=tl.float32)
    sum_w = tl.zeros((BLOCK_T,), dtype=tl.float32)
    sum_w2 = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for t0 in range(0, frames, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < frames
        mask_x = mask_d[:, None] & mask_t[None, :]
        x = tl.load(x_row[:, None] + offs_t[None, :], mask=mask_x, other=0.0).to(tl.float32)
        x = tl.where(mask_x, x - center[:, None], 0.0)
        if HAS_WEIGHTS:
            w = tl.load(w_row + offs_t, mask=mask_t, other=0.0).to(tl.float32)
            sum_x += tl.sum(x * w[None, :], axis=1)
            sum_w += w
            sum_w2 += w * w
        else:
            sum_x += tl.sum(x, axis=1)
    if HAS_WEIGHTS:
        v1 = tl.sum(sum_w, axis=0) + 1e-8
        v2 = tl.sum(sum_w2, axis=0)
        # sum w x / v1 = center + (sum w (x - center) - 1e-8 * center) / v1
        shifted_mean = (sum_x - 1e-8 * center) / v1
    else:
        shifted_mean = sum_x / frames

    # Pass 2: (weighted) squared deviations from the mean.
    sum_dx2 = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for t0 in range(0, frames, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < frames
        mask_x = mask_d[:, None] & mask_t[None, :]
        x = tl.load(x_row[:, None] + offs_t[None, :], mask=mask_x, other=0.0).to(tl.float32)
        dx = tl.where(mask_x, (x - center[:, None]) - shifted_mean[:, None], 0.0)
        if HAS_WEIGHTS:
            w = tl.load(w_row + offs_t, mask=mask_t, other=0.0).to(tl.float32)
            sum_dx2 += tl.sum(dx * dx * w[None, :], axis=1)
        else:
            sum_dx2 += tl.sum(dx * dx, axis=1)
    if HAS_WEIGHTS:
        var = sum_dx2 / (v1 - v2 / v1 + 1e-8)
    else:
        var = sum_dx2 / tl.maximum(frames - 1, 1)
    std = tl.sqrt(var)
    mean = center + shifted_mean

    out_row = out_ptr + pid_bs.to(tl.int64) * (2 * features)
    tl.store(out_row + offs_d, mean.to(out_ptr.dtype.element_ty), mask=mask_d)
    tl.store(out_row + features + offs_d, std.to(out_ptr.dtype.element_ty), mask=mask_d)


# ---------------------------------------------------------------------------------------------
# Launch plans (rlx_triton/backends/triton/launches.py): every launch of this module as a record
# ---------------------------------------------------------------------------------------------


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
    """The (c_out, c_in, kh, kw) weight for the tf32x3 GEMM: split_terms of its (c_out, kh * kw * c_in) form,
    k = tap * c_in + ci; cached per weight version."""
    return cached_weight(weight, lambda w: split_terms(w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)), "conv2d_split")


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


def igemm_flops(grid, meta, c_in: int, kh: int, kw: int, fold_taps: bool) -> int:
    """FLOPs the dots of a `_conv2d_kernel` launch execute: every program walks the whole reduction in
    BLOCK_K steps on a full BLOCK_CO x BLOCK_P tile (masked lanes included)."""
    programs = 1
    for g in grid:
        programs *= g
    block_k = meta["BLOCK_K"]
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
    args = (x, weight, w_split,
            bias if (fused and bias is not None) else weight,
            residual if (fused and residual is not None) else gemm_out,
            gemm_out,
            batch, c_in, height, width, c_out, out_h, out_w, stride, padding,
            weight.stride(0), weight.stride(1), weight.stride(2), weight.stride(3),
            triton.next_power_of_2(batch))
    fold_taps = c_in < FOLD_TAPS_BELOW
    flags = dict(KH=kh, KW=kw, FOLD_TAPS=fold_taps, HAS_BIAS=fused and bias is not None,
                 HAS_RESIDUAL=fused and residual is not None, APPLY_RELU=fused and relu)
    weight_bytes = _nbytes(w_split) if candidate.precision == "tf32x3" else _nbytes(weight)
    counts = dict(bytes_read=_nbytes(x) + weight_bytes + (_nbytes(bias) + _nbytes(residual) if fused else 0),
                  bytes_written=_nbytes(gemm_out), unit=UNIT_OF_PRECISION[candidate.precision])

    def grid_for(meta):
        return (triton.cdiv(n_pixels, meta["BLOCK_P"]), triton.cdiv(c_out, meta["BLOCK_CO"]))

    if tuned is not None:
        config = tuned.config_of(candidate).kwargs
        gemm = Launch.tuned(tuned, candidate, grid_for, args, flags, route=route,
                            flops=igemm_flops(grid_for(config), config, c_in, kh, kw, fold_taps), **counts)
    else:
        meta = _meta(candidate)
        num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
        gemm = Launch(_conv2d_kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=num_warps,
                      num_stages=num_stages, flops=igemm_flops(grid_for(meta), meta, c_in, kh, kw, fold_taps),
                      **counts)
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


# ---------------------------------------------------------------------------------------------
# Routing data
# ---------------------------------------------------------------------------------------------

COVERAGE = Coverage(
    ops=frozenset({"conv2d", "stats_pool"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"taps": (1, 49), "stride": (1, 4), "c_in": (1, 1 << 16), "c_out": (1, 1 << 17),
            "batch": (1, 1 << 20)},
    features={
        "kernel": frozenset((kh, kw) for kh in range(1, 8) for kw in range(1, 8)),
        "padding": frozenset(range(0, 4)),
        "residual": frozenset({True, False}),
        "relu": frozenset({True, False}),
        "weighted": frozenset({True, False}),  # stats_pool with or without frame weights
        "requires_grad": frozenset({False}),  # forward-only kernels: calls autograd records go to torch
    },
)

# True-fp32 candidates (ieee, tf32x3) are approved on the error the sweep test re-measures
# (tests/triton/test_conv2d.py::test_every_conv_candidate_meets_its_approval). The interpreter computes
# fp32 dots exactly whatever the precision, so it cannot measure TF32 rounding: plain tf32 stays
# unapproved until a GPU run (tests marked gpu) measures it.
_WHERE = "interpreter, tests/triton/test_conv2d.py (3x3/1x1, stride 1/2, residual+relu, vs float64)"
CONV2D_MAX_REL_ERR = 1e-5


APPROVALS = approvals_by_precision("conv", {"ieee": CONV2D_MAX_REL_ERR, "tf32x3": CONV2D_MAX_REL_ERR}, _WHERE)


def _bucket(value: int) -> int:
    """The power of two at or above value: what the route cache buckets a field to."""
    return 1 << max(0, (int(value) - 1).bit_length())


def recipe_key(request) -> str:
    """The layer geometry a recipe is chosen for: "KHxKW/stride c_in->c_out", channels in the route
    cache's power-of-two buckets (requests that share a route share a recipe)."""
    fields = request.field_map
    kh, kw = request.feature_map.get("kernel", (1, 1))
    return f"{kh}x{kw}/{fields['stride']} {_bucket(fields['c_in'])}->{_bucket(fields['c_out'])}"


def _trunk_recipes() -> dict:
    """The tf32x3 tile of each conv geometry of a WeSpeaker ResNet (m_channels 32: ResNet34 and its kin):
    the 32-wide channel tile on the 32-channel stem and layer1, the 64-wide one elsewhere, so no tile
    computes channels the layer lacks; both keep >= 2 CTAs per SM on sm_80 and sm_90 (rlx-triton perf
    --device h200 / a100 embedding). The seg_1 projection (5120 -> 256 as a 1x1 conv over 32 rows) is
    a weight stream on 8 CTAs: the ieee tile reads the weights once, the split terms would read them
    four times (est. 45 vs 79 us on an H200)."""
    narrow, wide = ConvVariant.TF32X3_P64_CO32.tag(), ConvVariant.TF32X3_P64_CO64.tag()
    table = {"3x3/1 1->32": narrow, "3x3/1 32->32": narrow, "1x1/1 8192->256": ConvVariant.IEEE_P64_CO32.tag(),
             "*": wide}
    for c_in in (32, 64, 128):
        table.update({f"3x3/2 {c_in}->{2 * c_in}": wide, f"1x1/2 {c_in}->{2 * c_in}": wide,
                      f"3x3/1 {2 * c_in}->{2 * c_in}": wide})
    return table


# Device class -> candidate tag, or layer geometry (recipe_key) -> tag. sm_90 and sm_80: the trunk tiles
# above (true fp32, tf32x3; estimates of rlx-triton perf until bench/embedding.py measures a GPU;
# `rlx-triton tune wespeaker` records measured winners, which take precedence). In the interpreter the
# cost is per program, so the widest ieee tile wins (measured on a 2x4x16x48 3x3 conv: 128x64 tiles
# 0.17 s, 64x32 tiles 0.34 s).
RECIPES = {"interpreter": ConvVariant.IEEE_P128_CO64.tag(), "sm90": _trunk_recipes(), "sm80": _trunk_recipes()}
SPEED_EVIDENCE: dict = {}


def _audit_kernels() -> list:
    candidates = tuple(all_candidates())
    conv_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*fp32", "w_split_ptr": "*fp32", "bias_ptr": "*fp32",
        "res_ptr": "*{dt}", "out_ptr": "*{dt}",
        "batch": "i32", "c_in": "i32", "height": "i32", "width": "i32",
        "c_out": "i32", "out_h": "i32", "out_w": "i32", "stride": "i32", "padding": "i32",
        "stride_wo": "i32", "stride_wi": "i32", "stride_wh": "i32", "stride_ww": "i32", "batch_bucket": "i32",
        "KH": "constexpr", "KW": "constexpr", "FOLD_TAPS": "constexpr", "HAS_BIAS": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "APPLY_RELU": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_CO": "constexpr", "BLOCK_K": "constexpr",
    }
    pool_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*{dt}", "out_ptr": "*{dt}",
        "features": "i32", "frames": "i32", "num_speakers": "i32",
        "HAS_WEIGHTS": "constexpr", "BLOCK_D": "constexpr", "BLOCK_T": "constexpr",
    }
    return [
        AuditSpec(
            name="conv2d_igemm_3x3", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=3, KW=3, FOLD_TAPS=False, HAS_BIAS=True, HAS_RESIDUAL=True, APPLY_RELU=True,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv2d_igemm_1x1", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=1, KW=1, FOLD_TAPS=False, HAS_BIAS=True, HAS_RESIDUAL=False, APPLY_RELU=False,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(  # the stem: one input channel, taps folded into the reduction
            name="conv2d_igemm_stem", family="conv", kernel=_conv2d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(KH=3, KW=3, FOLD_TAPS=True, HAS_BIAS=True, HAS_RESIDUAL=False, APPLY_RELU=True,
                                    **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv2d_stats_pool", family="conv", kernel=_stats_pool_kernel, signature=pool_signature,
            meta=lambda c, dt: dict(HAS_WEIGHTS=True, BLOCK_D=_POOL_BLOCK_D, BLOCK_T=64, num_warps=4, num_stages=1),
            # the pooling kernel has fixed blocks: no candidate field changes it, so one variant is compiled
            candidates=(default_candidate(),), default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
    ]


AUDIT_KERNELS = _audit_kernels()
