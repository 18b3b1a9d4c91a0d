"""BackendSpec: what a backend states about itself for the router (name, precedence, probe, families).

Plain data with no dependency on the registry or on any backend, so that each backend package can
declare its `SPEC` and the registry can register `rlx_triton.backends.SPECS` without either importing
the other at import time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple


@dataclass(frozen=True)
class BackendSpec:
    name: str
    precedence: int  # lower is tried first; the library fallback is last
    package: str  # e.g. "rlx_triton.backends.triton"; family modules live at <package>.<family>
    families: Tuple[str, ...]  # family values this backend implements (module names)
    probe: Callable[[object], Optional[str]]  # DeviceFacts -> None if it runs there, else the reason
    is_library: bool = False  # the always-correct torch fallback
    # ops of a family whose kernels live in a sibling module (e.g. conv2d of the conv family in conv2d.py)
    op_modules: Tuple[Tuple[str, str], ...] = ()
    # attributes every family module of this backend defines beyond the protocol (e.g. AUDIT_KERNELS)
    module_attributes: Tuple[str, ...] = ()
    # the module that estimates this backend's time for a routed call (router/speed.py): a kernel backend's
    # `kernel_us(request, route, call, profile)`, the library's `library_us(request, profile)`; None: no estimate
    speed_model: Optional[str] = None

    def module_name(self, family: str, op: Optional[str] = None) -> str:
        return dict(self.op_modules).get(op, family) if op is not None else family
