"""Weight preparation of the conv families, cached per weight version: the packed (C_in * taps, C_out)
weight, the tf32x3 split terms (four per k for the 1-D convs, every hi then every lo for the 2-D trunk) and the
sinc bank's half filters.

The sinc filters themselves are built with torch ops (rlx_triton.ops.conv.sinc_filters), once per
weight version: they are 80 x 251 numbers computed once per parameter update, so a kernel would buy
nothing, and running asteroid's exact op sequence keeps float32 filters bit-identical to pyannote's.
"""
from __future__ import annotations

import torch

from rlx_triton.backends.triton._tf32 import split_tf32
from rlx_triton.backends.triton.device_cache import packed_weights


def _packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, taps) -> (C_in * taps, C_out) contiguous, so weight tiles load along C_out; cached per
    weight version (cached_weight)."""
    return cached_weight(weight, lambda w: w.reshape(w.shape[0], -1).t().contiguous(), "conv_packed")


def split_terms(matrix: torch.Tensor) -> torch.Tensor:
    """(rows, K) -> (rows, 4 * K) float32: the four terms [hi, lo, hi, lo] of each k (split_tf32) contiguous,
    the weight operand of dot_split."""
    hi, lo = split_tf32(matrix)
    return torch.stack((hi, lo, hi, lo), dim=-1).reshape(matrix.shape[0], -1).contiguous()


def split_halves(matrix: torch.Tensor) -> torch.Tensor:
    """(rows, K) -> (rows, 2 * K) float32: the hi of each k (split_tf32) in the first K columns, then the lo of
    each k: the weight operands of the ResNet trunk's three-product dot (`_tf32.dot_split3`)."""
    hi, lo = split_tf32(matrix)
    return torch.cat((hi, lo), dim=1).contiguous()


def cached_weight(weight: torch.Tensor, make, kind: str):
    """make(weight) cached per weight version under `kind` (device_cache.packed_weights): an inference loop
    prepares each weight once, an in-place update (optimizer step, load_state_dict) prepares it again, and
    inference tensors are prepared on every call."""
    return packed_weights(kind, [weight], lambda: make(weight.detach()))


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



def _split_weight(weight: torch.Tensor) -> torch.Tensor:
    """(C_out, C_in, taps) -> split_terms of (C_out, C_in * taps): the tf32x3 operand; cached per weight version."""
    return cached_weight(weight, lambda w: split_terms(w.reshape(w.shape[0], -1)), "conv_split")
