"""Triton kernels of the 1-D conv family: pyannote's SincNet stage and a general Conv1d.

One implicit-GEMM kernel (`_conv1d_kernel`) does every 1-D convolution here. The reduction index r
runs over (input channel, tap) pairs, so out[p, co] = sum_r X[p, r] * W[r, co] is one `tl.dot` per
BLOCK_K chunk, with the input tile gathered straight from the signal (no im2col buffer) and the weight
packed once per weight version as (C_in * taps, C_out), so weight tiles load along C_out. Around the
dot it fuses what SincNet needs:
  prologue  per-(batch, input channel) instance norm + leaky ReLU applied to the input as it is
            loaded (the previous block's norm, or the waveform norm), zero padding kept zero;
  epilogue  bias -> |x| -> max-pool (kernel = stride = POOL, floor mode) -> leaky ReLU.
The max-pool is done by running the K loop once per pool phase j (conv position q*POOL + j) and
keeping the running max, so the un-pooled conv output (15975 x 80 per 10 s chunk) is never stored.

Instance norm needs statistics over the whole pooled row, which one conv tile does not see; a
per-(batch, channel) program (`_row_norm_kernel`) computes them (two passes over the row: mean, then
centred variance, deterministic, no atomics; rows longer than 16384, i.e. the waveform, are split into
chunks whose (mean, M2) one more small kernel merges) and either hands a RowNorm (center, scale, shift)
to the next conv's prologue or, for the last block, writes leaky((x - center) * scale + shift) itself.

Constant rows (silence, DC offsets). A row with variance v << eps is normalized by 1/sqrt(eps), ~316x,
and SincNet does that four times in a row, so rounding noise that makes a mathematically constant row
vary by one ulp becomes O(1) after three blocks (measured before this design on an all-zero waveform
with OpenBLAS's Zen kernels in the interpreter: the sinc block's rows vary by up to 1.2e-6 with
std/|mean| up to 1.8, the odd sinc filters summing to ~0; the next blocks by 1.5e-4 and 0.04; the
output by 2.8, where float64 gives a constant). No tolerance on std/|mean| or on the normalized
deviation separates that noise from signal (a -120 dBFS tone produces the same deviations in the sinc
block), so constant rows are made exactly constant instead:
  - statistics are taken from shifted data, x - center with center = the row's first element, in
    every chunk of a chunked row: an exactly constant row sums to exactly 0, so its variance is
    exactly 0, and the norm is applied as (x - center) * scale + shift, which is exactly shift (beta)
    there and keeps the digits a large DC offset would cancel;
  - the conv prologue feeds the dot act(norm(x)) - act(shift), exactly 0 where x == center (an
    explicit test), and adds the removed part, sum_r act(shift[ci(r)]) * W[r, co], once per program:
    an exactly constant input row gives an exactly constant output row, whatever order, tiling or
    precision (ieee, tf32x3) the dot uses.
The rule is therefore exact: a row is constant only if all its values are equal, and then its variance
is 0 and its output beta. Measured after: every SincNet row is exactly constant on all-zero and DC
waveforms (0.5, -100, 1e4) with the default, Zen and Haswell OpenBLAS kernels (spread 0, std/|mean| 0
in every block), and the output matches float64 to 3e-10. Rows that are only nearly constant are data
and are normalized as float64 does; their error is fp32's, |y - y64| <= |gamma| (k u (x_max - x_min)
+ e_in) / sqrt(var + eps) + k u |y - beta|, with k u the few-ulp rounding of the row's own sums and
e_in the error its values already carry (torch's fp32 instance_norm amplifies e_in the same way:
-120 dBFS input carries ~2e-3 relative error after SincNet in either). A NaN or Inf in a row gives a
NaN row, as in torch.

SincNet = 7 launches for pyannote's two Conv1d blocks (8 when the waveform statistics are chunked, as
for 10 s chunks): waveform stats -> sinc conv|abs|pool -> stats -> conv|pool -> stats -> conv|pool ->
stats+normalize+leaky (an unfused candidate adds one epilogue pass per pooled conv). Intermediates
between launches are float32.

Launch plans: every launch is a record (rlx_triton/backends/triton/launches.py) built by a plan function
with its launcher's signature (`sincnet_plan`, `conv1d_plan`), buildable from meta tensors; the launchers
run exactly those records and `launch_count(request, candidate)` states how many. Records count the
minimum traffic (each input, weight and output byte once) and the FLOPs the dots execute on full tiles
(masked lanes included; the elementwise prologue and epilogue are not counted).

The sinc filters themselves are built with torch ops (rlx_triton.ops.conv.sinc_filters), once per
weight version: they are 80 x 251 numbers computed once per parameter update, so a kernel would buy
nothing, and running asteroid's exact op sequence keeps float32 filters bit-identical to pyannote's.

Candidate mapping (ConvCandidate): tile_pos -> BLOCK_P output positions per program (pooled
positions when a pool is fused), tile_co -> BLOCK_CO, tile_k -> BLOCK_K (reduction per loop iteration,
issued as 16-wide tl.dots on GPUs: DOT_K), tg_size // 32 -> num_warps,
stages -> num_stages, precision -> tl.dot input_precision, fuse_epilogue -> abs/pool/leaky in the conv
kernel (True) or in a separate `_epilogue_kernel` pass over the stored conv output (False).
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.config import settings
from rlx_triton.planner.candidates.conv import DEFAULT_VARIANT, ConvCandidate, ConvVariant
from rlx_triton.router.coverage import Coverage

# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _output_offset(w_ptr, bias_ptr, in_shift_ptr, offs_co, co_mask, pid_b, C_in, C_out, in_slope,
                   TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, IN_AFFINE: tl.constexpr, IN_LEAKY: tl.constexpr,
                   BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr, DOT_K: tl.constexpr):
    # bias[co] + (with the norm prologue) sum_r base[ci(r)] * W[r, co]: the input of channel ci is
    # act((x - center) * scale + shift), and its value where x == center, base = act(shift), is taken
    # out of the dot, which then sees exactly 0 wherever the normalized row is exactly constant
    # (silence, DC), whatever order, tiling or precision it sums in
    offset = tl.zeros((BLOCK_CO,), dtype=tl.float32)
    if HAS_BIAS:
        offset += tl.load(bias_ptr + offs_co, mask=co_mask, other=0.0).to(tl.float32)
    if IN_AFFINE:
        R = C_in * TAPS
        for r0 in range(0, R, BLOCK_K):
            for kk in tl.static_range(0, BLOCK_K, DOT_K):
                offs_r = r0 + kk + tl.arange(0, DOT_K)
                r_mask = offs_r < R
                base = tl.load(in_shift_ptr + pid_b * C_in + offs_r // TAPS, mask=r_mask, other=0.0)
                if IN_LEAKY:
                    base = tl.where(base >= 0, base, base * in_slope)
                w_ptrs = w_ptr + offs_r[:, None] * C_out + offs_co[None, :]
                w_tile = tl.load(w_ptrs, mask=r_mask[:, None] & co_mask[None, :], other=0.0).to(tl.float32)
                offset += tl.sum(base[:, None] * w_tile, axis=0)
    return offset


@triton.jit
def _conv1d_kernel(
    x_ptr, w_ptr, bias_ptr, in_center_ptr, in_scale_ptr, in_shift_ptr, out_ptr,
    C_in, L_in, C_out, L_out,
    stride_xb, stride_xc, stride_xl,
    stride_ob, stride_oc, stride_ol,
    conv_stride, padding, dilation,
    in_slope, out_slope,
    TAPS: tl.constexpr,
    POOL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IN_AFFINE: tl.constexpr,
    IN_LEAKY: tl.constexpr,
    ABS: tl.constexpr,
    OUT_LEAKY: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_CO: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_K: tl.constexpr,
):
    # grid: (output position tiles, output channel tiles, batch)
    pid_p = tl.program_id(0)
    pid_co = tl.program_id(1)
    pid_b = tl.program_id(2)

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)      # (pooled) output positions
    offs_co = pid_co * BLOCK_CO + tl.arange(0, BLOCK_CO)  # output channels
    p_mask = offs_p < L_out
    co_mask = offs_co < C_out

    R = C_in * TAPS                                       # reduction length: channels x taps
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb

    # per-channel terms added to every conv output: the bias and, with the norm prologue, the part of
    # the input taken out of the dot (see _output_offset). |x| needs them before each pool phase;
    # otherwise they are added once after the max (max_j (a_j + c) == max_j a_j + c, rounding is
    # monotonic), which keeps them out of the registers of the reduction loop
    if ABS:
        offset = _output_offset(w_ptr, bias_ptr, in_shift_ptr, offs_co, co_mask, pid_b, C_in, C_out, in_slope,
                                TAPS, HAS_BIAS, IN_AFFINE, IN_LEAKY, BLOCK_CO, BLOCK_K, DOT_K)

    result = tl.full((BLOCK_P, BLOCK_CO), float("-inf"), dtype=tl.float32)
    for j in tl.static_range(POOL):
        conv_pos = offs_p * POOL + j                       # conv output position of pool phase j
        in_start = conv_pos * conv_stride - padding        # < L_in + padding: fits int32
        acc = tl.zeros((BLOCK_P, BLOCK_CO), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_K):
            # BLOCK_K per iteration, as DOT_K-wide dots: an fp32 FMA dot holds its whole K slice
            # of both operands in registers, so narrow dots keep the pooled kernels spill-free
            for kk in tl.static_range(0, BLOCK_K, DOT_K):
                offs_r = r0 + kk + tl.arange(0, DOT_K)
                r_mask = offs_r < R
                ci = offs_r // TAPS
                tap = offs_r % TAPS

                # input tile X[p, r] = x[b, ci, start(p) + tap * dilation], zero outside the signal
                pos = in_start[:, None] + (tap * dilation)[None, :]
                x_mask = p_mask[:, None] & r_mask[None, :] & (pos >= 0) & (pos < L_in)
                x_ptrs = (x_base + ci.to(tl.int64) * stride_xc)[None, :] + pos * stride_xl
                x_tile = tl.load(x_ptrs, mask=x_mask, other=0.0).to(tl.float32)
                if IN_AFFINE:
                    row = pid_b * C_in + ci
                    center = tl.load(in_center_ptr + row, mask=r_mask, other=0.0)
                    scale = tl.load(in_scale_ptr + row, mask=r_mask, other=0.0)
                    shift = tl.load(in_shift_ptr + row, mask=r_mask, other=0.0)
                    at_center = x_tile == center[None, :]
                    x_tile = (x_tile - center[None, :]) * scale[None, :] + shift[None, :]
                    base = shift
                    if IN_LEAKY:
                        x_tile = tl.where(x_tile >= 0, x_tile, x_tile * in_slope)
                        base = tl.where(base >= 0, base, base * in_slope)
                    # x == center contributes exactly 0 (an explicit test: no FMA contraction of
                    # act(...) - base can leave a rounding residue); zero padding is applied after the
                    # norm, so a padded input is 0, i.e. -base here
                    x_tile = tl.where(at_center, 0.0, x_tile - base[None, :])
                    x_tile = tl.where(x_mask, x_tile, -base[None, :])

                # weight tile W[r, co] from the (C_in * TAPS, C_out) packed weight: rows of co are contiguous
                w_ptrs = w_ptr + offs_r[:, None] * C_out + offs_co[None, :]
                w_mask = r_mask[:, None] & co_mask[None, :]
                w_tile = tl.load(w_ptrs, mask=w_mask, other=0.0).to(tl.float32)

                acc += tl.dot(x_tile, w_tile, input_precision=PRECISION)

        if ABS:
            acc = tl.abs(acc + offset[None, :])
        result = tl.maximum(result, acc, propagate_nan=tl.PropagateNan.ALL)   # NaN pools to NaN, as in torch

    if not ABS:
        offset = _output_offset(w_ptr, bias_ptr, in_shift_ptr, offs_co, co_mask, pid_b, C_in, C_out, in_slope,
                                TAPS, HAS_BIAS, IN_AFFINE, IN_LEAKY, BLOCK_CO, BLOCK_K, DOT_K)
        result += offset[None, :]
    if OUT_LEAKY:
        result = tl.where(result >= 0, result, result * out_slope)

    out_ptrs = (out_ptr + pid_b.to(tl.int64) * stride_ob
                + offs_co.to(tl.int64)[None, :] * stride_oc
                + offs_p.to(tl.int64)[:, None] * stride_ol)
    out_mask = p_mask[:, None] & co_mask[None, :]
    tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _epilogue_kernel(
    y_ptr, bias_ptr, out_ptr,
    C, L_conv, L_out,
    stride_yb, stride_yc, stride_yl,
    stride_ob, stride_oc, stride_ol,
    out_slope,
    POOL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ABS: tl.constexpr,
    OUT_LEAKY: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # the un-fused epilogue: bias -> |x| -> max-pool -> leaky ReLU over a stored conv output.
    # grid: (batch * channels, position tiles); rows in dim 0, which has no 65535 limit
    row = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = row // C
    c = row % C
    offs = pid_p * BLOCK + tl.arange(0, BLOCK)
    mask = offs < L_out
    y_base = y_ptr + b.to(tl.int64) * stride_yb + c.to(tl.int64) * stride_yc
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + c).to(tl.float32)
    result = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for j in tl.static_range(POOL):
        pos = offs.to(tl.int64) * POOL + j
        v = tl.load(y_base + pos * stride_yl, mask=mask, other=0.0).to(tl.float32) + bias
        if ABS:
            v = tl.abs(v)
        result = tl.maximum(result, v, propagate_nan=tl.PropagateNan.ALL)
    if OUT_LEAKY:
        result = tl.where(result >= 0, result, result * out_slope)
    out_ptrs = out_ptr + b.to(tl.int64) * stride_ob + c.to(tl.int64) * stride_oc + offs.to(tl.int64) * stride_ol
    tl.store(out_ptrs, result.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_scale_shift(shifted_mean, var, eps, rows, row_mask, c, gamma_ptr, beta_ptr, scale_ptr, shift_ptr,
                       HAS_AFFINE: tl.constexpr, BLOCK_R: tl.constexpr):
    # instance norm of each row r = b * C + c as an affine map of the centred row, stored and returned:
    # y = (x - center) * scale + shift with scale = gamma / sqrt(var + eps) and
    # shift = beta - shifted_mean * scale (gamma = 1, beta = 0 without HAS_AFFINE)
    rstd = tl.div_rn(tl.full((BLOCK_R,), 1.0, tl.float32), tl.sqrt_rn(var + eps))
    scale = rstd
    shift = -shifted_mean * rstd
    if HAS_AFFINE:
        gamma = tl.load(gamma_ptr + c, mask=row_mask, other=1.0).to(tl.float32)
        beta = tl.load(beta_ptr + c, mask=row_mask, other=0.0).to(tl.float32)
        scale = gamma * rstd
        shift = beta - shifted_mean * scale
    tl.store(scale_ptr + rows, scale, mask=row_mask)
    tl.store(shift_ptr + rows, shift, mask=row_mask)
    return scale, shift


@triton.jit
def _row_norm_kernel(
    x_ptr, gamma_ptr, beta_ptr, center_ptr, scale_ptr, shift_ptr, out_ptr,
    n_rows, C, L,
    stride_xb, stride_xc, stride_xl,
    stride_ob, stride_oc, stride_ol,
    eps, slope,
    HAS_AFFINE: tl.constexpr,
    APPLY: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    # instance norm of BLOCK_R (batch, channel) rows from shifted data: center = the row's first
    # element, mean and biased variance of x - center (two passes, deterministic). An exactly constant
    # row sums to exactly 0, so its variance is exactly 0 and its output exactly beta. Writes center,
    # scale and shift for each row r = b * C + c (y = (x - center) * scale + shift); with APPLY it also
    # writes out = leaky_relu(y).
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < n_rows
    b = rows // C
    c = rows % C
    x_rows = x_ptr + b.to(tl.int64) * stride_xb + c.to(tl.int64) * stride_xc   # (BLOCK_R,) pointers
    offs0 = tl.arange(0, BLOCK_L)
    center = tl.load(x_rows, mask=row_mask, other=0.0).to(tl.float32)

    total = tl.zeros((BLOCK_R, BLOCK_L), dtype=tl.float32)
    for l0 in range(0, L, BLOCK_L):
        offs = l0 + offs0
        mask = row_mask[:, None] & (offs < L)[None, :]
        ptrs = x_rows[:, None] + offs.to(tl.int64)[None, :] * stride_xl
        v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        total += tl.where(mask, v - center[:, None], 0.0)
    shifted_mean = tl.sum(total, axis=1) / L

    sq = tl.zeros((BLOCK_R, BLOCK_L), dtype=tl.float32)
    for l0 in range(0, L, BLOCK_L):
        offs = l0 + offs0
        mask = row_mask[:, None] & (offs < L)[None, :]
        ptrs = x_rows[:, None] + offs.to(tl.int64)[None, :] * stride_xl
        v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, (v - center[:, None]) - shifted_mean[:, None], 0.0)
        sq += d * d
    var = tl.sum(sq, axis=1) / L
    tl.store(center_ptr + rows, center, mask=row_mask)
    scale, shift = _store_scale_shift(shifted_mean, var, eps, rows, row_mask, c, gamma_ptr, beta_ptr, scale_ptr,
                                      shift_ptr, HAS_AFFINE, BLOCK_R)

    if APPLY:
        out_rows = out_ptr + b.to(tl.int64) * stride_ob + c.to(tl.int64) * stride_oc
        for l0 in range(0, L, BLOCK_L):
            offs = l0 + offs0
            mask = row_mask[:, None] & (offs < L)[None, :]
            ptrs = x_rows[:, None] + offs.to(tl.int64)[None, :] * stride_xl
            v = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
            y = (v - center[:, None]) * scale[:, None] + shift[:, None]
            y = tl.where(y >= 0, y, y * slope)
            out_ptrs = out_rows[:, None] + offs.to(tl.int64)[None, :] * stride_ol
            tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _row_partial_stats_kernel(
    x_ptr, part_ptr, center_ptr,
    C, L, n_chunks,
    stride_xb, stride_xc, stride_xl,
    CHUNK: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    # long rows (the waveform): one program per CHUNK of one row writes the chunk's mean and M2
    # (sum of squared deviations from the chunk mean) of x - center to part[row, chunk, 0:2], every
    # chunk shifted by the same center, the row's first element (stored by chunk 0). An exactly
    # constant row gives exactly 0 in every chunk.
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // C
    c = row % C
    x_row = x_ptr + b.to(tl.int64) * stride_xb + c.to(tl.int64) * stride_xc
    center = tl.load(x_row).to(tl.float32)
    start = chunk * CHUNK
    count = tl.minimum(L - start, CHUNK).to(tl.float32)
    offs0 = tl.arange(0, BLOCK_L)

    total = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for l0 in range(0, CHUNK, BLOCK_L):
        offs = start + l0 + offs0
        mask = (offs < L) & (l0 + offs0 < CHUNK)
        v = tl.load(x_row + offs.to(tl.int64) * stride_xl, mask=mask, other=0.0).to(tl.float32)
        total += tl.where(mask, v - center, 0.0)
    mean = tl.sum(total, axis=0) / count

    sq = tl.zeros((BLOCK_L,), dtype=tl.float32)
    for l0 in range(0, CHUNK, BLOCK_L):
        offs = start + l0 + offs0
        mask = (offs < L) & (l0 + offs0 < CHUNK)
        v = tl.load(x_row + offs.to(tl.int64) * stride_xl, mask=mask, other=0.0).to(tl.float32)
        d = tl.where(mask, (v - center) - mean, 0.0)
        sq += d * d
    part = part_ptr + (row.to(tl.int64) * n_chunks + chunk) * 2
    tl.store(part, mean)
    tl.store(part + 1, tl.sum(sq, axis=0))
    if chunk == 0:
        tl.store(center_ptr + row, center)


@triton.jit
def _row_combine_stats_kernel(
    part_ptr, gamma_ptr, beta_ptr, scale_ptr, shift_ptr,
    n_rows, C, L, n_chunks,
    eps,
    HAS_AFFINE: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # merges the chunk statistics of BLOCK_R rows (Chan et al.: M2 = sum M2_i + sum n_i (mean_i - mean)^2,
    # all in the row's shifted frame) into scale = gamma / sqrt(var + eps), shift = beta - mean * scale.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    chunks = tl.arange(0, BLOCK_C)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (chunks < n_chunks)[None, :]
    part = part_ptr + (rows.to(tl.int64)[:, None] * n_chunks + chunks[None, :]) * 2
    chunk_mean = tl.load(part, mask=mask, other=0.0)
    chunk_m2 = tl.load(part + 1, mask=mask, other=0.0)
    counts = tl.where(mask, tl.minimum(L - chunks * CHUNK, CHUNK), 0).to(tl.float32)

    mean = tl.sum(counts * chunk_mean, axis=1) / L
    d = tl.where(mask, chunk_mean - mean[:, None], 0.0)
    var = (tl.sum(chunk_m2, axis=1) + tl.sum(counts * d * d, axis=1)) / L
    _store_scale_shift(mean, var, eps, rows, row_mask, rows % C, gamma_ptr, beta_ptr, scale_ptr, shift_ptr,
                       HAS_AFFINE, BLOCK_R)


# ----------------------------------------------------------------------------------------------
# launch plans (rlx_triton/backends/triton/launches.py): every launch of this module as a record
# ----------------------------------------------------------------------------------------------

_ROW_BLOCK_MAX = 1024   # row chunk of the norm and epilogue kernels
_ROW_TILE = 4096        # elements per norm program tile (BLOCK_R x BLOCK_L)
_STATS_CHUNK = 4096     # long rows: elements per statistics program
_STATS_BLOCK = 2048     # ... loaded BLOCK_L at a time (1024 leaves 8 B of stack for fp16 on sm_90)
_SPLIT_ROW_MIN = 16384  # rows longer than this get chunked statistics (the 160000-sample waveform)

# FLOPs per row element of the statistics passes: shift + sum, then shift, centre and square-add
_STATS_FLOPS = 6
# ... and of applying a norm + leaky ReLU: subtract, multiply-add, select
_APPLY_FLOPS = 4
# epilogue pass per pooled input element: bias, |x|, max
_EPILOGUE_FLOPS = 3

# what executes a dot of each precision (rlx_triton.devices.UNITS); the kernels cast every operand to fp32
UNIT_OF_PRECISION = {"ieee": "fp32_fma", "tf32": "tf32", "tf32x3": "tf32x3"}


def _dot_k(block_k: int, interpret: bool) -> int:
    """K width of one tl.dot: 16 on GPUs (an fp32 FMA dot keeps its whole K slice of both operands in
    registers; 16-wide dots keep the pooled kernels spill-free); the whole BLOCK_K in the interpreter,
    where the sum is the same and each op costs per call."""
    return block_k if interpret else min(16, block_k)


def _meta(candidate, interpret: bool = False) -> dict:
    """ConvCandidate -> meta-parameters of `_conv1d_kernel`."""
    return dict(
        BLOCK_P=candidate.tile_pos,
        BLOCK_CO=candidate.tile_co,
        BLOCK_K=candidate.tile_k,
        DOT_K=_dot_k(candidate.tile_k, interpret),
        PRECISION=candidate.precision,
        num_warps=max(1, candidate.tg_size // 32),
        num_stages=candidate.stages,
    )


def _conv_out_len(length: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


_PACKED: dict = {}


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, taps) -> (C_in * taps, C_out) contiguous, so weight tiles load along C_out.

    Cached per weight version (data_ptr + `_version`, tied to the tensor by a weak reference), so an
    inference loop packs each weight once and an in-place update (optimizer step, load_state_dict)
    repacks. Inference tensors have no version counter and can still be changed in place inside
    torch.inference_mode(), so they are packed on every call (one copy of the weight)."""
    if weight.is_inference():
        return weight.reshape(weight.shape[0], -1).t().contiguous()
    key = (weight.data_ptr(), weight._version, tuple(weight.shape), tuple(weight.stride()), weight.dtype,
           weight.device)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is weight:
        return hit[1]
    packed = weight.detach().reshape(weight.shape[0], -1).t().contiguous()
    if len(_PACKED) > 256:
        _PACKED.clear()
    _PACKED[key] = (weakref.ref(weight), packed)
    return packed


