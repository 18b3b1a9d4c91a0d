"""Triton LSTM: multi-layer, uni- or bidirectional nn.LSTM inference as two kernels per layer.

1. `_lstm_input_proj_kernel`: the input projection of every timestep and both directions as one
   GEMM, G[rows, D*4H] = X[rows, I] @ W_ih_cat^T + (b_ih + b_hh), with `tl.dot` at the candidate's
   precision ("ieee" or "tf32x3" are approved; "tf32" has no accuracy evidence and is not).
2. `_lstm_recurrence_kernel`: one program per (direction, batch tile) runs the recurrence over the
   timesteps [step_begin, step_end). Each step streams W_hh tiles (BLOCK_K x BLOCK_H per gate) and
   computes gates = G[t] + h_{t-1} @ W_hh^T in fp32 ("ieee" dot), then the cell update in fp32.
   The state never leaves the program's reach: h_{t-1} is re-read from the output row it wrote the
   step before (y[t-1], L1/L2 resident), c lives in the c_n output buffer and is updated in place.
   mode="persistent" launches it once with [0, T) (one barrier per step orders the CTA's own writes);
   mode="stepwise" launches it once per timestep with [s, s+1): the same arithmetic, and a mode the
   interpreter can check step by step.

Gate order is torch's (i, f, g, o); gates, state and recurrence stay fp32 whatever the candidate.
Refused to the torch op (typed, via COVERAGE features): training with dropout > 0, proj_size > 0,
packed sequences, autograd, hidden > 512, dtypes other than float32.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.planner.candidates.lstm import DEFAULT_VARIANT, LstmCandidate
from rlx_triton.router.coverage import Coverage

MAX_HIDDEN = 512


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _lstm_input_proj_kernel(
    x_ptr, w_ptr, bias_ptr, g_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_gm,
    HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """G[M, N] = X[M, K] @ W[N, K]^T (+ bias[N]); fp32 accumulation."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_mask = offs_m < M
    col_mask = offs_n < N
    rows64 = offs_m.to(tl.int64)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_idx = k0 + offs_k
        k_mask = k_idx < K
        x_tile = tl.load(x_ptr + rows64[:, None] * stride_xm + k_idx[None, :],
                         mask=row_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        # W^T tile: element (k, n) = W[n, k]
        w_tile = tl.load(w_ptr + offs_n[None, :] * stride_wn + k_idx[:, None],
                         mask=k_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(x_tile, w_tile, input_precision=PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=col_mask, other=0.0).to(tl.float32)
        acc += bias[None, :]
    tl.store(g_ptr + rows64[:, None] * stride_gm + offs_n[None, :], acc,
             mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # no tanh outside libdevice: tanh(x) = 2 * sigmoid(2x) - 1
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _gate_preact(acc, whh_ptr, h_prev, w_rows, k_idx, k_mask, h_mask, H):
    """acc += h_prev[BLOCK_B, BLOCK_H(k)] @ W_hh[w_rows, k]^T, in true fp32."""
    w_tile = tl.load(whh_ptr + w_rows[None, :].to(tl.int64) * H + k_idx[:, None],
                     mask=k_mask[:, None] & h_mask[None, :], other=0.0)
    return acc + tl.dot(h_prev, w_tile, input_precision="ieee")


@triton.jit
def _lstm_recurrence_kernel(
    g_ptr, whh_ptr, h0_ptr, c_ptr, y_ptr, hn_ptr,
    T, B, H, step_begin, step_end,
    stride_gt, stride_gb,      # G rows: (t, b) -> row offset; columns: dir*4H + gate*H + unit
    stride_yt, stride_yb,      # y: (t, b) -> offset; columns: dir*H + unit
    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program = one direction x one batch tile; loops over steps [step_begin, step_end)."""
    direction = tl.program_id(0)
    pid_b = tl.program_id(1)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_h = tl.arange(0, BLOCK_H)
    offs_k = tl.arange(0, BLOCK_K)
    b_mask = offs_b < B
    b64 = offs_b.to(tl.int64)

    whh_dir = whh_ptr + direction.to(tl.int64) * 4 * H * H    # (D, 4H, H) stack
    h0_dir = h0_ptr + direction.to(tl.int64) * B * H           # (D, B, H)
    c_dir = c_ptr + direction.to(tl.int64) * B * H             # (D, B, H), updated in place
    hn_dir = hn_ptr + direction.to(tl.int64) * B * H
    g_col0 = direction * 4 * H
    y_col0 = direction * H

    for s in range(step_begin, step_end):
        # forward runs t = s; reverse runs t = T-1-s. h_{t-1} comes from h0 at the first step,
        # else from the output row this program wrote the step before.
        t = s + direction * (T - 1 - 2 * s)
        t_prev = t - 1 + 2 * direction
        step_vec = offs_k * 0 + s          # the step as a tensor, so it combines with masks
        first = (step_vec == 0)[None, :]
        later = (step_vec > 0)[None, :]
        last = ((offs_h * 0 + s) == T - 1)[None, :]
        for j0 in range(0, H, BLOCK_H):
            unit = j0 + offs_h
            h_mask = unit < H
            acc_i = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
            acc_f = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
            acc_g = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
            acc_o = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
            for k0 in range(0, H, BLOCK_K):
                k_idx = k0 + offs_k
                k_mask = k_idx < H
                state_mask = b_mask[:, None] & k_mask[None, :]
                h_from_h0 = tl.load(h0_dir + b64[:, None] * H + k_idx[None, :],
                                    mask=state_mask & first, other=0.0)
                h_from_y = tl.load(y_ptr + t_prev.to(tl.int64) * stride_yt + b64[:, None] * stride_yb
                                   + y_col0 + k_idx[None, :],
                                   mask=state_mask & later, other=0.0)
                h_prev = h_from_h0 + h_from_y
                acc_i = _gate_preact(acc_i, whh_dir, h_prev, 0 * H + unit, k_idx, k_mask, h_mask, H)
                acc_f = _gate_preact(acc_f, whh_dir, h_prev, 1 * H + unit, k_idx, k_mask, h_mask, H)
                acc_g = _gate_preact(acc_g, whh_dir, h_prev, 2 * H + unit, k_idx, k_mask, h_mask, H)
                acc_o = _gate_preact(acc_o, whh_dir, h_prev, 3 * H + unit, k_idx, k_mask, h_mask, H)

            out_mask = b_mask[:, None] & h_mask[None, :]
            g_row = g_ptr + t.to(tl.int64) * stride_gt + b64[:, None] * stride_gb + g_col0 + unit[None, :]
            pre_i = acc_i + tl.load(g_row + 0 * H, mask=out_mask, other=0.0)
            pre_f = acc_f + tl.load(g_row + 1 * H, mask=out_mask, other=0.0)
            pre_g = acc_g + tl.load(g_row + 2 * H, mask=out_mask, other=0.0)
            pre_o = acc_o + tl.load(g_row + 3 * H, mask=out_mask, other=0.0)

            state_ptrs = b64[:, None] * H + unit[None, :]
            c_prev = tl.load(c_dir + state_ptrs, mask=out_mask, other=0.0)
            c_new = _sigmoid(pre_f) * c_prev + _sigmoid(pre_i) * _tanh(pre_g)
            h_new = _sigmoid(pre_o) * _tanh(c_new)
            tl.store(c_dir + state_ptrs, c_new, mask=out_mask)
            tl.store(y_ptr + t.to(tl.int64) * stride_yt + b64[:, None] * stride_yb + y_col0 + unit[None, :],
                     h_new, mask=out_mask)
            tl.store(hn_dir + state_ptrs, h_new, mask=out_mask & last)
        # every thread of the program sees this step's h before the next step reads it
        tl.debug_barrier()


# ---------------------------------------------------------------------------------------------
# candidate -> meta-parameters
# ---------------------------------------------------------------------------------------------
def make_candidate(batch_tile=16, hidden_tile=32, tg_size=128, stages=1, mode="persistent",
                   precision="ieee") -> LstmCandidate:
    return LstmCandidate(batch_tile=batch_tile, hidden_tile=hidden_tile, tg_size=tg_size, stages=stages,
                         mode=mode, precision=precision)


def _proj_meta(candidate) -> dict:
    # 64 x 64 output tiles, K in chunks of 16: no spills on sm_80/sm_90 for any candidate (audit)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=16, PRECISION=candidate.precision,
                num_warps=max(1, candidate.tg_size // 32), num_stages=max(1, candidate.stages))


def _rec_meta(candidate) -> dict:
    """BLOCK_B = batch_tile; BLOCK_H = hidden_tile capped so the four fp32 gate accumulators
    (4 x BLOCK_B x BLOCK_H) take at most 16 registers per thread each (BLOCK_B*BLOCK_H <= 4*tg_size;
    larger tiles spill on sm_90); W_hh is streamed in BLOCK_K=16 x BLOCK_H tiles per gate.
    num_stages: in persistent mode the W_hh k-loop is software-pipelined `stages` deep (the next
    tile is fetched from L2 while the current one is in the dot); stepwise launches use one stage
    (two spill on sm_80). The arithmetic is the same either way."""
    num_warps = max(1, candidate.tg_size // 32)
    block_b = max(16, int(candidate.batch_tile))
    block_h = max(16, int(candidate.hidden_tile))
    while block_h > 16 and block_b * block_h > 4 * 32 * num_warps:
        block_h //= 2
    stages = max(1, int(candidate.stages)) if candidate.mode == "persistent" else 1
    return dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=16, num_warps=num_warps, num_stages=stages)


# ---------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------
def _layer_weights(flat_weights: Sequence[torch.Tensor], has_biases: bool, layer: int, directions: int):
    per = 4 if has_biases else 2
    w_ih, w_hh, b_ih, b_hh = [], [], [], []
    for d in range(directions):
        chunk = flat_weights[(layer * directions + d) * per:(layer * directions + d + 1) * per]
        w_ih.append(chunk[0])
        w_hh.append(chunk[1])
        if has_biases:
            b_ih.append(chunk[2])
            b_hh.append(chunk[3])
    w_ih_cat = torch.cat(w_ih, 0).float().contiguous()                  # (D*4H, I)
    w_hh_stack = torch.stack(w_hh, 0).float().contiguous()              # (D, 4H, H)
    bias = (torch.cat(b_ih, 0).float() + torch.cat(b_hh, 0).float()).contiguous() if has_biases else None
    return w_ih_cat, w_hh_stack, bias


_PROJ_UNITS = {"ieee": "fp32_fma", "tf32x3": "tf32x3", "tf32": "tf32"}


def _as_batched(input, hx, batch_first: bool):
    """(x, hx, unbatched): an unbatched (T, I) input and its (layers*D, H) state gain a batch of one."""
    unbatched = input.dim() == 2
    x = input.unsqueeze(1 if not batch_first else 0) if unbatched else input
    if hx is not None and unbatched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    return x, hx, unbatched


def _projection_launch(layer_in, w_ih_cat, bias, gates, candidate) -> Launch:
    """G = X @ W_ih_cat^T + bias for every timestep and direction of one layer."""
    meta = _proj_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    rows, in_features = gates.shape[0], layer_in.shape[-1]
    n_cols = w_ih_cat.shape[0]
    grid = (triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))
    read = (rows * in_features + n_cols * in_features + (n_cols if bias is not None else 0)) * 4
    return Launch(_lstm_input_proj_kernel, grid,
                  (layer_in, w_ih_cat, bias if bias is not None else w_ih_cat, gates,
                   rows, n_cols, in_features, in_features, w_ih_cat.stride(0), gates.stride(0)),
                  meta=dict(HAS_BIAS=bias is not None, **meta), num_warps=num_warps, num_stages=num_stages,
                  bytes_read=read, bytes_written=rows * n_cols * 4, flops=2 * rows * n_cols * in_features,
                  unit=_PROJ_UNITS[candidate.precision])


def _recurrence_launches(gates, w_hh_stack, h0, c_state, y, hn, *, T, B, hidden, directions, batch_first,
                         candidate) -> List[Launch]:
    """The recurrence of one layer: one launch over [0, T) (persistent), or one per timestep (stepwise).

    Bytes are what each launch needs from memory once: W_hh (every stepwise launch reads all of it again),
    the input gates, the previous h and the cell state of its steps, and the h rows it writes."""
    meta = _rec_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    n_cols = 4 * hidden * directions
    if batch_first:   # rows are b*T + t
        strides = (n_cols, T * n_cols, y.stride(1), y.stride(0))
    else:             # rows are t*B + b
        strides = (B * n_cols, n_cols, y.stride(0), y.stride(1))
    grid = (directions, triton.cdiv(B, meta["BLOCK_B"]))
    state = directions * B * hidden * 4

    def launch(step_begin: int, step_end: int) -> Launch:
        steps = step_end - step_begin
        read = w_hh_stack.numel() * 4 + steps * (B * n_cols * 4 + state) + 2 * state
        written = steps * state + 2 * state
        return Launch(_lstm_recurrence_kernel, grid,
                      (gates, w_hh_stack, h0, c_state, y, hn, T, B, hidden, step_begin, step_end, *strides),
                      meta=meta, num_warps=num_warps, num_stages=num_stages, bytes_read=read, bytes_written=written,
                      flops=steps * (2 * B * directions * 4 * hidden * hidden), unit="fp32_fma")

    if candidate.mode == "stepwise":
        return [launch(s, s + 1) for s in range(T)]
    return [launch(0, T)]


def lstm_plan(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]],
              flat_weights: List[torch.Tensor], *, has_biases: bool, num_layers: int, dropout: float, training: bool,
              bidirectional: bool, batch_first: bool, proj_size: int = 0, candidate):
    """The launches of `lstm` as records, and the fp32 buffers they fill: (records, (y, h_n, c_n)).

    Per layer: the input projection, then the recurrence (see `_recurrence_launches`). Buffers are
    allocated on the input's device, so meta inputs give the plan at any shape."""
    x, hx, _unbatched = _as_batched(input, hx, batch_first)
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1]
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    device = x.device

    h_n = torch.empty(num_layers * directions, B, hidden, device=device, dtype=torch.float32)
    if hx is None:
        c_n = torch.zeros(num_layers * directions, B, hidden, device=device, dtype=torch.float32)
        h0_all = torch.zeros_like(c_n)
    else:
        c_n = hx[1].to(torch.float32).contiguous().clone()
        h0_all = hx[0].to(torch.float32).contiguous()

    records: List[Launch] = []
    layer_in = x.to(torch.float32).contiguous()
    for layer in range(num_layers):
        w_ih_cat, w_hh_stack, bias = _layer_weights(flat_weights, has_biases, layer, directions)
        gates = torch.empty(B * T, w_ih_cat.shape[0], device=device, dtype=torch.float32)
        records.append(_projection_launch(layer_in, w_ih_cat, bias, gates, candidate))
        y = torch.empty(*layer_in.shape[:2], directions * hidden, device=device, dtype=torch.float32)
        sl = slice(layer * directions, (layer + 1) * directions)
        records += _recurrence_launches(gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl], T=T, B=B,
                                        hidden=hidden, directions=directions, batch_first=batch_first,
                                        candidate=candidate)
        layer_in = y
    return records, (layer_in, h_n, c_n)


def lstm(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, proj_size: int = 0, candidate) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """nn.LSTM's forward (torch.lstm's arguments) on Triton kernels; returns (output, (h_n, c_n)).

    input: (T, B, I), or (B, T, I) when batch_first, or unbatched (T, I). hx: (h0, c0), each
    (layers*D, B, H) (or (layers*D, H) unbatched), or None for zeros. dropout/training are accepted
    for signature parity; covered requests have no active dropout and proj_size == 0.
    """
    plan, (output, h_n, c_n) = lstm_plan(input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers,
                                         dropout=dropout, training=training, bidirectional=bidirectional,
                                         batch_first=batch_first, proj_size=proj_size, candidate=candidate)
    launches.run(plan)
    out_dtype = input.dtype
    output, h_n, c_n = output.to(out_dtype), h_n.to(out_dtype), c_n.to(out_dtype)
    if input.dim() == 2:
        output = output.squeeze(1 if not batch_first else 0)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)


def launch_count(request, candidate) -> int:
    """Launches of one routed call: per layer the projection, then 1 recurrence launch (persistent) or
    one per timestep (stepwise)."""
    fields = request.field_map
    per_layer = 1 + (fields["seq"] if candidate.mode == "stepwise" else 1)
    return fields["layers"] * per_layer


# ---------------------------------------------------------------------------------------------
# routing data
# ---------------------------------------------------------------------------------------------
COVERAGE = Coverage(
    ops=frozenset({"lstm"}),
    devices=frozenset({"cuda", "cpu"}),
    dtypes=frozenset({"float32"}),
    ranges={"hidden": (1, MAX_HIDDEN), "layers": (1, 64), "directions": (1, 2), "input_size": (1, 1 << 16),
            "seq": (1, 1 << 20), "batch": (1, 1 << 16)},
    features={
        "dropout_active": frozenset({False}),   # training with dropout > 0 goes to torch
        "proj_size": frozenset({0}),
        "packed": frozenset({False}),
        "has_biases": frozenset({True, False}),
        "batch_first": frozenset({True, False}),
        "requires_grad": frozenset({False}),    # forward-only kernels: autograd goes to torch
    },
)

_WHERE = "interpreter, tests/triton/test_lstm.py (1-2 layers, bi, hidden 7..33, vs float64)"

# tf32 has no retained accuracy evidence (TF32 moves diarization error rates: notes, speakrs): unapproved
APPROVALS = approvals_by_precision("lstm", {"ieee": 1e-5, "tf32x3": 2e-5}, _WHERE)
RECIPES = {}
SPEED_EVIDENCE = {}


def _audit_kernels() -> list:
    cands = tuple(plan_candidates("lstm"))
    default = DEFAULT_VARIANT.candidate()
    return [
        AuditSpec(
            name="lstm_input_proj", family="lstm", kernel=_lstm_input_proj_kernel,
            signature={"x_ptr": "*{dt}", "w_ptr": "*fp32", "bias_ptr": "*fp32", "g_ptr": "*fp32",
                       "M": "i32", "N": "i32", "K": "i32",
                       "stride_xm": "i32", "stride_wn": "i32", "stride_gm": "i32",
                       "HAS_BIAS": "constexpr", "PRECISION": "constexpr",
                       "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"},
            meta=lambda cand, dt: dict(HAS_BIAS=True, **_proj_meta(cand)),
            candidates=cands, default=default, dtypes=("fp32",),
            expects_mma=lambda cand, dt: cand.precision != "ieee"),
        AuditSpec(
            name="lstm_recurrence", family="lstm", kernel=_lstm_recurrence_kernel,
            signature={"g_ptr": "*fp32", "whh_ptr": "*fp32", "h0_ptr": "*fp32", "c_ptr": "*fp32",
                       "y_ptr": "*fp32", "hn_ptr": "*fp32",
                       "T": "i32", "B": "i32", "H": "i32", "step_begin": "i32", "step_end": "i32",
                       "stride_gt": "i32", "stride_gb": "i32", "stride_yt": "i32", "stride_yb": "i32",
                       "BLOCK_B": "constexpr", "BLOCK_H": "constexpr", "BLOCK_K": "constexpr"},
            meta=lambda cand, dt: _rec_meta(cand),
            candidates=cands, default=default, dtypes=("fp32",), expects_mma=False),
    ]


AUDIT_KERNELS = _audit_kernels()
