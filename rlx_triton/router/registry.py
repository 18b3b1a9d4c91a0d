"""Backend registry: each backend package registers itself (name, precedence, probe, families).

The router never names a backend or a family: it walks what is registered here. A backend's family
modules are imported lazily, only once the backend can run on the device at hand, so that triton is
not imported on machines that cannot use it; each is checked against the family protocol
(router/protocol.py) when it is first loaded.
"""
from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

from rlx_triton.router.protocol import check_family_module


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

    def module_name(self, family: str, op: Optional[str] = None) -> str:
        return dict(self.op_modules).get(op, family) if op is not None else family


_backends: Dict[str, BackendSpec] = {}
_modules: Dict[Tuple[str, str, Optional[str]], ModuleType] = {}
_lock = threading.Lock()
_loaded = False


def register_backend(spec: BackendSpec) -> None:
    with _lock:
        _backends[spec.name] = spec
    _forget_routes()


def unregister_backend(name: str) -> None:
    with _lock:
        _backends.pop(name, None)
        for key in [key for key in _modules if key[0] == name]:
            del _modules[key]
    _forget_routes()


def _forget_routes() -> None:
    """Device facts hold a verdict per registered backend, and remembered routes were decided among the
    backends registered then: a change of the backends clears both."""
    from rlx_triton.router.device import clear_device_cache  # both modules import this one
    from rlx_triton.router.route import clear_route_cache

    clear_device_cache()
    clear_route_cache()


def _ensure_loaded() -> None:
    global _loaded
    if not _loaded:
        importlib.import_module("rlx_triton.backends")  # each backend package registers on import
        _loaded = True


def backends() -> List[BackendSpec]:
    """Registered backends in precedence order."""
    _ensure_loaded()
    return sorted(_backends.values(), key=lambda spec: spec.precedence)


def backend(name: str) -> BackendSpec:
    _ensure_loaded()
    return _backends[name]


def library_backend() -> BackendSpec:
    for spec in backends():
        if spec.is_library:
            return spec
    raise LookupError("no library backend is registered")


def family_module(backend_name: str, family: str, op: Optional[str] = None) -> ModuleType:
    """The backend's module for one family, or for one op of it (imported and checked on first use)."""
    key = (backend_name, family, op)
    module = _modules.get(key)
    if module is None:
        spec = backend(backend_name)
        module = importlib.import_module(f"{spec.package}.{spec.module_name(family, op)}")
        check_family_module(module, backend=spec.name, is_library=spec.is_library, extra=spec.module_attributes)
        _modules[key] = module
    return module
