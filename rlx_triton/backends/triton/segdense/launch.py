"""Segdense launches: candidate -> meta-parameters, the packed head cached per parameter version, and
the launch records with their byte and FLOP models."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.device_cache import packed_weights
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.backends.triton.segdense.kernels import ACTIVATIONS, _segdense_activation_kernel, _segdense_kernel
from rlx_triton.planner.candidates.segdense import SegdenseCandidate

MAX_CLASSES = 256
MAX_FEATURES = 4096
MIN_DOT = 16          # tl.dot's smallest tile side: BLOCK_R, BLOCK_K and BLOCK_C are at least this
OUTPUT_CHUNK = 32     # output columns per dot of a linear layer (BLOCK_N)
THREADS_PER_WARP = 32


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