class RowNorm(NamedTuple):
    """Per-(batch, channel) instance norm as an affine map of the centred row, each (B * C,) fp32:
    y = (x - center) * scale + shift, center = the row's first element."""

    center: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor


def conv_flops(grid, meta: dict, reduction: int, pool: int) -> int:
    """FLOPs the dots of a `_conv1d_kernel` launch execute: every program runs POOL phases of the
    reduction in BLOCK_K steps on a full BLOCK_P x BLOCK_CO tile (masked lanes included)."""
    programs = 1
    for g in grid:
        programs *= g
    steps = triton.cdiv(reduction, meta["BLOCK_K"]) * meta["BLOCK_K"]
    return 2 * programs * pool * steps * meta["BLOCK_P"] * meta["BLOCK_CO"]


def _conv_record(x, w2d, bias, out, *, taps, stride, padding, dilation, pool, abs_, out_slope, in_norm,
                 in_slope, candidate) -> Launch:
    """out[b, co, q] = leaky(max_j |conv(prologue(x))[b, co, q*pool + j] + bias|); x is (B, C_in, L).

    prologue(x) = leaky((x - center) * scale + shift, in_slope) per input row (in_norm, a RowNorm)."""
    B, C_in, L_in = x.shape
    C_out, L_out = out.shape[1], out.shape[2]
    meta = _meta(candidate, interpret=settings().interpret)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    grid = (triton.cdiv(L_out, meta["BLOCK_P"]), triton.cdiv(C_out, meta["BLOCK_CO"]), B)
    norm_bytes = 3 * B * C_in * 4 if in_norm is not None else 0
    return Launch(
        _conv1d_kernel, grid,
        (x, w2d, bias if bias is not None else w2d, *(in_norm if in_norm is not None else (w2d, w2d, w2d)), out,
         C_in, L_in, C_out, L_out,
         x.stride(0), x.stride(1), x.stride(2),
         out.stride(0), out.stride(1), out.stride(2),
         stride, padding, dilation,
         0.0 if in_slope is None else float(in_slope),
         0.0 if out_slope is None else float(out_slope)),
        meta=dict(TAPS=taps, POOL=pool, HAS_BIAS=bias is not None, IN_AFFINE=in_norm is not None,
                  IN_LEAKY=in_slope is not None, ABS=bool(abs_), OUT_LEAKY=out_slope is not None, **meta),
        num_warps=num_warps, num_stages=num_stages,
        bytes_read=_nbytes(x) + _nbytes(w2d) + _nbytes(bias) + norm_bytes, bytes_written=_nbytes(out),
        flops=conv_flops(grid, meta, C_in * taps, pool), unit=UNIT_OF_PRECISION[candidate.precision])


