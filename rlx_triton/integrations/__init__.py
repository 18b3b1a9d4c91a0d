"""Integrations with model libraries: `transformers` (attention backend), `pyannote` (model optimizer) and
`torch_attention` (rt's kernels as torch's flash attention implementation "RLX").

Submodules load on first access (`rt.integrations.pyannote`), so importing rlx_triton does not
import transformers.
"""
from __future__ import annotations

import importlib

_SUBMODULES = ("pyannote", "torch_attention", "transformers")
__all__ = list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        module = importlib.import_module(f"rlx_triton.integrations.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'rlx_triton.integrations' has no attribute {name!r}")


def __dir__():
    return __all__
