"""Drop-in nn.Modules built on rlx_triton's ops; names resolve lazily."""
from __future__ import annotations

import importlib

# public module name -> submodule of rlx_triton.nn that defines it
_EXPORTS = {
    "Fbank": "fbank",
    "SincNet": "conv",
    "Conv1d": "conv",
    "Conv2d": "conv2d",
    "StatsPool": "conv2d",
    "Projection": "conv2d",
    "BasicBlock": "conv2d",
    "Bottleneck": "conv2d",
    "LSTM": "lstm",
    "SegDense": "segdense",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"rlx_triton.nn.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx_triton.nn' has no attribute {name!r}")


def __dir__():
    return __all__
