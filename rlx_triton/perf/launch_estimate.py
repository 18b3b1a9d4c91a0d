"""The estimate of one launch record on a device profile: its compiled facts read with its kernel's loop
structure (rlx_triton.perf.structure: passes per loop, latency chain) and priced by the roofline model
(rlx_triton.perf.roofline: occupancy, waves, SM fill, memory / compute / issue / chain times).

The roofline model knows no kernel; the structure tables name kernels and read their constants. This module
joins the two, so the kernels may ask the roofline model (their occupancy on a profile) without reaching
back to themselves.
"""
from __future__ import annotations

from typing import Optional, Sequence

from rlx_triton.devices import sustained_peak
from rlx_triton.perf.roofline import KernelEstimate, KernelTerms, occupancy, priced, rounded, wave_shape
from rlx_triton.perf.structure import chain_steps, loop_trips


def _selected_loop(loops: Sequence[dict], trips: Sequence[float]) -> Optional[int]:
    """The loop executing the most instructions: its own instructions x passes (spin loops aside)."""
    work = [i for i, loop in enumerate(loops) if not loop["spin"]]
    if not work:
        return None
    return max(work, key=lambda i: (loops[i]["own"] * trips[i], loops[i]["own"]))


def estimate(launch, compiled, profile) -> KernelEstimate:
    """The analysis of one launch record given its compiled facts (rlx_triton.perf.compiled.Compiled)."""
    memory_s = launch.bytes / profile.bandwidth
    compute_s = launch.flops / profile.peak[launch.unit] if launch.flops else 0.0
    floor_us = max(memory_s, compute_s) * 1e6
    base = dict(name=launch.name, grid=list(launch.grid), ctas=launch.ctas, bytes=launch.bytes,
                flops=int(launch.flops), unit=launch.unit, floor_us=rounded(floor_us),
                num_stages=int(launch.num_stages))
    if compiled is None or not compiled.ok:
        return KernelEstimate(ctas_per_sm=None, waves=None, sm_fill=None, regs=None, smem=None, spills=None,
                              mma=None, ldg128=None, est_us=None, num_warps=int(launch.num_warps),
                              error=compiled.error if compiled is not None else "not compiled", **base)
    occ = occupancy(profile, compiled.registers, compiled.shared, compiled.num_warps)
    loops = list(compiled.loops)
    trips, rule = loop_trips(launch, loops, compiled.num_warps)
    selected = _selected_loop(loops, trips)
    mix = dict(mma=compiled.mma, ldg128=compiled.ldg128, ffma=compiled.ffma, ldgsts=compiled.ldgsts,
               scope=compiled.scope)
    if selected is not None:
        loop = loops[selected]
        mix = dict(mma=loop["mma"], ldg128=loop["ldg128"], ffma=loop["ffma"], ldgsts=loop["ldgsts"], scope="loop")
    straight = compiled.kernel_instructions - sum(loop["own"] for loop in loops)
    per_warp = max(0, straight) + sum(loop["own"] * t for loop, t in zip(loops, trips) if not loop["spin"])
    spin = [{"start": loop["start"], "size": loop["own"]} for loop in loops if loop["spin"]]
    common = dict(regs=compiled.registers, smem=compiled.shared, spills=compiled.spills, num_warps=compiled.num_warps,
                  limiter=occ.limiter, spin_loops=spin, trips_rule=rule, **mix)
    if occ.ctas_per_sm == 0:
        return KernelEstimate(ctas_per_sm=0, waves=None, sm_fill=None, est_us=None,
                              error=f"does not fit on an SM ({occ.limiter})", **common, **base)
    sms = profile.sm_count
    slots = sms * occ.ctas_per_sm
    ctas = launch.ctas
    remainder = ctas % slots
    last_wave = remainder if remainder else (slots if ctas else 0)
    sm_fill = min(last_wave, sms) / sms
    chain = chain_steps(launch, loops)
    terms = KernelTerms(bytes=launch.bytes, flops=float(launch.flops), peak=sustained_peak(profile, launch.unit), sms=sms,
                        ctas=ctas, waves=wave_shape(ctas, slots), warps=compiled.num_warps,
                        warp_instructions=float(per_warp), chain=chain)
    times = priced(terms, profile)
    return KernelEstimate(ctas_per_sm=occ.ctas_per_sm, waves=rounded(ctas / slots, 4), sm_fill=rounded(sm_fill, 4),
                          est_us=rounded(times["est_us"]), issue_us=rounded(times["issue_us"]), chain_steps=chain,
                          chain_us=round(times["chain_us"], 3), bound=times["bound"],
                          est_low_us=rounded(times["est_low_us"]), est_high_us=rounded(times["est_high_us"]),
                          warp_instructions=int(round(per_warp * compiled.num_warps * ctas)),
                          memory_us=times["memory_us"], compute_us=times["compute_us"], terms=terms,
                          **common, **base)
