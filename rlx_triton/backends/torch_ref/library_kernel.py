"""LibraryKernel: one kernel a library path runs (torch, cuBLAS, cuDNN, FlashAttention, cuFFT), as plain data.

A library's kernels are modelled by their launch rules (grid, resident CTAs per SM, the instruction class
of the main loop and the work beside it), not read from compiled code: rlx_triton.perf.library states them
per library, `library_kernels(request, profile)` in each family module of the torch fallback picks what
torch launches for a routed request, and rlx_triton.perf.roofline prices them with the same constants as
the Triton launches. This record is data only, so the torch modules state it without importing the
analysis that reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


@dataclass(frozen=True)
class LibraryKernel:
    """One kernel of a library path, as its model states it.

    bytes_read / bytes_written: what it moves to and from device memory at least (each byte once; tiles
        re-read from L2 are not counted). flops on `unit` (rlx_triton.devices.UNITS): its main loop's work.
    efficiency: the fraction of the unit's sustained rate that main loop's instruction class reaches on
        this architecture (1.0: the unit's rate; e.g. sm_80-style mma.sync issued on sm_90, where only
        wgmma reaches the tensor cores' rate). `note` says where a value other than 1 comes from.
    side_ops: work beside the main loop that does not overlap with it, unit -> operations (a softmax's
        exponentials on "sfu", its scaling, max and sums on "fp32_fma" counted as FLOPs).
    chain: the dependent steps it cannot overlap (latency kind -> steps, as rlx_triton.perf.structure counts
        them: "l2_hit", "hbm", "atomic", "cta_barrier").
    ctas: its grid's CTAs where the library's launch rule gives them (None: as many as fill every SM once);
        ctas_per_sm: how many of them are resident per SM at once (its occupancy), which sets the waves.
    repeat: the same kernel launched that many times one after another (a recurrence's steps), the figures
        above being one launch's.
    note: the launch rule and sources, for the reader of `rlx-triton perf`.
    """
    name: str
    bytes_read: int
    bytes_written: int
    flops: float = 0
    unit: str = "fp32_fma"
    chain: Mapping[str, int] = field(default_factory=dict)
    ctas: Optional[int] = None
    repeat: int = 1
    ctas_per_sm: int = 1
    efficiency: float = 1.0
    side_ops: Mapping[str, float] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        if not 0.0 < self.efficiency <= 1.0:
            raise ValueError(f"LibraryKernel {self.name!r}: efficiency must be in (0, 1], got {self.efficiency}")
        if self.ctas_per_sm < 1:
            raise ValueError(f"LibraryKernel {self.name!r}: ctas_per_sm must be >= 1, got {self.ctas_per_sm}")

    @property
    def bytes(self) -> int:
        return int(self.bytes_read) + int(self.bytes_written)