def _epilogue_record(y, bias, out, *, pool, abs_, out_slope) -> Launch:
    B, C, L_conv = y.shape
    L_out = out.shape[2]
    BLOCK = min(_ROW_BLOCK_MAX, triton.next_power_of_2(max(L_out, 16)))
    pooled = B * C * L_out * pool
    return Launch(
        _epilogue_kernel, (B * C, triton.cdiv(L_out, BLOCK)),
        (y, bias if bias is not None else y, out,
         C, L_conv, L_out,
         y.stride(0), y.stride(1), y.stride(2),
         out.stride(0), out.stride(1), out.stride(2),
         0.0 if out_slope is None else float(out_slope)),
        meta=dict(POOL=pool, HAS_BIAS=bias is not None, ABS=bool(abs_), OUT_LEAKY=out_slope is not None,
                  BLOCK=BLOCK),
        num_warps=4, bytes_read=pooled * y.element_size() + _nbytes(bias), bytes_written=_nbytes(out),
        flops=_EPILOGUE_FLOPS * pooled)


def _conv_block_plan(x, weight, bias, *, stride, padding, dilation, pool, abs_, out_slope, out_dtype,
                     in_norm=None, in_slope=None, candidate):
    """(records, out) of one conv with its epilogue, fused in the conv kernel or as a second pass
    (fuse_epilogue); no records for an empty output."""
    B, _, L_in = x.shape
    taps = weight.shape[2]
    L_conv = _conv_out_len(L_in, taps, stride, padding, dilation)
    L_out = L_conv // pool
    out = torch.empty((B, weight.shape[0], L_out), device=x.device, dtype=out_dtype)
    if out.numel() == 0:
        return [], out
    w2d = _packed_weight(weight)
    bias = bias.contiguous() if bias is not None else None
    conv = dict(taps=taps, stride=stride, padding=padding, dilation=dilation, in_norm=in_norm, in_slope=in_slope,
                candidate=candidate)
    plain = pool == 1 and not abs_ and out_slope is None
    if candidate.fuse_epilogue or plain:
        return [_conv_record(x, w2d, bias, out, pool=pool, abs_=abs_, out_slope=out_slope, **conv)], out
    y = torch.empty((B, weight.shape[0], L_conv), device=x.device, dtype=torch.float32)
    return [_conv_record(x, w2d, None, y, pool=1, abs_=False, out_slope=None, **conv),
            _epilogue_record(y, bias, out, pool=pool, abs_=abs_, out_slope=out_slope)], out


