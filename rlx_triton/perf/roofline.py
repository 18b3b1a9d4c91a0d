"""The roofline model of a launch on a device profile: occupancy, waves, SM fill and the time its terms take.

The model is the same for every kernel and names none (rlx_triton.perf.launch_estimate reads a launch's
loop structure and prices it here; the kernels read their occupancy here): per wave the longest of memory (bytes at the profile's achievable
bandwidth), compute (FLOPs at the unit's peak) and issue (warp instructions over the SMs' schedulers),
then the launch's latency chain and one launch latency. The constants come from the profile
(rlx_triton/devices.py) and the assumptions below, which `rlx-triton perf` writes into its JSON;
`kernel_time` prices a launch's terms at any constants, which is what est_low_us / est_high_us and
`rlx-triton perf --calibrate` (rlx_triton.perf.calibrate) re-evaluate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel  # the records library_estimate reads
from rlx_triton.devices import Occupancy, occupancy, sustained_peak  # the occupancy calculator the estimates use

ASSUMPTIONS = (
    "uncalibrated unless the profile says calibrated: constants come from the device profile "
    "(rlx_triton/devices.py: datasheet and achievable bandwidth, dense peak rates, SM clock, latency ranges from "
    "public microbenchmarks, an assumed launch latency of 3-5 us) and are the same for every kernel",
    "memory: a launch moves the bytes its launch record states (each byte once) at the profile's achievable "
    "bandwidth (a device-to-device copy's); compute: its FLOPs at the peak rate of the record's unit",
    "issue: every warp executes the kernel's straight-line SASS once and each loop's own instructions once per "
    "pass; passes per CTA come from the launch record where rlx_triton/perf/structure.py states them, else the "
    "loop doing the most work per pass does all the launch's FLOPs (bytes) and every other loop one pass; a "
    "scheduler (4 per SM) issues at most one warp instruction per cycle at the profile's clock, and one warp "
    "one per issue_interval cycles, so fewer warps per scheduler than issue_interval issue proportionally less",
    "every CTA of a launch does the same share of its bytes, FLOPs and instructions",
    "CTAs per SM = min(by registers: 65536 / (registers per warp rounded up to 256 x warps), by shared memory: "
    "shared memory per SM / (CTA shared memory + 1 KB reserved), by warps: warps per SM / warps, the hardware "
    "limit); registers, shared memory and warps are the compiled kernel's",
    "CTAs run in waves of SMs x CTAs per SM; a wave with fewer CTAs than SMs keeps only that many SMs busy, "
    "and its bandwidth, FLOP and issue rates scale with the busy SMs; a wave takes the longest of its memory, "
    "compute and issue times (no overlap loss)",
    "latency chain: the dependent steps a launch cannot overlap (serial merge round trips; a recurrence's previous "
    "state handed through L2 and the CTA barriers of each step; rlx_triton/perf/structure.py), each priced at the "
    "profile's latency of its kind (L2 hit, HBM, global atomic, CTA barrier), added after the waves",
    "sm_fill = busy SMs in the last (full or partial) wave / SMs",
    "est_us = the waves' time + the chain + one launch latency per launch (no CUDA graphs, launches do not "
    "overlap); est_low_us / est_high_us: the same with every constant at the fast / slow end of its range "
    "(bandwidth: datasheet / achievable); floor_us = bytes at datasheet bandwidth or FLOPs at peak rate, "
    "whichever is longer, all SMs busy, no launch latency; a case sums its launches",
    "bound: the largest of the launch's memory, compute and issue times summed over its waves, or latency where "
    "its chain is longer than each of them",
    "bw_fraction = bytes / est_us / achievable bandwidth; null where the FLOP time at peak exceeds the byte time",
    "mma, ldg128: SASS instructions of the loop executing the most instructions (its own instructions x passes; "
    "spin loops, a barrier's poll, are listed apart in spin_loops), or of the whole kernel without a loop; "
    "ldg128 counts 128-bit global loads into registers (LDG.E.128) and into shared memory (LDGSTS.128)",
    "plans are built as the compiled kernels launch (triton's interpreter off), routed as on the profile with "
    "no winner table and no tuning",
    "models: launches_per_forward counts the Triton kernel launches of one forward at the bench shape (ops that "
    "run on torch are not counted); host_syncs_per_forward counts .item()/bool() reads, tensors made from host "
    "data and host-device copies in that forward",
    "library path estimate: the kernels torch launches for each routed call (backends/torch_ref/<family>.py "
    "`library_kernels(request, profile)`, modelled by their launch rules in rlx_triton/perf/library: grid, resident "
    "CTAs per SM, the main loop's unit and the fraction of its rate that instruction class reaches, the work beside "
    "the loop that does not overlap it, the latency chain), read with the same constants: waves of SMs x resident "
    "CTAs, each the longest of its memory and compute time (no issue term: no SASS), plus the chain and one launch "
    "latency per launch; the case's estimate is their sum",
    "tensor-core rates: the datasheet peak times the profile's tensor_sustained (the clock a long tensor-core kernel "
    "keeps; measured on an H200), for Triton launches and library kernels alike; floors use the datasheet peak",
)

# est_low_us, est_us, est_high_us: each constant at the fast end, its nominal value, its slow end
RANGE_ENDS = ("low", "nominal", "high")


def constants(profile, end: str = "nominal") -> dict:
    """The model's constants of a profile at one end of their ranges (RANGE_ENDS): bandwidth (bytes/s), launch
    (us), clock (Hz), schedulers, and the latency constants (ns; issue_interval in cycles)."""
    which = RANGE_ENDS.index(end)
    bandwidth = {"low": profile.bandwidth, "nominal": profile.achievable_bw, "high": profile.achievable_bw}[end]
    launch = profile.launch_us * (0.75, 1.0, 1.25)[which]
    values = {"bandwidth": bandwidth, "launch_us": launch, "clock_hz": profile.clock_hz or 1.5e9,
              "schedulers": profile.schedulers_per_sm}
    for key, span in profile.latency.items():
        values[key] = span[which]
    return values


@dataclass
class KernelTerms:
    """What a launch's time is made of, independent of the constants (kernel_time prices it): the model
    re-evaluates these for the range ends and for calibration."""
    bytes: int
    flops: float
    peak: float                     # FLOP/s of the unit (the profile's datasheet rate)
    sms: int
    ctas: int
    waves: List[tuple]              # (number of such waves, CTAs in each)
    warps: int = 0
    warp_instructions: float = 0.0  # per warp (straight-line code + loops' own instructions x passes)
    chain: Dict[str, int] = field(default_factory=dict)
    launches: int = 1


def kernel_time(terms: KernelTerms, values: dict) -> dict:
    """{"memory_us", "compute_us", "issue_us", "chain_us", "est_us", "bound"} of one launch at `values` (constants())."""
    memory_s = terms.bytes / values["bandwidth"]
    compute_s = terms.flops / terms.peak if terms.flops else 0.0
    memory = compute = issue = waves_s = 0.0
    ctas = max(1, terms.ctas)
    rate_per_warp = 1.0 / max(values.get("issue_interval", 1.0), 1e-9)
    for count, in_wave in terms.waves:
        busy = min(in_wave, terms.sms)
        scale = terms.sms / busy
        wave_memory = memory_s * in_wave / ctas * scale
        wave_compute = compute_s * in_wave / ctas * scale
        wave_issue = 0.0
        if terms.warp_instructions and terms.warps:
            warps_per_scheduler = in_wave / busy * terms.warps / values["schedulers"]
            issue_rate = min(1.0, warps_per_scheduler * rate_per_warp)   # per scheduler, instructions per cycle
            wave_issue = (terms.warp_instructions * in_wave / busy * terms.warps
                          / (values["schedulers"] * values["clock_hz"] * issue_rate))
        memory += count * wave_memory
        compute += count * wave_compute
        issue += count * wave_issue
        waves_s += count * max(wave_memory, wave_compute, wave_issue)
    chain_us = sum(steps * values[kind] for kind, steps in terms.chain.items()) / 1000.0
    parts = {"memory": memory * 1e6, "compute": compute * 1e6, "issue": issue * 1e6}
    bound = max(parts, key=lambda name: parts[name])
    if chain_us > parts[bound]:
        bound = "latency"
    return {"memory_us": parts["memory"], "compute_us": parts["compute"], "issue_us": parts["issue"],
            "chain_us": chain_us, "est_us": waves_s * 1e6 + chain_us + terms.launches * values["launch_us"],
            "bound": bound}


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
    issue_us: Optional[float] = None
    chain_steps: Dict[str, int] = field(default_factory=dict)
    chain_us: float = 0.0
    bound: Optional[str] = None
    est_low_us: Optional[float] = None
    est_high_us: Optional[float] = None
    warp_instructions: Optional[int] = None
    spin_loops: List[dict] = field(default_factory=list)
    trips_rule: str = ""
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
    terms: Optional[KernelTerms] = None

    JSON_KEYS = ("name", "grid", "ctas", "ctas_per_sm", "waves", "sm_fill", "regs", "smem", "spills", "mma",
                 "ldg128", "bytes", "flops", "unit", "floor_us", "est_us", "issue_us", "chain_steps", "chain_us",
                 "bound", "est_low_us", "est_high_us", "warp_instructions", "spin_loops", "trips_rule")

    def as_json(self) -> dict:
        data = asdict(self)
        return {key: data[key] for key in self.JSON_KEYS}


def rounded(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(value, digits)


def wave_shape(ctas: int, slots: int) -> List[tuple]:
    """(number of waves, CTAs in each) of a grid: its full waves of `slots` CTAs, then the partial one."""
    full, remainder = divmod(ctas, slots)
    shape = [(full, slots)] if full else []
    if remainder:
        shape.append((1, remainder))
    return shape


def priced(terms: KernelTerms, profile) -> dict:
    """kernel_time of a launch at the nominal constants, with est_low_us / est_high_us from the range ends."""
    result = kernel_time(terms, constants(profile, "nominal"))
    result["est_low_us"] = kernel_time(terms, constants(profile, "low"))["est_us"]
    result["est_high_us"] = kernel_time(terms, constants(profile, "high"))["est_us"]
    return result


def library_terms(kernel: LibraryKernel, profile) -> KernelTerms:
    """A library kernel's terms: its stated CTAs (every SM once where none are stated) in waves of SMs x its
    resident CTAs per SM, its main loop at its efficiency of the unit's sustained rate with the work beside the
    loop added (no overlap), no issue term (its SASS is not read), its chain; `repeat` launches of all of it."""
    repeat = max(1, int(kernel.repeat))
    slots = profile.sm_count * max(1, int(kernel.ctas_per_sm))
    ctas = slots if kernel.ctas is None else max(1, int(kernel.ctas))
    chain = {kind: steps * repeat for kind, steps in kernel.chain.items()}
    rate = sustained_peak(profile, kernel.unit) * kernel.efficiency
    compute_s = float(kernel.flops) / rate if kernel.flops else 0.0
    compute_s += sum(ops / sustained_peak(profile, unit) for unit, ops in kernel.side_ops.items())
    # the terms carry one rate: the loop's FLOPs over the time the loop and the work beside it take together
    flops = float(kernel.flops) if kernel.flops else compute_s * rate
    peak = flops / compute_s if compute_s else rate
    return KernelTerms(bytes=kernel.bytes * repeat, flops=flops * repeat, peak=peak,
                       sms=profile.sm_count, ctas=ctas * repeat,
                       waves=[(count * repeat, size) for count, size in wave_shape(ctas, slots)],
                       chain=chain, launches=repeat)


def library_kernel_us(kernel: LibraryKernel, profile) -> tuple:
    """(floor_us, est_us) of one library kernel: bytes at datasheet bandwidth or FLOPs at the datasheet peak; and
    the model's nominal time (library_terms at the nominal constants)."""
    repeat = max(1, int(kernel.repeat))
    memory_s = kernel.bytes * repeat / profile.bandwidth
    compute_s = kernel.flops * repeat / profile.peak[kernel.unit] if kernel.flops else 0.0
    floor_us = max(memory_s, compute_s) * 1e6
    return floor_us, kernel_time(library_terms(kernel, profile), constants(profile))["est_us"]


