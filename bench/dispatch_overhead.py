"""Dispatch overhead: an rlx op routed to the torch library op, against calling torch directly, on CPU.

Two cases, both on tiny CPU tensors, alternated in rounds with the direct torch call; the overhead
is the difference of the medians (target: under 10 us):
- repeated: the same call signature again (the exact-signature route cache: no re-validation);
- new signature: every call differs from all earlier ones (a fresh scale each time, standing in for a
  decode step's new KV length), so each call is validated, reduced to a request and looked up in the
  bucketed route cache.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

ROUNDS, CALLS = 15, 400


def _median_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) * 1e6 / calls


def measure(quick: bool = False, fresh: bool = False) -> dict:
    import itertools

    import rlx_triton as rt
    from rlx_triton.config import settings

    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 32, 16), torch.randn(1, 4, 32, 16)
    counter = itertools.count()

    def next_scale():
        return 0.25 + next(counter) * 1e-12 if fresh else 0.25

    def rlx():
        return rt.scaled_dot_product_attention(q, k, v, scale=next_scale())

    def direct():
        return F.scaled_dot_product_attention(q, k, v, scale=next_scale())

    # under the interpreter "auto" would pick the Triton kernel on CPU; the overhead we want is the library route
    backend = "torch" if settings().interpret else "auto"
    with rt.use_backend(backend):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        calls = CALLS // 4 if quick else CALLS
        rlx_times, torch_times = [], []
        for _ in range(ROUNDS // 3 if quick else ROUNDS):
            rlx_times.append(_median_us(rlx, calls))
            torch_times.append(_median_us(direct, calls))
    rlx_us, torch_us = statistics.median(rlx_times), statistics.median(torch_times)
    return {"route": route.backend, "rlx_us": rlx_us, "torch_us": torch_us, "overhead_us": rlx_us - torch_us}


CASES = (("repeated call", False), ("new signature every call", True))


def run(quick: bool = False) -> list:
    from bench.common import case

    rows = []
    for name, fresh in CASES:
        result = measure(quick, fresh)
        rows.append(case("dispatch_overhead", f"sdpa q(1,4,1,16) kv(1,4,32,16) cpu, {name}",
                         torch.float32, result["rlx_us"], "torch.nn.functional.scaled_dot_product_attention",
                         result["torch_us"], backend=result["route"], overhead_us=round(result["overhead_us"], 3)))
    return rows


if __name__ == "__main__":
    for name, fresh in CASES:
        result = measure(fresh=fresh)
        print(f"{name}: route {result['route']}; rlx {result['rlx_us']:.2f} us, torch {result['torch_us']:.2f} us, "
              f"overhead {result['overhead_us']:.2f} us per call")
