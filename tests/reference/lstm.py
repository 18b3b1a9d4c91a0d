"""float64 reference of nn.LSTM's forward (gate order i, f, g, o), written out step by step."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch


def lstm_float64(x: torch.Tensor, flat_weights: Sequence[torch.Tensor], *, num_layers: int, bidirectional: bool,
                 batch_first: bool, has_biases: bool = True,
                 hx: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
    """(output, (h_n, c_n)) in float64 for a batched input (T, B, I) or (B, T, I) when batch_first."""
    directions = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    seq = x.double().transpose(0, 1) if batch_first else x.double()   # (T, B, I)
    T, B = seq.shape[0], seq.shape[1]
    hidden = flat_weights[1].shape[1]
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(directions):
            idx = layer * directions + d
            w = [t.detach().double() for t in flat_weights[idx * per:(idx + 1) * per]]
            b = (w[2] + w[3]) if has_biases else torch.zeros(4 * hidden, dtype=torch.float64)
            h = hx[0][idx].double() if hx is not None else torch.zeros(B, hidden, dtype=torch.float64)
            c = hx[1][idx].double() if hx is not None else torch.zeros(B, hidden, dtype=torch.float64)
            ys = [None] * T
            for t in (range(T) if d == 0 else reversed(range(T))):
                gates = seq[t] @ w[0].T + h @ w[1].T + b
                i, f, g, o = gates.chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                ys[t] = h
            outs.append(torch.stack(ys))
            h_n.append(h)
            c_n.append(c)
        seq = torch.cat(outs, dim=2)
    output = seq.transpose(0, 1) if batch_first else seq
    return output, (torch.stack(h_n), torch.stack(c_n))
