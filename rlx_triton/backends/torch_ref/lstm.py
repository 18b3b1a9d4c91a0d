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


def library_kernels(request, profile) -> list:
    """The kernels `lstm` above runs on a GPU for a routed request (rlx_triton.backends.torch_ref.library_kernel
    .LibraryKernel), priced by rlx_triton.perf.library's models: the zero h0 and c0 this function fills when no
    state is given (two kernels), the copy _cudnn_rnn makes of a batch_first input (`input.transpose(0, 1)
    .contiguous()`), then cuDNN's LSTM forward (rlx_triton.perf.library.rnn): per layer the input projection GEMM
    and the recurrence, with the algorithm torch's get_algo picks (PERSIST_STATIC_SMALL_H for hidden <= 192: one
    persistent launch per layer), fp32 with TF32 off as the benches and pyannote run it. The request does not say
    whether a state is given; none is assumed (nn.LSTM's and pyannote's call)."""
    from rlx_triton.perf.library import Unmodelled
    from rlx_triton.perf.library.eager import elementwise
    from rlx_triton.perf.library.gemm import REQUEST_DTYPE
    from rlx_triton.perf.library.rnn import lstm_kernels

    dtype = REQUEST_DTYPE.get(request.dtype)
    if dtype is None:
        raise Unmodelled(f"the LSTM library path in {request.dtype} is not modelled")
    fields, features = request.field_map, request.feature_map
    batch, seq, hidden = fields["batch"], fields["seq"], fields["hidden"]
    layers, directions, inputs = fields["layers"], fields["directions"], fields["input_size"]
    element = 2 if dtype in ("fp16", "bf16") else 4
    state = layers * directions * batch * hidden * element
    kernels = [elementwise("h0 zeros", 0, state), elementwise("c0 zeros", 0, state)]
    if features.get("batch_first") and not features.get("packed"):
        sequence = batch * seq * inputs * element
        kernels.append(elementwise("batch_first input to (seq, batch) (contiguous copy)", sequence, sequence))
    kernels += lstm_kernels(batch, seq, inputs, hidden, layers, directions, dtype, profile,
                            packed=bool(features.get("packed")), proj_size=int(features.get("proj_size", 0)))
    return kernels
