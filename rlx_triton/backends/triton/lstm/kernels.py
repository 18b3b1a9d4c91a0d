"""The LSTM kernels (@triton.jit code only): the input projection and the two recurrences of a layer.

1. `_lstm_input_proj_kernel`: the input projection of every timestep and both directions as one
   GEMM, G[rows, D*4H] = X[rows, I] @ W_ih_cat^T + (b_ih + b_hh), with `tl.dot` at the candidate's
   precision ("ieee" or "tf32x3" are approved; "tf32" has no accuracy evidence and is not).
2. The recurrence, by the candidate's mode:
   - "onchip" (`_lstm_onchip_kernel`, the default): the hidden units of each direction are split
     across programs, UNITS per program; a program loads its 4*UNITS rows of W_hh once and holds
     them on chip (the compiler keeps the loop-invariant dot operand in shared memory) for every
     step, with its units' cell state in registers. The programs of one (direction, batch tile)
     hand each other h_t through an exchange in global memory (read from L2) whose words carry the
     step that wrote them (`_tagged_bits`, `_read_exchange`): each thread waits for exactly the h
     values it reads (`_wait_for_tag`, its own poll), with no counter, fence or barrier between
     programs or inside one, so a layer is one launch: W_hh read once per layer, every SM of a group
     busy. A program that waits for one that is not resident deadlocks, so the launcher checks that
     every program of the launch fits on the device at once (launch.py `co_residency_refusal`) and
     launches it as a cooperative grid; where programs do not run concurrently (the CPU interpreter
     runs them one after another) a group of several programs runs one launch per step instead, the
     launch boundary as its wait (SYNC off): the same arithmetic and the same exchange, which the
     interpreter checks. A step's cell update runs in the unit's gate columns, which trade values in
     two exchanges inside a warp (`_unit_cell`), so a step passes through shared memory once (h_{t-1}
     into the product) and meets two CTA barriers; a tensor-core product whose warps split K
     (`_recurrent_product`) passes its slices through shared memory too, behind two more.
   - "persistent" (`_lstm_recurrence_kernel` over [0, T)): one program per (direction, batch tile)
     streams W_hh tiles (BLOCK_K x BLOCK_H per gate) from L2 every step;
   - "stepwise": the same kernel launched once per timestep with [s, s+1).
   The persistent and stepwise kernels re-read h_{t-1} from the output row written the step before
   (y[t-1]) and keep c in the c_n buffer; the on-chip kernel reads h_{t-1} from the exchange and keeps c
   in registers.

Gate order is torch's (i, f, g, o) in the weights; the on-chip recurrence packs the gate rows
unit-major (unit*4 + gate) so a program's units are one contiguous run. The recurrent product is
fp32 ("ieee") or three TF32 tensor-core products of the operands' tf32 parts ("tf32x3"; in an on-chip
program of 16 gate columns, fp32 FMAs up to FMA_PRODUCT_MAX_K: `_product_precision`); gates and state stay
fp32. The gates' sigmoid divides with div.approx (2 ulp). The synchronised on-chip recurrence waits and
publishes with inline PTX (`_wait_for_tag`, `_publish` with STRONG_STORE), which only a GPU runs: the
interpreter runs the kernel with SYNC off.
"""
from __future__ import annotations

import triton
import triton.language as tl

from rlx_triton.backends.triton._tf32 import dot_split3_clamped, dot_split3_parts, split3_sum, tf32_split

GATES = 4   # i, f, g, o: torch's gate order in the weights' rows
MIN_DOT = 16   # tl.dot's smallest tile side: every BLOCK_* that meets a dot is at least this
_MIN_DOT = tl.constexpr(MIN_DOT)

