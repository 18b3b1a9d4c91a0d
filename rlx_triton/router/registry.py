"""Backend registry: the backends the router walks (name, precedence, probe, families).

The router never names a backend or a family: it walks what is registered here. The built-in backends
are registered on first use from `rlx_triton.backends.SPECS` (each backend package declares its SPEC as
data); third-party backends and tests add theirs with `register_backend`. A backend's family
modules are imported lazily, only once the backend can run on the device at hand, so that triton is
not imported on machines that cannot use it; each is checked against the family protocol
(router/protocol.py) when it is first loaded. A change of the registered backends is announced to
router/invalidation.py: device facts and remembered routes were read from the backends registered before it.
"""
from __future__ import annotations

import importlib
import threading
from typing import Dict, List, Optional, Tuple, cast

from rlx_triton.router.backend_spec import BackendSpec
from rlx_triton.router.invalidation import Change, changed
from rlx_triton.router.protocol import FamilyModule, KernelFamilyModule, check_family_module

__all__ = ["BackendSpec", "backend", "backends", "family_module", "kernel_family_module", "library_backend",
           "register_backend", "unregister_backend"]


_backends: Dict[str, BackendSpec] = {}
_modules: Dict[Tuple[str, str, Optional[str]], FamilyModule] = {}
_lock = threading.Lock()
_loaded = False


def register_backend(spec: BackendSpec) -> None:
    with _lock:
        _backends[spec.name] = spec
    changed(Change.BACKENDS)


def unregister_backend(name: str) -> None:
    with _lock:
        _backends.pop(name, None)
        for key in [key for key in _modules if key[0] == name]:
            del _modules[key]
    changed(Change.BACKENDS)


def _ensure_loaded() -> None:
    """Registers the built-in backends once; a backend registered under the same name before stays."""
    global _loaded
    if _loaded:
        return
    from rlx_triton import backends as built_in  # on first use: the backends import this package's spec type

    with _lock:
        if not _loaded:
            for spec in built_in.SPECS:
                _backends.setdefault(spec.name, spec)
            _loaded = True
    changed(Change.BACKENDS)


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


def family_module(backend_name: str, family: str, op: Optional[str] = None) -> FamilyModule:
    """The backend's module for one family, or for one op of it (imported and checked against the family
    protocol on first use, so what it lacks is refused then, by name)."""
    key = (backend_name, family, op)
    module = _modules.get(key)
    if module is None:
        spec = backend(backend_name)
        loaded = importlib.import_module(f"{spec.package}.{spec.module_name(family, op)}")
        check_family_module(loaded, backend=spec.name, is_library=spec.is_library, extra=spec.module_attributes)
        module = _modules[key] = cast(FamilyModule, loaded)
    return module


def kernel_family_module(backend_name: str, family: str, op: Optional[str] = None) -> KernelFamilyModule:
    """family_module of a kernel backend (not the library): its routing tables were checked when it loaded."""
    if backend(backend_name).is_library:
        raise ValueError(f"kernel_family_module: backend {backend_name!r} is the library fallback, which states "
                         f"no routing tables; use family_module")
    return cast(KernelFamilyModule, family_module(backend_name, family, op))
