"""Speed decides the route among the eligible kernels and the torch library op.

Coverage and accuracy approval make a kernel eligible (route.py); speed never approves one. Among the eligible
kernels and the library op the fastest runs, by the strongest evidence there is:

1. measured: the winner table holds a winner for the bucket (`rlx-triton tune` times every approved candidate
   and the library op on the GPU): a candidate tag, or `LIBRARY_WINNER` where the library op was fastest;
2. estimated: the perf model prices each eligible kernel's launch plan for this call and the library's kernels
   on the device's profile (rlx_triton.devices), once per bucket, with no device sync;
3. default: neither is available (an unprofiled GPU, no call to plan, triton's compiler missing): the first
   eligible kernel, as the router always did.

A forced backend (`use_backend("triton")`, RLX_TRITON_BACKEND), strict mode and a pinned candidate take the
kernel without asking (decided_by "forced"); on a CPU or an Apple GPU nothing is estimated (no profile prices
them) and the kernel stays the default.

The estimates come from a speed model the backends name (BackendSpec.speed_model: a module with
`kernel_us(request, route, call, profile)` and `library_us(request, profile)`), so the router imports no
analysis code. `call` gives the public op and its arguments (the op passes it when it routes, as a function that returns them,
so a call whose route is remembered builds nothing): the model plans the kernel's launches from it.
"""
from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

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
