"""Triton segdense: pyannote's segmentation head in one kernel.

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

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.device_cache import packed_weights
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.segdense import DEFAULT_VARIANT, SegdenseCandidate
from rlx_triton.router.coverage import Coverage

ACTIVATIONS = ("none", "sigmoid", "log_softmax")   # the kernels' ACTIVATION is the index of the name here
MAX_CLASSES = 256
MAX_FEATURES = 4096
MIN_DOT = 16          # tl.dot's smallest tile side: BLOCK_R, BLOCK_K and BLOCK_C are at least this
OUTPUT_CHUNK = 32     # output columns per dot of a linear layer (BLOCK_N)
THREADS_PER_WARP = 32

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


# ---------------------------------------------------------------------------------------------
# candidate -> meta-parameters
# ---------------------------------------------------------------------------------------------
def make_candidate(row_tile=32, tg_size=128, stages=1, precision="ieee", fused_activation=True) -> SegdenseCandidate:
    return SegdenseCandidate(row_tile=row_tile, tg_size=tg_size, stages=stages, precision=precision,
                             fused_activation=fused_activation)


def _meta(candidate, classes: int = MIN_DOT) -> dict:
    # output columns in chunks of OUTPUT_CHUNK, reduction in chunks of MIN_DOT: the default candidate does
    # not spill on sm_80/sm_90 (audit); row_tile is the candidate's
    return dict(BLOCK_R=max(MIN_DOT, int(candidate.row_tile)), BLOCK_N=OUTPUT_CHUNK, BLOCK_K=MIN_DOT,
                BLOCK_C=max(MIN_DOT, triton.next_power_of_2(classes)), PRECISION=candidate.precision,
                FUSED_ACTIVATION=bool(candidate.fused_activation),
                num_warps=max(1, candidate.tg_size // THREADS_PER_WARP), num_stages=max(1, candidate.stages))


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------
_UNITS = {"ieee": "fp32_fma", "tf32x3": "tf32x3", "tf32": "tf32"}


def _pack_head(weights, biases, classifier_weight, classifier_bias, f_in: int):
    """(w_stack (L, D, D), b_stack (L, D), classifier weight (C, K), classifier bias (C,)) in fp32, the linear
    layers zero-padded to the widest width D."""
    num_linear = len(weights)
    d_max = max([f_in] + [w.shape[0] for w in weights])
    device = classifier_weight.device
    w_stack = torch.zeros(max(num_linear, 1), d_max, d_max, device=device, dtype=torch.float32)
    b_stack = torch.zeros(max(num_linear, 1), d_max, device=device, dtype=torch.float32)
    for layer, (w, b) in enumerate(zip(weights, biases)):
        w_stack[layer, :w.shape[0], :w.shape[1]] = w.detach().float()
        if b is not None:
            b_stack[layer, :w.shape[0]] = b.detach().float()
    wc = classifier_weight.detach().float().contiguous()
    bc = (classifier_bias.detach().float().contiguous() if classifier_bias is not None
          else torch.zeros(wc.shape[0], device=device, dtype=torch.float32))
    return w_stack, b_stack, wc, bc


def _packed_head(weights, biases, classifier_weight, classifier_bias, f_in: int):
    """The packed head, cached per parameter version (device_cache.packed_weights: an inference loop packs
    once, an in-place update or load_state_dict repacks, inference tensors pack on every call)."""
    tensors = [t for t in (*weights, *biases, classifier_weight, classifier_bias) if t is not None]
    return packed_weights("segdense", tensors,
                          lambda: _pack_head(weights, biases, classifier_weight, classifier_bias, f_in),
                          f_in, tuple(b is None for b in biases), classifier_bias is None)


def segdense_plan(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor],
                  classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor], *,
                  activation: str, candidate):
    """The launches of `segdense` as records, and the (rows, classes) fp32 output they fill.

    One `_segdense_kernel` launch over row blocks, plus `_segdense_activation_kernel` when the activation
    is a second pass; no launch for zero rows. The layer widths are constexprs and the weights are packed
    once per parameter version, so a call copies nothing from the host. Bytes: x, the weights and biases,
    each layer's activations written to and read back from the scratch buffer, the output; FLOPs: the
    dots (2 per multiply-add)."""
    f_in = x.shape[-1]
    rows = x.reshape(-1, f_in).to(torch.float32).contiguous()
    R = rows.shape[0]
    C = classifier_weight.shape[0]
    device = x.device
    num_linear = len(weights)
    dims = [f_in] + [w.shape[0] for w in weights]
    d_max = max(dims)
    w_stack, b_stack, wc, bc = _packed_head(list(weights), list(biases), classifier_weight, classifier_bias, f_in)
    scratch = torch.empty(2 if num_linear else 1, max(R, 1), d_max, device=device, dtype=torch.float32)
    out = torch.empty(R, C, device=device, dtype=torch.float32)
    act = ACTIVATIONS.index(activation)
    meta = _meta(candidate, C)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    if R == 0:
        return [], out
    grid = (triton.cdiv(R, meta["BLOCK_R"]),)
    products = sum(n * k for n, k in zip(dims[1:], dims[:-1])) + C * dims[-1]
    weight_bytes = 4 * (products + sum(dims[1:]) + C)
    scratch_bytes = 4 * R * sum(dims[1:])   # each layer's activations: written once, read once
    plan = [Launch(_segdense_kernel, grid, (rows, w_stack, b_stack, wc, bc, scratch, out, R, f_in, C, d_max),
                   meta=dict(NUM_LINEAR=num_linear, DIMS=tuple(dims[1:]), ACTIVATION=act, **meta),
                   num_warps=num_warps, num_stages=num_stages, bytes_read=4 * R * f_in + weight_bytes + scratch_bytes,
                   bytes_written=scratch_bytes + 4 * R * C, flops=2 * R * products, unit=_UNITS[candidate.precision])]
    if not candidate.fused_activation and activation != "none":
        plan.append(Launch(_segdense_activation_kernel, grid, (out, R, C),
                           meta=dict(ACTIVATION=act, BLOCK_R=meta["BLOCK_R"], BLOCK_C=meta["BLOCK_C"]),
                           num_warps=num_warps, bytes_read=4 * R * C, bytes_written=4 * R * C, flops=4 * R * C))
    return plan, out


def segdense(x: torch.Tensor, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor],
             classifier_weight: torch.Tensor, classifier_bias: Optional[torch.Tensor], *,
             activation: str, candidate) -> torch.Tensor:
    """(..., F) -> (..., C): leaky_relu(linear) for each (weight, bias), classifier, activation."""
    plan, out = segdense_plan(x, weights, biases, classifier_weight, classifier_bias, activation=activation,
                              candidate=candidate)
    launches.run(plan)
    return out.reshape(*x.shape[:-1], classifier_weight.shape[0]).to(x.dtype)


def launch_count(request, candidate) -> int:
    """Launches of one routed call: none for zero rows, else the head kernel, plus the activation pass
    when the candidate does not fuse it."""
    if request.field_map["rows"] == 0:
        return 0
    second_pass = not candidate.fused_activation and request.feature_map["activation"] != "none"
    return 1 + int(second_pass)


# ---------------------------------------------------------------------------------------------
# routing data
# ---------------------------------------------------------------------------------------------
COVERAGE = Coverage(
    ops=frozenset({"segdense"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32"}),
    ranges={"classes": (1, MAX_CLASSES), "in_features": (1, MAX_FEATURES), "hidden": (1, MAX_FEATURES),
            "rows": (0, (1 << 31) - 1)},
    features={
        "activation": frozenset(ACTIVATIONS),
        "linear_layers": frozenset(range(0, 9)),
        "requires_grad": frozenset({False}),   # forward-only kernel: autograd goes to torch
    },
)

_WHERE = "interpreter, tests/triton/test_segdense.py (vs float64)"

# tf32 stays unapproved: no accuracy evidence is kept for it, and TF32 products have been measured to move
# diarization error rates (the diarization kernels default to true fp32)
APPROVALS = approvals_by_precision("segdense", {"ieee": 1e-5, "tf32x3": 2e-5}, _WHERE)
RECIPES = {}
SPEED_EVIDENCE = {}


def _audit_kernels() -> list:
    cands = tuple(plan_candidates("segdense"))
    default = DEFAULT_VARIANT.candidate()
    return [AuditSpec(
        name="segdense_head", family="segdense", kernel=_segdense_kernel,
        signature={"x_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "wc_ptr": "*fp32", "bc_ptr": "*fp32", "scratch_ptr": "*fp32", "out_ptr": "*fp32",
                   "R": "i32", "F_IN": "i32", "C": "i32", "D_MAX": "i32",
                   "NUM_LINEAR": "constexpr", "DIMS": "constexpr", "ACTIVATION": "constexpr", "FUSED_ACTIVATION": "constexpr",
                   "PRECISION": "constexpr", "BLOCK_R": "constexpr", "BLOCK_N": "constexpr",
                   "BLOCK_K": "constexpr", "BLOCK_C": "constexpr"},
        meta=lambda cand, dt: dict(NUM_LINEAR=2, DIMS=(128, 128), ACTIVATION=ACTIVATIONS.index("log_softmax"),
                                   **_meta(cand, 7)),
        expects_mma=lambda cand, dt: cand.precision != "ieee",
        candidates=cands, default=default, dtypes=("fp32",))]


AUDIT_KERNELS = _audit_kernels()
