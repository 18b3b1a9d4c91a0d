"""Tracing one rlx_triton call "as on" a device profile: its routes, its launch plan and its host syncs.

The call runs under the profile's device facts (rlx_triton.router.device.routing_as), with plans built
as the compiled kernels launch (triton's interpreter switched off, no winner table, no tuning) and the
executor in planning mode: launch records are collected instead of run, and a kernel launched outside
the executor is skipped and listed. Inputs are meta tensors, which stand for the profile's device: no
memory is allocated and nothing runs, so a model forward at the bench shape takes well under a second.
`HostSyncs` counts, in the same call, what would synchronise the host with that device.
"""
from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
# ops whose implementation on a GPU waits for the device: a value, or an output size, read on the host
_HOST_READS = {_aten._local_scalar_dense.default: "host read (.item())", _aten.is_nonzero.default: "host read (bool())",
               _aten.equal.default: "host read (torch.equal)", _aten.nonzero.default: "value-dependent size (nonzero)",
               _aten.masked_select.default: "value-dependent size (masked_select)"}
_COPIES = (_aten._to_copy.default, _aten.copy_.default)
_FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}


def meta_copy(value: Any) -> Any:
    """A meta copy of a call argument: tensors keep shape, strides and dtype (no data), and what the ops know of
    them by identity (a sinc_filters bank stays one); lists, tuples and dicts are copied through; anything else
    is returned as is."""
    if isinstance(value, torch.Tensor):
        from rlx_triton.ops.conv import mark_copy_of_sinc_bank

        copy = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
        mark_copy_of_sinc_bank(value, copy)
        return copy
    if isinstance(value, list):
        return [meta_copy(item) for item in value]
    if type(value) is tuple:
        return tuple(meta_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: meta_copy(item) for key, item in value.items()}
    return value


def _on_device(device) -> bool:
    return device is not None and torch.device(device).type != "cpu"


class _HostDataTensors(TorchFunctionMode):
    """torch.tensor(data, device=<device>) and friends: a host-to-device copy (invisible to dispatch on meta)."""

    def __init__(self, events: List[str]):
        super().__init__()
        self.events = events

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_HOST_DATA:
            device = kwargs.get("device")
            if func is torch.Tensor.new_tensor and device is None:
                device = args[0].device
            if _on_device(device):
                self.events.append("host-to-device copy (tensor from host data)")
        elif func is torch.Tensor.tolist and _on_device(args[0].device):
            self.events.append("host read (.tolist())")
        return func(*args, **kwargs)


class _DeviceReads(TorchDispatchMode):
    """Host reads of device values and copies between the host and the device."""

    def __init__(self, events: List[str]):
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _HOST_READS.get(func)
        if kind is not None and not any(isinstance(a, torch.Tensor) and _on_device(a.device) for a in args):
            kind = None  # a CPU tensor's value is on the host already
        if kind is None and func in _COPIES:
            kind = _copy_kind(func, args, kwargs)
        if kind is not None:
            self.events.append(kind)
        return func(*args, **kwargs)


def _copy_kind(func, args, kwargs) -> Optional[str]:
    if func is _aten.copy_.default:
        source, target = args[1], args[0].device
    else:
        source, target = args[0], kwargs.get("device") or args[0].device
    if not isinstance(source, torch.Tensor):
        return None
    source_on, target_on = _on_device(source.device), _on_device(target)
    if target_on and not source_on:
        return "host-to-device copy"
    if source_on and not target_on:
        return "device-to-host copy"
    return None


class HostSyncs:
    """Counts, inside a with-block, what would synchronise the host with the device or block CUDA-graph
    capture: .item()/bool()/.tolist() and value-dependent output sizes (nonzero, masked_select, ...) of device
    tensors, tensors made from host data on the device (torch.tensor(..., device=...)), and copies between
    the host and the device. Meta and CUDA tensors are device tensors, CPU tensors host tensors. A host read
    of a meta tensor is counted and then fails (there is no value), which ends the traced call.
    """

    def __init__(self):
        self.events: List[str] = []
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> "HostSyncs":
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_HostDataTensors(self.events))
        self._stack.enter_context(_DeviceReads(self.events))
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.__exit__(*exc)


@dataclass
class Trace:
    """What one traced call did: routes in order, the launch log, the host syncs seen and what it returned."""
    routes: List[Any] = field(default_factory=list)
    log: Any = None
    host_syncs: Optional[List[str]] = None
    error: str = ""
    output: Any = None

    @property
    def records(self) -> list:
        return list(self.log.records) if self.log is not None else []

    @property
    def launches(self) -> int:
        return len(self.log.kernels) if self.log is not None else 0

    def unplanned_families(self) -> List[str]:
        """Families whose launches bypassed the executor (no launch plan yet), in route order."""
        if self.log is None:
            return []
        families: List[str] = []
        for name, owner, bypassed in zip(self.log.kernels, self.log.owners, self.log.bypassed):
            if bypassed:
                family = self.routes[owner].family if 0 <= owner < len(self.routes) else name
                if family not in families:
                    families.append(family)
        return families


@contextlib.contextmanager
def as_compiled() -> Iterator[None]:
    """Plans as the compiled kernels launch: triton's interpreter switch and rlx_triton's settings read "off",
    and no winner table or tuning (a profile's route must not depend on this machine's table)."""
    from rlx_triton.config import override_settings

    try:
        import triton

        knobs = triton.knobs.runtime
    except (ImportError, AttributeError):
        knobs = None
    # triton's knob writes TRITON_INTERPRET into the environment: the settings are read before it changes,
    # and the variable is put back as it was
    with override_settings(interpret=False, tune=False, tune_cache_load=False, tune_cache_persist=False):
        if knobs is None:
            yield
            return
        # @triton.jit reads the knob when a module is imported: the kernels are made before it changes
        from rlx_triton.backends.triton.audit import triton_family_modules

        for name in triton_family_modules():
            importlib.import_module(name)
        saved, saved_env = knobs.interpret, os.environ.get("TRITON_INTERPRET")
        knobs.interpret = False
        try:
            yield
        finally:
            knobs.interpret = saved
            if saved_env is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = saved_env


def trace(call: Callable[[], Any], facts, *, devices: Sequence[str] = ("meta",), host_syncs: bool = False,
          execute: bool = False) -> Trace:
    """Runs `call()` as on `facts` (a profile's DeviceFacts) and returns what it routed, launched and synced.

    devices: the device types that report `facts` (besides facts.kind). execute: run the launches (the
    interpreter tests compare an executed call with its plan); default: build the plan only.
    """
    import rlx_triton as rt
    from rlx_triton.backends.triton import launches
    from rlx_triton.router import recording_routes
    from rlx_triton.router.device import routing_as

    result = Trace()
    counter = HostSyncs() if host_syncs else None
    with contextlib.ExitStack() as stack:
        if not execute:
            stack.enter_context(as_compiled())
        stack.enter_context(routing_as(facts, devices=tuple(devices)))
        stack.enter_context(rt.use_backend("auto"))
        result.routes = stack.enter_context(recording_routes())
        result.log = stack.enter_context(launches.recording(execute=execute, routes=result.routes))
        stack.enter_context(torch.inference_mode())
        if counter is not None:
            stack.enter_context(counter)
        try:
            result.output = call()
        except Exception as error:  # the trace says what broke (e.g. a host read of a meta tensor)
            text = str(error).strip()
            result.error = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    if counter is not None:
        result.host_syncs = list(counter.events)
    return result
