"""The online softmax both attention kernels run over their KV blocks (sdpa_decode/kernels.py and
varlen_attention/kernels.py): scores are base 2 (the scale folded with log2(e)), and a program keeps per
query row a running max m, a running sum l and the PV accumulator, all fp32.

A row with no visible key so far keeps m = -inf, l = 0, acc = 0 (its max is replaced by 0 before the
exponentials, so -inf - -inf never makes a NaN). A NaN score makes l NaN whether or not the max keeps it
(tl.max drops NaN): p = exp2(NaN - m) is NaN, and so the output and the LSE of that row stay NaN, as
torch's are. l is exactly 0 at the end only when every score was -inf (the largest score contributes
exp2(0) = 1), so `normalise` tests l == 0, not l > 0.

The steps are split where the kernels load and mask between them, so a kernel reads: load K, `scores`, scale
and mask, `rescale`, load V, `accumulate`, and after the last block `normalise`.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def scores(q, k, DOT_LOWP: tl.constexpr):
    """q @ k^T (rows x keys, fp32): on the 16-bit operands' tensor cores when DOT_LOWP, else fp32 ieee dots."""
    if DOT_LOWP:
        qk = tl.dot(q, tl.trans(k))
    else:
        qk = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    return qk


@triton.jit
def rescale(m_i, l_i, scores):
    """(m_new, p, alpha, l_new) for one block of base-2 `scores` (rows x keys, -inf where masked):
    the new running max, the block's exponentials, the factor the old sum and accumulator scale by, and
    the new running sum."""
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_new = l_i * alpha + tl.sum(p, 1)
    return m_new, p, alpha, l_new


@triton.jit
def accumulate(acc, alpha, p, v, DOT_LOWP: tl.constexpr):
    """acc * alpha + p @ v: on the 16-bit operands' tensor cores when DOT_LOWP, else fp32 ieee dots."""
    if DOT_LOWP:
        pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return acc * alpha[:, None] + pv


@triton.jit
def normalise(acc, l_i):
    """(out, no_keys, l_safe): acc / l per row, with rows that saw no key (l == 0) left at 0 and flagged
    so a kernel writes their LSE as its convention says; l_safe is l with those rows' 0 replaced by 1."""
    no_keys = l_i == 0.0
    l_safe = tl.where(no_keys, 1.0, l_i)
    return acc / l_safe[:, None], no_keys, l_safe
