"""Speed decides the route among the eligible kernels and the torch library op.

Coverage and accuracy approval make a kernel eligible (route.py); speed never approves one. Among the eligible
kernels and the library op the fastest runs, by the strongest evidence there is:

1. measured: the winner table holds a winner for the bucket (`rlx-triton tune` times every approved candidate
   and the library op on the GPU): a candidate tag, or `LIBRARY_WINNER` where the library op was fastest;
2. estimated: the perf model prices each eligible kernel's launch plan for this call and the library's kernels
   on the device's profile (rlx_triton.devices), once per bucket, with no device sync;
3. default: neither is available (an unprofiled GPU, no call to plan, triton's compiler missing): the first
   eligible kernel, as the router always did.

Which candidate of a kernel backend is weighed follows the same evidence: a winner-table winner, else a built-in
recipe for the device class, else, where the speed model can price them, the approved candidates ranked by the
plan's ObjectiveWeights (`rank`: latency from the perf model, error from each approval's measured bound, memory
from the bytes the launches move), else the plan's default.

A forced backend (`use_backend("triton")`, RLX_TRITON_BACKEND), strict mode and a pinned candidate take the
kernel without asking (decided_by "forced"); on a CPU or an Apple GPU nothing is estimated (no profile prices
them) and the kernel stays the default.

The estimates come from a speed model the backends name (BackendSpec.speed_model: a module with
`kernel_us(request, route, call, profile)`, `library_us(request, profile)` and, for ranking,
`kernel_cost(request, route, call, profile)` -> (us, bytes)), so the router imports no
analysis code. `call` gives the public op and its arguments (the op passes it when it routes, as a function that returns them,
so a call whose route is remembered builds nothing): the model plans the kernel's launches from it.
"""
from __future__ import annotations

import importlib
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

MEASURED = "measured"
ESTIMATED = "estimated"
DEFAULT = "default"
FORCED = "forced"
DECIDED_BY = (MEASURED, ESTIMATED, DEFAULT, FORCED)

# returns a public op and the arguments of one call of it: what a speed model plans a kernel's launches from
Call = Callable[[], Tuple[Callable[..., Any], tuple, Dict[str, Any]]]


@dataclass(frozen=True)
class Timing:
    """One option the router weighed: a kernel backend's candidate or the library op, with its time.

    backend: "triton", "metal" or "torch"; candidate_tag: the kernel's candidate (None for the library);
    time_us: the measured or estimated time of this call (None where there is none); source: "measured",
    "estimated" or None; chosen: whether the route took it; note: where the time comes from, or why there is
    none."""

    backend: str
    candidate_tag: Optional[str]
    time_us: Optional[float]
    source: Optional[str]
    chosen: bool = False
    note: str = ""

    def __str__(self) -> str:
        what = f"{self.backend} {self.candidate_tag}" if self.candidate_tag else f"{self.backend} (library op)"
        time = f"{self.time_us:.1f} us {self.source}" if self.time_us is not None else "no time"
        mark = " <- chosen" if self.chosen else ""
        note = f" ({self.note})" if self.note else ""
        return f"{what}: {time}{note}{mark}"


_models: Dict[str, Any] = {}
_models_lock = threading.Lock()


def speed_model(module_name: Optional[str]) -> Any:
    """The speed model module a backend names (imported once), or None when it names none or cannot be
    imported here (its analysis needs what this machine lacks)."""
    if not module_name:
        return None
    with _models_lock:
        if module_name not in _models:
            try:
                _models[module_name] = importlib.import_module(module_name)
            except ImportError:
                _models[module_name] = None
        return _models[module_name]


@dataclass(frozen=True)
class Ranked:
    """One approved candidate that nothing has timed, weighed by the plan's ObjectiveWeights.

    latency_us: the perf model's estimate of the call on it; error: its approval's measured bound; memory_bytes:
    the bytes its launches move; terms: (latency, error, memory) as weighed, each relative to the best option
    (latency and memory as ratios, error as 1 + decades above the most accurate); score: the weighted sum, the
    lowest chosen."""

    candidate_tag: str
    latency_us: float
    error: float
    memory_bytes: int
    terms: Tuple[float, float, float]
    score: float
    chosen: bool = False

    def __str__(self) -> str:
        latency, error, memory = self.terms
        mark = " <- chosen" if self.chosen else ""
        return (f"{self.candidate_tag}: latency {self.latency_us:.1f} us (x{latency:.2f}), error {self.error:.1e} "
                f"({error:.2f}), memory {self.memory_bytes / 1e6:.2f} MB (x{memory:.2f}) -> {self.score:.3f}{mark}")


def rank(options: Sequence[Tuple[str, float, float, int]], weights: Any) -> Tuple[Ranked, ...]:
    """The options, (tag, latency_us, error, memory_bytes) in plan order, scored by `weights`
    (planner.ObjectiveWeights): latency and memory relative to the best (ratios >= 1), error in decades above the
    most accurate plus one (a candidate 100x less accurate weighs 3, not 100); the lowest score is chosen, plan
    order breaking ties."""
    best_latency = min(option[1] for option in options)
    best_error = min(option[2] for option in options)
    best_memory = min(option[3] for option in options)
    scored = []
    for tag, latency_us, error, memory_bytes in options:
        terms = (latency_us / best_latency if best_latency > 0 else 1.0,
                 1.0 + (math.log10(error / best_error) if best_error > 0 and error > 0 else 0.0),
                 memory_bytes / best_memory if best_memory > 0 else 1.0)
        score = weights.latency * terms[0] + weights.error * terms[1] + weights.memory * terms[2]
        scored.append(Ranked(tag, latency_us, error, int(memory_bytes), terms, score))
    winner = min(range(len(scored)), key=lambda index: (scored[index].score, index))
    return tuple(replace(option, chosen=index == winner) for index, option in enumerate(scored))
