"""rlx_triton.nn.LSTM: a drop-in nn.LSTM whose forward runs through the routed `lstm` op.

It has nn.LSTM's constructor, attributes (input_size, hidden_size, num_layers, bias, batch_first, dropout,
bidirectional, proj_size), parameters and state_dict keys (weight_ih_l0, ...), so it loads any nn.LSTM
checkpoint; only forward changes: covered calls run the Triton kernels, everything else (autograd, training
with dropout, proj_size, packed sequences) falls back to torch's LSTM.

    fast = rlx_triton.nn.LSTM.from_torch(model.lstm)   # shares model.lstm's Parameter objects

It is an nn.Module, not an nn.LSTM subclass: torch.compile refuses every nn.RNN/GRU/LSTM instance ("Dynamo does
not support RNN, GRU, or LSTM", unless torch._dynamo.config.allow_rnn is set), while this module's forward is
one call of the lstm op, which compiles as one custom op (ops/_compiled.py).
"""
from __future__ import annotations

import copy
from typing import Any, List

import torch
from torch import nn

from rlx_triton.ops import lstm as lstm_op

# nn.LSTM's own state that this module does not keep: the flat weight list is read from the parameters on
# every call (so .to(), load_state_dict and assignments never leave it stale)
_DERIVED = ("_flat_weights", "_flat_weight_refs")


class LSTM(nn.Module):
    """nn.LSTM with a routed forward (Triton kernels where covered, torch otherwise); takes nn.LSTM's arguments.

    Example:
        >>> import torch, rlx_triton as rt
        >>> stock = torch.nn.LSTM(60, 128, num_layers=4, bidirectional=True, batch_first=True)
        >>> fast = rt.nn.LSTM.from_torch(stock)            # shares stock's Parameter objects
        >>> out, (h, c) = fast(torch.randn(2, 50, 60))
        >>> out.shape, h.shape
        (torch.Size([2, 50, 256]), torch.Size([8, 2, 128]))
    """

    # nn.LSTM's hyperparameters, taken from the nn.LSTM this module is built from
    mode: str
    input_size: int
    hidden_size: int
    num_layers: int
    bias: bool
    batch_first: bool
    dropout: float
    bidirectional: bool
    proj_size: int
    _flat_weights_names: List[str]
    _all_weights: List[List[str]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._take(nn.LSTM(*args, **kwargs))

    @classmethod
    def from_torch(cls, lstm: nn.LSTM) -> "LSTM":
        """An rlx LSTM sharing `lstm`'s Parameter objects (no copy; updates show in both)."""
        if not isinstance(lstm, nn.LSTM):
            raise TypeError(f"LSTM.from_torch: lstm must be a torch.nn.LSTM, got {type(lstm).__name__}")
        new = cls.__new__(cls)
        new._take(lstm)
        return new

    def _take(self, lstm: nn.LSTM) -> None:
        """Takes lstm's hyperparameters, mode, parameters, hooks and state_dict layout: the containers are copied,
        their contents (Parameters, buffers, hooks) shared."""
        for key, value in lstm.__dict__.items():
            if key not in _DERIVED:
                self.__dict__[key] = copy.copy(value) if isinstance(value, (dict, list)) else value

    @property
    def _flat_weights(self) -> List[torch.Tensor]:
        """The weights in nn.LSTM's flat order (torch.lstm's), read from the registered parameters."""
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> List[List[nn.Parameter]]:
        return [[getattr(self, weight) for weight in weights] for weights in self._all_weights]

    # nn.LSTM's own methods run on this module: they read only the attributes above
    def flatten_parameters(self) -> None:
        """nn.LSTM's: on CUDA, puts the weights in one cuDNN buffer (torch's path reads them from it)."""
        nn.LSTM.flatten_parameters(self)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        return nn.LSTM.extra_repr(self)  # type: ignore[arg-type]

    def _apply(self, fn, recurse: bool = True):
        # as nn.LSTM does: weights moved to CUDA are put back in one cuDNN buffer
        applied = super()._apply(fn, recurse)
        self.flatten_parameters()
        return applied

    def _op_kwargs(self) -> dict:
        return dict(has_biases=self.bias, num_layers=self.num_layers, dropout=float(self.dropout),
                    training=self.training, bidirectional=self.bidirectional, batch_first=self.batch_first,
                    proj_size=self.proj_size)

    def forward(self, input, hx=None):
        return lstm_op.lstm(input, hx, self._flat_weights, **self._op_kwargs())

    def explain(self, input, hx=None):
        """The Route forward(input, hx) takes, without running it."""
        from rlx_triton.router import explain

        return explain(lstm_op.lstm, input, hx, self._flat_weights, **self._op_kwargs())
