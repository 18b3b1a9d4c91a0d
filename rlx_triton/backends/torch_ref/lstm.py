"""Library fallback for the lstm family: torch's own LSTM (cuDNN on CUDA), same signature as the Triton launcher."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS = {}
RECIPES = {}
SPEED_EVIDENCE = {}


def lstm(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, candidate=None) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """torch.lstm with nn.LSTM's conventions (zero state when hx is None, unbatched (T, I) input)."""
    unbatched = input.dim() == 2
    x = input.unsqueeze(0 if batch_first else 1) if unbatched else input
    directions = 2 if bidirectional else 1
    if hx is None:
        hidden = flat_weights[1].shape[1]
        batch = x.shape[0] if batch_first else x.shape[1]
        zeros = torch.zeros(num_layers * directions, batch, hidden, dtype=x.dtype, device=x.device)
        hx = (zeros, zeros)
    elif unbatched:
        hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
    output, h_n, c_n = torch.lstm(x, hx, flat_weights, has_biases, num_layers, float(dropout), training,
                                  bidirectional, batch_first)
    if unbatched:
        output = output.squeeze(0 if batch_first else 1)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)
