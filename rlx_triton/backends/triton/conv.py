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

SincNet's sinc conv has its own kernel (`_sinc_conv_kernel`) for the banks sinc_filters builds: their
first half is symmetric about the centre tap and their second half antisymmetric, exactly (cos_bp and
sin_bp are one flipped half), so with L_t, R_t the samples t taps left and right of a conv position the
mirrored samples are pre-added, S_t = L_t + R_t for the even filters and D_t = L_t - R_t for the odd
ones, and each output takes 126 multiply-adds instead of 251 (20.55 -> 10.6 GFLOP executed at the
pyannote bench shape). A program owns BLOCK_P pooled positions and 8 even + 8 odd filters (80 = 5 x 16:
no padded channels). Other filter banks (a copy, an in-place edit: ops.conv.is_sinc_filter_bank) take
`_conv1d_kernel`.

tf32x3 candidates (true fp32 on TF32 tensor cores) run `dot_split` in both kernels: the input tile is
split into TF32 halves in registers (tf32_split), the weights once per weight version (split_terms),
and each step is one TF32 dot over the four products of the halves, so the MMA group stays in flight
while the next tiles load (three separate products would be three dependent, waited-for dots). The
interpreter runs the same splitting, so its error against float64 is what tensor cores give, up to
summation order, and the approvals are measured there. An infinite input can give NaN where torch
gives +-inf (inf times a weight's zero low half); NaN propagates as in torch.

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
positions when a pool is fused), tile_co -> BLOCK_CO (not the sinc kernel's: 8 + 8 filters), tile_k ->
BLOCK_K (reduction per loop iteration, issued as 16-wide tl.dots on GPUs: DOT_K), tg_size // 32 ->
num_warps, stages -> num_stages, precision -> tl.dot input_precision ("ieee", "tf32") or dot_split
("tf32x3"), fuse_epilogue -> abs/pool/leaky in the conv kernel (True) or in a separate `_epilogue_kernel`
pass over the stored conv output (False). A routed fused conv goes through the autotune bridge (keys:
batch and length buckets, channels, stride, taps, pool).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton._tf32 import split_tf32, tf32_split
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.device_cache import packed_weights
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.config import settings
from rlx_triton.planner.candidates.conv import DEFAULT_VARIANT, ConvCandidate, ConvVariant
from rlx_triton.router.coverage import Coverage

# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def dot_split(x_tile, w_terms, acc, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + x_tile @ W in true fp32 on TF32 tensor cores: x_tile (BLOCK_M, BLOCK_K) is split in registers
    (tf32_split) and interleaved per k as [x_hi, x_hi, x_lo, x_lo]; w_terms (4 * BLOCK_K, N) holds the
    split weights interleaved the same way, [w_hi, w_lo, w_hi, w_lo] (split_terms, once per weight
    version). So each call is ONE TF32 dot of 4 * BLOCK_K terms, every pair of halves multiplied (the
    tf32x4 unit): one MMA group that stays in flight while the next tiles load, where three separate
    products would be three dependent dots, each waited for."""
    x_hi, x_lo = tf32_split(x_tile)
    x_terms = tl.reshape(tl.join(tl.join(x_hi, x_lo), tl.join(x_hi, x_lo)), (BLOCK_M, 4 * BLOCK_K))
    return tl.dot(x_terms, w_terms, acc, input_precision="tf32")


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
    x_ptr, w_ptr, w_split_ptr, bias_ptr, in_center_ptr, in_scale_ptr, in_shift_ptr, out_ptr,
    C_in, L_in, C_out, L_out,
    stride_xb, stride_xc, stride_xl,
    stride_ob, stride_oc, stride_ol,
    conv_stride, padding, dilation,
    in_slope, out_slope,
    batch_bucket, length_bucket,  # powers of two of batch and L_in: the autotune key, unused by the body
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

                if PRECISION == "tf32x3":
                    # the split weight terms (C_out, 4 * R), K-major as TF32 MMAs read them
                    terms = 4 * (r0 + kk) + tl.arange(0, 4 * DOT_K)
                    w_ptrs = w_split_ptr + offs_co.to(tl.int64)[None, :] * (4 * R) + terms[:, None]
                    w_tile = tl.load(w_ptrs, mask=(terms < 4 * R)[:, None] & co_mask[None, :], other=0.0)
                    acc = dot_split(x_tile, w_tile, acc, BLOCK_P, DOT_K)
                else:
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
def _sinc_conv_kernel(
    x_ptr, w_ptr, w_split_ptr, tap_sum_ptr, in_center_ptr, in_scale_ptr, in_shift_ptr, out_ptr,
    L_in, C_out, L_out,
    stride_xb, stride_xl,
    stride_ob, stride_oc, stride_ol,
    conv_stride,
    batch_bucket, length_bucket,  # powers of two of batch and L_in: the autotune key, unused by the body
    HALF: tl.constexpr,
    POOL: tl.constexpr,
    ABS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_K: tl.constexpr,
):
    # SincNet's sinc conv of a normalized mono waveform, with the filters' symmetry: the first C_out / 2
    # filters are symmetric about their centre tap HALF, the others antisymmetric (sinc_filters builds
    # them so), so with L_t = x[c + HALF - t] and R_t = x[c + HALF + t] around conv position c
    #   even filter: sum_t w[HALF - t] (L_t + R_t),   odd filter: sum_t w[HALF - t] (L_t - R_t),
    # t = 0..HALF (the centre once: R_0 := 0): HALF + 1 multiply-adds per output instead of 2 HALF + 1.
    # A program owns BLOCK_P pooled positions and 8 even + 8 odd filters (program 1 = g: filters g*8..+8
    # and C_out/2 + g*8..+8; 80 = 5 x 16). The weights come packed (HALF + 1, C_out), w[c, HALF - t] at
    # row t, and for tf32x3 as split terms (C_out, 4 (HALF + 1)); tap_sum[c] = sum over all taps.
    # The waveform norm is applied to each loaded sample as (x - center) * scale, exactly 0 where
    # x == center, and its shift enters once as shift * tap_sum (the design of _conv1d_kernel).
    pid_p = tl.program_id(0)
    pid_g = tl.program_id(1)
    pid_b = tl.program_id(2)
    HALF_C = C_out // 2
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < L_out
    chan = tl.arange(0, 8)
    even = pid_g * 8 + chan                               # symmetric filters
    odd = HALF_C + even                                   # antisymmetric filters
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb
    center = tl.load(in_center_ptr + pid_b)
    scale = tl.load(in_scale_ptr + pid_b)
    shift = tl.load(in_shift_ptr + pid_b)
    offset_even = shift * tl.load(tap_sum_ptr + even)
    offset_odd = shift * tl.load(tap_sum_ptr + odd)
    K = HALF + 1

    result_even = tl.full((BLOCK_P, 8), float("-inf"), dtype=tl.float32)
    result_odd = tl.full((BLOCK_P, 8), float("-inf"), dtype=tl.float32)
    for j in tl.static_range(POOL):
        mid = (offs_p * POOL + j) * conv_stride + HALF    # centre sample of each conv position
        acc_even = tl.zeros((BLOCK_P, 8), dtype=tl.float32)
        acc_odd = tl.zeros((BLOCK_P, 8), dtype=tl.float32)
        for t0 in range(0, K, BLOCK_K):
            for kk in tl.static_range(0, BLOCK_K, DOT_K):
                t = t0 + kk + tl.arange(0, DOT_K)
                t_mask = t < K
                mask = p_mask[:, None] & t_mask[None, :]
                # the mirrored samples pre-added: S = n(L) + n(R), D = n(L) - n(R), n(x) = (x - center) * scale
                left = tl.load(x_base + (mid[:, None] - t[None, :]).to(tl.int64) * stride_xl, mask=mask,
                               other=0.0).to(tl.float32)
                right = tl.load(x_base + (mid[:, None] + t[None, :]).to(tl.int64) * stride_xl,
                                mask=mask & (t > 0)[None, :], other=0.0).to(tl.float32)
                left = tl.where(mask & (left != center), (left - center) * scale, 0.0)
                right = tl.where(mask & (t > 0)[None, :] & (right != center), (right - center) * scale, 0.0)
                sums = left + right
                diffs = left - right
                if PRECISION == "tf32x3":
                    terms = 4 * (t0 + kk) + tl.arange(0, 4 * DOT_K)
                    term_mask = (terms < 4 * K)[:, None]
                    w_even = tl.load(w_split_ptr + even.to(tl.int64)[None, :] * (4 * K) + terms[:, None],
                                     mask=term_mask, other=0.0)
                    w_odd = tl.load(w_split_ptr + odd.to(tl.int64)[None, :] * (4 * K) + terms[:, None],
                                    mask=term_mask, other=0.0)
                    acc_even = dot_split(sums, w_even, acc_even, BLOCK_P, DOT_K)
                    acc_odd = dot_split(diffs, w_odd, acc_odd, BLOCK_P, DOT_K)
                else:
                    w_rows = w_ptr + t[:, None] * C_out
                    w_even = tl.load(w_rows + even[None, :], mask=t_mask[:, None], other=0.0).to(tl.float32)
                    w_odd = tl.load(w_rows + odd[None, :], mask=t_mask[:, None], other=0.0).to(tl.float32)
                    acc_even += tl.dot(sums, w_even, input_precision=PRECISION)
                    acc_odd += tl.dot(diffs, w_odd, input_precision=PRECISION)
        acc_even += offset_even[None, :]
        acc_odd += offset_odd[None, :]
        if ABS:
            acc_even = tl.abs(acc_even)
            acc_odd = tl.abs(acc_odd)
        result_even = tl.maximum(result_even, acc_even, propagate_nan=tl.PropagateNan.ALL)
        result_odd = tl.maximum(result_odd, acc_odd, propagate_nan=tl.PropagateNan.ALL)

    out_rows = out_ptr + pid_b.to(tl.int64) * stride_ob + offs_p.to(tl.int64)[:, None] * stride_ol
    out_mask = p_mask[:, None]
    tl.store(out_rows + even.to(tl.int64)[None, :] * stride_oc, result_even.to(out_ptr.dtype.element_ty),
             mask=out_mask)
    tl.store(out_rows + odd.to(tl.int64)[None, :] * stride_oc, result_odd.to(out_ptr.dtype.element_ty),
             mask=out_mask)


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

# what executes a dot of each precision (rlx_triton.devices.UNITS); the kernels cast every operand to fp32.
# tf32x3 candidates (true fp32 on TF32 tensor cores) run dot_split: four TF32 products per fp32 product
UNIT_OF_PRECISION = {"ieee": "fp32_fma", "tf32": "tf32", "tf32x3": "tf32x4"}


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


def _sinc_meta(candidate, interpret: bool = False) -> dict:
    """ConvCandidate -> meta-parameters of `_sinc_conv_kernel` (its channel tile is fixed: 8 + 8 filters)."""
    meta = _meta(candidate, interpret)
    meta.pop("BLOCK_CO")
    return meta


def _conv_out_len(length: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, taps) -> (C_in * taps, C_out) contiguous, so weight tiles load along C_out; cached per
    weight version (cached_weight)."""
    return cached_weight(weight, lambda w: w.reshape(w.shape[0], -1).t().contiguous(), "conv_packed")


def split_terms(matrix: torch.Tensor) -> torch.Tensor:
    """(rows, K) -> (rows, 4 * K) float32: the four terms [hi, lo, hi, lo] of each k (split_tf32) contiguous,
    the weight operand of dot_split."""
    hi, lo = split_tf32(matrix)
    return torch.stack((hi, lo, hi, lo), dim=-1).reshape(matrix.shape[0], -1).contiguous()


def cached_weight(weight: torch.Tensor, make, kind: str):
    """make(weight) cached per weight version under `kind` (device_cache.packed_weights): an inference loop
    prepares each weight once, an in-place update (optimizer step, load_state_dict) prepares it again, and
    inference tensors are prepared on every call."""
    return packed_weights(kind, [weight], lambda: make(weight.detach()))


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


def _buckets(x) -> tuple:
    """(batch, length) of a (B, C, L) input as the autotune key's powers of two."""
    return triton.next_power_of_2(max(1, x.shape[0])), triton.next_power_of_2(max(1, x.shape[2]))


def _config(candidate) -> triton.Config:
    meta = _meta(candidate, interpret=settings().interpret)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _sinc_config(candidate) -> triton.Config:
    meta = _sinc_meta(candidate, interpret=settings().interpret)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


# Autotune keys: shape buckets and the constexprs that shape the loops (never raw lengths, never tensors).
_TUNE_KEY = ["batch_bucket", "length_bucket", "C_in", "C_out", "conv_stride", "TAPS", "POOL"]
_SINC_TUNE_KEY = ["batch_bucket", "length_bucket", "C_out", "conv_stride", "HALF", "POOL"]
_tuned: dict = {}


def tuned_kernel(name: str = "conv1d"):
    """`_conv1d_kernel` ("conv1d") or `_sinc_conv_kernel` ("sinc") under the autotune bridge, with a config
    per approved fused-epilogue candidate."""
    if name not in _tuned:
        from rlx_triton.backends.triton.autotune import TunedKernel

        candidates = [c for c in all_candidates() if c.fuse_epilogue and c.tag() in APPROVALS]
        kernel, to_config, key = ((_conv1d_kernel, _config, _TUNE_KEY) if name == "conv1d"
                                  else (_sinc_conv_kernel, _sinc_config, _SINC_TUNE_KEY))
        _tuned[name] = TunedKernel(kernel, candidates, to_config, key=key)
    return _tuned[name]


def _tuned_or_none(name: str, candidate, route):
    """The tuned kernel a routed call launches through (None: launch the candidate directly)."""
    if route is None or not candidate.fuse_epilogue:
        return None
    tuned = tuned_kernel(name)
    return tuned if candidate.tag() in tuned.tags else None


def _record(kernel, tuned, candidate, route, grid_for, args, flags, counts, flops_of) -> Launch:
    """A plain launch of `kernel` with the candidate's meta, or a tuned one through the bridge."""
    if tuned is not None:
        config = tuned.config_of(candidate)
        return Launch.tuned(tuned, candidate, grid_for, args, flags, route=route,
                            flops=flops_of(grid_for(config.kwargs), config.kwargs), **counts)
    config = (_sinc_config if kernel is _sinc_conv_kernel else _config)(candidate)
    meta = config.kwargs
    return Launch(kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=config.num_warps,
                  num_stages=config.num_stages, flops=flops_of(grid_for(meta), meta), **counts)


def _conv_record(x, w2d, w_split, bias, out, *, taps, stride, padding, dilation, pool, abs_, out_slope, in_norm,
                 in_slope, candidate, route=None) -> Launch:
    """out[b, co, q] = leaky(max_j |conv(prologue(x))[b, co, q*pool + j] + bias|); x is (B, C_in, L).

    prologue(x) = leaky((x - center) * scale + shift, in_slope) per input row (in_norm, a RowNorm)."""
    B, C_in, L_in = x.shape
    C_out, L_out = out.shape[1], out.shape[2]
    norm_bytes = 3 * B * C_in * 4 if in_norm is not None else 0
    weight_bytes = _nbytes(w_split) if candidate.precision == "tf32x3" else _nbytes(w2d)
    args = (x, w2d, w_split, bias if bias is not None else w2d, *(in_norm if in_norm is not None else (w2d, w2d, w2d)),
            out,
            C_in, L_in, C_out, L_out,
            x.stride(0), x.stride(1), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            stride, padding, dilation,
            0.0 if in_slope is None else float(in_slope),
            0.0 if out_slope is None else float(out_slope),
            *_buckets(x))
    flags = dict(TAPS=taps, POOL=pool, HAS_BIAS=bias is not None, IN_AFFINE=in_norm is not None,
                 IN_LEAKY=in_slope is not None, ABS=bool(abs_), OUT_LEAKY=out_slope is not None)
    counts = dict(bytes_read=_nbytes(x) + weight_bytes + _nbytes(bias) + norm_bytes, bytes_written=_nbytes(out),
                  unit=UNIT_OF_PRECISION[candidate.precision])

    def grid_for(meta):
        return (triton.cdiv(L_out, meta["BLOCK_P"]), triton.cdiv(C_out, meta["BLOCK_CO"]), B)

    return _record(_conv1d_kernel, _tuned_or_none("conv1d", candidate, route), candidate, route, grid_for, args,
                   flags, counts, lambda grid, meta: conv_flops(grid, meta, C_in * taps, pool))


def sinc_flops(grid, meta, half: int, pool: int) -> int:
    """FLOPs the dots of a `_sinc_conv_kernel` launch execute: POOL phases of HALF + 1 pre-added taps in
    BLOCK_K steps on BLOCK_P positions x 16 filters per program."""
    programs = 1
    for g in grid:
        programs *= g
    steps = triton.cdiv(half + 1, meta["BLOCK_K"]) * meta["BLOCK_K"]
    return 2 * programs * pool * steps * meta["BLOCK_P"] * 16


def _sinc_record(x, bank, out, *, stride, pool, abs_, in_norm, candidate, route=None) -> Launch:
    """out[b, c, q] = max_j |sinc conv(n(x))[b, c, q*pool + j]| with the filters' symmetry (_sinc_conv_kernel)."""
    w_half, w_split, tap_sum = bank
    B, _, L_in = x.shape
    C_out, L_out = out.shape[1], out.shape[2]
    half = w_half.shape[0] - 1
    weight_bytes = _nbytes(w_split) if candidate.precision == "tf32x3" else _nbytes(w_half)
    args = (x, w_half, w_split, tap_sum, *in_norm, out,
            L_in, C_out, L_out,
            x.stride(0), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            stride, *_buckets(x))
    counts = dict(bytes_read=_nbytes(x) + weight_bytes + _nbytes(tap_sum) + 3 * B * 4, bytes_written=_nbytes(out),
                  unit=UNIT_OF_PRECISION[candidate.precision])

    def grid_for(meta):
        return (triton.cdiv(L_out, meta["BLOCK_P"]), C_out // 16, B)

    return _record(_sinc_conv_kernel, _tuned_or_none("sinc", candidate, route), candidate, route, grid_for, args,
                   dict(HALF=half, POOL=pool, ABS=bool(abs_)), counts,
                   lambda grid, meta: sinc_flops(grid, meta, half, pool))


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


def _sinc_bank(filters: torch.Tensor):
    """(w_half, w_split, tap_sum) of a symmetric sinc filter bank (C, 1, taps): w_half (HALF + 1, C) with
    w[c, HALF - t] at row t, its split terms (C, 4 (HALF + 1)) for tf32x3, and each filter's sum over all
    taps (float64, rounded once); cached per filter version."""
    def make(w):
        half = w.shape[2] // 2
        w_half = w[:, 0, :half + 1].flip(-1).t().float().contiguous()
        return w_half, split_terms(w_half.t()), w[:, 0].double().sum(-1).float()

    return cached_weight(filters, make, "conv_sinc")


def symmetric_bank(filters: torch.Tensor, c_in: int) -> bool:
    """Whether `_sinc_conv_kernel` computes this conv: a filter bank sinc_filters built (its first half
    symmetric, its second half antisymmetric, exactly), 16 | C filters of odd length, one input channel."""
    from rlx_triton.ops.conv import is_sinc_filter_bank

    return (c_in == 1 and filters.shape[0] % 16 == 0 and filters.shape[2] % 2 == 1
            and is_sinc_filter_bank(filters))


def _conv_block_plan(x, weight, bias, *, stride, padding, dilation, pool, abs_, out_slope, out_dtype,
                     in_norm=None, in_slope=None, candidate, route=None, symmetric=False):
    """(records, out) of one conv with its epilogue, fused in the conv kernel or as a second pass
    (fuse_epilogue); no records for an empty output. symmetric: the conv is SincNet's sinc conv of a
    symmetric bank (symmetric_bank) with the waveform norm and no bias, run by `_sinc_conv_kernel`."""
    B, _, L_in = x.shape
    taps = weight.shape[2]
    L_conv = _conv_out_len(L_in, taps, stride, padding, dilation)
    L_out = L_conv // pool
    out = torch.empty((B, weight.shape[0], L_out), device=x.device, dtype=out_dtype)
    if out.numel() == 0:
        return [], out
    plain = pool == 1 and not abs_ and out_slope is None
    fused = candidate.fuse_epilogue or plain
    target = out if fused else torch.empty((B, weight.shape[0], L_conv), device=x.device, dtype=torch.float32)
    if symmetric:
        conv = _sinc_record(x, _sinc_bank(weight), target, stride=stride, pool=pool if fused else 1,
                            abs_=abs_ and fused, in_norm=in_norm, candidate=candidate, route=route)
    else:
        w2d = _packed_weight(weight)
        # the split weights, for a tf32x3 launch or a tuned one (whose configs include tf32x3 candidates)
        split = candidate.precision == "tf32x3" or _tuned_or_none("conv1d", candidate, route) is not None
        w_split = _split_weight(weight) if split else w2d
        conv = _conv_record(x, w2d, w_split, bias.contiguous() if bias is not None and fused else None, target,
                            taps=taps, stride=stride, padding=padding, dilation=dilation, pool=pool if fused else 1,
                            abs_=abs_ and fused, out_slope=out_slope if fused else None, in_norm=in_norm,
                            in_slope=in_slope, candidate=candidate, route=route)
    if fused:
        return [conv], out
    bias = bias.contiguous() if bias is not None else None
    return [conv, _epilogue_record(target, bias, out, pool=pool, abs_=abs_, out_slope=out_slope)], out


def _split_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, taps) -> split_terms of (C_out, C_in * taps): the tf32x3 operand; cached per weight version."""
    return cached_weight(weight, lambda w: split_terms(w.reshape(w.shape[0], -1)), "conv_split")


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


def conv1d_plan(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate,
                route=None):
    """(records, out) of `conv1d`."""
    pool = 1 if epilogue is None else int(epilogue.pool)
    abs_ = False if epilogue is None else bool(epilogue.abs)
    slope = None if epilogue is None else epilogue.negative_slope
    return _conv_block_plan(input, weight, bias, stride=stride, padding=padding, dilation=dilation, pool=pool,
                            abs_=abs_, out_slope=slope, out_dtype=input.dtype, candidate=candidate, route=route)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate, route=None):
    """F.conv1d (groups=1) on a (B, C_in, L) input, then the optional epilogue
    (epilogue.abs, epilogue.pool, epilogue.negative_slope: bias -> |x| -> max-pool -> leaky ReLU).

    With the router's `route` a fused launch goes through the autotune bridge (the routed candidate is
    injected; a cold bucket may be tuned among the approved candidates where tuning is on)."""
    plan, out = conv1d_plan(input, weight, bias, stride, padding, dilation, epilogue=epilogue, candidate=candidate,
                            route=route)
    launches.run(plan)
    return out


def _sinc_length(samples: int, taps: int, stride: int, pool: int) -> int:
    """Frames after the sinc conv and its pool: the longest row SincNet normalizes after the waveform."""
    return _conv_out_len(samples, taps, stride, 0, 1) // pool


def sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                 norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
                 candidate, route=None):
    """(records, out) of `sincnet`.

    The sinc conv runs `_sinc_conv_kernel` (the filters' symmetry) for a bank sinc_filters built
    (symmetric_bank), else `_conv1d_kernel`. The block statistics are chunked for every block when the
    sinc output is longer than _SPLIT_ROW_MIN (so the launch count follows from the request: launch_count)."""
    x = waveforms
    records = []
    # 1. waveform instance norm, folded into the sinc conv's input prologue
    step, norm = _row_norm_plan(x, wav_norm_weight, wav_norm_bias, eps=eps)
    records += step
    step, h = _conv_block_plan(x, sinc_filters, None, stride=sinc_stride, padding=0, dilation=1, pool=pool,
                               abs_=True, out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=None,
                               candidate=candidate, route=route, symmetric=symmetric_bank(sinc_filters, x.shape[1]))
    records += step
    split = _split_rows(h.shape[2])
    # 2. each Conv1d block reads the previous block's norm + leaky in its prologue
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        step, norm = _row_norm_plan(h, norm_weights[i], norm_biases[i], eps=eps, split=split)
        records += step
        step, h = _conv_block_plan(h, w, b, stride=1, padding=0, dilation=1, pool=pool, abs_=False,
                                   out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=negative_slope,
                                   candidate=candidate, route=route)
        records += step
    # 3. the last block's norm + leaky, written once
    out = torch.empty(h.shape, device=h.device, dtype=waveforms.dtype)
    last = len(conv_weights)
    step, _ = _row_norm_plan(h, norm_weights[last], norm_biases[last], eps=eps, slope=negative_slope, out=out)
    return records + step, out


def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
            norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
            candidate, route=None):
    """pyannote SincNet forward (non-streaming) on (B, 1, T) waveforms -> (B, C, frames).

    waveform instance norm -> sinc conv |.| pool -> norm+leaky -> [conv pool -> norm+leaky] per
    entry of conv_weights. norm_weights/norm_biases hold one (affine) instance norm per block. With the
    router's `route` the fused convolutions go through the autotune bridge."""
    plan, out = sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                             norm_weights, norm_biases, sinc_stride=sinc_stride, pool=pool, eps=eps,
                             negative_slope=negative_slope, candidate=candidate, route=route)
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
# (tests/triton/test_conv.py::test_every_conv_candidate_runs_and_every_approval_holds). tf32x3 candidates
# run dot_split, whose TF32 halves are exact TF32 values built by the kernel's own arithmetic, so the
# interpreter's float32 dots compute what the tensor cores compute (up to summation order): their error is
# measured there too. Plain tf32 rounds inside the MMA, which the interpreter does not: unapproved
# (diarization stays true fp32).
CONV1D_MAX_REL_ERR = 1e-5
_WHERE = "interpreter, tests/triton/test_conv.py (conv1d + SincNet blocks vs float64)"
APPROVALS = approvals_by_precision("conv", {"ieee": CONV1D_MAX_REL_ERR, "tf32x3": CONV1D_MAX_REL_ERR}, _WHERE)
# Device class -> candidate tag. sm_90 / sm_80: true fp32 on TF32 tensor cores with 64 x 32 tiles (the sinc
# conv's channel tile is its own 8 + 8 filters), chosen on rlx-triton perf's estimates until
# bench/sincnet.py measures a GPU: at the bench shape the 60-channel blocks hold 192 (sm_90) / 168 (sm_80)
# registers with 64 x 32 and 250 / 255 with 48 B of spills (sm_80) with 64 x 64; SincNet est. 229 vs 235 us
# (H200), 638 vs 658 us (A100). In the interpreter the cost is per program, so the widest ieee tile wins
# (measured on SincNet, 2 x 2000 samples, on a loaded 2-core machine: 64x32 tiles 5.8-10 s, 128x64 tiles
# 3.3-5 s per forward).
RECIPES = {"interpreter": ConvVariant.IEEE_P128_CO64.tag(), "sm90": ConvVariant.TF32X3_P64_CO32.tag(),
           "sm80": ConvVariant.TF32X3_P64_CO32.tag()}
