"""torch's own kernels between the library calls of an eager forward: elementwise ops, reductions, copies.

Eager torch runs each tensor op as its own kernel (TensorIterator's vectorised elementwise and reduction
kernels, `cat`, `constant_pad_nd`, `max_pool1d`): each reads its inputs from and writes its output to device
memory once, bandwidth-bound, with one launch. These helpers state such a kernel as a LibraryKernel with every
SM busy (their grids cover the tensor in many CTAs); each byte is priced at the achievable HBM bandwidth
(reuse in the 50-60 MB L2 between consecutive kernels is not modelled). A host-to-device copy of a scalar made
with `torch.tensor(value, device=...)` on every call is stated as its own entry: its cost is the launch-like
latency of the copy, not its bytes.
"""
from __future__ import annotations

from typing import Mapping

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel

ELEMENT_BYTES: Mapping[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def elementwise(name: str, bytes_read: int, bytes_written: int, flops: float = 0, note: str = "") -> LibraryKernel:
    """One TensorIterator elementwise kernel (or a copy, cat, pad): its inputs read and its output written once."""
    return LibraryKernel(name, int(bytes_read), int(bytes_written), float(flops), "fp32_fma",
                         note=note or "torch elementwise kernel: bandwidth-bound, one launch")


def reduction(name: str, bytes_read: int, bytes_written: int, flops: float = 0, note: str = "") -> LibraryKernel:
    """One TensorIterator reduction kernel (sum, mean, var / std, max): its input read once, its result written."""
    return LibraryKernel(name, int(bytes_read), int(bytes_written), float(flops), "fp32_fma",
                         note=note or "torch reduction kernel: bandwidth-bound, one launch")


def host_copy(name: str, nbytes: int) -> LibraryKernel:
    """A host-to-device copy of a few bytes (a Python scalar made a device tensor on every call)."""
    return LibraryKernel(name, int(nbytes), int(nbytes), ctas=1,
                         note="cudaMemcpyAsync host to device from pageable memory: priced as one launch")
