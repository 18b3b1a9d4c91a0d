"""Dispatch overhead: an rlx op routed to the torch library op, against calling torch directly, on CPU.

Two cases, both on tiny CPU tensors, alternated in rounds with the direct torch call (both sides make the
same calls, back to back); the overhead is the difference of the medians, and the ratio is the median of the
rounds' ratios, rlx over torch: pairing each round with its neighbour keeps a slow stretch of a shared machine
out of the ratio (its rows have the metric "dispatch_overhead": a wrapper is never faster than what it wraps,
so they claim no speedup):
- repeated: the same call signature again (the exact-signature route cache: no re-validation); target
  <= 1.25x the direct call;
- new KV length every call: a decode step, each call one key longer than the last, so no call's exact
  signature was seen before and each reuses its KV-length bucket's decision after checking only what the
  length touches; target <= 1.5x the direct call.
"""
from __future__ import annotations

import statistics
import time
from typing import List, Optional

import torch
import torch.nn.functional as F

# a growing KV length makes torch's own call slower: fewer calls per round keep the lengths short
ROUNDS, CALLS, GROWING_CALLS = 31, 400, 100


def measure(quick: bool = False, growing: bool = False) -> dict:
    import rlx_triton as rt
    from bench.common import Timing
    from rlx_triton.config import settings

    rounds = ROUNDS // 3 if quick else ROUNDS
    calls = GROWING_CALLS if growing else CALLS
    calls = calls // 4 if quick else calls
    first = 32
    q = torch.randn(1, 4, 1, 16)
    k_cache, v_cache = torch.randn(1, 4, first + rounds * calls, 16), torch.randn(1, 4, first + rounds * calls, 16)

    def lengths(round_index: int):
        # each round's calls: the same lengths on both sides; growing, every length is used by one round only
        if not growing:
            return [first] * calls
        return range(first + round_index * calls, first + (round_index + 1) * calls)

    def timed(fn, round_index: int) -> float:
        views = [(k_cache[:, :, :n], v_cache[:, :, :n]) for n in lengths(round_index)]
        start = time.perf_counter()
        for k, v in views:
            fn(q, k, v)
        return (time.perf_counter() - start) * 1e6 / len(views)

    def rlx(q, k, v):
        return rt.scaled_dot_product_attention(q, k, v, scale=0.25)

    def direct(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.25)

    # under the interpreter "auto" would pick the Triton kernel on CPU; the overhead we want is the library route
    backend = "torch" if settings().interpret else "auto"
    with rt.use_backend(backend):
        route = rt.explain(rt.scaled_dot_product_attention, q, k_cache[:, :, :first], v_cache[:, :, :first])
        rlx_times, torch_times = [], []
        for round_index in range(rounds):
            rlx_times.append(timed(rlx, round_index))
            torch_times.append(timed(direct, round_index))
    rlx_us, torch_us = Timing.of(rlx_times), Timing.of(torch_times)
    ratio = statistics.median(mine / theirs for mine, theirs in zip(rlx_times, torch_times))
    return {"route": route.backend, "rlx_us": rlx_us, "torch_us": torch_us, "overhead_us": rlx_us - torch_us,
            "ratio": ratio}


CASES = (("repeated call", False), ("new KV length every call", True))


def cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """Case descriptions: name and whether the KV length grows; the same on every device (CPU tensors)."""
    return [dict(case=name, growing=growing) for name, growing in CASES]


def run(quick: bool = False, progress=None) -> list:
    """One row per case; progress (optional) counts each case (bench.common.each_case)."""
    from bench.common import case, each_case

    rows = []
    for spec in each_case("dispatch_overhead", cases(quick), progress):
        name = spec["case"]
        result = measure(quick, spec["growing"])
        rows.append(case("dispatch_overhead", f"sdpa q(1,4,1,16) kv(1,4,32,16) cpu, {name}",
                         torch.float32, result["rlx_us"], "torch.nn.functional.scaled_dot_product_attention",
                         result["torch_us"], metric="dispatch_overhead", backend=result["route"],
                         overhead_us=round(result["overhead_us"], 3)))
    return rows


if __name__ == "__main__":
    for name, growing in CASES:
        result = measure(growing=growing)
        print(f"{name}: route {result['route']}; rlx {result['rlx_us']:.2f} us, torch {result['torch_us']:.2f} us, "
              f"overhead {result['overhead_us']:.2f} us per call ({result['ratio']:.2f}x)")
