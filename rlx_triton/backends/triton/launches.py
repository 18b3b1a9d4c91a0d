"""Launch plans: every Triton kernel launch as data (`Launch`), and the one executor that runs them (`run`).

A family's launcher computes its launches as a list of `Launch` records (kernel, grid, arguments as
passed, constexpr meta, num_warps, num_stages, bytes read and written, FLOPs and the unit that executes
them) and hands the list to `run`, which launches exactly those records. The ahead-of-time analysis
(`rlx_triton.perf`) reads the same records, so it cannot drift from what runs.

- The argument types and the integer/pointer specialisation the JIT will see are derived from the
  arguments (`Launch.specialization`) with triton's own parameter objects (`KernelParam`) and dtype
  names (`type_canonicalisation_dict`), by the rules of triton 3.9's binder (`create_function_from_signature`
  and `native_specialize_impl`): a tensor is a pointer `*<dtype>` with divisibility 16 when its address
  is a multiple of 16; an int equal to 1 becomes a constexpr; other ints are i32 (i64 beyond 32 bits, u64
  at 2**63 and above) with divisibility 16 when a multiple of 16; floats are fp32, bools u1 and None a
  constexpr, none of them specialised; `do_not_specialize` / `do_not_specialize_on_alignment` and typed
  annotations are honoured. tests/triton/test_launches.py compares these rules with the installed
  triton's binder argument by argument, so a triton that specialises differently fails there.
- Plans can be built from meta-device tensors: nothing is allocated or run until `run` executes them.
- `recording()` observes launches: the records `run` received, and every kernel launch made at all (so a
  launch that bypasses `run` is visible). With `execute=False` (planning) `run` collects the records
  without launching them, and a kernel launched outside `run` is skipped and listed, so a model forward
  on meta tensors yields its plan and its launch count at any shape.
- A record of an autotuned kernel (`Launch.tuned`, the autotune bridge's `TunedKernel`) runs through the
  bridge with its route, which injects the route's candidate; the record states that candidate's config.

A family module (backends/triton/<family>.py) builds its records in a plan function with its launcher's
signature, returning the records and the outputs it allocated (on the inputs' device, so meta inputs
give a plan at any shape); the launcher is `plan, outputs = <op>_plan(...); run(plan); return outputs`,
and nothing in the module launches a kernel any other way. The module states
`launch_count(request, candidate) -> int`, the number of records its launcher runs for a routed
request; `rlx-triton perf` checks it against the launches it counts at every bench shape.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from rlx_triton.devices import UNITS

_DIVISIBILITY = 16
DIVISIBLE = [["tt.divisibility", _DIVISIBILITY]]


@dataclass(frozen=True)
class Specialization:
    """What the JIT compiles a call as: ASTSource's signature, constexprs and attrs, in triton's own form.

    signature: {arg name: "*fp16" | "i32" | "i64" | "u64" | "fp32" | "u1" | "constexpr"};
    constexprs: {(arg index,): value}; attrs: {(arg index,): [["tt.divisibility", 16]] or []} for every
    argument the JIT specialises (constexprs included, with []), as `JITFunction._pack_args` returns them.
    """
    signature: Mapping[str, str]
    constexprs: Mapping[Tuple[int, ...], Any]
    attrs: Mapping[Tuple[int, ...], List[List[Any]]]

    def key(self) -> tuple:
        """A hashable form (dedupes identical configurations)."""
        return (tuple(self.signature.items()), tuple(sorted((k, repr(v)) for k, v in self.constexprs.items())),
                tuple(sorted((k, repr(v)) for k, v in self.attrs.items())))


def _jit_of(kernel):
    """The @triton.jit object under a kernel handle: a JITFunction/InterpretedFunction, or a TunedKernel's."""
    inner = getattr(kernel, "autotuner", None)
    if inner is not None:  # the autotune bridge's TunedKernel
        return kernel.kernel
    return kernel


