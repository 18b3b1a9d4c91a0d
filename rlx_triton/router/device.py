"""Device facts: what the router needs to know about the device a tensor lives on, computed once.

Kind (cuda, mps, cpu), name, compute capability, SM count, memory, which registered backends run
there (each backend's own probe: triton needs CUDA, or CPU tensors under TRITON_INTERPRET=1; Metal
needs a compile-and-run smoke test to pass), a device class for built-in recipes ("sm90", "sm80",
"cuda", "mps", "interpreter", "cpu") and a stable fingerprint for winner-table keys.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from rlx_triton.router import registry


@dataclass(frozen=True)
class DeviceFacts:
    kind: str
    index: Optional[int]
    name: str
    capability: Optional[Tuple[int, int]]
    sm_count: Optional[int]
    memory_bytes: Optional[int]
    device_class: str
    fingerprint: str
    backend_reasons: Tuple[Tuple[str, Optional[str]], ...] = ()  # (backend, None if it runs here else why not)

    def unavailable_reason(self, backend: str) -> Optional[str]:
        for name, reason in self.backend_reasons:
            if name == backend:
                return reason
        return f"backend {backend!r} is not registered"

    @property
    def triton_ok(self) -> bool:
        return self.unavailable_reason("triton") is None

    @property
    def metal_ok(self) -> bool:
        return self.unavailable_reason("metal") is None


def _hardware(kind: str, index: Optional[int]) -> DeviceFacts:
    from rlx_triton.config import settings

    capability = sm_count = memory = None
    if kind == "cuda":
        props = torch.cuda.get_device_properties(index or 0)
        name = props.name
        capability = (props.major, props.minor)
        sm_count = props.multi_processor_count
        memory = props.total_memory
        device_class = f"sm{props.major}{props.minor}" if (props.major, props.minor) in {(8, 0), (9, 0)} else "cuda"
    elif kind == "mps":
        name = "Apple GPU (MPS)"
        device_class = "mps"
    else:
        name = "CPU"
        device_class = "interpreter" if settings().interpret else "cpu"
    digest_source = f"{kind}|{name}|{capability}|{sm_count}|{memory}|torch{torch.__version__}"
    fingerprint = f"{kind}-{hashlib.sha1(digest_source.encode()).hexdigest()[:12]}"
    return DeviceFacts(kind, index, name, capability, sm_count, memory, device_class, fingerprint)


@functools.lru_cache(maxsize=None)
def _facts(kind: str, index: Optional[int]) -> DeviceFacts:
    facts = _hardware(kind, index)
    reasons: Dict[str, Optional[str]] = {}
    for spec in registry.backends():
        try:
            reasons[spec.name] = spec.probe(facts)
        except Exception as error:  # a probe that breaks means the backend does not run here
            reasons[spec.name] = f"probe failed: {type(error).__name__}: {error}"
    return DeviceFacts(**{**facts.__dict__, "backend_reasons": tuple(reasons.items())})


def device_facts(device) -> DeviceFacts:
    """Facts for a torch.device / device string / tensor's device; cached per device."""
    if isinstance(device, torch.Tensor):
        device = device.device
    device = torch.device(device)
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _facts(device.type, index)


def clear_device_cache() -> None:
    _facts.cache_clear()
