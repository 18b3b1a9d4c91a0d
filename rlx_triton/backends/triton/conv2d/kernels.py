"""The @triton.jit code of the conv family for 2-D convolution: the WeSpeaker ResNet trunk and its pooling.

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
  (split_weights), three separate TF32 products per step (`dot_split3`: x_lo w_hi, x_hi w_lo, x_hi w_hi; the
  fourth product, x_lo w_lo, is below fp32's rounding and not computed). Separate dots need no [hi, lo] pair
  operand built in registers (one dot of [x_hi, x_lo] against [w_hi, w_hi] pairs held 156 registers on the
  64 x 64 tile and 240 on the Winograd tile, against 128 and 158), at the price of waiting for each dot before
  the next (the 1-D convs keep one four-product dot for that reason): the CTA per SM the registers buy gives the
  waits other warps to hide behind, by the model (its issue count does not price the waits; the GPU benchmark,
  bench/embedding.py, is what decides it). The trunk's tiles run one stage: the patch is a gathered load (masks
  for the padding), not a cp.async copy, so a deeper pipeline only held the next step's operands in registers.
  The loop runs per tap, then per channel chunk: each tap's pixel offsets and padding mask once for all its
  chunks, and no division by the chunk count in the loop (it was a third of the loop's instructions). The patch
  is loaded channels x pixels, so a warp's lanes walk consecutive pixels and a thread holds few of them: a tap's
  addresses and padding masks halved (the tap loop 123 -> 60 instructions on layer1). As the trunk launches
  compile on sm_90 (`rlx-triton perf`), the 64 x 64 x 16 tile of the downsampling layers holds 128 registers
  (4 CTAs/SM) and the 128 x 32 x 16 tile of the stem 100.
  3x3 stride-1 layers (WINOGRAD, launch.py `winograd_applies`) run `_winograd_tf32x3` instead: Winograd F(2, 3)
  along each output row, directly along the height, so a pair of output pixels takes four products per kernel
  row where the direct form takes six (two thirds of the tensor-core work, and 4 input columns loaded per pair
  and row instead of 6), each `dot_split3` against the transformed weights' halves (winograd_weights): the four
  transformed tiles' operands fit 158 registers on sm_90 (3 CTAs/SM on the 128 x 32 tile). The transform is
  exact for finite values up to its rounding, but not where a value is infinite (inf - inf) or a transformed sum
  overflows, so a tile with any non-finite value is recomputed by the direct form, which gives the direct form's
  infinities and NaNs as torch's conv does; the transformed tiles split without `tf32_split`'s select for
  infinities (`_winograd_product`).
- `_stats_pool_kernel` — TSTP statistics pooling: mean and (unbiased) standard deviation over
  time, optionally weighted by per-frame weights exactly as pyannote's `StatsPool` computes them.
- The 5120 -> 256 projection after the pooling is a 1x1 convolution over one pixel, so `linear`
  launches `_conv2d_kernel` on a (rows, in_features, 1, 1) view.
"""
from __future__ import annotations

import triton
import triton.language as tl

from rlx_triton.backends.triton._tf32 import dot_split3, tf32_split