@functools.lru_cache(maxsize=None)
def _params_of(jit) -> tuple:
    """triton's KernelParam objects of a @triton.jit kernel (also for the interpreter's InterpretedFunction)."""
    params = getattr(jit, "params", None)
    if params is not None:
        return tuple(params)
    from triton.runtime.jit import JITFunction

    options = {name: jit.kwargs.get(name) for name in ("do_not_specialize", "do_not_specialize_on_alignment")}
    return tuple(JITFunction(jit.fn, **options).params)


def _pointer_element_type(dtype: Any) -> str:
    """The element type triton's JIT names a tensor's pointer with (its own canonical dtype table)."""
    from triton._utils import type_canonicalisation_dict

    element = type_canonicalisation_dict.get(str(dtype).split(".")[-1])
    if element is None:
        raise TypeError(f"tensor argument of dtype {dtype} has no triton pointer type")
    return element


def _value_spec(value, *, specialize: bool, align: bool, is_const: bool) -> Tuple[str, Any]:
    """(type, specialisation) of one argument, as triton's native_specialize_impl gives them."""
    if value is None:
        return "constexpr", None
    if isinstance(value, bool):
        return "u1", None
    if isinstance(value, int):
        if specialize and value == 1:
            return "constexpr", 1
        if -2**31 <= value < 2**31:
            kind = "i32"
        elif 2**63 <= value < 2**64:
            kind = "u64"
        elif -2**63 <= value < 2**63:
            kind = "i64"
        else:
            raise TypeError(f"integer argument {value} does not fit in 64 bits")
        if not specialize:
            return kind, None
        return kind, "D" if align and value % _DIVISIBILITY == 0 else ""
    if isinstance(value, float):
        return "fp32", None
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        element = _pointer_element_type(value.dtype)
        kind = ("*k" if is_const else "*") + element
        if not specialize:
            return kind, None
        return kind, "D" if align and value.data_ptr() % _DIVISIBILITY == 0 else ""
    if type(value).__name__ == "constexpr":
        return "constexpr", value
    raise TypeError(f"cannot launch a kernel with an argument of type {type(value).__name__}")


def _param_spec(param, value) -> Tuple[str, Any]:
    if param.is_constexpr:
        return "constexpr", value
    spec = _value_spec(value, specialize=not param.do_not_specialize,
                       align=not param.do_not_specialize_on_alignment, is_const=param.is_const)
    annotated = param.annotation_type
    if annotated:  # a typed parameter keeps its type; floats and bools are never specialised
        if annotated == "u1" or annotated[:2] in ("fp", "bf") or param.do_not_specialize:
            return annotated, None
        return annotated, spec[1]
    return spec


def specialize(kernel, args: Sequence[Any], meta: Mapping[str, Any]) -> Specialization:
    """The Specialization the JIT computes for `kernel[grid](*args, **meta)`."""
    params = _params_of(_jit_of(kernel))
    values = list(args) + [meta[p.name] if p.name in meta else p.default for p in params[len(args):]]
    signature: Dict[str, str] = {}
    constexprs: Dict[Tuple[int, ...], Any] = {}
    attrs: Dict[Tuple[int, ...], List[List[Any]]] = {}
    for index, (param, value) in enumerate(zip(params, values)):
        kind, detail = _param_spec(param, value)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[(index,)] = detail
            attrs[(index,)] = []
        elif isinstance(detail, str):
            attrs[(index,)] = [list(entry) for entry in DIVISIBLE] if "D" in detail else []
    return Specialization(MappingProxyType(signature), MappingProxyType(constexprs), MappingProxyType(attrs))