def library_estimate(kernels: Sequence[LibraryKernel], profile) -> dict:
    """The library path estimate of a case: per kernel and summed (see ASSUMPTIONS), JSON-ready."""
    rows = []
    for kernel in kernels:
        floor_us, _ = library_kernel_us(kernel, profile)
        times = priced(library_terms(kernel, profile), profile)
        rows.append({"name": kernel.name, "launches": max(1, int(kernel.repeat)), "bytes": kernel.bytes,
                     "flops": int(kernel.flops), "unit": kernel.unit,
                     "floor_us": rounded(floor_us), "est_us": rounded(times["est_us"]),
                     "est_low_us": rounded(times["est_low_us"]), "est_high_us": rounded(times["est_high_us"]),
                     "chain_steps": dict(kernel.chain), "chain_us": rounded(times["chain_us"]),
                     "bound": times["bound"], "ctas": library_terms(kernel, profile).ctas // max(1, int(kernel.repeat)),
                     "ctas_per_sm": int(kernel.ctas_per_sm), "efficiency": kernel.efficiency,
                     "side_ops": dict(kernel.side_ops), "note": kernel.note})
    label = "library path estimate" + ("" if profile.calibrated else " (uncalibrated)")
    return {"label": label, "launches": sum(max(1, int(kernel.repeat)) for kernel in kernels),
            "floor_us": rounded(sum(row["floor_us"] for row in rows)),
            "est_us": rounded(sum(row["est_us"] for row in rows)),
            "est_low_us": rounded(sum(row["est_low_us"] for row in rows)),
            "est_high_us": rounded(sum(row["est_high_us"] for row in rows)), "kernels": rows}