@triton.jit
def _igemm_tf32x3(x_pixel_base, w_split_ptr, mask_p, ih_base, iw_base, offs_co, mask_co,
                  c_in, height, width,
                  KH: tl.constexpr, KW: tl.constexpr, FOLD_TAPS: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[p, co] = sum_k X[p, k] W[k, co] in true fp32 on TF32 tensor cores.

    Each step is one `dot_split3`: the input patch split in registers (tf32_split), the weights split once per
    weight version (split_weights: (c_out, 2 * K) for K = KH*KW*c_in and k = tap * c_in + ci: the hi of every k,
    then the lo of every k, K-major as TF32 MMAs read them)."""
    k_total = c_in * KH * KW
    plane = height * width
    offs_k = tl.arange(0, BLOCK_K)
    w_hi_rows = w_split_ptr + offs_co.to(tl.int64)[None, :] * (2 * k_total)
    w_lo_rows = w_hi_rows + k_total
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
            x_hi, x_lo = tf32_split(
                tl.load(x_ptrs, mask=mask_p[:, None] & mask_k[None, :] & inside, other=0.0).to(tl.float32))
            w_mask = mask_k[:, None] & mask_co[None, :]
            acc = dot_split3(x_hi, x_lo, tl.load(w_hi_rows + k[:, None], mask=w_mask, other=0.0),
                              tl.load(w_lo_rows + k[:, None], mask=w_mask, other=0.0), acc)
    else:
        # per tap: its pixel offsets and padding mask are computed once for all its channel
        # chunks (the tap's row and column: a division by the constant KW, not by the chunk count)
        for tap in range(0, KH * KW):
            ih = ih_base + tap // KW
            iw = iw_base + tap % KW
            mask_pix = mask_p & (ih >= 0) & (ih < height) & (iw >= 0) & (iw < width)  # zero padding
            pixel_ptrs = x_pixel_base + (ih * width + iw)
            k_tap = tap * c_in
            for ci0 in range(0, c_in, BLOCK_K):
                ci = ci0 + offs_k
                # loaded channels x pixels, pixels the fastest axis: a warp's lanes walk consecutive pixels of a
                # channel (contiguous NCHW memory) and each thread holds few pixels, so a tap computes few
                # addresses and padding masks; transposed for the dot
                x_ptrs = (ci * plane)[:, None] + pixel_ptrs[None, :]
                x_hi, x_lo = tf32_split(tl.trans(tl.load(x_ptrs, mask=(ci < c_in)[:, None] & mask_pix[None, :],
                                                         other=0.0).to(tl.float32)))
                k = k_tap + ci[:, None]
                w_mask = (ci < c_in)[:, None] & mask_co[None, :]
                acc = dot_split3(x_hi, x_lo, tl.load(w_hi_rows + k, mask=w_mask, other=0.0),
                                  tl.load(w_lo_rows + k, mask=w_mask, other=0.0), acc)
    return acc


@triton.jit
def _winograd_product(v, w_hi, w_lo, acc):
    """acc + v @ U for a transformed input tile v and U's halves: `dot_split3`, v split without `tf32_split`'s
    select for infinities (a non-finite value sends the Winograd tile to the direct recompute). Split here,
    after the caller's weight loads are issued (split first, the loop takes 34 more instructions)."""
    v_hi, v_lo = tf32_split(v, KEEP_INF=False)
    return dot_split3(v_hi, v_lo, w_hi, w_lo, acc)


@triton.jit
def _winograd_columns(d0, d1, d2, d3):
    """B^T d of Winograd F(2, 3): the four transformed columns of a window of four input columns."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@triton.jit
def _winograd_tf32x3(x_pixel_base, w_wino_ptr, mask_pair, ih_base, iw_base, offs_co, mask_co,
                     c_in, height, width,
                     BLOCK_PAIRS: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr):
    """A 3x3 stride-1 convolution's output for BLOCK_PAIRS pairs of horizontally adjacent pixels, in true fp32
    on TF32 tensor cores, as Winograd F(2, 3) along the width and directly along the height: per kernel row, the
    pair's window of four input columns is transformed (`_winograd_columns`) and each transformed column j meets
    its transformed weights U_j (winograd_weights: U_0 = g0, U_1 = (g0 + g1 + g2) / 2, U_2 = (g0 - g1 + g2) / 2,
    U_3 = g2), four products where the direct form takes six; then y0 = m0 + m1 + m2 and y1 = m1 - m2 - m3.
    Returns (BLOCK_PAIRS, 2, BLOCK_CO) flattened to pixel rows: pair q's left pixel, then its right one.

    w_wino_ptr holds U's TF32 halves as (c_out, 2 * 12 * c_in), the hi of every k then the lo, k = (kh * 4 + j) *
    c_in + ci."""
    k_total = 12 * c_in
    plane = height * width
    offs_k = tl.arange(0, BLOCK_K)
    w_hi_rows = w_wino_ptr + offs_co.to(tl.int64)[None, :] * (2 * k_total)
    w_lo_rows = w_hi_rows + k_total
    m0 = tl.zeros((BLOCK_PAIRS, BLOCK_CO), dtype=tl.float32)
    m1 = tl.zeros((BLOCK_PAIRS, BLOCK_CO), dtype=tl.float32)
    m2 = tl.zeros((BLOCK_PAIRS, BLOCK_CO), dtype=tl.float32)
    m3 = tl.zeros((BLOCK_PAIRS, BLOCK_CO), dtype=tl.float32)
    for kh in range(0, 3):
        ih = ih_base + kh
        in_row = mask_pair & (ih >= 0) & (ih < height)
        row_ptrs = x_pixel_base + (ih * width + iw_base)
        # the window's columns iw_base + j inside the image (zero padding outside)
        in_0 = in_row & (iw_base >= 0) & (iw_base < width)
        in_1 = in_row & (iw_base + 1 >= 0) & (iw_base + 1 < width)
        in_2 = in_row & (iw_base + 2 >= 0) & (iw_base + 2 < width)
        in_3 = in_row & (iw_base + 3 >= 0) & (iw_base + 3 < width)
        k_row = kh * 4 * c_in
        for ci0 in range(0, c_in, BLOCK_K):
            ci = ci0 + offs_k
            mask_ci = (ci < c_in)[:, None]
            # channels x pairs, pairs the fastest axis (as the direct patch), transposed for the dots
            channel_ptrs = (ci * plane)[:, None] + row_ptrs[None, :]
            d0 = tl.trans(tl.load(channel_ptrs, mask=mask_ci & in_0[None, :], other=0.0).to(tl.float32))
            d1 = tl.trans(tl.load(channel_ptrs + 1, mask=mask_ci & in_1[None, :], other=0.0).to(tl.float32))
            d2 = tl.trans(tl.load(channel_ptrs + 2, mask=mask_ci & in_2[None, :], other=0.0).to(tl.float32))
            d3 = tl.trans(tl.load(channel_ptrs + 3, mask=mask_ci & in_3[None, :], other=0.0).to(tl.float32))
            v0, v1, v2, v3 = _winograd_columns(d0, d1, d2, d3)
            w_mask = mask_ci & mask_co[None, :]
            k_0 = k_row + ci[:, None]
            m0 = _winograd_product(v0, tl.load(w_hi_rows + k_0, mask=w_mask, other=0.0),
                                     tl.load(w_lo_rows + k_0, mask=w_mask, other=0.0), m0)
            k_1 = k_0 + c_in
            m1 = _winograd_product(v1, tl.load(w_hi_rows + k_1, mask=w_mask, other=0.0),
                                     tl.load(w_lo_rows + k_1, mask=w_mask, other=0.0), m1)
            k_2 = k_1 + c_in
            m2 = _winograd_product(v2, tl.load(w_hi_rows + k_2, mask=w_mask, other=0.0),
                                     tl.load(w_lo_rows + k_2, mask=w_mask, other=0.0), m2)
            k_3 = k_2 + c_in
            m3 = _winograd_product(v3, tl.load(w_hi_rows + k_3, mask=w_mask, other=0.0),
                                     tl.load(w_lo_rows + k_3, mask=w_mask, other=0.0), m3)
    left = m0 + m1 + m2
    right = m1 - m2 - m3
    return tl.reshape(tl.permute(tl.join(left, right), (0, 2, 1)), (2 * BLOCK_PAIRS, BLOCK_CO))


@triton.jit
def _conv2d_kernel(
    x_ptr, w_ptr, w_split_ptr, w_wino_ptr, bias_ptr, res_ptr, out_ptr,
    batch, c_in, height, width,
    c_out, out_h, out_w,
    stride, padding,
    stride_wo, stride_wi, stride_wh, stride_ww,
    batch_bucket,  # next power of two of batch: the autotune key, unused by the body
    KH: tl.constexpr, KW: tl.constexpr, FOLD_TAPS: tl.constexpr, WINOGRAD: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, APPLY_RELU: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_CO: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[b, co, oh, ow] = act(sum_{ci,kh,kw} x[b, ci, oh*s-p+kh, ow*s-p+kw] * w[co, ci, kh, kw] + bias[co] + res).

    PRECISION "tf32x3" reads the split weights (w_split_ptr, see split_weights) and runs `_igemm_tf32x3`, or with
    WINOGRAD (3x3, stride 1) `_winograd_tf32x3` on the transformed weights (w_wino_ptr, see winograd_weights);
    "ieee" and "tf32" read w_ptr through its strides."""
    pid_p = tl.program_id(0)
    pid_co = tl.program_id(1)
    winograd = WINOGRAD and PRECISION == "tf32x3"
    pair_cols = (out_w + 1) // 2   # output pixel pairs per row (Winograd)

    if winograd:
        # Output pixels in horizontal pairs, the pairs flattened over (batch, out_h, pair columns): row i of the
        # tile is the left (i even) or right pixel of pair BLOCK_P // 2 * pid_p + i // 2.
        offs_row = tl.arange(0, BLOCK_P)
        pair_of_row = pid_p * (BLOCK_P // 2) + offs_row // 2
        b_idx = pair_of_row // (out_h * pair_cols)
        oh = (pair_of_row // pair_cols) % out_h
        ow = 2 * (pair_of_row % pair_cols) + offs_row % 2
        mask_p = (b_idx < batch) & (ow < out_w)
        pix = oh * out_w + ow
    else:
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

    if winograd:
        offs_pair = pid_p * (BLOCK_P // 2) + tl.arange(0, BLOCK_P // 2)
        pair_b = offs_pair // (out_h * pair_cols)
        x_pair_base = x_ptr + pair_b.to(tl.int64) * c_in * height * width
        acc = _winograd_tf32x3(x_pair_base, w_wino_ptr, pair_b < batch,
                               (offs_pair // pair_cols) % out_h - padding, 2 * (offs_pair % pair_cols) - padding,
                               offs_co, mask_co, c_in, height, width, BLOCK_P // 2, BLOCK_CO, BLOCK_K)
        # The transformed sums are not the direct ones where a value is not finite: an infinite input meets
        # both signs in the transform (inf - inf, NaN where the direct sum is infinite), and a transformed
        # sum can overflow where the direct one does not. A tile with any non-finite value is recomputed
        # directly, which gives the direct form's values, as torch's do.
        if tl.max(tl.where(tl.abs(acc) < float("inf"), 0, 1)) > 0:
            acc = _igemm_tf32x3(x_pixel_base, w_split_ptr, mask_p, ih_base, iw_base, offs_co, mask_co,
                                c_in, height, width, KH, KW, FOLD_TAPS, BLOCK_P, BLOCK_CO, BLOCK_K)
        acc = tl.trans(acc)
    elif PRECISION == "tf32x3":
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