def _split_rows(length: int) -> bool:
    """Whether rows of `length` get chunked statistics (two launches) instead of one serial walk per row."""
    return length > _SPLIT_ROW_MIN


def _row_norm_plan(x, weight, bias, *, eps, slope=None, out=None, split=None):
    """(records, RowNorm) of the instance-norm statistics of every (batch, channel) row of x.

    With `out` given, the one-pass kernel also writes out = leaky_relu((x - center) * scale + shift, slope).
    split: chunked statistics (default: rows longer than _SPLIT_ROW_MIN; never with `out`)."""
    B, C, L = x.shape
    n_rows = B * C
    center, scale, shift = (torch.empty(n_rows, device=x.device, dtype=torch.float32) for _ in range(3))
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    affine_bytes = _nbytes(weight) + _nbytes(bias)
    stats_bytes = 3 * n_rows * 4
    split = _split_rows(L) if split is None else split
    if out is None and split:
        # long rows: chunk statistics in parallel, then one merge, instead of a serial walk per row
        n_chunks = triton.cdiv(L, _STATS_CHUNK)
        part = torch.empty((n_rows, n_chunks, 2), device=x.device, dtype=torch.float32)
        partial = Launch(
            _row_partial_stats_kernel, (n_rows, n_chunks),
            (x, part, center, C, L, n_chunks, x.stride(0), x.stride(1), x.stride(2)),
            meta=dict(CHUNK=_STATS_CHUNK, BLOCK_L=min(_STATS_BLOCK, _STATS_CHUNK)), num_warps=4,
            bytes_read=_nbytes(x), bytes_written=_nbytes(part) + n_rows * 4, flops=_STATS_FLOPS * x.numel())
        BLOCK_C = triton.next_power_of_2(n_chunks)
        BLOCK_R = max(1, min(16, _ROW_TILE // BLOCK_C))
        combine = Launch(
            _row_combine_stats_kernel, (triton.cdiv(n_rows, BLOCK_R),),
            (part, weight if weight is not None else scale, bias if bias is not None else shift,
             scale, shift, n_rows, C, L, n_chunks, float(eps)),
            meta=dict(HAS_AFFINE=weight is not None, CHUNK=_STATS_CHUNK, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C),
            num_warps=4, bytes_read=_nbytes(part) + affine_bytes, bytes_written=2 * n_rows * 4,
            flops=_STATS_FLOPS * part.numel())
        return [partial, combine], RowNorm(center, scale, shift)
    BLOCK_L = min(_ROW_BLOCK_MAX, triton.next_power_of_2(max(L, 16)))
    # rows that fit a tile whole are packed several per program; long rows get a program each
    BLOCK_R = max(1, min(16, _ROW_TILE // triton.next_power_of_2(max(L, 1))))
    target = out if out is not None else x
    record = Launch(
        _row_norm_kernel, (triton.cdiv(n_rows, BLOCK_R),),
        (x, weight if weight is not None else scale, bias if bias is not None else shift,
         center, scale, shift, target,
         n_rows, C, L,
         x.stride(0), x.stride(1), x.stride(2),
         target.stride(0), target.stride(1), target.stride(2),
         float(eps), 0.0 if slope is None else float(slope)),
        meta=dict(HAS_AFFINE=weight is not None, APPLY=out is not None, BLOCK_R=BLOCK_R, BLOCK_L=BLOCK_L),
        num_warps=4, bytes_read=_nbytes(x) + affine_bytes, bytes_written=stats_bytes + _nbytes(out),
        flops=(_STATS_FLOPS + (_APPLY_FLOPS if out is not None else 0)) * x.numel())
    return [record], RowNorm(center, scale, shift)


def _conv_block(x, weight, bias, *, candidate, **options):
    """Runs `_conv_block_plan` (one conv and its epilogue); returns the output."""
    records, out = _conv_block_plan(x, weight, bias, candidate=candidate, **options)
    launches.run(records)
    return out


def _row_norm(x, weight, bias, *, eps, slope=None, out=None) -> RowNorm:
    """Runs `_row_norm_plan`: the RowNorm of every (batch, channel) row of x (and `out`, when given)."""
    records, norm = _row_norm_plan(x, weight, bias, eps=eps, slope=slope, out=out)
    launches.run(records)
    return norm


def conv1d_plan(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate):
    """(records, out) of `conv1d`."""
    pool = 1 if epilogue is None else int(epilogue.pool)
    abs_ = False if epilogue is None else bool(epilogue.abs)
    slope = None if epilogue is None else epilogue.negative_slope
    return _conv_block_plan(input, weight, bias, stride=stride, padding=padding, dilation=dilation, pool=pool,
                            abs_=abs_, out_slope=slope, out_dtype=input.dtype, candidate=candidate)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate):
    """F.conv1d (groups=1) on a (B, C_in, L) input, then the optional epilogue
    (epilogue.abs, epilogue.pool, epilogue.negative_slope: bias -> |x| -> max-pool -> leaky ReLU)."""
    plan, out = conv1d_plan(input, weight, bias, stride, padding, dilation, epilogue=epilogue, candidate=candidate)
    launches.run(plan)
    return out


def _sinc_length(samples: int, taps: int, stride: int, pool: int) -> int:
    """Frames after the sinc conv and its pool: the longest row SincNet normalizes after the waveform."""
    return _conv_out_len(samples, taps, stride, 0, 1) // pool


def sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                 norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
                 candidate):
    """(records, out) of `sincnet`.

    The block statistics are chunked for every block when the sinc output is longer than
    _SPLIT_ROW_MIN (so the launch count follows from the request: launch_count)."""
    x = waveforms
    records = []
    # 1. waveform instance norm, folded into the sinc conv's input prologue
    step, norm = _row_norm_plan(x, wav_norm_weight, wav_norm_bias, eps=eps)
    records += step
    step, h = _conv_block_plan(x, sinc_filters, None, stride=sinc_stride, padding=0, dilation=1, pool=pool,
                               abs_=True, out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=None,
                               candidate=candidate)
    records += step
    split = _split_rows(h.shape[2])
    # 2. each Conv1d block reads the previous block's norm + leaky in its prologue
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        step, norm = _row_norm_plan(h, norm_weights[i], norm_biases[i], eps=eps, split=split)
        records += step
        step, h = _conv_block_plan(h, w, b, stride=1, padding=0, dilation=1, pool=pool, abs_=False,
                                   out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=negative_slope,
                                   candidate=candidate)
        records += step
    # 3. the last block's norm + leaky, written once
    out = torch.empty(h.shape, device=h.device, dtype=waveforms.dtype)
    last = len(conv_weights)
    step, _ = _row_norm_plan(h, norm_weights[last], norm_biases[last], eps=eps, slope=negative_slope, out=out)
    return records + step, out


def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
            norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
            candidate):
    """pyannote SincNet forward (non-streaming) on (B, 1, T) waveforms -> (B, C, frames).

    waveform instance norm -> sinc conv |.| pool -> norm+leaky -> [conv pool -> norm+leaky] per
    entry of conv_weights. norm_weights/norm_biases hold one (affine) instance norm per block."""
    plan, out = sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                             norm_weights, norm_biases, sinc_stride=sinc_stride, pool=pool, eps=eps,
                             negative_slope=negative_slope, candidate=candidate)
    launches.run(plan)
    return out


