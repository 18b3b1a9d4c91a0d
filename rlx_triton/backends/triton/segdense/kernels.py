"""The @triton.jit code of segdense: pyannote's segmentation head in one kernel.

For a block of BLOCK_R rows (frames of all chunks), `_segdense_kernel` runs
    a = x;  for each linear layer l: a = leaky_relu(a @ W_l^T + b_l)      (slope 0.01)
    logits = a @ W_c^T + b_c;  out = activation(logits)
where activation is log-softmax over classes (powerset / mono-label), sigmoid (multi-label) or
none. Intermediate activations of a row block go through a per-kernel scratch buffer (L2
resident, written and read by the same program, ordered by a barrier), so any number of linear
layers and any widths fit one launch. Accumulation is fp32, dots at the candidate's precision;
with fused_activation=False the kernel writes logits and `_segdense_activation_kernel` applies the
activation in a second pass. The weights are packed (zero-padded stacks) once per parameter version
and the layer widths are constexprs, so a call makes no host-to-device copy (CUDA-graph capturable).
"""
from __future__ import annotations

import triton
import triton.language as tl

ACTIVATIONS = ("none", "sigmoid", "log_softmax")   # the kernels' ACTIVATION is the index of the name here

# the same facts for the kernels, which read only constexpr globals
ACT_NONE, ACT_SIGMOID, ACT_LOG_SOFTMAX = (tl.constexpr(code) for code in range(len(ACTIVATIONS)))
LEAKY_SLOPE = tl.constexpr(0.01)   # the slope of pyannote's F.leaky_relu (torch's default)


@triton.jit
def _dense_tile(acc, a_ptr, stride_a, rows64, row_mask, w_ptr, stride_w, cols, col_mask, K,
                PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[BLOCK_R, BLOCK_N] += A[rows, :K] @ W[cols, :K]^T, K in BLOCK_K chunks."""
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        k_idx = k0 + offs_k
        k_mask = k_idx < K
        a_tile = tl.load(a_ptr + rows64[:, None] * stride_a + k_idx[None, :],
                         mask=row_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        w_tile = tl.load(w_ptr + cols[None, :] * stride_w + k_idx[:, None],
                         mask=k_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(a_tile, w_tile, input_precision=PRECISION)
    return acc


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _apply_activation(logits, col_mask, ACTIVATION: tl.constexpr):
    if ACTIVATION == ACT_SIGMOID:
        logits = _sigmoid(logits)
    elif ACTIVATION == ACT_LOG_SOFTMAX:  # over the class axis
        masked = tl.where(col_mask[None, :], logits, float("-inf"))
        row_max = tl.max(masked, axis=1)
        shifted = masked - row_max[:, None]
        row_sum = tl.sum(tl.where(col_mask[None, :], tl.exp(shifted), 0.0), axis=1)
        logits = shifted - tl.log(row_sum)[:, None]
    return logits


@triton.jit
def _segdense_kernel(
    x_ptr, w_ptr, b_ptr, wc_ptr, bc_ptr, scratch_ptr, out_ptr,
    R, F_IN, C, D_MAX,
    NUM_LINEAR: tl.constexpr, DIMS: tl.constexpr, ACTIVATION: tl.constexpr, FUSED_ACTIVATION: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Rows [pid*BLOCK_R, +BLOCK_R): linear stack (weights padded to D_MAX x D_MAX, DIMS the layers' output
    widths) + classifier."""
    pid = tl.program_id(0)
    offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = offs_r < R
    rows64 = offs_r.to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    scratch_stride = R.to(tl.int64) * D_MAX        # scratch is (2, R, D_MAX): ping-pong buffers

    k_dim = F_IN
    for layer in tl.static_range(NUM_LINEAR):
        n_dim = DIMS[layer]
        w_layer = w_ptr + layer * D_MAX * D_MAX
        out_buf = scratch_ptr + (layer % 2) * scratch_stride
        if layer == 0:   # the first layer reads x, the others the previous layer's scratch buffer
            in_buf, in_stride = x_ptr, F_IN
        else:
            in_buf, in_stride = scratch_ptr + ((layer - 1) % 2) * scratch_stride, D_MAX
        for n0 in range(0, n_dim, BLOCK_N):
            cols = n0 + offs_n
            col_mask = cols < n_dim
            acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
            acc = _dense_tile(acc, in_buf, in_stride, rows64, row_mask, w_layer, D_MAX, cols, col_mask, k_dim,
                              PRECISION, BLOCK_R, BLOCK_K)
            bias = tl.load(b_ptr + layer * D_MAX + cols, mask=col_mask, other=0.0)
            acc += bias[None, :]
            acc = tl.where(acc >= 0, acc, LEAKY_SLOPE * acc)
            tl.store(out_buf + rows64[:, None] * D_MAX + cols[None, :], acc,
                     mask=row_mask[:, None] & col_mask[None, :])
        # this program's threads see the whole layer output before the next layer reads it
        tl.debug_barrier()
        k_dim = n_dim

    classes = tl.arange(0, BLOCK_C)
    class_mask = classes < C
    if NUM_LINEAR == 0:   # the classifier reads x, or the last layer's scratch buffer
        last_buf, last_stride = x_ptr, F_IN
    else:
        last_buf, last_stride = scratch_ptr + ((NUM_LINEAR - 1) % 2) * scratch_stride, D_MAX
    logits = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    logits = _dense_tile(logits, last_buf, last_stride, rows64, row_mask, wc_ptr, k_dim, classes, class_mask, k_dim,
                         PRECISION, BLOCK_R, BLOCK_K)
    logits += tl.load(bc_ptr + classes, mask=class_mask, other=0.0)[None, :]
    if FUSED_ACTIVATION:
        logits = _apply_activation(logits, class_mask, ACTIVATION)
    tl.store(out_ptr + rows64[:, None] * C + classes[None, :], logits,
             mask=row_mask[:, None] & class_mask[None, :])


@triton.jit
def _segdense_activation_kernel(out_ptr, R, C, ACTIVATION: tl.constexpr,
                                BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Second pass for fused_activation=False: activation over each row of logits, in place."""
    pid = tl.program_id(0)
    offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    classes = tl.arange(0, BLOCK_C)
    row_mask = offs_r < R
    class_mask = classes < C
    ptrs = out_ptr + offs_r.to(tl.int64)[:, None] * C + classes[None, :]
    mask = row_mask[:, None] & class_mask[None, :]
    logits = tl.load(ptrs, mask=mask, other=0.0)
    tl.store(ptrs, _apply_activation(logits, class_mask, ACTIVATION), mask=mask)
