"""The @triton.jit code of the 1-D conv family: pyannote's SincNet stage and a general Conv1d.

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
"""
from __future__ import annotations

import triton
import triton.language as tl

from rlx_triton.backends.triton._tf32 import tf32_split


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
    PHASES: tl.constexpr,
    ABS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_K: tl.constexpr,
):
    # SincNet's sinc conv of a normalized mono waveform, with the filters' symmetry: the first C_out / 2
    # filters are symmetric about their centre tap HALF, the others antisymmetric (sinc_filters builds
    # them so), so with L_t = x[c + HALF - t] and R_t = x[c + HALF + t] around conv position c
    #   even filter: sum_t w[HALF - t] (L_t + R_t),   odd filter: sum_t w[HALF - t] (L_t - R_t),
    # t = 0..HALF (the centre once: R_0 := 0): HALF + 1 multiply-adds per output instead of 2 HALF + 1.
    # A program owns BLOCK_P pooled positions and BLOCK_F even + BLOCK_F odd filters (program 1 = g: filters
    # g*BLOCK_F.. and C_out/2 + g*BLOCK_F..; the launcher makes BLOCK_F cover every filter of a parity where it
    # can: 40 + 40 of SincNet's 80 in 64 + 64 lanes). The samples' loads, normalisation, mirrored sums and
    # TF32 splits, not the MMAs, are what each output costs, so every filter a program holds shares them.
    # The weights come packed (HALF + 1, C_out), w[c, HALF - t] at
    # row t, and for tf32x3 as split terms (C_out, 4 (HALF + 1)); tap_sum[c] = sum over all taps.
    # The waveform norm is applied to each loaded sample as (x - center) * scale, exactly 0 where
    # x == center, and its shift enters once as shift * tap_sum (the design of _conv1d_kernel).
    # The pool's POOL conv positions of each pooled position are rows of one tile, phase j of pooled position
    # p in row j * BLOCK_P + p (PHASES = POOL rounded up to a power of two; rows of the extra phases are masked
    # off): each weight tile then feeds every phase's MMA, and the pool is a max over the tile's phases.
    pid_p = tl.program_id(0)
    pid_g = tl.program_id(1)
    pid_b = tl.program_id(2)
    HALF_C = C_out // 2
    rows = tl.arange(0, PHASES * BLOCK_P)
    phase = rows // BLOCK_P
    row_p = pid_p * BLOCK_P + rows % BLOCK_P              # the pooled position of each row
    row_mask = (phase < POOL) & (row_p < L_out)
    mid = (row_p * POOL + phase) * conv_stride + HALF     # centre sample of each row's conv position
    even = pid_g * BLOCK_F + tl.arange(0, BLOCK_F)        # symmetric filters
    f_mask = even < HALF_C
    odd = HALF_C + even                                   # antisymmetric filters
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb
    center = tl.load(in_center_ptr + pid_b)
    scale = tl.load(in_scale_ptr + pid_b)
    shift = tl.load(in_shift_ptr + pid_b)
    offset_even = shift * tl.load(tap_sum_ptr + even, mask=f_mask, other=0.0)
    offset_odd = shift * tl.load(tap_sum_ptr + odd, mask=f_mask, other=0.0)
    K = HALF + 1

    acc_even = tl.zeros((PHASES * BLOCK_P, BLOCK_F), dtype=tl.float32)
    acc_odd = tl.zeros((PHASES * BLOCK_P, BLOCK_F), dtype=tl.float32)
    for t0 in range(0, K, BLOCK_K):
        for kk in tl.static_range(0, BLOCK_K, DOT_K):
            t = t0 + kk + tl.arange(0, DOT_K)
            t_mask = t < K
            mask = row_mask[:, None] & t_mask[None, :]
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
                term_mask = (terms < 4 * K)[:, None] & f_mask[None, :]
                w_even = tl.load(w_split_ptr + even.to(tl.int64)[None, :] * (4 * K) + terms[:, None],
                                 mask=term_mask, other=0.0)
                w_odd = tl.load(w_split_ptr + odd.to(tl.int64)[None, :] * (4 * K) + terms[:, None],
                                mask=term_mask, other=0.0)
                acc_even = dot_split(sums, w_even, acc_even, PHASES * BLOCK_P, DOT_K)
                acc_odd = dot_split(diffs, w_odd, acc_odd, PHASES * BLOCK_P, DOT_K)
            else:
                w_rows = w_ptr + t[:, None] * C_out
                w_mask = t_mask[:, None] & f_mask[None, :]
                w_even = tl.load(w_rows + even[None, :], mask=w_mask, other=0.0).to(tl.float32)
                w_odd = tl.load(w_rows + odd[None, :], mask=w_mask, other=0.0).to(tl.float32)
                acc_even += tl.dot(sums, w_even, input_precision=PRECISION)
                acc_odd += tl.dot(diffs, w_odd, input_precision=PRECISION)
    acc_even += offset_even[None, :]
    acc_odd += offset_odd[None, :]
    if ABS:
        acc_even = tl.abs(acc_even)
        acc_odd = tl.abs(acc_odd)
    # the pool: a max over the phases that NaN propagates through, as torch's max_pool1d
    in_pool = (phase < POOL)[:, None]
    result_even = tl.reduce(tl.reshape(tl.where(in_pool, acc_even, float("-inf")), (PHASES, BLOCK_P, BLOCK_F)), 0,
                            _nan_max)
    result_odd = tl.reduce(tl.reshape(tl.where(in_pool, acc_odd, float("-inf")), (PHASES, BLOCK_P, BLOCK_F)), 0,
                           _nan_max)

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    out_rows = out_ptr + pid_b.to(tl.int64) * stride_ob + offs_p.to(tl.int64)[:, None] * stride_ol
    out_mask = (offs_p < L_out)[:, None] & f_mask[None, :]
    tl.store(out_rows + even.to(tl.int64)[None, :] * stride_oc, result_even.to(out_ptr.dtype.element_ty),
             mask=out_mask)
    tl.store(out_rows + odd.to(tl.int64)[None, :] * stride_oc, result_odd.to(out_ptr.dtype.element_ty),
             mask=out_mask)


@triton.jit
def _nan_max(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


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
