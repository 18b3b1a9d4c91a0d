"""Dispatch overhead: an rlx op routed to the torch library op, against calling torch directly, on CPU.

The rlx call pays for input validation, the request signature and a cached route lookup. Both
sides run on the same tiny CPU tensors, alternated in rounds; the overhead is the difference of
the medians (target: under 10 us).
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


def measure(quick: bool = False) -> dict:
    import rlx_triton as rt
    from rlx_triton.config import settings

    q = torch.randn(1, 4, 1, 16)
    k = torch.randn(1, 4, 32, 16)
    v = torch.randn(1, 4, 32, 16)
    # under the interpreter "auto" would pick the Triton kernel on CPU; the overhead we want is the library route
    backend = "torch" if settings().interpret else "auto"
    with rt.use_backend(backend):
        rlx = lambda: rt.scaled_dot_product_attention(q, k, v)  # noqa: E731
        direct = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        calls = CALLS // 4 if quick else CALLS
        rlx_times, torch_times = [], []
        for _ in range(ROUNDS // 3 if quick else ROUNDS):
            rlx_times.append(_median_us(rlx, calls))
            torch_times.append(_median_us(direct, calls))
    rlx_us, torch_us = statistics.median(rlx_times), statistics.median(torch_times)
    return {"route": route.backend, "rlx_us": rlx_us, "torch_us": torch_us, "overhead_us": rlx_us - torch_us}


def run(quick: bool = False) -> list:
    from bench.common import case

    result = measure(quick)
    return [case("dispatch_overhead", "sdpa q(1,4,1,16) kv(1,4,32,16) cpu", torch.float32, result["rlx_us"],
                 "torch.nn.functional.scaled_dot_product_attention", result["torch_us"],
                 backend=result["route"], overhead_us=round(result["overhead_us"], 3))]


if __name__ == "__main__":
    result = measure()
    print(f"route: {result['route']}; rlx {result['rlx_us']:.2f} us, torch {result['torch_us']:.2f} us, "
          f"overhead {result['overhead_us']:.2f} us per call")