def launch_count(request, candidate) -> int:
    """Launches `sincnet` / `conv1d` run for a routed request (the request's fields and features)."""
    fields, features = request.field_map, request.feature_map
    if request.op == "conv1d":
        if fields["batch"] == 0 or fields["c_out"] == 0 or fields["tokens"] == 0:
            return 0
        plain = features["pool"] == 1 and not features["abs"] and not features["leaky"]
        return 1 if candidate.fuse_epilogue or plain else 2
    pool = features["pool"]
    conv_launches = 1 if candidate.fuse_epilogue else 2              # the sinc conv has |x|
    block_launches = 1 if candidate.fuse_epilogue or pool == 1 else 2
    block_stats = 2 if _split_rows(_sinc_length(fields["length"], fields["taps"], fields["stride"], pool)) else 1
    waveform_stats = 2 if _split_rows(fields["length"]) else 1
    blocks = features["blocks"]
    return waveform_stats + conv_launches + blocks * (block_stats + block_launches) + 1


# ----------------------------------------------------------------------------------------------
# candidates (the planner's ConvCandidate; conv2d.py shares these helpers)
# ----------------------------------------------------------------------------------------------


def make_candidate(tile_pos=64, tile_co=32, tile_k=32, tg_size=128, stages=2, precision="ieee",
                   fuse_epilogue=True) -> ConvCandidate:
    return ConvCandidate(tile_pos=tile_pos, tile_co=tile_co, tile_k=tile_k, tg_size=tg_size, stages=stages,
                         precision=precision, fuse_epilogue=fuse_epilogue)


