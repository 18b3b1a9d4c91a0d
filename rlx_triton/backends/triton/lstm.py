"""Triton LSTM: multi-layer, uni- or bidirectional nn.LSTM inference as two kernels per layer.

1. `_lstm_input_proj_kernel`: the input projection of every timestep and both directions as one
   GEMM, G[rows, D*4H] = X[rows, I] @ W_ih_cat^T + (b_ih + b_hh), with `tl.dot` at the candidate's
   precision ("ieee" or "tf32x3" are approved; "tf32" has no accuracy evidence and is not).
2. The recurrence, by the candidate's mode:
   - "onchip" (`_lstm_onchip_kernel`, the default): the hidden units of each direction are split
     across programs, UNITS per program; a program loads its 4*UNITS rows of W_hh once and holds
     them on chip (the compiler keeps the loop-invariant dot operand in shared memory) for every
     step, with its units' cell state in registers. The programs of one (direction, batch tile)
     exchange h_t through global memory (the layer's output rows, read from L2) and meet at a
     barrier each step (`_group_barrier`: a release atomic per program, an acquire spin on the
     group's counter), so a layer is one launch: W_hh read once per layer, every SM of a group busy.
     A barrier that waits for programs that are not resident deadlocks, so the launcher checks that
     every program of the launch fits on the device at once, from the compiled kernel's registers,
     shared memory and warps and the tensors' GPU (`co_residency_refusal`), and launches it as a
     cooperative grid (`launch_cooperative_grid`: the driver runs it whole or refuses it, whatever
     other streams, MPS clients or a sanitizer hold). A refusal, at plan time or by the driver, runs
     the persistent candidate of the same precision (`fallback_candidate`) with one warning, and
     rt.explain's `runs` line says so and why. Where programs do not
     run concurrently (the CPU interpreter runs them one after another) a group of several
     programs runs one launch per step instead, the launch boundary as its barrier: the same
     arithmetic, which the interpreter checks.
   - "persistent" (`_lstm_recurrence_kernel` over [0, T)): one program per (direction, batch tile)
     streams W_hh tiles (BLOCK_K x BLOCK_H per gate) from L2 every step;
   - "stepwise": the same kernel launched once per timestep with [s, s+1).
   h_{t-1} is re-read from the output row written the step before (y[t-1]); c stays on chip (onchip)
   or in the c_n buffer (persistent, stepwise).

Gate order is torch's (i, f, g, o) in the weights; the on-chip recurrence packs the gate rows
unit-major (unit*4 + gate) so a program's units are one contiguous run. The recurrent product is
fp32 ("ieee") or, in the tf32x3 on-chip candidate, three TF32 tensor-core products of the operands'
tf32 parts; gates and state stay fp32. Weights are packed once per parameter version (inference
tensors, which have no version counter, on every call). With the router's route the projection and
the on-chip recurrence run through the autotune bridge (key: batch bucket, sequence-length bucket,
hidden / N, K). Refused to the torch op (typed, via COVERAGE features): training with dropout > 0,
proj_size > 0, packed sequences, autograd, hidden > 512, dtypes other than float32.
"""
from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from rlx_triton.backends.candidates import approvals_by_precision, plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton._tf32 import tf32_split
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.device_cache import packed_weights
from rlx_triton.backends.triton.launches import Launch
from rlx_triton import devices
from rlx_triton.planner.candidates.lstm import DEFAULT_VARIANT, LstmCandidate, LstmVariant
from rlx_triton.router.coverage import DEVICE_UNSUPPORTED, Coverage, Refusal
from rlx_triton.router.device import device_facts

MAX_HIDDEN = 512
GATES = 4   # i, f, g, o: torch's gate order in the weights' rows
MIN_DOT = 16   # tl.dot's smallest tile side: every BLOCK_* that meets a dot is at least this
THREADS_PER_WARP = 32

# the same facts for the kernels, which read only constexpr globals
_GATES = tl.constexpr(GATES)
GATE_I, GATE_F, GATE_G, GATE_O = (tl.constexpr(gate) for gate in range(GATES))


# ---------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dot_fp32(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b at the candidate's precision. "tf32x3" is written out as three TF32 tensor-core
    products of the operands' tf32 parts (hi*lo + lo*hi + hi*hi, small terms first): every product of two
    tf32 numbers is exact in fp32, so the CPU interpreter, whose dots are fp32 whatever the precision,
    reproduces the rounding of the GPU's tf32x3 and measures its error."""
    if PRECISION == "tf32x3":
        a_hi, a_lo = tf32_split(a)
        b_hi, b_lo = tf32_split(b)
        acc = tl.dot(a_hi, b_lo, acc, input_precision="tf32")
        acc = tl.dot(a_lo, b_hi, acc, input_precision="tf32")
        acc = tl.dot(a_hi, b_hi, acc, input_precision="tf32")
    else:
        acc = acc + tl.dot(a, b, input_precision=PRECISION)
    return acc


