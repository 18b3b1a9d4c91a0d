"""rlx_triton.nn.LSTM: a drop-in nn.LSTM whose forward runs through the routed `lstm` op.

It *is* an nn.LSTM (same constructor, parameters, state_dict keys weight_ih_l0, ...), so it loads
any nn.LSTM checkpoint; only forward changes: covered calls run the Triton kernels, everything else
(autograd, training with dropout, proj_size, packed sequences) falls back to torch's LSTM.

    fast = rlx_triton.nn.LSTM.from_torch(model.lstm)   # shares model.lstm's Parameter objects
"""
from __future__ import annotations

import copy
from typing import List, cast

import torch
from torch import nn

from rlx_triton.ops import lstm as lstm_op


class LSTM(nn.LSTM):
    """nn.LSTM with a routed forward (Triton kernels where covered, torch otherwise).

    Example:
        >>> import torch, rlx_triton as rt
        >>> stock = torch.nn.LSTM(60, 128, num_layers=4, bidirectional=True, batch_first=True)
        >>> fast = rt.nn.LSTM.from_torch(stock)            # shares stock's Parameter objects
        >>> out, (h, c) = fast(torch.randn(2, 50, 60))
        >>> out.shape, h.shape
        (torch.Size([2, 50, 256]), torch.Size([8, 2, 128]))
    """

    @classmethod
    def from_torch(cls, lstm: nn.LSTM) -> "LSTM":
        """An rlx LSTM sharing `lstm`'s Parameter objects (no copy; updates show in both)."""
        if not isinstance(lstm, nn.LSTM):
            raise TypeError(f"LSTM.from_torch: lstm must be a torch.nn.LSTM, got {type(lstm).__name__}")
        new = cls.__new__(cls)
        state = {}
        for key, value in lstm.__dict__.items():
            # the containers are copied, their contents (Parameters, buffers, hooks) are shared
            state[key] = copy.copy(value) if isinstance(value, (dict, list)) else value
        new.__dict__.update(state)
        new._init_flat_weights()
        return new

    def _op_kwargs(self) -> dict:
        return dict(has_biases=self.bias, num_layers=self.num_layers, dropout=float(self.dropout),
                    training=self.training, bidirectional=self.bidirectional, batch_first=self.batch_first,
                    proj_size=self.proj_size)

    def _weights(self) -> List[torch.Tensor]:
        # every name in _flat_weights_names is a registered parameter, so no entry is None
        return cast(List[torch.Tensor], self._flat_weights)

    def forward(self, input, hx=None):
        return lstm_op.lstm(input, hx, self._weights(), **self._op_kwargs())

    def explain(self, input, hx=None):
        """The Route forward(input, hx) takes, without running it."""
        from rlx_triton.router import explain

        return explain(lstm_op.lstm, input, hx, self._weights(), **self._op_kwargs())
