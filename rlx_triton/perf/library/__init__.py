"""Models of library kernels (FlashAttention 2 and 3, FlashInfer, cuDNN, cuBLAS, cuFFT, torch's own), by their
launch rules: what each library launches for an op at a shape on a GPU, as LibraryKernel records
(rlx_triton.backends.torch_ref.library_kernel) that rlx_triton.perf.roofline prices with the same constants as
the Triton launches.

Two readers:
- the torch fallback's `library_kernels(request, profile)` (backends/torch_ref/<family>.py) picks, per routed
  request, the kernels torch really launches (its SDPA backend choice, cuDNN, cuBLAS, cuFFT) from these models:
  the library side of a speed decision and of `rlx-triton perf`'s library estimate;
- `rlx-triton perf --published FILE.csv` (rlx_triton.perf.published) prices published measurements of the
  libraries with them, which is how far the model is from the world.

A model is registered per (op, impl) of the published format with `@library_model(op, impl)`: a function of
the shape (the format's keys: attention batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, page_size;
conv2d batch, c_in, c_out, h, w, kernel, stride, padding; lstm batch, seq, input, hidden, layers,
bidirectional; gemm m, n, k; rfft batch, n), the dtype ("fp16", "bf16", "fp32", "tf32", "fp8") and the device
profile, returning the kernels; a shape or dtype the model does not cover raises Unmodelled with the reason.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List, Mapping, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel

Model = Callable[[Mapping[str, int], str, object], List[LibraryKernel]]

# the modules that register models, imported on first use
MODEL_MODULES = ("rlx_triton.perf.library.attention", "rlx_triton.perf.library.gemm",
                 "rlx_triton.perf.library.conv", "rlx_triton.perf.library.rnn", "rlx_triton.perf.library.fft")

_models: Dict[Tuple[str, str], Model] = {}
_loaded = False


class Unmodelled(ValueError):
    """A shape, dtype or GPU a library model does not cover; the message says why."""


def library_model(op: str, impl: str) -> Callable[[Model], Model]:
    """Registers the decorated function as the model of `impl`'s kernels for `op`."""
    def register(model: Model) -> Model:
        _models[(op, impl)] = model
        return model
    return register


def models() -> Dict[Tuple[str, str], Model]:
    """Every registered model, (op, impl) -> model."""
    global _loaded
    if not _loaded:
        for name in MODEL_MODULES:
            importlib.import_module(name)
        _loaded = True
    return dict(_models)


def kernels_of(op: str, impl: str, shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """The kernels `impl` launches for `op` at `shape`; Unmodelled where no model covers it."""
    model = models().get((op, impl))
    if model is None:
        raise Unmodelled(f"no model of {impl} for {op}")
    return model(shape, dtype, profile)
