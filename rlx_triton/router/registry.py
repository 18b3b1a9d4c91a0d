"""Backend registry: the backends the router walks (name, precedence, probe, families).

The router never names a backend or a family: it walks what is registered here. The built-in backends
are registered on first use from `rlx_triton.backends.SPECS` (each backend package declares its SPEC as
data); third-party backends and tests add theirs with `register_backend`. A backend's family
modules are imported lazily, only once the backend can run on the device at hand, so that triton is
not imported on machines that cannot use it; each is checked against the family protocol
(router/protocol.py) when it is first loaded.
"""
from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Dict, List, Optional, Tuple

from rlx_triton.router.backend_spec import BackendSpec
from rlx_triton.router.protocol import check_family_module

__all__ = ["BackendSpec", "backend", "backends", "family_module", "library_backend", "register_backend",
           "unregister_backend"]


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
    _forget_routes()


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
