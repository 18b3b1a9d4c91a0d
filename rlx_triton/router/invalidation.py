"""When the router's remembered decisions go stale, and who forgets them then.

The router remembers device facts per device (router/device.py: each registered backend's verdict) and routes
per request signature (router/route.py). Two changes make them stale: the registered backends change
(router/registry.py), and `routing_as` changes the facts a device reports (router/device.py). Each cache
states here which changes it must forget, and the module where a change happens announces it, so the
registry, the device facts and route() each import only the modules below them.
"""
from __future__ import annotations

import enum
import threading
from typing import Callable, Dict, List


class Change(enum.Enum):
    BACKENDS = "the registered backends changed"
    DEVICE_VIEW = "routing_as changed the facts a device reports"


_forgetters: Dict[Change, List[Callable[[], None]]] = {change: [] for change in Change}
_lock = threading.Lock()


def forget_on(change: Change, forget: Callable[[], None]) -> None:
    """Calls `forget` (a cache's clear) whenever `change` happens."""
    with _lock:
        if forget not in _forgetters[change]:
            _forgetters[change].append(forget)


def changed(change: Change) -> None:
    """Announces a change: every cache stated for it forgets what it holds."""
    with _lock:
        forgetters = list(_forgetters[change])
    for forget in forgetters:
        forget()