# the gate facts for the kernels, which read only constexpr globals
_GATES = tl.constexpr(GATES)
GATE_I, GATE_F, GATE_G, GATE_O = (tl.constexpr(gate) for gate in range(GATES))


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
    """G[M, N] = X[M, K] @ W[N, K]^T (+ bias[N]); fp32 accumulation ("tf32x3": `dot_split3_clamped`, one
    accumulator, so an infinite input's gates are infinite as in fp32)."""
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
        if PRECISION == "tf32x3":
            x_hi, x_lo = tf32_split(x_tile)
            w_hi, w_lo = tf32_split(w_tile)
            acc = dot_split3_clamped(x_hi, x_lo, w_hi, w_lo, acc)
        else:
            acc = tl.dot(x_tile, w_tile, acc, input_precision=PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=col_mask, other=0.0).to(tl.float32)
        acc += bias[None, :]
    tl.store(g_ptr + rows64[:, None] * stride_gm + offs_n[None, :], acc,
             mask=row_mask[:, None] & col_mask[None, :])


# exp(-x) is computed as exp2(x * -log2(e)), the product the exponential's lowering would form, with any scaling
# of x folded into the constant
LOG2_E = tl.constexpr(1.4426950408889634)


@triton.jit
def _scaled_sigmoid(x, scale):
    """sigmoid(scale * x), with exp(-scale x) as exp2 of x times -scale log2(e) (a constant `scale` folds into it).
    div.approx (2 ulp for denominators up to 2^126; past it the quotient, below 2^-126, reads as 0): an IEEE
    division would add a range check and a Newton step to every gate of every step."""
    return tl.fdiv(1.0, 1.0 + tl.exp2(x * (scale * -LOG2_E)), approx=True)


@triton.jit
def _sigmoid(x):
    return _scaled_sigmoid(x, 1.0)


@triton.jit
def _tanh(x):
    # no tanh outside libdevice: tanh(x) = 2 * sigmoid(2x) - 1
    return 2.0 * _scaled_sigmoid(x, 2.0) - 1.0


@triton.jit
def _gate_activation(pre, scale):
    """sigmoid of the pre-activations whose `scale` is 1 (gates i, f, o), tanh = 2 sigmoid(2x) - 1 of those whose
    scale is 2 (gate g): one exp2 and one division each"""
    return scale * _scaled_sigmoid(pre, scale) - (scale - 1.0)


@triton.jit
def _pair_sum(x, AXIS: tl.constexpr, BLOCK_B: tl.constexpr, UNITS: tl.constexpr):
    """x plus x of the partner column, in both: a unit's columns (i, f, g, o) pair as (i, g) and (f, o) on AXIS 2,
    as (i, f) and (g, o) on AXIS 3"""
    pairs = tl.sum(tl.reshape(x, (BLOCK_B, UNITS, 2, 2)), AXIS)
    return tl.reshape(tl.broadcast_to(tl.expand_dims(pairs, AXIS), (BLOCK_B, UNITS, 2, 2)), (BLOCK_B, UNITS * _GATES))


@triton.jit
def _unit_cell(act, c, gate, BLOCK_B: tl.constexpr, UNITS: tl.constexpr):
    """(c_t, h_t) of nn.LSTM's cell from the gate activations `act` of each unit's four columns (i, f, g, o) and
    c_{t-1}, exact in the unit's o column (c_t = g i + f c_{t-1}, h_t = o tanh(c_t)) and, for c_t, in its g column;
    the i and f columns hold values no step reads. Two exchanges between a unit's columns (adding 0 to a value
    is exact)."""
    # the g column gets i, the o column f
    partner = _pair_sum(tl.where((gate == GATE_I) | (gate == GATE_F), act, 0.0), 2, BLOCK_B, UNITS)
    # g i in the g column plus f c_{t-1} in the o column, in both
    c = _pair_sum(tl.where(gate == GATE_G, act * partner, partner * c), 3, BLOCK_B, UNITS)
    return c, act * _tanh(c)


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


# the on-chip recurrence's exchange (see `_lstm_onchip_kernel`): its rows are padded to a multiple of
# EXCHANGE_ROWS (every batch tile's rows exist, so a program reads them unmasked), and its columns past the
# hidden size carry PAD_TAG, a tag no step waits past (no program writes them; they hold 0.0)
EXCHANGE_ROWS = 64
PAD_TAG = 0x7FFFFFFF
_EXCHANGE_ROWS = tl.constexpr(EXCHANGE_ROWS)


