"""Library fallback for the lstm family: torch's own LSTM (cuDNN on CUDA), same signature as the Triton launcher.

It also takes what the Triton kernel refuses: packed sequences, proj_size > 0, training with dropout.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch.nn.utils.rnn import PackedSequence

from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: Dict[str, Approval] = {}
RECIPES: Dict[str, str] = {}
SPEED_EVIDENCE: Dict[str, str] = {}


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


def library_kernels(request) -> list:
    """The kernels torch's LSTM (cuDNN's standard algorithm, TF32 off as the benches and pyannote run it) needs
    per layer, for the library path estimate (rlx_triton.perf.roofline.LibraryKernel): the input projection of
    every step and direction as one GEMM, then one launch per step for the recurrent GEMM and the gate update of
    every direction, each step reading back the h row the step before wrote (one dependent L2 read). W_hh is
    read from L2 every step (not memory traffic). At least one launch per step is a lower bound of cuDNN's."""
    from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel

    fields = request.field_map
    batch, seq, hidden = fields["batch"], fields["seq"], fields["hidden"]
    layers, directions, features = fields["layers"], fields["directions"], fields["input_size"]
    gates = 4 * hidden * directions
    kernels = []
    for layer in range(layers):
        inputs = features if layer == 0 else hidden * directions
        kernels.append(LibraryKernel(f"layer {layer} input projection (cuBLAS SGEMM)",
                                     (batch * seq * inputs + gates * inputs + gates) * 4, batch * seq * gates * 4,
                                     2 * batch * seq * inputs * gates))
        state = batch * hidden * directions * 4
        kernels.append(LibraryKernel(f"layer {layer} recurrence step (GEMM + gates)", batch * gates * 4 + 2 * state,
                                     2 * state, 2 * batch * gates * hidden, chain={"l2_hit": 1}, repeat=seq))
    return kernels