@dataclass(frozen=True, eq=False)
class Launch:
    """One kernel launch: what `run` executes and what the analysis reads.

    kernel: the @triton.jit function, or the autotune bridge's TunedKernel (then `route` is the route whose
    candidate the bridge injects and `grid_for` the grid of whichever config runs). args: the positional
    arguments as passed; meta: every remaining parameter by name (constexprs, flags). bytes_read /
    bytes_written: global-memory traffic the launch needs (each byte once); flops: floating-point operations
    (an FMA is two); unit: what executes them (rlx_triton.devices.UNITS). cooperative: launched with
    triton's `launch_cooperative_grid=True` (a kernel whose programs wait for each other's results):
    the driver then makes every program resident at once or refuses the launch, instead of letting a partly
    resident grid spin forever.
    """
    kernel: Any
    grid: Tuple[int, ...]
    args: Tuple[Any, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    unit: str = "fp32_fma"
    name: str = ""
    route: Any = None
    grid_for: Optional[Callable[[Mapping[str, Any]], Tuple[int, ...]]] = None
    cooperative: bool = False

    def __post_init__(self):
        grid = tuple(int(g) for g in self.grid)
        if not 1 <= len(grid) <= 3 or any(g < 0 for g in grid):
            raise ValueError(f"Launch grid must be 1 to 3 non-negative ints, got {self.grid!r}")
        if self.unit not in UNITS:
            raise ValueError(f"Launch unit must be one of {', '.join(UNITS)}, got {self.unit!r}")
        for name in ("bytes_read", "bytes_written", "flops", "num_warps", "num_stages"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"Launch {name} must be >= 0, got {getattr(self, name)}")
        params = _params_of(_jit_of(self.kernel))
        if len(self.args) > len(params):
            raise TypeError(f"{self.kernel_name}: {len(self.args)} positional arguments for {len(params)} parameters")
        names = [p.name for p in params]
        unknown = [key for key in self.meta if key not in names]
        doubled = [key for key in self.meta if key in names[:len(self.args)]]
        missing = [p.name for p in params[len(self.args):] if p.name not in self.meta and not p.has_default]
        if unknown or doubled or missing:
            raise TypeError(f"{self.kernel_name}: meta names unknown parameters {unknown}, repeats positional "
                            f"ones {doubled}, or leaves out {missing}")
        object.__setattr__(self, "grid", grid)
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))
        if not self.name:
            object.__setattr__(self, "name", self.function.__name__)

    @classmethod
    def tuned(cls, tuned_kernel, candidate, grid_for: Callable[[Mapping[str, Any]], Tuple[int, ...]],
              args: Sequence[Any], meta: Mapping[str, Any], *, route, cooperative: bool = False,
              **counts) -> "Launch":
        """A launch through the autotune bridge with `candidate`'s config (what it injects for `route`)."""
        if route is not None and route.candidate is not None and route.candidate.tag() != candidate.tag():
            raise ValueError(f"Launch.tuned: candidate {candidate.tag()} is not the route's {route.candidate.tag()}")
        config = tuned_kernel.config_of(candidate)
        full = {**dict(meta), **config.kwargs}
        return cls(kernel=tuned_kernel, grid=tuple(grid_for(full)), args=tuple(args), meta=full,
                   num_warps=config.num_warps, num_stages=config.num_stages, route=route, grid_for=grid_for,
                   cooperative=cooperative, **counts)

    @property
    def jit(self):
        """The @triton.jit object that runs."""
        return _jit_of(self.kernel)

    @property
    def function(self):
        """The Python function under the @triton.jit decorator."""
        return self.jit.fn

    @property
    def kernel_name(self) -> str:
        """module:qualname of the kernel function: how a compile worker imports it."""
        fn = self.function
        return f"{fn.__module__}:{fn.__qualname__}"

    @property
    def ctas(self) -> int:
        count = 1
        for g in self.grid:
            count *= g
        return count

    @property
    def bytes(self) -> int:
        return int(self.bytes_read) + int(self.bytes_written)

    def specialization(self) -> Specialization:
        return specialize(self.kernel, self.args, self.meta)

    def describe(self) -> tuple:
        """(kernel name, grid, specialisation, num_warps, num_stages): what the GPU is asked to run."""
        return (self.function.__name__, self.grid, self.specialization().key(), int(self.num_warps),
                int(self.num_stages))

    def config_key(self) -> tuple:
        """Identifies the compiled binary: kernel, specialisation and launch options."""
        return (self.kernel_name, self.specialization().key(), int(self.num_warps), int(self.num_stages),
                bool(self.cooperative))

    def launch_options(self) -> Dict[str, Any]:
        """The launch options the call passes besides num_warps / num_stages (triton's names)."""
        return {"launch_cooperative_grid": True} if self.cooperative else {}

    def __repr__(self) -> str:
        return (f"Launch({self.name}, grid={self.grid}, warps={self.num_warps}, stages={self.num_stages}, "
                f"bytes={self.bytes}, flops={self.flops}, unit={self.unit}"
                f"{', cooperative' if self.cooperative else ''})")


