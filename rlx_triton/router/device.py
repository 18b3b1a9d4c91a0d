"""Device facts: what the router needs to know about the device a tensor lives on, computed once.

Kind (cuda, mps, cpu), name, compute capability, SM count, memory, which registered backends run
there (each backend's own probe: triton needs CUDA, or CPU tensors under TRITON_INTERPRET=1; Metal
needs a compile-and-run smoke test to pass), a device class for built-in recipes ("sm90", "sm80",
"cuda", "mps", "interpreter", "cpu") and a stable fingerprint for winner-table keys.

`profile_facts(profile)` gives the facts a device of a named profile (rlx_triton/devices.py) would
report, and `routing_as(profile)` makes the router read them for that kind of device (and for meta
tensors, which stand for it), so a route "as on an H200" can be decided on a machine without one.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple, Union

import torch

from rlx_triton.devices import DeviceProfile
from rlx_triton.router import registry
from rlx_triton.router.invalidation import Change, changed, forget_on


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


def cuda_device_class(capability: Tuple[int, int]) -> str:
    """The recipe class of a CUDA device: "sm90" and "sm80" have their own recipes, other GPUs share "cuda"."""
    return f"sm{capability[0]}{capability[1]}" if tuple(capability) in {(8, 0), (9, 0)} else "cuda"


def _fingerprint(kind: str, digest_source: str) -> str:
    return f"{kind}-{hashlib.sha1(digest_source.encode()).hexdigest()[:12]}"


def _hardware(kind: str, index: Optional[int]) -> DeviceFacts:
    from rlx_triton.config import settings

    capability = sm_count = memory = None
    if kind == "cuda":
        props = torch.cuda.get_device_properties(index or 0)
        name = props.name
        capability = (props.major, props.minor)
        sm_count = props.multi_processor_count
        memory = props.total_memory
        device_class = cuda_device_class(capability)
    elif kind == "mps":
        name = "Apple GPU (MPS)"
        device_class = "mps"
    else:
        name = "CPU"
        device_class = "interpreter" if settings().interpret else "cpu"
    digest_source = f"{kind}|{name}|{capability}|{sm_count}|{memory}|torch{torch.__version__}"
    return DeviceFacts(kind, index, name, capability, sm_count, memory, device_class,
                       _fingerprint(kind, digest_source))


def _with_verdicts(facts: DeviceFacts, assumed: Tuple[str, ...] = ()) -> DeviceFacts:
    reasons: Dict[str, Optional[str]] = {}
    for spec in registry.backends():
        if spec.name in assumed:
            reasons[spec.name] = None
            continue
        try:
            reasons[spec.name] = spec.probe(facts)
        except Exception as error:  # a probe that breaks means the backend does not run here
            reasons[spec.name] = f"probe failed: {type(error).__name__}: {error}"
    return DeviceFacts(**{**facts.__dict__, "backend_reasons": tuple(reasons.items())})


@functools.lru_cache(maxsize=None)
def _facts(kind: str, index: Optional[int]) -> DeviceFacts:
    return _with_verdicts(_hardware(kind, index))


# Backends that run on every device of a kind, where the probe needs the device itself: Metal's
# probe compiles and runs a shader, which a profile of an Apple GPU cannot do on another machine.
_ASSUMED_ON_KIND = {"mps": ("metal",)}


def profile_facts(profile: DeviceProfile) -> DeviceFacts:
    """The DeviceFacts a device of this profile (rlx_triton.devices.DeviceProfile) gives the router.

    Kind, name, capability, SM count, memory and device class are what `device_facts` reads from such a
    device; the fingerprint has the same form ("cuda-" + 12 hex digits) and names the profile; each
    backend's verdict is its probe's on these facts (Metal is assumed to run on an Apple GPU profile).
    """
    if profile.kind == "cuda" and profile.capability is not None:
        device_class = cuda_device_class(profile.capability)
    else:
        device_class = profile.kind
    digest_source = f"{profile.kind}|{profile.name}|{profile.capability}|{profile.sm_count}|" \
                    f"{profile.memory_bytes}|profile:{profile.key}"
    facts = DeviceFacts(profile.kind, 0, profile.name, profile.capability, profile.sm_count, profile.memory_bytes,
                        device_class, _fingerprint(profile.kind, digest_source))
    return _with_verdicts(facts, _ASSUMED_ON_KIND.get(profile.kind, ()))


_routing_as: contextvars.ContextVar[Optional[Tuple[DeviceFacts, frozenset]]] = contextvars.ContextVar(
    "rlx_triton_routing_as", default=None)


@contextlib.contextmanager
def routing_as(profile_or_facts: Union[DeviceProfile, DeviceFacts],
               devices: Tuple[str, ...] = ("meta",), announce: bool = True) -> Iterator[DeviceFacts]:
    """Inside the block, devices of the profile's kind and of the `devices` types (meta tensors by default;
    "cpu" too to run real CPU tensors as if on the device) report the profile's facts.

    Entry and exit announce Change.DEVICE_VIEW, which clears the remembered routes, so no decision made
    for one device serves another. announce=False leaves them: for a block that routes nothing of its own (a
    speed model planning meta copies of a call under a route it was given).
    """
    facts = profile_or_facts if isinstance(profile_or_facts, DeviceFacts) else profile_facts(profile_or_facts)
    token = _routing_as.set((facts, frozenset((facts.kind, *devices))))
    if announce:
        changed(Change.DEVICE_VIEW)
    try:
        yield facts
    finally:
        _routing_as.reset(token)
        if announce:
            changed(Change.DEVICE_VIEW)


def device_facts(device: Union[torch.device, str, torch.Tensor]) -> DeviceFacts:
    """Facts for a torch.device / device string / tensor's device; cached per device."""
    if isinstance(device, torch.Tensor):
        device = device.device
    device = torch.device(device)
    pretended = _routing_as.get()
    if pretended is not None and device.type in pretended[1]:
        return pretended[0]
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _facts(device.type, index)


def clear_device_cache() -> None:
    _facts.cache_clear()


# each fact holds every registered backend's verdict
forget_on(Change.BACKENDS, clear_device_cache)
