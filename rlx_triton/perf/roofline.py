"""Occupancy, waves, SM fill and a roofline estimate of one launch on a device profile.

The model is the same for every kernel: the constants come from the profile (rlx_triton/devices.py)
and the assumptions below, which `rlx-triton perf` writes into its JSON. No number here is calibrated
against a measured run.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

ASSUMPTIONS = (
    "uncalibrated: no measured run has scaled these estimates; constants come from the device profile "
    "(rlx_triton/devices.py: datasheet bandwidth and dense peak rates, an assumed launch latency)",
    "a launch moves the bytes its launch record states (each byte once) at the profile's peak bandwidth and "
    "executes its FLOPs at the peak rate of the record's unit; it takes the longer of the two (no overlap loss)",
    "every CTA of a launch does the same share of its bytes and FLOPs",
    "CTAs per SM = min(by registers: 65536 / (registers per warp rounded up to 256 x warps), by shared memory: "
    "shared memory per SM / (CTA shared memory + 1 KB reserved), by warps: warps per SM / warps, the hardware "
    "limit); registers, shared memory and warps are the compiled kernel's",
    "CTAs run in waves of SMs x CTAs per SM; a wave with fewer CTAs than SMs keeps only that many SMs busy, "
    "and its bandwidth and FLOP rate scale with the busy SMs; latency hiding by occupancy is not modelled",
    "sm_fill = busy SMs in the last (full or partial) wave / SMs",
    "est_us = the waves' time + one launch latency per launch (no CUDA graphs, launches do not overlap); "
    "floor_us = bytes at peak bandwidth or FLOPs at peak rate, whichever is longer, all SMs busy, no launch "
    "latency; a case sums its launches",
    "bw_fraction = bytes / est_us / peak bandwidth; null where the FLOP time at peak exceeds the byte time",
    "mma, ldg128: SASS instructions in the kernel's innermost loop (the backward branch holding no other; of "
    "several, the one with the most tensor-core instructions, then FFMA), or in the whole kernel without a loop; "
    "ldg128 counts 128-bit global loads into registers (LDG.E.128) and into shared memory (LDGSTS.128)",
    "plans are built as the compiled kernels launch (triton's interpreter off), routed as on the profile with "
    "no winner table and no tuning",
    "models: launches_per_forward counts the Triton kernel launches of one forward at the bench shape (ops that "
    "run on torch are not counted); host_syncs_per_forward counts .item()/bool() reads, tensors made from host "
    "data and host-device copies in that forward",
    "library path estimate: where a family's torch path states its kernels (backends/torch_ref/<family>.py "
    "`library_kernels(request)`: each kernel's minimum bytes and FLOPs and its unit), each is read with the same "
    "roofline with every SM busy (no occupancy or fill loss) plus one launch latency; the case's estimate is "
    "their sum",
)


@dataclass(frozen=True)
class Occupancy:
    by_registers: int
    by_shared: int
    by_warps: int
    hardware: int
    ctas_per_sm: int

    @property
    def limiter(self) -> str:
        limits = {"registers": self.by_registers, "shared": self.by_shared, "warps": self.by_warps,
                  "hardware": self.hardware}
        return min(limits, key=limits.get)


def occupancy(profile, registers: int, shared: int, num_warps: int) -> Occupancy:
    """Resident CTAs per SM of a kernel on a profile (the CUDA occupancy calculator's rules)."""
    unit = profile.register_alloc_unit
    per_warp = math.ceil(max(1, registers) * 32 / unit) * unit
    by_registers = profile.registers_per_sm // (per_warp * num_warps)
    if shared > profile.shared_per_cta:
        by_shared = 0
    else:
        by_shared = profile.shared_per_sm // (shared + profile.shared_reserved_per_cta)
    by_warps = profile.max_warps_per_sm // num_warps
    hardware = profile.max_ctas_per_sm
    return Occupancy(by_registers, by_shared, by_warps, hardware, min(by_registers, by_shared, by_warps, hardware))


@dataclass
class KernelEstimate:
    """One launch analysed; the first block is what `perf` writes per kernel."""
    name: str
    grid: List[int]
    ctas: int
    ctas_per_sm: Optional[int]
    waves: Optional[float]
    sm_fill: Optional[float]
    regs: Optional[int]
    smem: Optional[int]
    spills: Optional[int]
    mma: Optional[int]
    ldg128: Optional[int]
    bytes: int
    flops: int
    unit: str
    floor_us: float
    est_us: Optional[float]
    # for the printed table
    num_warps: int = 0
    num_stages: int = 0
    scope: str = ""
    ffma: Optional[int] = None
    ldgsts: Optional[int] = None
    limiter: str = ""
    memory_us: float = 0.0
    compute_us: float = 0.0
    error: str = ""

    JSON_KEYS = ("name", "grid", "ctas", "ctas_per_sm", "waves", "sm_fill", "regs", "smem", "spills", "mma",
                 "ldg128", "bytes", "flops", "unit", "floor_us", "est_us")

    def as_json(self) -> dict:
        data = asdict(self)
        return {key: data[key] for key in self.JSON_KEYS}


def _rounded(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(value, digits)


def estimate(launch, compiled, profile) -> KernelEstimate:
    """The analysis of one launch record given its compiled facts (rlx_triton.perf.compiled.Compiled)."""
    memory_s = launch.bytes / profile.bandwidth
    compute_s = launch.flops / profile.peak[launch.unit] if launch.flops else 0.0
    floor_us = max(memory_s, compute_s) * 1e6
    base = dict(name=launch.name, grid=list(launch.grid), ctas=launch.ctas, bytes=launch.bytes,
                flops=int(launch.flops), unit=launch.unit, floor_us=_rounded(floor_us),
                num_stages=int(launch.num_stages), memory_us=memory_s * 1e6, compute_us=compute_s * 1e6)
    if compiled is None or not compiled.ok:
        return KernelEstimate(ctas_per_sm=None, waves=None, sm_fill=None, regs=None, smem=None, spills=None,
                              mma=None, ldg128=None, est_us=None, num_warps=int(launch.num_warps),
                              error=compiled.error if compiled is not None else "not compiled", **base)
    occ = occupancy(profile, compiled.registers, compiled.shared, compiled.num_warps)
    common = dict(regs=compiled.registers, smem=compiled.shared, spills=compiled.spills, mma=compiled.mma,
                  ldg128=compiled.ldg128, num_warps=compiled.num_warps, scope=compiled.scope,
                  ffma=compiled.ffma, ldgsts=compiled.ldgsts, limiter=occ.limiter)
    if occ.ctas_per_sm == 0:
        return KernelEstimate(ctas_per_sm=0, waves=None, sm_fill=None, est_us=None,
                              error=f"does not fit on an SM ({occ.limiter})", **common, **base)
    sms = profile.sm_count
    slots = sms * occ.ctas_per_sm
    ctas = launch.ctas
    full_waves, remainder = divmod(ctas, slots)
    last_wave = remainder if remainder else (slots if ctas else 0)
    sm_fill = min(last_wave, sms) / sms
    seconds = 0.0
    if ctas:
        wave_s = max(memory_s, compute_s) / ctas * slots  # one full wave, every SM busy
        seconds = full_waves * wave_s
        if remainder:  # the partial wave's share of a wave's work, on the SMs it keeps busy
            seconds += wave_s * (remainder / slots) / (min(remainder, sms) / sms)
    est_us = seconds * 1e6 + profile.launch_us
    return KernelEstimate(ctas_per_sm=occ.ctas_per_sm, waves=_rounded(ctas / slots, 4), sm_fill=_rounded(sm_fill, 4),
                          est_us=_rounded(est_us), **common, **base)


@dataclass(frozen=True)
class LibraryKernel:
    """One kernel of a library (torch) path, as a family states it for the library path estimate: the bytes it
    must read and write at least (each byte once) and the FLOPs it must execute, on `unit`."""
    name: str
    bytes_read: int
    bytes_written: int
    flops: int = 0
    unit: str = "fp32_fma"

    @property
    def bytes(self) -> int:
        return int(self.bytes_read) + int(self.bytes_written)


def library_kernel_us(kernel: LibraryKernel, profile) -> tuple:
    """(floor_us, est_us) of one library kernel: the roofline with every SM busy, plus one launch latency."""
    memory_s = kernel.bytes / profile.bandwidth
    compute_s = kernel.flops / profile.peak[kernel.unit] if kernel.flops else 0.0
    floor_us = max(memory_s, compute_s) * 1e6
    return floor_us, floor_us + profile.launch_us


def library_estimate(kernels: Sequence[LibraryKernel], profile) -> dict:
    """The library path estimate of a case: per kernel and summed (see ASSUMPTIONS), JSON-ready."""
    rows = []
    for kernel in kernels:
        floor_us, est_us = library_kernel_us(kernel, profile)
        rows.append({"name": kernel.name, "bytes": kernel.bytes, "flops": int(kernel.flops), "unit": kernel.unit,
                     "floor_us": _rounded(floor_us), "est_us": _rounded(est_us)})
    return {"label": "library path estimate (uncalibrated)", "launches": len(rows),
            "floor_us": _rounded(sum(row["floor_us"] for row in rows)),
            "est_us": _rounded(sum(row["est_us"] for row in rows)), "kernels": rows}


def case_totals(kernels: Sequence[KernelEstimate], profile):
    """(floor_us, est_us, bw_fraction) of a case: sums over its launches (None where any launch has no estimate)."""
    if not kernels:
        return None, None, None
    floor_us = round(sum(k.floor_us for k in kernels), 3)
    if any(k.est_us is None for k in kernels):
        return floor_us, None, None
    est_us = round(sum(k.est_us for k in kernels), 3)
    memory_us = sum(k.memory_us for k in kernels)
    compute_us = sum(k.compute_us for k in kernels)
    total_bytes = sum(k.bytes for k in kernels)
    bw_fraction = None
    if compute_us <= memory_us and est_us > 0:
        bw_fraction = round(total_bytes / (est_us * 1e-6) / profile.bandwidth, 4)
    return floor_us, est_us, bw_fraction
