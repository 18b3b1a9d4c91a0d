"""LSTM weight preparation, cached per weight version: one layer's W_ih of both directions concatenated,
the W_hh stack and the summed biases in fp32, gate-major (torch's rows) or unit-major for the on-chip
recurrence, whose W_hh rows are zero-padded to its reduction width (`_block_k`).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import triton

from rlx_triton.backends.triton.device_cache import packed_weights
from rlx_triton.backends.triton.lstm.kernels import GATES, MIN_DOT


def _block_k(hidden: int) -> int:
    """The on-chip kernel's reduction width: the hidden size padded to a power of two (at least MIN_DOT)."""
    return max(MIN_DOT, triton.next_power_of_2(hidden))


def _pack_layer(tensors: Sequence[torch.Tensor], has_biases: bool, directions: int,
                unit_major: bool) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """(W_ih_cat (D*4H, I), W_hh stack (D, 4H, H), bias (D*4H,) or None) in fp32.

    Gate rows are torch's (gate-major: gate*H + unit), or unit-major (unit*4 + gate) for the on-chip
    recurrence, whose programs own contiguous runs of units; its W_hh rows are zero-padded to the
    kernel's BLOCK_K (D, 4H, BLOCK_K)."""
    per = 4 if has_biases else 2   # w_ih, w_hh (, b_ih, b_hh) per direction
    w_ih: List[torch.Tensor] = []
    w_hh: List[torch.Tensor] = []
    biases: List[torch.Tensor] = []
    for d in range(directions):
        chunk = [t.detach().float() for t in tensors[d * per:(d + 1) * per]]
        hidden = chunk[1].shape[1]
        b = chunk[2] + chunk[3] if has_biases else None
        if unit_major:
            chunk = [t.reshape(GATES, hidden, -1).transpose(0, 1).reshape(GATES * hidden, -1) for t in chunk[:2]]
            b = b.reshape(GATES, hidden).t().reshape(GATES * hidden) if b is not None else None
        w_ih.append(chunk[0])
        w_hh.append(chunk[1])
        if b is not None:
            biases.append(b)
    w_hh_stack = torch.stack(w_hh, 0)
    if unit_major:
        w_hh_stack = torch.nn.functional.pad(w_hh_stack, (0, _block_k(w_hh_stack.shape[-1]) - w_hh_stack.shape[-1]))
    return (torch.cat(w_ih, 0).contiguous(), w_hh_stack.contiguous(),
            torch.cat(biases, 0).contiguous() if has_biases else None)


def _layer_weights(flat_weights: Sequence[torch.Tensor], has_biases: bool, layer: int, directions: int,
                   unit_major: bool = False) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The packed weights of one layer, cached per weight version (device_cache.packed_weights: an inference
    loop packs once, an in-place update or load_state_dict repacks, inference tensors pack on every call)."""
    per = 4 if has_biases else 2
    tensors = list(flat_weights[layer * directions * per:(layer + 1) * directions * per])
    return packed_weights("lstm", tensors, lambda: _pack_layer(tensors, has_biases, directions, unit_major),
                          unit_major, has_biases, directions)
