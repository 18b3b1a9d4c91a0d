"""Library fallback for the lstm family: torch's own LSTM (cuDNN on CUDA), same signature as the Triton launcher.

It also takes what the Triton kernel refuses: packed sequences, proj_size > 0, training with dropout.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch.nn.utils.rnn import PackedSequence

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS = {}
RECIPES = {}
SPEED_EVIDENCE = {}


def _zero_state(num_states: int, batch: int, hidden: int, proj_size: int, like: torch.Tensor):
    h = torch.zeros(num_states, batch, proj_size or hidden, dtype=like.dtype, device=like.device)
    c = torch.zeros(num_states, batch, hidden, dtype=like.dtype, device=like.device)
    return h, c


def lstm(input, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, proj_size: int = 0, candidate=None, route=None):
    """torch.lstm with nn.LSTM's conventions (zero state when hx is None, unbatched input, PackedSequence)."""
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1] if proj_size == 0 else flat_weights[1].shape[0] // 4
    num_states = num_layers * directions
    if isinstance(input, PackedSequence):
        data, batch_sizes, sorted_indices, unsorted_indices = input
        if hx is None:
            hx = _zero_state(num_states, int(batch_sizes[0]), hidden, proj_size, data)
        elif sorted_indices is not None:
            hx = (hx[0].index_select(1, sorted_indices), hx[1].index_select(1, sorted_indices))
        out, h_n, c_n = torch.lstm(data, batch_sizes, hx, flat_weights, has_biases, num_layers, float(dropout),
                                   training, bidirectional)
        if unsorted_indices is not None:
            h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
        return PackedSequence(out, batch_sizes, sorted_indices, unsorted_indices), (h_n, c_n)

    unbatched = input.dim() == 2
    x = input.unsqueeze(0 if batch_first else 1) if unbatched else input
    if hx is None:
        batch = x.shape[0] if batch_first else x.shape[1]
        hx = _zero_state(num_states, batch, hidden, proj_size, x)
    elif unbatched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    output, h_n, c_n = torch.lstm(x, hx, flat_weights, has_biases, num_layers, float(dropout), training,
                                  bidirectional, batch_first)
    if unbatched:
        output = output.squeeze(0 if batch_first else 1)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)
