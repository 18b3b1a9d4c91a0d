"""The process-wide caches: one bounded, thread-safe LRU type, and the size of every cache that uses it.

Every cache rlx_triton keeps across calls is a `BoundedCache` named in LIMITS, so the sizes a long-running
process can reach are stated here and nowhere else; `sizes()` reads them all (tests and `info` use it).

Rules each cache keeps:
- Bounded: at most LIMITS[name] entries that are not pinned; inserting past the bound evicts the least
  recently used unpinned entry, one at a time (never the whole cache at once).
- Thread-safe: every read and write takes the cache's lock, held only for the dict operation (values are
  built outside it, so a slow build never blocks other callers; two threads that miss the same key at once
  may both build, and the first stored value is the one both return).
- Never evicting what is in use: a value a running call has read stays alive through that call's own
  reference (eviction only drops the cache's); an entry a captured CUDA graph reads is pinned, and pinned
  entries are never evicted and never cleared (a graph may replay for the rest of the process).

Pure Python: the planner and router use it, and neither imports torch.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, Generic, Hashable, List, Optional, Tuple, TypeVar

# entries kept per cache (pinned entries come on top); the one place these sizes are stated
LIMITS: Dict[str, int] = {
    "route_signatures": 4096,   # router: exact op-call signature -> route
    "route_buckets": 4096,      # router: bucketed request signature -> route and its range checks
    "op_decisions": 4096,       # ops: a wrapper's decision handed to its torch.library custom op, by key
    "op_decision_ids": 4096,    # ops: the same decisions' keys, by Route id
    "weight_packs": 1024,       # Triton lstm / segdense / conv / conv2d: packed weights per weight version
    "fbank_constants": 128,     # Triton fbank: window, mel bank and DFT tables per option set and device
    "sinc_filters": 64,         # ops.conv: SincNet filters per parameter version
    "sinc_banks": 256,          # ops.conv: the filter banks sinc_filters built (the symmetric kernel's test)
    "fbank_options": 256,       # ops.fbank: validated option sets (a functools.lru_cache of this size)
    "compiled_options": 256,    # ops._compiled: option strings of compiled calls, parsed (a functools.lru_cache)
    "speed_estimates": 4096,    # perf.route_estimate: estimated time of a request on a candidate or the library op
}

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """An LRU of at most LIMITS[name] unpinned entries, safe for concurrent use (see the module docstring)."""

    def __init__(self, name: str):
        if name not in LIMITS:
            raise ValueError(f"BoundedCache: no limit is stated for {name!r} in rlx_triton.caches.LIMITS")
        self.name = name
        self.limit = LIMITS[name]
        self._entries: "OrderedDict[K, V]" = OrderedDict()
        self._pinned: Dict[K, V] = {}
        self._retired: List[V] = []  # pinned values whose key now names another value
        self._lock = threading.Lock()
        with _registry_lock:
            _registry[name] = self

    def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        # the hit of an unpinned entry hashes the key twice (look up, mark as used): the hot path of every op call
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is not _MISSING:
                self._entries.move_to_end(key)
                return value
            return self._pinned.get(key, default)

    def put(self, key: K, value: V, *, pin: bool = False,
            replace_stale: Optional[Callable[[V], bool]] = None) -> V:
        """Stores `value` unless the key holds one already; returns the stored one (first writer wins). A held
        value that replace_stale(held) calls stale is replaced; a pinned one is kept alive all the same (a
        graph may still read it), outside the cache."""
        with self._lock:
            held = self._pinned.get(key, _MISSING)
            if held is _MISSING:
                held = self._entries.get(key, _MISSING)
            if held is not _MISSING and replace_stale is not None and replace_stale(held):
                if key in self._pinned:
                    self._retired.append(self._pinned.pop(key))
                else:
                    del self._entries[key]
                held = _MISSING
            if held is not _MISSING:
                if pin:
                    self._pin_locked(key, held)
                return held
            if pin:
                self._pinned[key] = value
                return value
            self._entries[key] = value
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
            return value

    def get_or_build(self, key: K, build: Callable[[], V], *, pin: bool = False) -> V:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            return self.put(key, build(), pin=pin)
        if pin:
            self.pin(key)
        return value  # type: ignore[return-value]

    def pin(self, key: K) -> None:
        """Keeps the entry for the rest of the process (a captured graph reads it)."""
        with self._lock:
            value = self._entries.get(key, _MISSING)
            if value is not _MISSING:
                self._pin_locked(key, value)

    def _pin_locked(self, key: K, value: V) -> None:
        self._entries.pop(key, None)
        self._pinned[key] = value

    def clear(self) -> None:
        """Drops every unpinned entry."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries) + len(self._pinned)

    def counts(self) -> Tuple[int, int]:
        """(unpinned entries, pinned entries, retired pinned values included)."""
        with self._lock:
            return len(self._entries), len(self._pinned) + len(self._retired)


_MISSING: Any = object()  # "no entry": None may be a stored value
_registry: Dict[str, BoundedCache] = {}
_registry_lock = threading.Lock()


def sizes() -> Dict[str, Tuple[int, int, int]]:
    """name -> (unpinned entries, pinned entries, limit) of every cache created so far."""
    with _registry_lock:
        caches = dict(_registry)
    return {name: (*cache.counts(), cache.limit) for name, cache in sorted(caches.items())}