def candidate_tag(candidate: ConvCandidate) -> str:
    return candidate.tag()


def all_candidates() -> list:
    """Every conv candidate of the plan, in plan order (the sweep tests run each one)."""
    return plan_candidates("conv")


def default_candidate() -> ConvCandidate:
    return DEFAULT_VARIANT.candidate()


# ----------------------------------------------------------------------------------------------
# routing data
# ----------------------------------------------------------------------------------------------

COVERAGE = Coverage(
    ops=frozenset({"sincnet", "conv1d"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    # batch is grid dim z (CUDA limit 65535); taps/stride are loop bounds only
    ranges={"batch": (1, 65535), "c_in": (1, 1 << 16), "c_out": (1, 1 << 16), "taps": (1, 4096),
            "stride": (1, 4096)},
    features={
        "groups": frozenset({1}),
        "padding_mode": frozenset({"zeros"}),        # symmetric zero padding (not 'same' with odd total)
        "pool": frozenset(range(1, 17)),             # fused max-pool kernel = stride
        "abs": frozenset({True, False}),             # conv1d epilogue: |x| before the pool
        "leaky": frozenset({True, False}),           # conv1d epilogue: leaky ReLU after the pool
        "blocks": frozenset(range(0, 65)),           # SincNet: Conv1d blocks after the sinc conv
        "requires_grad": frozenset({False}),         # kernels are forward-only; autograd goes to torch
        "streaming": frozenset({False}),             # SincNet: the non-streaming (normalized) forward
        "sample_rate": frozenset({16000}),
    },
)

# Approvals are the max relative error the tests re-measure against float64
# (tests/triton/test_conv.py::test_every_approved_candidate_holds_its_bound). The interpreter computes
# fp32 dots exactly whatever input_precision says, so it cannot measure TF32 rounding: only "ieee"
# candidates are approved here; tf32x3/tf32 wait for a GPU measurement (tests marked gpu).
CONV1D_MAX_REL_ERR = 1e-5
_WHERE = "interpreter, tests/triton/test_conv.py (conv1d + SincNet blocks vs float64)"
APPROVALS = approvals_by_precision("conv", {"ieee": CONV1D_MAX_REL_ERR}, _WHERE)
# Device class -> candidate tag. GPU classes have none until bench/sincnet.py measures them. In the
# interpreter the cost is per program, so the widest ieee tile wins (measured on SincNet, 2 x 2000
# samples, on a loaded 2-core machine: 64x32 tiles 5.8-10 s, 128x64 tiles 3.3-5 s per forward).
RECIPES = {"interpreter": ConvVariant.IEEE_P128_CO64.tag()}
SPEED_EVIDENCE: dict = {}


def _audit_kernels() -> list:
    candidates = tuple(all_candidates())
    conv_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*{dt}", "bias_ptr": "*{dt}", "in_center_ptr": "*fp32",
        "in_scale_ptr": "*fp32", "in_shift_ptr": "*fp32", "out_ptr": "*{dt}",
        "C_in": "i32", "L_in": "i32", "C_out": "i32", "L_out": "i32",
        "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32",
        "conv_stride": "i32", "padding": "i32", "dilation": "i32",
        "in_slope": "fp32", "out_slope": "fp32",
        "TAPS": "constexpr", "POOL": "constexpr", "HAS_BIAS": "constexpr", "IN_AFFINE": "constexpr",
        "IN_LEAKY": "constexpr", "ABS": "constexpr", "OUT_LEAKY": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_CO": "constexpr", "BLOCK_K": "constexpr", "DOT_K": "constexpr",
    }
    norm_signature = {
        "x_ptr": "*fp32", "gamma_ptr": "*fp32", "beta_ptr": "*fp32", "center_ptr": "*fp32",
        "scale_ptr": "*fp32", "shift_ptr": "*fp32", "out_ptr": "*{dt}", "n_rows": "i32", "C": "i32", "L": "i32",
        "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32",
        "eps": "fp32", "slope": "fp32",
        "HAS_AFFINE": "constexpr", "APPLY": "constexpr", "BLOCK_R": "constexpr", "BLOCK_L": "constexpr",
    }
    epilogue_signature = {
        "y_ptr": "*fp32", "bias_ptr": "*{dt}", "out_ptr": "*{dt}", "C": "i32", "L_conv": "i32",
        "L_out": "i32", "stride_yb": "i64", "stride_yc": "i32", "stride_yl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32", "out_slope": "fp32",
        "POOL": "constexpr", "HAS_BIAS": "constexpr", "ABS": "constexpr", "OUT_LEAKY": "constexpr",
        "BLOCK": "constexpr",
    }
    flags_off = dict(HAS_BIAS=True, IN_AFFINE=False, IN_LEAKY=False, ABS=False, OUT_LEAKY=False)
    return [
        AuditSpec(
            name="conv1d_igemm", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=5, POOL=1, **flags_off, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee"),
        AuditSpec(
            name="conv1d_sinc_abs_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=251, POOL=3, HAS_BIAS=False, IN_AFFINE=True, IN_LEAKY=False,
                                    ABS=True, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee"),
        AuditSpec(
            name="conv1d_norm_leaky_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=5, POOL=3, HAS_BIAS=True, IN_AFFINE=True, IN_LEAKY=True,
                                    ABS=False, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee"),
        AuditSpec(
            name="conv1d_row_norm", family="conv", kernel=_row_norm_kernel, signature=norm_signature,
            meta=lambda c, dt: dict(HAS_AFFINE=True, APPLY=True, BLOCK_R=4, BLOCK_L=1024, num_warps=4,
                                    num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_row_partial_stats", family="conv", kernel=_row_partial_stats_kernel,
            signature={"x_ptr": "*{dt}", "part_ptr": "*fp32", "center_ptr": "*fp32", "C": "i32", "L": "i32",
                       "n_chunks": "i32",
                       "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
                       "CHUNK": "constexpr", "BLOCK_L": "constexpr"},
            meta=lambda c, dt: dict(CHUNK=_STATS_CHUNK, BLOCK_L=_STATS_BLOCK, num_warps=4, num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_row_combine_stats", family="conv", kernel=_row_combine_stats_kernel,
            signature={"part_ptr": "*fp32", "gamma_ptr": "*{dt}", "beta_ptr": "*{dt}", "scale_ptr": "*fp32",
                       "shift_ptr": "*fp32", "n_rows": "i32", "C": "i32", "L": "i32", "n_chunks": "i32",
                       "eps": "fp32", "HAS_AFFINE": "constexpr", "CHUNK": "constexpr",
                       "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
            meta=lambda c, dt: dict(HAS_AFFINE=True, CHUNK=_STATS_CHUNK, BLOCK_R=16, BLOCK_C=64, num_warps=4,
                                    num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
        AuditSpec(
            name="conv1d_epilogue", family="conv", kernel=_epilogue_kernel, signature=epilogue_signature,
            meta=lambda c, dt: dict(POOL=3, HAS_BIAS=True, ABS=True, OUT_LEAKY=True, BLOCK=1024,
                                    num_warps=4, num_stages=1),
            candidates=candidates[:1], default=candidates[0], dtypes=("fp32", "fp16", "bf16"),
            expects_mma=False),
    ]


AUDIT_KERNELS = _audit_kernels()
