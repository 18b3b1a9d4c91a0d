"""LibraryKernel: one kernel the torch library path runs, as a family's torch module states it.

Each family module of the library fallback may state `library_kernels(request) -> [LibraryKernel]`: the kernels
torch launches on a GPU for a routed request, with the bytes and FLOPs each must move and execute at least.
`rlx-triton perf` reads them for its library path estimate (rlx_triton.perf.roofline.library_estimate); this
record is plain data, so the torch modules state it without importing the analysis that reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class LibraryKernel:
    """One kernel of a library (torch) path, as a family states it for the library path estimate: the bytes it
    must read and write at least (each byte once), the FLOPs it must execute, on `unit`, and the dependent steps
    it cannot overlap (`chain`: latency kind -> steps, as rlx_triton.perf.structure counts them). `ctas`: the
    CTAs its grid has where that is known from the library's launch rule (one per SM at a time; None: every SM
    busy); `repeat`: the same kernel launched that many times one after another (a recurrence's steps), the
    figures above being one launch's."""
    name: str
    bytes_read: int
    bytes_written: int
    flops: float = 0
    unit: str = "fp32_fma"
    chain: Mapping[str, int] = field(default_factory=dict)
    ctas: Optional[int] = None
    repeat: int = 1

    @property
    def bytes(self) -> int:
        return int(self.bytes_read) + int(self.bytes_written)
