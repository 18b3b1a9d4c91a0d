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


# ------------------------------------------------------------------------------- degenerate inputs
# A 2-layer bidirectional batch_first nn.LSTM(6, 9) on (2, 5, 6) inputs. name -> (edit(x, h0, c0),
# expect): NaN anywhere in a sequence's input or state spreads through the recurrence (and through
# the other direction in layer 2) to that sequence's whole output; +-Inf inputs saturate the gates
# (sigmoid(+-inf) = 1 or 0, tanh(+-inf) = +-1) and give finite outputs, as in torch; an Inf cell state
# stays Inf in c_n while h = o * tanh(c) stays finite.
NAN, INF = float("nan"), float("inf")


def _set(tensor, index, value):
    tensor[index] = value


LSTM_DEGENERATE_CASES = {
    "zeros": (lambda x, h0, c0: (x.zero_(), h0.zero_(), c0.zero_()), "finite"),
    "constants": (lambda x, h0, c0: (x.fill_(0.5), h0.fill_(-0.25), c0.fill_(0.75)), "finite"),
    "single_step": (None, "finite"),
    "nan_in_the_input": (lambda x, h0, c0: _set(x, (0, 2, 1), NAN), "nan"),
    "inf_in_the_input": (lambda x, h0, c0: _set(x, (1, 3, 4), INF), "finite"),
    "neg_inf_in_the_input": (lambda x, h0, c0: _set(x, (0, 0, 0), -INF), "finite"),
    "nan_in_h0": (lambda x, h0, c0: _set(h0, (1, 0, 3), NAN), "nan"),
    "inf_in_c0": (lambda x, h0, c0: _set(c0, (0, 1, 3), INF), "inf_cell"),
}


def lstm_degenerate_inputs(name: str, seed: int = 0):
    """(module, x, (h0, c0), expect) of one LSTM_DEGENERATE_CASES entry, float32."""
    edit, expect = LSTM_DEGENERATE_CASES[name]
    torch.manual_seed(seed)
    module = torch.nn.LSTM(6, 9, num_layers=2, bidirectional=True, batch_first=True).eval()
    x = torch.randn(2, 1 if name == "single_step" else 5, 6)
    h0, c0 = torch.randn(4, 2, 9), torch.randn(4, 2, 9)
    if edit is not None:
        edit(x, h0, c0)
    return module, x, (h0, c0), expect


def check_lstm_degenerate_case(launch, name: str, *, rtol: float):
    """Runs `launch(module, x, hx) -> (output, (h_n, c_n))` on one case and compares with lstm_float64:
    NaN and Inf exactly where it has them, its values elsewhere (rtol, atol scaled by the hidden size)."""
    module, x, hx, expect = lstm_degenerate_inputs(name)
    out, (h_n, c_n) = launch(module, x, hx)
    ref_out, (ref_h, ref_c) = lstm_float64(x, module._flat_weights, num_layers=2, bidirectional=True,
                                           batch_first=True, hx=hx)
    for actual, expected in ((out, ref_out), (h_n, ref_h), (c_n, ref_c)):
        torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=rtol * 3, equal_nan=True)
    if expect == "nan":
        assert out.isnan().any() and h_n.isnan().any()
    elif expect == "inf_cell":
        assert c_n.isinf().any() and out.isfinite().all()
    else:
        assert out.isfinite().all() and c_n.isfinite().all()
    return out, (h_n, c_n)
