"""The speed model the router asks when it weighs a kernel against the library op (router/speed.py).

`kernel_us(request, route, call, profile)`: the call's launches on the route's candidate, planned from meta
copies of its arguments (nothing is allocated or run), compiled for the profile's architecture with the ptxas
in the triton wheel (cached on disk, as `rlx-triton perf` caches them) and priced by the roofline model: the
same numbers `rlx-triton perf` reports for the call. `library_us(request, profile)`: the torch path's kernels
for the request (backends/torch_ref/<family>.py `library_kernels`) priced with the same constants.

Both are computed once per request and kept (caches.LIMITS "speed_estimates"); neither reads a device value or
waits for the device. None means "no estimate": the call could not be planned (an op launched outside the
executor, a launch that does not compile), the family states no library kernels or the library models do not
cover the request (rlx_triton.perf.library.Unmodelled), triton is not installed, or the
process runs triton's interpreter (TRITON_INTERPRET=1: its kernels cannot be compiled here, and nothing in such a
process runs on a GPU), where the router keeps its default.
"""
from __future__ import annotations

import contextlib
from typing import Any, List, Optional, Tuple

import torch

from rlx_triton.caches import BoundedCache

_estimates: BoundedCache[tuple, Any] = BoundedCache("speed_estimates")   # (us, bytes) of a kernel, us of the library
_NOTHING = -1.0   # no estimate is negative: what get() returns for a key it does not hold


@contextlib.contextmanager
def _no_outer_modes():
    """Outside any torch function or dispatch mode of the caller (a perf trace counting host syncs): the plan is
    the model's own business."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction():
        yield


def plan_call(call, decided, facts) -> Optional[List[Any]]:
    """The launch records of `call` (router.speed.Call: returns the op and its arguments) run on `decided`'s
    kernel as on `facts`' device, or None where the call launches a kernel outside the executor (no plan)."""
    from rlx_triton.backends.triton import launches
    from rlx_triton.perf.trace import meta_copy
    from rlx_triton.router.device import routing_as
    from rlx_triton.router.route import planning_with

    op, args, kwargs = call()
    with _no_outer_modes():
        meta_args, meta_kwargs = meta_copy(tuple(args)), meta_copy(dict(kwargs))
    with contextlib.ExitStack() as stack:
        stack.enter_context(routing_as(facts, announce=False))
        stack.enter_context(planning_with(decided))
        log = stack.enter_context(launches.planning_apart())
        stack.enter_context(torch.inference_mode())
        stack.enter_context(_no_outer_modes())
        op(*meta_args, **meta_kwargs)
    if log.outside or not log.records:
        return None
    return list(log.records)


def estimate_records(records, profile) -> Optional[float]:
    """The records' summed estimate (each configuration compiled once, in this process:
    perf.compiled.compiled_in_process); None if any configuration fails."""
    cost = cost_of_records(records, profile)
    return None if cost is None else cost[0]


def cost_of_records(records, profile) -> Optional[Tuple[float, int]]:
    """(summed estimate in us, bytes moved) of the records; None if any configuration fails."""
    from rlx_triton.perf.compiled import CompileJob, compiled_in_process
    from rlx_triton.perf.launch_estimate import estimate

    jobs = [CompileJob.of(record, profile.arch_number) for record in records]
    compiled = compiled_in_process(jobs)
    total, moved = 0.0, 0
    for record, job in zip(records, jobs):
        estimated = estimate(record, compiled.get(job), profile)
        if estimated.est_us is None:
            return None
        total += estimated.est_us
        moved += int(record.bytes)
    return total, moved


def kernel_us(request, decided, call, profile) -> Optional[float]:
    """The estimated time of `call` on `decided`'s kernel on `profile`'s GPU (see the module docstring)."""
    cost = kernel_cost(request, decided, call, profile)
    return None if cost is None else cost[0]


def kernel_cost(request, decided, call, profile) -> Optional[Tuple[float, int]]:
    """(estimated time in us, bytes its launches move) of `call` on `decided`'s kernel on `profile`'s GPU: what
    the router's ranking of untimed candidates weighs (router/speed.py `rank`)."""
    if call is None or decided.backend != "triton" or profile.arch_number is None:
        return None
    from rlx_triton.config import settings

    if settings().interpret:
        return None
    key = ("kernel", request, decided.candidate_tag, profile.key, profile.calibrated)
    held = _estimates.get(key, _NOTHING)
    if held is not _NOTHING:
        return held
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    from rlx_triton.router.device import profile_facts

    try:
        records = plan_call(call, decided, profile_facts(profile))
    except Exception:   # a call that cannot be planned on meta tensors has no estimate; the call itself still runs
        records = None
    try:
        value = cost_of_records(records, profile) if records else None
    except Exception:   # a kernel that cannot be compiled here (no ptxas, an unsupported arch) has no estimate
        value = None
    return _estimates.put(key, value)


def library_us(request, profile) -> Optional[float]:
    """The estimated time of the torch path's kernels for `request` on `profile`'s GPU, or None."""
    key = ("library", request, profile.key, profile.calibrated)
    held = _estimates.get(key, _NOTHING)
    if held is not _NOTHING:
        return held
    from rlx_triton.perf.roofline import library_estimate
    from rlx_triton.router import registry

    module = registry.family_module(registry.library_backend().name, request.family, request.op)
    stated = getattr(module, "library_kernels", None)
    value = None
    if stated is not None:
        from rlx_triton.perf.library import Unmodelled

        try:
            kernels = stated(request, profile)
        except Unmodelled:   # a dtype or shape the library models do not cover: no estimate, the default decides
            kernels = []
        value = float(library_estimate(kernels, profile)["est_us"]) if kernels else None
    return _estimates.put(key, value)