@triton.jit
def _lstm_input_proj_kernel(
    x_ptr, w_ptr, bias_ptr, g_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_gm,
    batch_bucket, seq_bucket,  # the autotune key (next powers of two of batch and sequence), unused by the body
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
        acc = _dot_fp32(x_tile, w_tile, acc, PRECISION)
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
def _lstm_cell(pre_i, pre_f, pre_g, pre_o, c):
    """(c_t, h_t) from the gates' pre-activations and c_{t-1}, as nn.LSTM computes them."""
    c = _sigmoid(pre_f) * c + _sigmoid(pre_i) * _tanh(pre_g)
    return c, _sigmoid(pre_o) * _tanh(c)


@triton.jit
def _gate_preact(acc, whh_ptr, h_prev, w_rows, k_idx, k_mask, h_mask, H):
    """acc += h_prev[BLOCK_B, BLOCK_H(k)] @ W_hh[w_rows, k]^T, in true fp32."""
    w_tile = tl.load(whh_ptr + w_rows[None, :].to(tl.int64) * H + k_idx[:, None],
                     mask=k_mask[:, None] & h_mask[None, :], other=0.0)
    return acc + tl.dot(h_prev, w_tile, input_precision="ieee")


@triton.jit
def _recurrent_preacts(whh_dir, h0_dir, y_prev, b64, b_mask, unit, h_mask, first, later, H,
                       BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """h_{t-1} @ W_hh^T for the units `unit` of the four gates, over K = H in BLOCK_K chunks; h_{t-1} is
    read from h0 at the first step (`first`), else from the previous output row y_prev (`later`)."""
    offs_k = tl.arange(0, BLOCK_K)
    acc_i = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc_f = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc_g = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    acc_o = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_idx = k0 + offs_k
        k_mask = k_idx < H
        state_mask = b_mask[:, None] & k_mask[None, :]
        h_from_h0 = tl.load(h0_dir + b64[:, None] * H + k_idx[None, :], mask=state_mask & first, other=0.0)
        h_from_y = tl.load(y_prev + k_idx[None, :], mask=state_mask & later, other=0.0)
        h_prev = h_from_h0 + h_from_y
        acc_i = _gate_preact(acc_i, whh_dir, h_prev, H * GATE_I + unit, k_idx, k_mask, h_mask, H)
        acc_f = _gate_preact(acc_f, whh_dir, h_prev, H * GATE_F + unit, k_idx, k_mask, h_mask, H)
        acc_g = _gate_preact(acc_g, whh_dir, h_prev, H * GATE_G + unit, k_idx, k_mask, h_mask, H)
        acc_o = _gate_preact(acc_o, whh_dir, h_prev, H * GATE_O + unit, k_idx, k_mask, h_mask, H)
    return acc_i, acc_f, acc_g, acc_o


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
    b_mask = offs_b < B
    b64 = offs_b.to(tl.int64)

    whh_dir = whh_ptr + direction.to(tl.int64) * _GATES * H * H    # (D, 4H, H) stack
    h0_dir = h0_ptr + direction.to(tl.int64) * B * H                # (D, B, H)
    c_dir = c_ptr + direction.to(tl.int64) * B * H                  # (D, B, H), updated in place
    hn_dir = hn_ptr + direction.to(tl.int64) * B * H
    g_col0 = direction * _GATES * H
    y_col0 = direction * H

    for s in range(step_begin, step_end):
        # forward runs t = s; reverse runs t = T-1-s. h_{t-1} comes from h0 at the first step,
        # else from the output row this program wrote the step before.
        t = s + direction * (T - 1 - 2 * s)
        t_prev = t - 1 + 2 * direction
        step_vec = tl.arange(0, BLOCK_K) * 0 + s   # the step as a tensor, so it combines with masks
        first = (step_vec == 0)[None, :]
        later = (step_vec > 0)[None, :]
        last = ((offs_h * 0 + s) == T - 1)[None, :]
        y_prev = y_ptr + t_prev.to(tl.int64) * stride_yt + b64[:, None] * stride_yb + y_col0
        for j0 in range(0, H, BLOCK_H):
            unit = j0 + offs_h
            h_mask = unit < H
            acc_i, acc_f, acc_g, acc_o = _recurrent_preacts(whh_dir, h0_dir, y_prev, b64, b_mask, unit, h_mask,
                                                            first, later, H, BLOCK_B, BLOCK_H, BLOCK_K)

            out_mask = b_mask[:, None] & h_mask[None, :]
            g_row = g_ptr + t.to(tl.int64) * stride_gt + b64[:, None] * stride_gb + g_col0 + unit[None, :]
            pre_i = acc_i + tl.load(g_row + H * GATE_I, mask=out_mask, other=0.0)
            pre_f = acc_f + tl.load(g_row + H * GATE_F, mask=out_mask, other=0.0)
            pre_g = acc_g + tl.load(g_row + H * GATE_G, mask=out_mask, other=0.0)
            pre_o = acc_o + tl.load(g_row + H * GATE_O, mask=out_mask, other=0.0)

            state_ptrs = b64[:, None] * H + unit[None, :]
            c_prev = tl.load(c_dir + state_ptrs, mask=out_mask, other=0.0)
            c_new, h_new = _lstm_cell(pre_i, pre_f, pre_g, pre_o, c_prev)
            tl.store(c_dir + state_ptrs, c_new, mask=out_mask)
            tl.store(y_ptr + t.to(tl.int64) * stride_yt + b64[:, None] * stride_yb + y_col0 + unit[None, :],
                     h_new, mask=out_mask)
            tl.store(hn_dir + state_ptrs, h_new, mask=out_mask & last)
        # every thread of the program sees this step's h before the next step reads it
        tl.debug_barrier()


@triton.jit
def _group_barrier(counter_ptr, expected):
    """Arrive at a group's counter and wait until it holds `expected` arrivals.

    Every thread's stores are ordered before the arrival by the CTA barrier, and published at GPU scope by
    the release of the one thread that adds (a scalar atomic runs on one thread); the acquire that sees the
    last arrival orders the group's stores before this program's later loads, and the closing CTA barrier
    holds every thread until then. Deadlock-free only when every program of the group is resident at once
    (the launcher checks it)."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while arrived < expected:
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _dot_parts(h, w, w_hi, w_lo, acc, PRECISION: tl.constexpr):
    """acc + h @ w, with w's tf32x3 parts precomputed (see `_dot_fp32`)."""
    if PRECISION == "tf32x3":
        h_hi, h_lo = tf32_split(h)
        acc = tl.dot(h_hi, w_lo, acc, input_precision="tf32")
        acc = tl.dot(h_lo, w_hi, acc, input_precision="tf32")
        acc = tl.dot(h_hi, w_hi, acc, input_precision="tf32")
    else:
        acc = tl.dot(h, w, acc, input_precision=PRECISION)
    return acc


@triton.jit(do_not_specialize=["step_begin", "step_end"])
def _lstm_onchip_kernel(
    g_ptr, whh_ptr, h0_ptr, c_ptr, y_ptr, hn_ptr, counter_ptr,
    T, B, H, step_begin, step_end,
    stride_gt, stride_gb,      # G rows: (t, b) -> row offset; columns: dir*4H + unit*4 + gate (unit-major)
    stride_yt, stride_yb,      # y: (t, b) -> offset; columns: dir*H + unit
    batch_bucket, seq_bucket,  # the autotune key (next powers of two of batch and sequence), unused by the body
    BLOCK_B: tl.constexpr, UNITS: tl.constexpr, BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr,
    PRECISION: tl.constexpr, SYNC: tl.constexpr,
):
    """Program (direction, part, batch tile) owns UNITS hidden units: their 4*UNITS rows of W_hh are loaded
    once and held on chip for steps [step_begin, step_end), with the units' cell state. Each step reads the
    whole h_{t-1} row of its batch tile (written by every part of the group the step before), computes its
    units' gates and h_t, writes them to y[t] and, with SYNC, waits at the group's barrier."""
    direction = tl.program_id(0)
    part = tl.program_id(1)
    pid_b = tl.program_id(2)
    parts = tl.num_programs(1)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = offs_b < B
    b64 = offs_b.to(tl.int64)
    cols = part * _GATES * UNITS + tl.arange(0, _GATES * UNITS)   # packed gate rows of this part: unit * 4 + gate
    col_mask = cols < H * _GATES
    unit = part * UNITS + tl.arange(0, UNITS)
    u_mask = unit < H
    offs_c = tl.arange(0, K_CHUNK)

    # W_hh^T slice (BLOCK_K x 4*UNITS) in K_CHUNK-row pieces: loaded once and loop invariant, so the
    # compiler keeps them in shared memory; per step each piece's dot reads only K_CHUNK rows into
    # registers (one BLOCK_K-deep FMA dot would hold whole operand columns). The packed rows are
    # zero-padded to BLOCK_K, so the loads are the same whatever H is.
    whh_dir = whh_ptr + direction.to(tl.int64) * _GATES * H * BLOCK_K
    w_rows = whh_dir + cols[None, :].to(tl.int64) * BLOCK_K
    w_parts = ()
    w_his = ()
    w_los = ()
    for kc in tl.static_range(BLOCK_K // K_CHUNK):
        piece = tl.load(w_rows + kc * K_CHUNK + offs_c[:, None], mask=col_mask[None, :], other=0.0)
        hi, lo = tf32_split(piece)   # the tf32x3 parts, once (unused at other precisions)
        w_parts = w_parts + (piece,)
        w_his = w_his + (hi,)
        w_los = w_los + (lo,)
    out_mask = b_mask[:, None] & u_mask[None, :]
    state_ptrs = direction.to(tl.int64) * B * H + b64[:, None] * H + unit[None, :]
    c = tl.load(c_ptr + state_ptrs, mask=out_mask, other=0.0)
    g_mask = b_mask[:, None] & col_mask[None, :]
    g_cols = g_ptr + b64[:, None] * stride_gb + direction * _GATES * H + cols[None, :]
    y_row = y_ptr + b64[:, None] * stride_yb + direction * H
    h0_row = h0_ptr + direction.to(tl.int64) * B * H + b64[:, None] * H
    counter = counter_ptr + direction * tl.num_programs(2) + pid_b

    # the input gates of the first step; later ones are fetched before the barrier wait
    t = step_begin + direction * (T - 1 - 2 * step_begin)
    g_in = tl.load(g_cols + t.to(tl.int64) * stride_gt, mask=g_mask, other=0.0)
    for s in range(step_begin, step_end):
        # forward runs t = s, reverse t = T-1-s; h_{t-1} is h0 at the first step, else the row y[t-1]
        # the group wrote the step before (read from L2: other programs wrote it)
        t = s + direction * (T - 1 - 2 * s)
        t_prev = t - 1 + 2 * direction
        # every chunk of h_{t-1} is requested before the first dot needs one: one L2 round trip per step, not
        # one per chunk (no branch between the loads: the row is chosen by a pointer select)
        h_row = tl.where(s == 0, h0_row, y_row + t_prev.to(tl.int64) * stride_yt)
        h_chunks = ()
        for kc in tl.static_range(BLOCK_K // K_CHUNK):
            k_idx = kc * K_CHUNK + offs_c
            h_mask = b_mask[:, None] & (k_idx < H)[None, :]
            h_chunks = h_chunks + (tl.load(h_row + k_idx[None, :], mask=h_mask, other=0.0, cache_modifier=".cg"),)
        pre = g_in
        for kc in tl.static_range(BLOCK_K // K_CHUNK):
            pre = _dot_parts(h_chunks[kc], w_parts[kc], w_his[kc], w_los[kc], pre, PRECISION)
        # columns u*4 + 2*a + b: the first split takes b (gates i, g | f, o), the second a
        even, odd = tl.split(tl.reshape(pre, (BLOCK_B, UNITS, 2, 2)))
        pre_i, pre_g = tl.split(even)
        pre_f, pre_o = tl.split(odd)
        c, h = _lstm_cell(pre_i, pre_f, pre_g, pre_o, c)
        tl.store(y_row + t.to(tl.int64) * stride_yt + unit[None, :], h, mask=out_mask)
        if s == T - 1:
            tl.store(hn_ptr + state_ptrs, h, mask=out_mask)
        t_next = (s + 1) + direction * (T - 3 - 2 * s)
        has_next = (offs_b * 0 + s + 1) < T   # as a tensor, so it combines with masks
        g_in = tl.load(g_cols + t_next.to(tl.int64) * stride_gt, mask=g_mask & has_next[:, None], other=0.0)
        if SYNC:
            _group_barrier(counter, parts * (s + 1 - step_begin))
    tl.store(c_ptr + state_ptrs, c, mask=out_mask)


# ---------------------------------------------------------------------------------------------
# candidate -> meta-parameters
# ---------------------------------------------------------------------------------------------
def make_candidate(batch_tile=16, hidden_tile=32, tg_size=128, stages=1, mode="persistent",
                   precision="ieee") -> LstmCandidate:
    return LstmCandidate(batch_tile=batch_tile, hidden_tile=hidden_tile, tg_size=tg_size, stages=stages,
                         mode=mode, precision=precision)


PROJ_TILE = 64   # the projection's output tile side: no spills on sm_80/sm_90 for any candidate (audit)
K_CHUNK_MAX = 32   # rows of W_hh^T the on-chip kernel's dots read into registers at a time


def _warps(candidate) -> int:
    return max(1, candidate.tg_size // THREADS_PER_WARP)


def _proj_meta(candidate) -> dict:
    # PROJ_TILE x PROJ_TILE output tiles, K in chunks of MIN_DOT
    return dict(BLOCK_M=PROJ_TILE, BLOCK_N=PROJ_TILE, BLOCK_K=MIN_DOT, PRECISION=candidate.precision,
                num_warps=_warps(candidate), num_stages=max(1, candidate.stages))


def _rec_meta(candidate) -> dict:
    """Meta-parameters of `_lstm_recurrence_kernel` (persistent and stepwise modes).

    BLOCK_B = batch_tile; BLOCK_H = hidden_tile capped so the four fp32 gate accumulators
    (4 x BLOCK_B x BLOCK_H) take at most 16 registers per thread each (BLOCK_B*BLOCK_H <= 4*tg_size;
    larger tiles spill on sm_90); W_hh is streamed in BLOCK_K=16 x BLOCK_H tiles per gate.
    num_stages: in persistent mode the W_hh k-loop is software-pipelined `stages` deep (the next
    tile is fetched from L2 while the current one is in the dot); stepwise launches use one stage
    (two spill on sm_80). The arithmetic is the same either way."""
    num_warps = _warps(candidate)
    block_b = max(MIN_DOT, int(candidate.batch_tile))
    block_h = max(MIN_DOT, int(candidate.hidden_tile))
    while block_h > MIN_DOT and block_b * block_h > GATES * THREADS_PER_WARP * num_warps:
        block_h //= 2
    stages = max(1, int(candidate.stages)) if candidate.mode == "persistent" else 1
    return dict(BLOCK_B=block_b, BLOCK_H=block_h, BLOCK_K=MIN_DOT, num_warps=num_warps, num_stages=stages)


def _onchip_meta(candidate, hidden: int) -> dict:
    """Meta-parameters of `_lstm_onchip_kernel`: BLOCK_B = batch_tile, UNITS = hidden_tile units per program
    (4 * UNITS gate columns: tl.dot needs >= 16), BLOCK_K = the hidden size padded to a power of two (a
    program reads the whole h row). One stage: the time loop must not be software-pipelined, since the
    next h row is written by other programs after the barrier."""
    return dict(BLOCK_B=max(MIN_DOT, int(candidate.batch_tile)),
                UNITS=max(MIN_DOT // GATES, int(candidate.hidden_tile)), BLOCK_K=_block_k(hidden),
                K_CHUNK=_k_chunk(hidden), PRECISION=candidate.precision, num_warps=_warps(candidate), num_stages=1)


def _block_k(hidden: int) -> int:
    """The on-chip kernel's reduction width: the hidden size padded to a power of two (at least MIN_DOT)."""
    return max(MIN_DOT, triton.next_power_of_2(hidden))


def _k_chunk(hidden: int) -> int:
    """Rows of the on-chip kernel's W_hh^T pieces (BLOCK_K in pieces of at most K_CHUNK_MAX rows)."""
    return min(K_CHUNK_MAX, _block_k(hidden))


def _bucket(value: int) -> int:
    return triton.next_power_of_2(max(1, int(value)))


# ---------------------------------------------------------------------------------------------
# packed weights
# ---------------------------------------------------------------------------------------------
def _pack_layer(tensors: Sequence[torch.Tensor], has_biases: bool, directions: int, unit_major: bool):
    """(W_ih_cat (D*4H, I), W_hh stack (D, 4H, H), bias (D*4H,) or None) in fp32.

    Gate rows are torch's (gate-major: gate*H + unit), or unit-major (unit*4 + gate) for the on-chip
    recurrence, whose programs own contiguous runs of units; its W_hh rows are zero-padded to the
    kernel's BLOCK_K (D, 4H, BLOCK_K)."""
    per = 4 if has_biases else 2   # w_ih, w_hh (, b_ih, b_hh) per direction
    w_ih, w_hh, bias = [], [], []
    for d in range(directions):
        chunk = [t.detach().float() for t in tensors[d * per:(d + 1) * per]]
        hidden = chunk[1].shape[1]
        b = chunk[2] + chunk[3] if has_biases else None
        if unit_major:
            chunk = [t.reshape(GATES, hidden, -1).transpose(0, 1).reshape(GATES * hidden, -1) for t in chunk[:2]]
            b = b.reshape(GATES, hidden).t().reshape(GATES * hidden) if b is not None else None
        w_ih.append(chunk[0])
        w_hh.append(chunk[1])
        bias.append(b)
    w_hh_stack = torch.stack(w_hh, 0)
    if unit_major:
        w_hh_stack = torch.nn.functional.pad(w_hh_stack, (0, _block_k(w_hh_stack.shape[-1]) - w_hh_stack.shape[-1]))
    return (torch.cat(w_ih, 0).contiguous(), w_hh_stack.contiguous(),
            torch.cat(bias, 0).contiguous() if has_biases else None)


def _layer_weights(flat_weights: Sequence[torch.Tensor], has_biases: bool, layer: int, directions: int,
                   unit_major: bool = False):
    """The packed weights of one layer, cached per weight version (device_cache.packed_weights: an inference
    loop packs once, an in-place update or load_state_dict repacks, inference tensors pack on every call)."""
    per = 4 if has_biases else 2
    tensors = list(flat_weights[layer * directions * per:(layer + 1) * directions * per])
    return packed_weights("lstm", tensors, lambda: _pack_layer(tensors, has_biases, directions, unit_major),
                          unit_major, has_biases, directions)


# ---------------------------------------------------------------------------------------------
# co-residency of the on-chip recurrence
# ---------------------------------------------------------------------------------------------
_RESOURCES: Dict[tuple, Tuple[int, int, int]] = {}
_SM_LIMITS: Dict[tuple, Any] = {}


def _compiled_resources(record: Launch, facts) -> Tuple[int, int, int]:
    """(registers, shared bytes, warps) of the record's kernel as compiled for the device: the JIT's own
    compile on a CUDA tensor, the ahead-of-time compile for the profile's arch on meta tensors."""
    device = next(a.device for a in record.args if isinstance(a, torch.Tensor))
    arch = facts.capability[0] * 10 + facts.capability[1]
    key = (record.config_key(), arch, device.type)
    if key in _RESOURCES:
        return _RESOURCES[key]
    if device.type == "cuda":
        with launches.on_device(device):   # compiled for, and its occupancy read on, the tensors' GPU
            compiled = record.jit.warmup(*record.args, grid=record.grid, **record.meta, num_warps=record.num_warps,
                                         num_stages=record.num_stages, **record.launch_options())
            if hasattr(compiled, "_init_handles"):
                compiled._init_handles()
        resources = (int(compiled.n_regs), int(compiled.metadata.shared), int(compiled.metadata.num_warps))
    else:
        from rlx_triton.perf.compiled import CompileJob, compile_all, default_cache_dir

        job = CompileJob.of(record, arch)
        compiled = compile_all([job], cache_dir=default_cache_dir(), workers=1)[job]
        if not compiled.ok:
            raise RuntimeError(f"{record.name} does not compile for sm_{arch}: {compiled.error}")
        resources = (compiled.registers, compiled.shared, compiled.num_warps)
    _RESOURCES[key] = resources
    return resources


def _sm_limits(facts, device: torch.device):
    """The per-SM limits of the device: its own properties on CUDA, else the profile of its name (or of
    its compute capability), with the SM count the facts report."""
    key = (facts.fingerprint, device.type)
    if key in _SM_LIMITS:
        return _SM_LIMITS[key]
    base = devices.profile_for_name(facts.name) or next(
        (p for p in devices.cuda_profiles() if p.capability == tuple(facts.capability)), devices.profile("h100"))
    limits = dataclasses.replace(base, sm_count=int(facts.sm_count or base.sm_count))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        limits = dataclasses.replace(
            limits, sm_count=props.multi_processor_count,
            registers_per_sm=getattr(props, "regs_per_multiprocessor", limits.registers_per_sm),
            shared_per_sm=getattr(props, "shared_memory_per_multiprocessor", limits.shared_per_sm),
            shared_per_cta=getattr(props, "shared_memory_per_block_optin", limits.shared_per_cta),
            max_warps_per_sm=getattr(props, "max_threads_per_multi_processor", 32 * limits.max_warps_per_sm) // 32)
    _SM_LIMITS[key] = limits
    return limits


def co_residency_refusal(record: Launch, facts) -> Optional[Refusal]:
    """None when every program of the on-chip recurrence launch `record` can be resident at once on the
    device `facts` describe (so no program waits at a barrier for one that cannot start), else the typed
    refusal: the programs, the CTAs per SM the compiled kernel allows and the SMs."""
    from rlx_triton.perf.roofline import occupancy

    if facts.kind != "cuda":
        return Refusal(DEVICE_UNSUPPORTED, f"the synchronised on-chip recurrence runs on CUDA devices, not "
                                           f"{facts.kind!r}")
    device = next(a.device for a in record.args if isinstance(a, torch.Tensor))
    try:
        registers, shared, warps = _compiled_resources(record, facts)
    except Exception as error:  # a configuration that does not compile here cannot be resident either
        return Refusal(DEVICE_UNSUPPORTED, f"{record.name} did not compile: {type(error).__name__}: {error}")
    limits = _sm_limits(facts, device)
    occ = occupancy(limits, registers, shared, warps)
    capacity = limits.sm_count * occ.ctas_per_sm
    if record.ctas > capacity:
        return Refusal(DEVICE_UNSUPPORTED,
                       f"{record.ctas} programs of {record.name} must be resident at once, but {limits.name} "
                       f"holds {capacity} ({occ.ctas_per_sm} per SM, limited by {occ.limiter}: {registers} "
                       f"registers, {shared} B shared memory, {warps} warps; {limits.sm_count} SMs)")
    return None


# cooperative launches the driver refused, per (device, compiled binary, grid): the reason
_REFUSED_LAUNCHES: Dict[tuple, str] = {}
# (candidate, device) pairs whose fallback was announced: one warning each per process
_WARNED: set = set()


def _launch_key(record: Launch, facts) -> tuple:
    return (facts.fingerprint, record.config_key(), record.grid)


def remember_refused_launch(record: Launch, facts, reason: str) -> None:
    _REFUSED_LAUNCHES[_launch_key(record, facts)] = reason


def synchronised_refusal(record: Launch, facts) -> Optional[Refusal]:
    """Why the synchronised on-chip launch `record` cannot run on the device `facts` describe, or None: the
    driver refused the same launch before, or `co_residency_refusal`."""
    refused = _REFUSED_LAUNCHES.get(_launch_key(record, facts))
    if refused is not None:
        return Refusal(DEVICE_UNSUPPORTED, refused)
    return co_residency_refusal(record, facts)


def warn_fallback(candidate, facts, reason: str) -> None:
    """One RuntimeWarning per (candidate, device) and process: the on-chip recurrence runs as its persistent
    fallback, and why."""
    key = (candidate.tag(), facts.fingerprint)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"rlx_triton lstm: the on-chip recurrence {candidate.tag()} cannot run synchronised on "
                  f"{facts.name}: {reason}; it runs as {fallback_candidate(candidate).tag()} (one program per "
                  f"direction and batch tile, slower)", RuntimeWarning, stacklevel=4)


def fallback_candidate(candidate):
    """The candidate a refused on-chip recurrence runs as: the persistent candidate of the same precision
    (one program per direction and batch tile, no barrier between programs, always resident)."""
    for variant in LstmVariant:
        other = variant.candidate()
        if other.mode == "persistent" and other.precision == candidate.precision:
            return other
    return LstmVariant.PERSISTENT_IEEE.candidate()


# ---------------------------------------------------------------------------------------------
# the autotune bridge: projection and on-chip recurrence, keyed on buckets
# ---------------------------------------------------------------------------------------------
_PROJ_TUNE_KEY = ["batch_bucket", "seq_bucket", "N", "K"]
_REC_TUNE_KEY = ["batch_bucket", "seq_bucket", "H"]
_tuned: Dict[str, Any] = {}


def _config(meta: dict) -> triton.Config:
    meta = dict(meta)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _onchip_config(candidate) -> triton.Config:
    meta = _onchip_meta(candidate, 16)
    meta.pop("BLOCK_K")   # the hidden size's, not the candidate's: passed with the launch
    meta.pop("K_CHUNK")
    return _config(meta)


def _resident_configs(configs, named_args, **kwargs):
    """The autotuner's prune: only configurations whose programs can all be resident are benchmarked (the
    routed candidate's is, the launcher checked it), so a benchmark never waits at a barrier forever."""
    facts = device_facts(named_args["g_ptr"].device)
    if facts.kind != "cuda" or not kwargs.get("SYNC"):
        return configs
    grid_for = _onchip_grid(named_args["H"], named_args["B"], named_args["whh_ptr"].shape[0])
    args = tuple(named_args[name] for name in _lstm_onchip_kernel.arg_names if name in named_args)
    parameters = set(_lstm_onchip_kernel.arg_names)
    kept = []
    for config in configs:
        meta = {key: value for key, value in {**kwargs, **config.kwargs}.items() if key in parameters}
        record = Launch(_lstm_onchip_kernel, grid_for(meta), args, meta=meta, num_warps=config.num_warps,
                        num_stages=config.num_stages, cooperative=bool(kwargs.get("launch_cooperative_grid")))
        if co_residency_refusal(record, facts) is None:
            kept.append(config)
    return kept


def tuned_kernels() -> Dict[str, Any]:
    """{"projection", "recurrence"}: the two kernels under the autotune bridge, with a config per approved
    on-chip candidate (a cold bucket is benchmarked only where the bridge allows tuning; the routed
    candidate is injected otherwise). Benchmarks of the recurrence start from zeroed counters and the
    saved cell state, and only co-resident configurations are benchmarked."""
    if not _tuned:
        from rlx_triton.backends.triton.autotune import TunedKernel

        onchip = [c for c in plan_candidates("lstm") if c.mode == "onchip" and c.tag() in APPROVALS]
        _tuned["projection"] = TunedKernel(_lstm_input_proj_kernel, onchip, lambda c: _config(_proj_meta(c)),
                                           key=_PROJ_TUNE_KEY)
        _tuned["recurrence"] = TunedKernel(_lstm_onchip_kernel, onchip, _onchip_config, key=_REC_TUNE_KEY,
                                           reset_to_zero=["counter_ptr"], restore_value=["c_ptr"],
                                           prune_configs_by={"early_config_prune": _resident_configs})
    return _tuned


# ---------------------------------------------------------------------------------------------
# launch plan and launcher
# ---------------------------------------------------------------------------------------------
_PROJ_UNITS = {"ieee": "fp32_fma", "tf32x3": "tf32x3", "tf32": "tf32"}


def _as_batched(input, hx, batch_first: bool):
    """(x, hx, unbatched): an unbatched (T, I) input and its (layers*D, H) state gain a batch of one."""
    unbatched = input.dim() == 2
    x = input.unsqueeze(1 if not batch_first else 0) if unbatched else input
    if hx is not None and unbatched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    return x, hx, unbatched


def _batch_tiles(batch: int, block_b: int) -> int:
    return triton.cdiv(batch, block_b)


def _onchip_grid(hidden: int, batch: int, directions: int):
    return lambda meta: (directions, triton.cdiv(hidden, meta["UNITS"]), _batch_tiles(batch, meta["BLOCK_B"]))


def _projection_launch(layer_in, w_ih_cat, bias, gates, candidate, *, batch: int, seq: int, tuned) -> Launch:
    """G = X @ W_ih_cat^T + bias for every timestep and direction of one layer."""
    rows, in_features = gates.shape[0], layer_in.shape[-1]
    n_cols = w_ih_cat.shape[0]
    args = (layer_in, w_ih_cat, bias if bias is not None else w_ih_cat, gates, rows, n_cols, in_features,
            in_features, w_ih_cat.stride(0), gates.stride(0), _bucket(batch), _bucket(seq))
    counts = dict(bytes_read=(rows * in_features + n_cols * in_features + (n_cols if bias is not None else 0)) * 4,
                  bytes_written=rows * n_cols * 4, flops=2 * rows * n_cols * in_features,
                  unit=_PROJ_UNITS[candidate.precision])
    flags = dict(HAS_BIAS=bias is not None)
    grid_for = lambda meta: (triton.cdiv(rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))  # noqa: E731
    if tuned is not None:
        return Launch.tuned(tuned[0]["projection"], candidate, grid_for, args, flags, route=tuned[1], **counts)
    meta = _proj_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return Launch(_lstm_input_proj_kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=num_warps,
                  num_stages=num_stages, **counts)


def _recurrence_launches(gates, w_hh_stack, h0, c_state, y, hn, *, T, B, hidden, directions, batch_first,
                         candidate) -> List[Launch]:
    """The recurrence of one layer on `_lstm_recurrence_kernel`: one launch over [0, T) (persistent), or one
    per timestep (stepwise).

    Bytes are what each launch needs from memory once: W_hh (every stepwise launch reads all of it again),
    the input gates, the previous h and the cell state of its steps, and the h rows it writes."""
    meta = _rec_meta(candidate)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    strides = _gate_strides(y, T, B, GATES * hidden * directions, batch_first)
    grid = (directions, triton.cdiv(B, meta["BLOCK_B"]))
    state = directions * B * hidden * 4

    def launch(step_begin: int, step_end: int) -> Launch:
        steps = step_end - step_begin
        read = w_hh_stack.numel() * 4 + steps * (B * GATES * hidden * directions * 4 + state) + 2 * state
        written = steps * state + 2 * state
        return Launch(_lstm_recurrence_kernel, grid,
                      (gates, w_hh_stack, h0, c_state, y, hn, T, B, hidden, step_begin, step_end, *strides),
                      meta=meta, num_warps=num_warps, num_stages=num_stages, bytes_read=read, bytes_written=written,
                      flops=steps * (2 * B * directions * GATES * hidden * hidden), unit="fp32_fma")

    if candidate.mode == "stepwise":
        return [launch(s, s + 1) for s in range(T)]
    return [launch(0, T)]


def _gate_strides(y, T: int, B: int, n_cols: int, batch_first: bool) -> tuple:
    """(stride_gt, stride_gb, stride_yt, stride_yb): G rows are b*T + t batch-first, else t*B + b."""
    if batch_first:
        return n_cols, T * n_cols, y.stride(1), y.stride(0)
    return B * n_cols, n_cols, y.stride(0), y.stride(1)


def _onchip_launches(gates, w_hh_stack, h0, c_state, y, hn, counters, *, T, B, hidden, directions, batch_first,
                     candidate, synchronised: bool, tuned) -> List[Launch]:
    """The recurrence of one layer on `_lstm_onchip_kernel`: one synchronised launch over [0, T), or (the
    mode the interpreter checks, where programs run one after another) one launch per timestep with the
    launch boundary as the barrier: the same arithmetic, W_hh reloaded and the cell state saved per launch.

    Bytes: W_hh once per launch, the input gates, h0 and the cell state, the h rows the steps write (the
    h rows read back from L2 by the other programs of a group are not memory traffic)."""
    strides = _gate_strides(y, T, B, GATES * hidden * directions, batch_first)
    state = directions * B * hidden * 4
    grid_for = _onchip_grid(hidden, B, directions)
    flags = dict(BLOCK_K=_block_k(hidden), K_CHUNK=_k_chunk(hidden), SYNC=synchronised)
    # programs that wait for each other at the barrier: a cooperative launch, which the driver makes resident
    # all at once or refuses (a group of one program waits for no other)
    cooperative = synchronised and _onchip_parts(hidden, candidate) > 1

    def launch(step_begin: int, step_end: int) -> Launch:
        steps = step_end - step_begin
        args = (gates, w_hh_stack, h0, c_state, y, hn, counters, T, B, hidden, step_begin, step_end, *strides,
                _bucket(B), _bucket(T))
        counts = dict(bytes_read=w_hh_stack.numel() * 4 + steps * B * GATES * hidden * directions * 4 + 2 * state,
                      bytes_written=steps * state + 2 * state,
                      flops=steps * (2 * B * directions * GATES * hidden * hidden),
                      unit=_PROJ_UNITS[candidate.precision])
        if tuned is not None:
            return Launch.tuned(tuned[0]["recurrence"], candidate, grid_for, args, flags, route=tuned[1],
                                cooperative=cooperative, **counts)
        meta = _onchip_meta(candidate, hidden)
        num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
        return Launch(_lstm_onchip_kernel, grid_for(meta), args, meta={**meta, "SYNC": synchronised},
                      num_warps=num_warps, num_stages=num_stages, cooperative=cooperative, **counts)

    if synchronised:
        return [launch(0, T)]
    return [launch(s, s + 1) for s in range(T)]


def _onchip_parts(hidden: int, candidate) -> int:
    """Programs per (direction, batch tile) group: the hidden units split UNITS at a time."""
    return triton.cdiv(hidden, _onchip_meta(candidate, hidden)["UNITS"])


def recurrence_mode(candidate, *, hidden: int, facts, step_launches: Optional[bool] = None) -> str:
    """How an on-chip candidate runs its recurrence on the device `facts` describe: "synchronised" (one
    launch per layer, the programs of a group meet at a barrier each step) on CUDA, or where a group is a
    single program; "step_launches" (one launch per step) where programs do not run concurrently (the
    interpreter), or when asked for (step_launches=True)."""
    if step_launches is None:
        step_launches = facts.kind != "cuda" and _onchip_parts(hidden, candidate) > 1
    return "step_launches" if step_launches else "synchronised"


def lstm_plan(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]],
              flat_weights: List[torch.Tensor], *, has_biases: bool, num_layers: int, dropout: float, training: bool,
              bidirectional: bool, batch_first: bool, proj_size: int = 0, candidate, route=None,
              step_launches: Optional[bool] = None, on_fallback: Optional[Callable[[str], None]] = None):
    """The launches of `lstm` as records, and the fp32 buffers they fill: (records, (y, h_n, c_n)).

    Per layer: the input projection, then the recurrence. An on-chip candidate runs synchronised on CUDA
    (a cooperative launch) when every program of the launch can be resident at once and the driver has not
    refused that launch before (`synchronised_refusal`); otherwise it runs as `fallback_candidate(candidate)`
    and `on_fallback` is called with the reason. With a route (the op's
    call) the on-chip kernels launch through the autotune bridge. Buffers are allocated on the input's
    device, so meta inputs give the plan at any shape (as on the device profile the router reads)."""
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

    onchip = candidate.mode == "onchip"
    synchronised = False
    counters = None
    if onchip:
        facts = device_facts(device)
        synchronised = recurrence_mode(candidate, hidden=hidden, facts=facts,
                                       step_launches=step_launches) == "synchronised"
        # one arrival counter per (layer, direction, batch tile of the smallest BLOCK_B)
        counters = torch.zeros(num_layers, directions * _batch_tiles(B, MIN_DOT), device=device, dtype=torch.int32)
    tuned = None
    if onchip and route is not None and route.candidate is not None and route.candidate.tag() == candidate.tag():
        kernels = tuned_kernels()
        if candidate.tag() in kernels["recurrence"].tags:
            tuned = (kernels, route)

    records: List[Launch] = []
    layer_in = x.to(torch.float32).contiguous()
    for layer in range(num_layers):
        w_ih_cat, w_hh_stack, bias = _layer_weights(flat_weights, has_biases, layer, directions, unit_major=onchip)
        gates = torch.empty(B * T, w_ih_cat.shape[0], device=device, dtype=torch.float32)
        projection = _projection_launch(layer_in, w_ih_cat, bias, gates, candidate, batch=B, seq=T, tuned=tuned)
        y = torch.empty(*layer_in.shape[:2], directions * hidden, device=device, dtype=torch.float32)
        sl = slice(layer * directions, (layer + 1) * directions)
        shape = dict(T=T, B=B, hidden=hidden, directions=directions, batch_first=batch_first)
        if onchip:
            recurrence = _onchip_launches(gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl], counters[layer],
                                          candidate=candidate, synchronised=synchronised, tuned=tuned, **shape)
            if synchronised and layer == 0 and facts.kind == "cuda":
                refusal = synchronised_refusal(recurrence[0], facts)
                if refusal is not None:
                    if on_fallback is not None:
                        on_fallback(refusal.reason)
                    fallback = fallback_candidate(candidate)
                    records, outputs = lstm_plan(
                        input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers, dropout=dropout,
                        training=training, bidirectional=bidirectional, batch_first=batch_first,
                        proj_size=proj_size, candidate=fallback)
                    return records, outputs
        else:
            recurrence = _recurrence_launches(gates, w_hh_stack, h0_all[sl], c_n[sl], y, h_n[sl],
                                              candidate=candidate, **shape)
        records.append(projection)
        records += recurrence
        layer_in = y
    return records, (layer_in, h_n, c_n)


def lstm(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, proj_size: int = 0, candidate, route=None,
         step_launches: Optional[bool] = None) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """nn.LSTM's forward (torch.lstm's arguments) on Triton kernels; returns (output, (h_n, c_n)).

    input: (T, B, I), or (B, T, I) when batch_first, or unbatched (T, I). hx: (h0, c0), each
    (layers*D, B, H) (or (layers*D, H) unbatched), or None for zeros. dropout/training are accepted
    for signature parity; covered requests have no active dropout and proj_size == 0. route: the
    router's route of the call (the on-chip kernels then go through the autotune bridge);
    step_launches: run an on-chip candidate one launch per step (see `recurrence_mode`).
    """
    def planned():
        return lstm_plan(input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers, dropout=dropout,
                         training=training, bidirectional=bidirectional, batch_first=batch_first,
                         proj_size=proj_size, candidate=candidate, route=route, step_launches=step_launches,
                         on_fallback=lambda reason: warn_fallback(candidate, device_facts(input.device), reason))

    plan, (output, h_n, c_n) = planned()
    try:
        launches.run(plan)
    except RuntimeError as error:
        refused = next((record for record in plan if record.cooperative), None)
        if refused is None:
            raise
        # the driver refused the cooperative launch (other work, MPS or a green context holds SMs): remembered,
        # so this call and the later ones plan the persistent fallback
        remember_refused_launch(refused, device_facts(input.device), f"the driver refused the cooperative "
                                f"launch of {refused.ctas} programs: {error}")
        plan, (output, h_n, c_n) = planned()
        launches.run(plan)
    out_dtype = input.dtype
    output, h_n, c_n = output.to(out_dtype), h_n.to(out_dtype), c_n.to(out_dtype)
    if input.dim() == 2:
        output = output.squeeze(1 if not batch_first else 0)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)


def launch_count(request, candidate) -> int:
    """Launches of one routed call: per layer the projection, then the recurrence: 1 launch (persistent; on-chip
    synchronised, or its persistent fallback), or one per timestep (stepwise; on-chip where programs do not
    run concurrently and a group has several programs)."""
    fields = request.field_map
    steps = candidate.mode == "stepwise" or (
        candidate.mode == "onchip"
        and recurrence_mode(candidate, hidden=fields["hidden"], facts=device_facts(request.device)) == "step_launches")
    return fields["layers"] * (1 + (fields["seq"] if steps else 1))


def explain_execution(request, candidate) -> Optional[str]:
    """How a routed call's recurrence runs on the request's device, and why (rt.explain's `runs` line): the
    on-chip recurrence in one cooperative launch per layer, one launch per step, or the persistent fallback
    with the refusal that sent it there (the check the launcher makes, on a plan built from the request's
    shape)."""
    if candidate.mode != "onchip":
        return f"{candidate.mode} recurrence"
    fields, features = request.field_map, request.feature_map
    facts = device_facts(request.device)
    hidden, batch, seq, directions = fields["hidden"], fields["batch"], fields["seq"], fields["directions"]
    if recurrence_mode(candidate, hidden=hidden, facts=facts) == "step_launches":
        return "on-chip recurrence, one launch per step (programs here run one after another, not at once)"
    if facts.kind != "cuda" or _onchip_parts(hidden, candidate) == 1:
        return "on-chip recurrence, one launch per layer (one program per group: no barrier between programs)"
    meta = dict(device="meta", dtype=torch.float32)
    state = torch.empty(directions, batch, hidden, **meta)
    y_shape = (batch, seq, directions * hidden) if features["batch_first"] else (seq, batch, directions * hidden)
    record = _onchip_launches(torch.empty(batch * seq, directions * GATES * hidden, **meta),
                              torch.empty(directions, GATES * hidden, _block_k(hidden), **meta), state, state,
                              torch.empty(y_shape, **meta), state,
                              torch.empty(directions * _batch_tiles(batch, MIN_DOT), device="meta", dtype=torch.int32),
                              T=seq, B=batch, hidden=hidden, directions=directions,
                              batch_first=features["batch_first"], candidate=candidate, synchronised=True,
                              tuned=None)[0]
    refusal = synchronised_refusal(record, facts)
    if refusal is not None:
        return f"persistent fallback {fallback_candidate(candidate).tag()}: {refusal.reason}"
    return (f"on-chip recurrence, one cooperative launch per layer ({record.ctas} programs, all resident at "
            f"once on {facts.name})")


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

_WHERE = ("interpreter, tests/triton/test_lstm.py (1-2 layers, bi, hidden 7..33, vs float64; the recurrent "
          "tf32x3 product over 589 steps)")

# tf32 stays unapproved: no accuracy evidence is kept for it, and TF32 products have been measured to move
# diarization error rates (the diarization kernels default to true fp32)
APPROVALS = approvals_by_precision("lstm", {"ieee": 1e-5, "tf32x3": 2e-5}, _WHERE)
# the on-chip recurrence where it is co-resident (the launcher falls back to the persistent candidate
# where it is not); no device run has measured the candidates against each other yet
RECIPES = {"sm80": LstmVariant.ONCHIP_IEEE.candidate().tag(), "sm90": LstmVariant.ONCHIP_IEEE.candidate().tag()}
SPEED_EVIDENCE = {}

AUDIT_HIDDEN = 128   # pyannote's hidden size: the on-chip kernel's BLOCK_K follows the hidden size
_REC_SIGNATURE = {"g_ptr": "*fp32", "whh_ptr": "*fp32", "h0_ptr": "*fp32", "c_ptr": "*fp32", "y_ptr": "*fp32",
                  "hn_ptr": "*fp32", "T": "i32", "B": "i32", "H": "i32", "step_begin": "i32", "step_end": "i32",
                  "stride_gt": "i32", "stride_gb": "i32", "stride_yt": "i32", "stride_yb": "i32"}


def _in_order(kernel, signature: dict) -> dict:
    return {name: signature[name] for name in kernel.arg_names}


def _audit_onchip_meta(candidate, dt: str) -> dict:
    return dict(SYNC=True, **_onchip_meta(candidate, AUDIT_HIDDEN))


def _audit_kernels() -> list:
    cands = tuple(plan_candidates("lstm"))
    onchip = tuple(c for c in cands if c.mode == "onchip")
    streaming = tuple(c for c in cands if c.mode != "onchip")
    constexpr = "constexpr"
    return [
        AuditSpec(
            name="lstm_input_proj", family="lstm", kernel=_lstm_input_proj_kernel,
            signature={"x_ptr": "*{dt}", "w_ptr": "*fp32", "bias_ptr": "*fp32", "g_ptr": "*fp32",
                       "M": "i32", "N": "i32", "K": "i32",
                       "stride_xm": "i32", "stride_wn": "i32", "stride_gm": "i32",
                       "batch_bucket": "i32", "seq_bucket": "i32",
                       "HAS_BIAS": constexpr, "PRECISION": constexpr,
                       "BLOCK_M": constexpr, "BLOCK_N": constexpr, "BLOCK_K": constexpr},
            meta=lambda cand, dt: dict(HAS_BIAS=True, **_proj_meta(cand)),
            candidates=cands, default=DEFAULT_VARIANT.candidate(), dtypes=("fp32",),
            expects_mma=lambda cand, dt: cand.precision != "ieee"),
        AuditSpec(
            name="lstm_recurrence", family="lstm", kernel=_lstm_recurrence_kernel,
            signature={**_REC_SIGNATURE, "BLOCK_B": constexpr, "BLOCK_H": constexpr, "BLOCK_K": constexpr},
            meta=lambda cand, dt: _rec_meta(cand),
            candidates=streaming, default=LstmVariant.PERSISTENT_IEEE.candidate(), dtypes=("fp32",),
            expects_mma=False),
        AuditSpec(
            name="lstm_onchip_recurrence", family="lstm", kernel=_lstm_onchip_kernel,
            signature=_in_order(_lstm_onchip_kernel, {
                **_REC_SIGNATURE, "counter_ptr": "*i32", "batch_bucket": "i32", "seq_bucket": "i32",
                "BLOCK_B": constexpr, "UNITS": constexpr, "BLOCK_K": constexpr, "K_CHUNK": constexpr,
                "PRECISION": constexpr, "SYNC": constexpr}),
            meta=_audit_onchip_meta, candidates=onchip, default=LstmVariant.ONCHIP_IEEE.candidate(),
            dtypes=("fp32",), expects_mma=lambda cand, dt: cand.precision != "ieee"),
    ]


AUDIT_KERNELS = _audit_kernels()