def case_totals(kernels: Sequence[KernelEstimate],
                profile) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(floor_us, est_us, bw_fraction) of a case: sums over its launches (None where any launch has no estimate)."""
    if not kernels:
        return None, None, None
    floor_us = round(sum(k.floor_us for k in kernels), 3)
    estimates = [k.est_us for k in kernels]
    if any(value is None for value in estimates):
        return floor_us, None, None
    est_us = round(sum(value or 0.0 for value in estimates), 3)
    memory_us = sum(k.memory_us for k in kernels)
    compute_us = sum(k.compute_us for k in kernels)
    total_bytes = sum(k.bytes for k in kernels)
    bw_fraction = None
    if compute_us <= memory_us and est_us > 0:
        bw_fraction = round(total_bytes / (est_us * 1e-6) / profile.achievable_bw, 4)
    return floor_us, est_us, bw_fraction


def case_range(kernels: Sequence[KernelEstimate]) -> tuple:
    """(est_low_us, est_high_us) of a case: sums over its launches (None where any launch has no estimate)."""
    if not kernels or any(k.est_low_us is None or k.est_high_us is None for k in kernels):
        return None, None
    return (round(sum(float(k.est_low_us or 0.0) for k in kernels), 3),
            round(sum(float(k.est_high_us or 0.0) for k in kernels), 3))