SPEED_EVIDENCE: dict = {}


def aligned_pointers(signature: dict) -> tuple:
    """The pointer arguments of an audit signature: what the launchers pass is torch's allocations and the
    packed / split weights, 16-byte aligned, so the JIT compiles them with the divisibility hint (vector
    loads, cp.async) and the audit does the same."""
    return tuple(name for name, kind in signature.items() if kind.startswith("*"))


def _audit_kernels() -> list:
    candidates = tuple(all_candidates())
    conv_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*{dt}", "w_split_ptr": "*fp32", "bias_ptr": "*{dt}", "in_center_ptr": "*fp32",
        "in_scale_ptr": "*fp32", "in_shift_ptr": "*fp32", "out_ptr": "*{dt}",
        "C_in": "i32", "L_in": "i32", "C_out": "i32", "L_out": "i32",
        "stride_xb": "i64", "stride_xc": "i32", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32",
        "conv_stride": "i32", "padding": "i32", "dilation": "i32",
        "in_slope": "fp32", "out_slope": "fp32", "batch_bucket": "i32", "length_bucket": "i32",
        "TAPS": "constexpr", "POOL": "constexpr", "HAS_BIAS": "constexpr", "IN_AFFINE": "constexpr",
        "IN_LEAKY": "constexpr", "ABS": "constexpr", "OUT_LEAKY": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_CO": "constexpr", "BLOCK_K": "constexpr", "DOT_K": "constexpr",
    }
    sinc_signature = {
        "x_ptr": "*{dt}", "w_ptr": "*fp32", "w_split_ptr": "*fp32", "tap_sum_ptr": "*fp32",
        "in_center_ptr": "*fp32", "in_scale_ptr": "*fp32", "in_shift_ptr": "*fp32", "out_ptr": "*fp32",
        "L_in": "i32", "C_out": "i32", "L_out": "i32", "stride_xb": "i64", "stride_xl": "i32",
        "stride_ob": "i64", "stride_oc": "i32", "stride_ol": "i32", "conv_stride": "i32",
        "batch_bucket": "i32", "length_bucket": "i32",
        "HALF": "constexpr", "POOL": "constexpr", "ABS": "constexpr", "PRECISION": "constexpr",
        "BLOCK_P": "constexpr", "BLOCK_K": "constexpr", "DOT_K": "constexpr",
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
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv1d_sinc_abs_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=251, POOL=3, HAS_BIAS=False, IN_AFFINE=True, IN_LEAKY=False,
                                    ABS=True, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
        AuditSpec(
            name="conv1d_sinc_symmetric", family="conv", kernel=_sinc_conv_kernel, signature=sinc_signature,
            meta=lambda c, dt: dict(HALF=125, POOL=3, ABS=True, **_sinc_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32", "fp16", "bf16"),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(sinc_signature)),
        AuditSpec(
            name="conv1d_norm_leaky_pool", family="conv", kernel=_conv1d_kernel, signature=conv_signature,
            meta=lambda c, dt: dict(TAPS=5, POOL=3, HAS_BIAS=True, IN_AFFINE=True, IN_LEAKY=True,
                                    ABS=False, OUT_LEAKY=False, **_meta(c)),
            candidates=candidates, default=default_candidate(), dtypes=("fp32",),
            expects_mma=lambda c, dt: c.precision != "ieee", divisible=aligned_pointers(conv_signature)),
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