# launch options a kernel call may pass besides its parameters, with triton's CUDA defaults
_OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3}
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
            "launch_pdl", "debug")


def describe_call(kernel, grid, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple:
    """Launch.describe() of a direct call `kernel[grid](*args, **kwargs)` (e.g. a LaunchLog.bypassing_calls entry)."""
    meta = {key: value for key, value in kwargs.items() if key not in _OPTIONS}
    options = {**_OPTION_DEFAULTS, **{key: kwargs[key] for key in _OPTION_DEFAULTS if key in kwargs}}
    if callable(grid):  # the JIT calls a grid function with every argument by name
        named = {param.name: value for param, value in zip(_params_of(_jit_of(kernel)), args)}
        grid = grid({**named, **meta})
    grid = tuple(int(g) for g in grid)
    return (_jit_of(kernel).fn.__name__, grid, specialize(kernel, args, meta).key(), int(options["num_warps"]),
            int(options["num_stages"]))


# ---------------------------------------------------------------------------------------------------
# Execution and observation
# ---------------------------------------------------------------------------------------------------
@dataclass
class LaunchLog:
    """What a `recording()` block saw.

    records: every record `run` received, in order (executed, or collected when planning);
    kernels: the name of every kernel launch made, through `run` or not (a tuned record counts once);
    outside: kernel launches that bypassed `run` (skipped when planning);
    owners: for each entry of `kernels`, the index of the last route in the `routes` list given to
    `recording` when it launched (-1 before the first), so launches can be counted per routed op call;
    bypassed: for each entry of `kernels`, whether it bypassed `run`;
    bypassing_calls: each launch that bypassed `run`, as (kernel, grid, args, kwargs) of the call.
    """
    execute: bool
    routes: Optional[List[Any]] = None
    records: List[Launch] = field(default_factory=list)
    kernels: List[str] = field(default_factory=list)
    outside: List[str] = field(default_factory=list)
    owners: List[int] = field(default_factory=list)
    bypassed: List[bool] = field(default_factory=list)
    bypassing_calls: List[Tuple[Any, Any, tuple, dict]] = field(default_factory=list)

    def note(self, name: str, outside: bool) -> None:
        self.kernels.append(name)
        self.owners.append(len(self.routes) - 1 if self.routes is not None else -1)
        self.bypassed.append(outside)
        if outside:
            self.outside.append(name)

    def launches_per_route(self) -> List[int]:
        """Kernel launches made after each route of `routes` and before the next one."""
        counts = [0] * len(self.routes or ())
        for owner in self.owners:
            if owner >= 0:
                counts[owner] += 1
        return counts


_logs: contextvars.ContextVar[Tuple[LaunchLog, ...]] = contextvars.ContextVar("rlx_triton_launch_logs", default=())
_in_run: contextvars.ContextVar[bool] = contextvars.ContextVar("rlx_triton_in_run", default=False)
_patch_lock = threading.Lock()
_patch_depth = 0
_originals: Dict[Any, Callable] = {}


def _planning() -> bool:
    return any(not log.execute for log in _logs.get())


def _observed_run(original):
    def run(self, *args, grid, warmup, **kwargs):
        logs = _logs.get()
        if warmup or not logs:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if not _in_run.get():
            for log in logs:
                log.note(self.fn.__name__, outside=True)
                log.bypassing_calls.append((self, grid, args, dict(kwargs)))
        if _planning():
            return None  # nothing runs while a plan is being built
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    run.__wrapped__ = original  # type: ignore[attr-defined]  # a function attribute, read by inspect.unwrap
    return run


def _kernel_classes() -> List[Any]:
    from triton.runtime.jit import JITFunction

    classes: List[Any] = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # a triton without the interpreter
        pass
    return classes


@contextlib.contextmanager
def _observing_kernel_launches() -> Iterator[None]:
    # every launch of a @triton.jit kernel goes through its class's run(); watching it there is what
    # makes a launch that bypasses the executor visible
    global _patch_depth
    with _patch_lock:
        if _patch_depth == 0:
            for cls in _kernel_classes():
                _originals[cls] = cls.run
                cls.run = _observed_run(cls.run)
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                for cls, original in _originals.items():
                    cls.run = original
                _originals.clear()


@contextlib.contextmanager
def recording(execute: bool = True, routes: Optional[List[Any]] = None) -> Iterator[LaunchLog]:
    """Collects every launch inside the block (see LaunchLog); execute=False builds plans without running them.

    routes: a list being filled with routes (rlx_triton.router.recording_routes) to attribute launches to.
    """
    log = LaunchLog(execute=execute, routes=routes)
    token = _logs.set(_logs.get() + (log,))
    try:
        with _observing_kernel_launches():
            yield log
    finally:
        _logs.reset(token)


def planning() -> contextlib.AbstractContextManager:
    """recording(execute=False): `run` collects records and launches nothing."""
    return recording(execute=False)


@contextlib.contextmanager
def planning_apart() -> Iterator[LaunchLog]:
    """A plan built inside an enclosing recording without entering it: the block's records go to its own log
    only (how the router's speed model plans a call while `rlx-triton perf` traces the call that routes)."""
    log = LaunchLog(execute=False)
    token = _logs.set((log,))
    try:
        with _observing_kernel_launches():
            yield log
    finally:
        _logs.reset(token)


# the Triton interpreter patches triton.language while a kernel runs, so interpreted launches from several
# threads run one at a time (compiled launches take no lock)
_interpreted_launch = threading.RLock()


def one_interpreted_launch_at_a_time() -> contextlib.AbstractContextManager:
    from rlx_triton.config import settings

    return _interpreted_launch if settings().interpret else contextlib.nullcontext()


def _launch_options(record: Launch) -> Dict[str, Any]:
    """The record's launch options, for a GPU launch only: the interpreter runs programs one after another,
    where a cooperative grid means nothing, and older interpreters reject options they do not know."""
    from rlx_triton.config import settings

    return {} if settings().interpret else record.launch_options()


def _launch(record: Launch) -> None:
    with one_interpreted_launch_at_a_time():
        _launch_record(record)


def _launch_record(record: Launch) -> None:
    kernel = record.kernel
    if record.route is not None and getattr(kernel, "autotuner", None) is not None:
        config_keys = set(kernel.config_of(record.route.candidate).kwargs) if record.route.candidate is not None \
            else set()
        flags = {key: value for key, value in record.meta.items() if key not in config_keys}
        kernel.launch(record.grid_for or record.grid, record.route, *record.args, **flags, **_launch_options(record))
        return
    jit = record.jit
    jit[record.grid](*record.args, **record.meta, num_warps=record.num_warps, num_stages=record.num_stages,
                     **_launch_options(record))


def launch_device(plan: Sequence[Launch]):
    """The device of the first tensor argument of the plan's records (every record of a plan runs on its
    inputs' device), or None."""
    for record in plan:
        for arg in record.args:
            device = getattr(arg, "device", None)
            if device is not None and hasattr(arg, "data_ptr"):
                return device
    return None


def on_device(device) -> contextlib.AbstractContextManager:
    """Makes a CUDA device current inside the block (`torch.cuda.device`), so triton launches on it and on its
    current stream: the inputs' GPU, whichever is current outside. Nothing for other devices."""
    if device is None or getattr(device, "type", None) != "cuda":
        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device)


def run(plan: Iterable[Launch]) -> None:
    """Launches the records in order (or, inside `planning()`, only collects them), on the device of their
    tensors (a CUDA device guard: triton launches on the current device's current stream)."""
    logs = _logs.get()
    planning_now = _planning()
    plan = list(plan)
    with on_device(None if planning_now else launch_device(plan)):
        for record in plan:
            for log in logs:
                log.records.append(record)
                log.note(record.function.__name__, outside=False)
            if planning_now or record.ctas == 0:
                continue
            token = _in_run.set(True)
            try:
                _launch(record)
            finally:
                _in_run.reset(token)