@triton.jit
def _tagged_bits(h, tag_high):
    """An exchange word: h's fp32 bits in the low half of an int64 and the tag in the high half (`tag_high`, the
    tag shifted up by 32): one aligned 64-bit store is seen whole or not at all, so a reader that sees the tag
    sees the value it was written with."""
    return h.to(tl.uint32, bitcast=True).to(tl.int64) | tag_high


@triton.jit
def _publish(ptrs, words, mask, STRONG_STORE: tl.constexpr = False):
    """Store exchange words as strong (relaxed, GPU-scope) writes: with the readers' volatile (relaxed,
    system-scope) loads, every access to a word is strong, so the memory model guarantees a reader sees a word
    whole and, eventually, the newest one (a plain store racing with the poll would have no such guarantee).
    STRONG_STORE writes with a predicated st.relaxed.gpu (compiled kernels only); otherwise with relaxed atomic
    exchanges, which the interpreter runs too."""
    if STRONG_STORE:
        tl.inline_asm_elementwise(
            "{\n.reg .pred publish;\nsetp.ne.s32 publish, $3, 0;\n@publish st.relaxed.gpu.global.b64 [$1], $2;\n"
            "mov.b32 $0, 0;\n}",
            "=r,l,l,r", [ptrs, words, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_xchg(ptrs, words, mask=mask, sem="relaxed", scope="gpu")


@triton.jit
def _word_value(word):
    return word.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _word_tag(word):
    return (word >> 32).to(tl.int32)


def _repoll_asm(words: int) -> str:
    """PTX for one thread's `words` exchange words, read once already: while any carries a tag older than the wanted
    one, every one is read again (one volatile load each, all issued before any is checked); then their values (the
    low halves). Operands: $0.. the values, then the words' pointers, the wanted tag, the words as read (one per
    word each)."""
    names = ", ".join(f"word{i}" for i in range(words))
    tags = ", ".join(f"tag{i}" for i in range(words))
    first = "".join(f"mov.b64 word{i}, ${3 * words + i};\n" for i in range(words))
    halves = "".join(f"mov.b64 {{${i}, tag{i}}}, word{i};\n" for i in range(words))
    oldest = "".join(f"min.s32 tag0, tag0, tag{i};\n" for i in range(1, words))
    loads = "".join(f"ld.volatile.global.b64 word{i}, [${words + i}];\n" for i in range(words))
    return ("{\n.reg .pred waiting;\n.reg .b64 " + names + ";\n.reg .b32 " + tags + ";\n" + first + "check:\n"
            + halves + oldest + f"setp.lt.s32 waiting, tag0, ${2 * words};\n@!waiting bra done;\n" + loads
            + "bra check;\ndone:\n}")


# words a thread polls at once -> the PTX and its operand constraints; a thread with more words polls 8 at a time
_REPOLL_ASM = tl.constexpr({words: _repoll_asm(words) for words in (1, 2, 4, 8)})
_REPOLL_CONSTRAINTS = tl.constexpr({words: ",".join(["=r"] * words + ["l"] * words + ["r"] * words + ["l"] * words)
                                    for words in (1, 2, 4, 8)})


@triton.jit
def _wait_for_tag(ptrs, words, tag, WORDS: tl.constexpr):
    """The fp32 values of the exchange words at `ptrs` (`words`, as read once; WORDS of them a thread) once every
    one carries `tag` or a later one: each thread polls its own words again, up to 8 at a time (one round trip for
    all of them per poll), with no barrier or reduction across the program."""
    PACK: tl.constexpr = min(WORDS, 8)
    bits = tl.inline_asm_elementwise(_REPOLL_ASM[PACK], _REPOLL_CONSTRAINTS[PACK],
                                     [ptrs, tl.full(ptrs.shape, tag, tl.int32), words], dtype=tl.int32,
                                     is_pure=False, pack=PACK)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _read_exchange(ptrs, tag, WAIT: tl.constexpr):
    """The fp32 values of the exchange words at `ptrs` once every one carries `tag`. Every word is requested at once
    (one L2 round trip; volatile, so every read reaches L2). With WAIT, each thread then polls its own words until
    they carry it (`_wait_for_tag`; a slot's words carry the step that wrote them, never a later one than a reader
    waits for); without it a word older than `tag` reads as NaN."""
    words = tl.load(ptrs, volatile=True)
    if WAIT:
        # a thread's words: the tile's over the program's threads (a power of two; a tile with fewer words than
        # the program has threads is replicated, one word a thread)
        return _wait_for_tag(ptrs, words, tag, max(ptrs.numel // tl.extra.cuda.num_threads(), 1))
    return tl.where(_word_tag(words) >= tag, _word_value(words), float("nan"))


# Up to this reduction width (BLOCK_K) a program of MIN_DOT gate columns multiplies h_{t-1} @ W_hh^T in fp32 FMAs
# whatever its candidate's precision: there the FMA product issues about as many instructions as the tensor-core
# one or fewer, and the tensor-core one's warps must split K and sum the slices behind two more CTA barriers a
# step. sm_90 SASS, 8 warps, a step's instructions a warp (CTA barriers), FMA vs tf32x3: BLOCK_K 32: 105 (2) vs
# 108 (4) in two slices; 64: 158 (2) vs 126 (4) in four (still the FMA product by the model, at 30 ns a barrier and
# 3 cycles an instruction); 128: 286 (2) vs 156 (4). The FMA product is true fp32, so the candidate's accuracy
# approval holds.
FMA_PRODUCT_MAX_K = 64


@triton.constexpr_function
def _product_precision(precision, columns, block_k):
    """The recurrent product's precision: "ieee" (fp32 FMAs) in a MIN_DOT-column program up to FMA_PRODUCT_MAX_K,
    else the candidate's."""
    return "ieee" if columns <= MIN_DOT and block_k <= FMA_PRODUCT_MAX_K else precision


@triton.constexpr_function
def _product_splits(product_precision, k_split, block_k):
    """K slices of the recurrent product: the launcher's K_SPLIT (launch.py `_k_split`), at most one per MIN_DOT rows
    of K; an FMA product is not split (its warps all have work already)."""
    return 1 if product_precision == "ieee" else min(k_split, block_k // MIN_DOT)


@triton.jit
def _sum_splits(partial, SPLITS: tl.constexpr):
    """partial[SPLITS, rows, cols] summed over its first axis. tl.sum over that axis, which the warps of the
    recurrent product split, compiles to shuffles and several passes through shared memory, each behind a CTA
    barrier; halving it pairwise with tl.split (whose pairs a thread holds in registers) moves every partial a
    thread adds into its registers in one pass."""
    ROWS: tl.constexpr = partial.shape[1]
    COLS: tl.constexpr = partial.shape[2]
    total = tl.permute(partial, (1, 2, 0))
    for level in tl.static_range(1, SPLITS.bit_length()):
        first, second = tl.split(tl.reshape(total, (ROWS, COLS, SPLITS >> level, 2)))
        total = first + second
    return tl.reshape(total, (ROWS, COLS))


@triton.jit
def _dot_parts(h, w, w_hi, w_lo, acc, PRECISION: tl.constexpr):
    """acc + h @ w (2-D, or batched 3-D), with w's tf32x3 parts precomputed. "tf32x3": the main product (h_hi
    w_hi, onto acc) and the two small ones in two accumulators, so their tensor-core chains overlap, summed by
    `split3_sum`, which keeps an infinite h's products infinite (h is split without the select that keeps an
    infinity's low part 0: `split3_sum` drops that NaN low part's products the same way)."""
    if PRECISION == "tf32x3":
        h_hi, h_lo = tf32_split(h, KEEP_INF=False)
        main, small = dot_split3_parts(h_hi, h_lo, w_hi, w_lo, acc, tl.zeros_like(acc))
        return split3_sum(main, small)
    return tl.dot(h, w, acc, input_precision=PRECISION)


@triton.jit
def _recurrent_product(h, w, w_hi, w_lo, acc, SPLITS: tl.constexpr, PRECISION: tl.constexpr):
    """acc + h[rows, K] @ the program's W_hh^T slice. With SPLITS > 1, `w` and its parts are [SPLITS, K / SPLITS,
    cols], K split in SPLITS slices: each slice is a product of its own warps (a tile of 16 rows and 16 gate
    columns has work for only two of a program's eight warps, so the others take a share of K), the slices
    summed after (`_sum_splits`)."""
    if SPLITS == 1:
        acc = _dot_parts(h, w, w_hi, w_lo, acc, PRECISION)
    else:
        ROWS: tl.constexpr = h.shape[0]
        K: tl.constexpr = h.shape[1]
        COLS: tl.constexpr = w.shape[2]
        h = tl.permute(tl.reshape(h, (ROWS, SPLITS, K // SPLITS)), (1, 0, 2))
        partial = _dot_parts(h, w, w_hi, w_lo, tl.zeros((SPLITS, ROWS, COLS), dtype=tl.float32), PRECISION)
        acc += _sum_splits(partial, SPLITS)
    return acc


@triton.jit(do_not_specialize=["step_begin", "step_end"])
def _lstm_onchip_kernel(
    g_ptr, whh_ptr, xchg_ptr, c_ptr, y_ptr, hn_ptr,
    T, B, H, step_begin, step_end,
    stride_gt, stride_gb,      # G rows: (t, b) -> row offset; columns: dir*4H + unit*4 + gate (unit-major)
    stride_yt, stride_yb,      # y: (t, b) -> offset; columns: dir*H + unit
    batch_bucket, seq_bucket,  # the autotune key (next powers of two of batch and sequence), unused by the body
    BLOCK_B: tl.constexpr, UNITS: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr, SYNC: tl.constexpr, K_SPLIT: tl.constexpr,
):
    """Program (direction, part, batch tile) owns UNITS hidden units: their 4*UNITS rows of W_hh are loaded
    once and held on chip for steps [step_begin, step_end), with the units' cell state. Each step reads the
    whole h_{t-1} row of its batch tile from the exchange (written by every part of the group the step
    before), computes its units' gates and h_t, and writes them to y[t] and to the exchange.

    The exchange (int64, (directions, 2 slots, B padded to EXCHANGE_ROWS, BLOCK_K)) carries each h value with
    the step that wrote it (`_tagged_bits`): step s writes slot s % 2 tagged s + 2 and reads slot (s + 1) % 2
    tagged s + 1 (the launcher writes h0 into slot 1 tagged 1). With SYNC each thread polls its own words until
    every one carries the tag: it waits for exactly the values it reads, with no counter or barrier between
    programs; the CTA barrier after the h tile's pass into shared memory then hands every thread the whole row.
    A slot is rewritten two steps later, by a program that has read every part's h of the step between, which
    each part wrote after its every thread had read the slot (that barrier comes between): no value is
    overwritten before every reader has it. Without SYNC (one launch per step, or the interpreter's one
    program, whose steps complete in order) the words are read once, and a word older than the step reads as
    NaN.

    Each of a unit's four gate columns (i, f, g, o) carries the unit's state; `_unit_cell` leaves c_t exact in
    the g and o columns and h_t in the o column, which publishes and stores it. K_SPLIT: the slices of K a
    tensor-core recurrent product splits across the warps (`_recurrent_product`, launch.py `_k_split`)."""
    direction = tl.program_id(0)
    part = tl.program_id(1)
    pid_b = tl.program_id(2)
    offs_b = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    b_mask = offs_b < B
    b64 = offs_b.to(tl.int64)
    cols = part * _GATES * UNITS + tl.arange(0, _GATES * UNITS)   # packed gate rows of this part: unit * 4 + gate
    col_mask = cols < H * _GATES
    gate = (cols % _GATES)[None, :]
    col_unit = cols // _GATES   # every column carries its unit's state; the o column stores it
    scale = tl.where(gate == GATE_G, 2.0, 1.0)   # g's activation is tanh(x) = 2 sigmoid(2x) - 1
    offs_k = tl.arange(0, BLOCK_K)

    # W_hh^T slice (BLOCK_K x 4*UNITS): loaded once and loop invariant, so the compiler keeps it on chip. The
    # packed rows are zero-padded to BLOCK_K, so the loads are the same whatever H is.
    whh_dir = whh_ptr + direction.to(tl.int64) * _GATES * H * BLOCK_K
    w = tl.load(whh_dir + cols[None, :].to(tl.int64) * BLOCK_K + offs_k[:, None], mask=col_mask[None, :], other=0.0)
    # the recurrent product's precision and K slices (`_recurrent_product`)
    PRODUCT: tl.constexpr = _product_precision(PRECISION, _GATES * UNITS, BLOCK_K)
    SPLITS: tl.constexpr = _product_splits(PRODUCT, K_SPLIT, BLOCK_K)
    if SPLITS > 1:
        w = tl.reshape(w, (SPLITS, BLOCK_K // SPLITS, _GATES * UNITS))
    w_hi, w_lo = tf32_split(w)   # the tf32x3 parts, once (unused at other precisions)
    g_mask = b_mask[:, None] & col_mask[None, :]
    out_mask = g_mask & (gate == GATE_O)
    state_ptrs = direction.to(tl.int64) * B * H + b64[:, None] * H + col_unit[None, :]
    c = tl.load(c_ptr + state_ptrs, mask=g_mask, other=0.0)
    g_cols = g_ptr + b64[:, None] * stride_gb + direction * _GATES * H + cols[None, :]
    y_row = y_ptr + b64[:, None] * stride_yb + direction * H + col_unit[None, :]
    slot_size = tl.cdiv(B, _EXCHANGE_ROWS) * _EXCHANGE_ROWS * BLOCK_K
    xchg_rows = xchg_ptr + direction.to(tl.int64) * 2 * slot_size + b64[:, None] * BLOCK_K + offs_k[None, :]
    publish_cols = xchg_ptr + direction.to(tl.int64) * 2 * slot_size + b64[:, None] * BLOCK_K + col_unit[None, :]
    # every row of the tile, padded ones too, so a reader's rows all carry the step's tag
    publish_mask = col_mask[None, :] & (gate == GATE_O)

    # forward runs t = s, reverse t = T-1-s: the step's rows of G and y move by `forward` rows a step
    t = step_begin + direction * (T - 1 - 2 * step_begin)
    forward = 1 - 2 * direction
    g_step = forward.to(tl.int64) * stride_gt
    y_step = forward.to(tl.int64) * stride_yt
    g_rows = g_cols + t.to(tl.int64) * stride_gt
    y_rows = y_row + t.to(tl.int64) * stride_yt
    read_slot = ((step_begin + 1) % 2) * slot_size   # step s reads slot (s + 1) % 2 and writes the other
    g_in = tl.load(g_rows, mask=g_mask, other=0.0)
    h = tl.zeros((BLOCK_B, _GATES * UNITS), dtype=tl.float32)
    publish_tag = (step_begin + 2).to(tl.int64) << 32   # step s publishes tag s + 2
    for s in range(step_begin, step_end):
        h_prev = _read_exchange(xchg_rows + read_slot, s + 1, SYNC)
        pre = _recurrent_product(h_prev, w, w_hi, w_lo, g_in, SPLITS, PRODUCT)
        act = _gate_activation(pre, scale)
        c, h = _unit_cell(act, c, gate, BLOCK_B, UNITS)
        read_slot = slot_size - read_slot   # the slot this step writes is the one the next step reads
        _publish(publish_cols + read_slot, _tagged_bits(h, publish_tag), publish_mask, SYNC)
        publish_tag += 1 << 32
        tl.store(y_rows, h, mask=out_mask)
        y_rows += y_step
        g_rows += g_step
        g_in = tl.load(g_rows, mask=tl.where(s + 1 < T, g_mask, False), other=0.0)   # the next step's input gates
    if step_end == T:
        tl.store(hn_ptr + state_ptrs, h, mask=out_mask)
    tl.store(c_ptr + state_ptrs, c, mask=out_mask)
