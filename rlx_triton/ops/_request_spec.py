"""Request specs: what an op sends the router, declared once beside the op and read by the op and by
`rlx-triton explain`.

An op's `RequestSpec` names
- its given fields: what the op reads from a call (tensor sizes, a few arguments), each required or with a
  default and the reason for it (`seq_q` defaults to 1: one query token, a decode step). Most are launch
  fields; a few are sizes only a derived field reads (conv2d's height and width);
- its derived fields, each computed from given fields and features by one function, with its formula
  (`m` = seq_q x num_heads / num_kv_heads): no caller computes them, so none can contradict the others;
- its features (the request's typed refusals and choices), each with a plain call's value and the values
  it takes;
- its checks (rules between fields, for fields typed by hand; an op validates its tensors itself) and the
  dtypes the op takes.

`RequestSpec.make` builds the routing Request from the given fields, the features, the dtype and the device:
it fills in the defaults, computes every derived field and sends the launch fields in the planner's order.
An op's request builder reads the given fields from its tensors and calls it; `rlx-triton explain` calls it
with the fields typed on the command line; so both build the same Request.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Mapping, Optional, Tuple

import torch

from rlx_triton.ops._checks import FLOAT_DTYPES
from rlx_triton.planner.candidates import FAMILIES
from rlx_triton.planner.candidates.base import LaunchField
from rlx_triton.planner.policy import U32_MAX
from rlx_triton.router import Request
from rlx_triton.router.request import dtype_name

Values = Dict[str, Any]           # field name -> value (ints; a few given fields take a bool or a tuple)
Features = Mapping[str, Any]   # feature name -> value (Hashable: a bool, an int, a string, a tuple)
Check = Callable[[Values, Features], Optional[str]]


@dataclass(frozen=True)
class Given:
    """A field the op reads from a call. `default`: None for a required field, else the value a call has
    when it says nothing (or a function of the given fields declared before it), and `why` that value.
    `meaning` and [low, high] are for a field the request does not carry (a launch field's are the
    planner's)."""

    name: str
    default: Any = None
    why: str = ""
    meaning: str = ""
    low: int = 1
    high: int = U32_MAX

    @property
    def required(self) -> bool:
        return self.default is None

    def default_value(self, values: Values) -> Any:
        return self.default(values) if callable(self.default) else self.default


@dataclass(frozen=True)
class Derived:
    """A field computed from given fields and features by `compute`: `formula` says how, `meaning` what it
    is, `reads` names the given fields and features it reads."""

    name: str
    compute: Callable[[Values, Features], int]
    formula: str
    reads: Tuple[str, ...] = ()
    meaning: str = ""

    @property
    def why(self) -> str:
        return f"{self.formula}: {self.meaning}" if self.meaning else self.formula


@dataclass(frozen=True)
class Feature:
    """A request feature: a plain call's value and the values it takes (empty: any value of the default's
    type). `sent_at_default=False`: the request names it only when it differs from the default (an option
    in use, which a backend's coverage must name)."""

    default: Hashable
    choices: Tuple[Hashable, ...] = ()
    sent_at_default: bool = True


def flag(default: bool, *, sent_at_default: bool = True) -> Feature:
    """A bool feature."""
    return Feature(default, (False, True), sent_at_default)


def launch_fields_of(family: str) -> Tuple[LaunchField, ...]:
    """The planner's launch fields of `family` (its value string), in the order requests send them."""
    for member, spec in FAMILIES.items():
        if member.value == family:
            return spec.launch_fields
    raise ValueError(f"unknown kernel family {family!r}")


@dataclass(frozen=True, eq=False)
class RequestSpec:
    """One op's request: its family and op name, given and derived fields, features, checks and dtypes."""

    family: str
    op: str
    given: Tuple[Given, ...]
    derived: Tuple[Derived, ...]
    features: Mapping[str, Feature]
    checks: Tuple[Check, ...] = ()
    dtypes: Tuple[torch.dtype, ...] = FLOAT_DTYPES
    _sent: Tuple[str, ...] = dataclasses.field(init=False, repr=False)
    _optional: Tuple[Given, ...] = dataclasses.field(init=False, repr=False)
    _quiet_defaults: Mapping[str, Hashable] = dataclasses.field(init=False, repr=False)
    _field_count: int = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = self.field_names
        if len(set(names)) != len(names):
            raise ValueError(f"{self.op}: a field is declared twice in {names}")
        known = {g.name for g in self.given} | set(self.features)
        for field in self.derived:
            unknown = set(field.reads) - known
            if unknown:
                raise ValueError(f"{self.op}: derived {field.name} reads {sorted(unknown)}, which come later or "
                                 f"are not declared")
            known.add(field.name)
        launch = launch_fields_of(self.family)
        missing = [f.name for f in launch if f.required and f.name not in names]
        if missing:
            raise ValueError(f"{self.op}: the {self.family} family's launch fields {missing} are not declared")
        object.__setattr__(self, "_sent", tuple(f.name for f in launch if f.name in names))
        object.__setattr__(self, "_optional", tuple(g for g in self.given if not g.required))
        object.__setattr__(self, "_field_count", len(names))
        object.__setattr__(self, "_quiet_defaults", {name: f.default for name, f in self.features.items()
                                                     if not f.sent_at_default})

    # ------------------------------------------------------------------------------------------ reading

    @property
    def field_names(self) -> Tuple[str, ...]:
        """Given fields, then derived ones."""
        return tuple(g.name for g in self.given) + tuple(d.name for d in self.derived)

    @property
    def required(self) -> Tuple[str, ...]:
        return tuple(g.name for g in self.given if g.required)

    @property
    def optional(self) -> Tuple[Given, ...]:
        return self._optional

    @property
    def sent(self) -> Tuple[str, ...]:
        """The launch fields the request carries, in the planner's order."""
        return self._sent

    def given_field(self, name: str) -> Optional[Given]:
        return next((g for g in self.given if g.name == name), None)

    def derived_field(self, name: str) -> Optional[Derived]:
        return next((d for d in self.derived if d.name == name), None)

    def bounds(self, name: str) -> Tuple[int, int]:
        """[low, high] of a field: the planner's for a launch field, else the spec's."""
        for field in launch_fields_of(self.family):
            if field.name == name:
                return field.low, field.high
        given = self.given_field(name)
        return (given.low, given.high) if given is not None else (0, U32_MAX)

    # ------------------------------------------------------------------------------------------ building

    def complete(self, given: Mapping[str, Any], features: Features) -> Values:
        """Every field's value: the given ones, the defaults of those not given, then the derived ones."""
        values = dict(given)
        for field in self._optional:
            if field.name not in values:
                values[field.name] = field.default_value(values)
        for derived in self.derived:
            values[derived.name] = derived.compute(values, features)
        return values

    def problem(self, values: Values, features: Features) -> Optional[str]:
        """The first check's message for a complete set of fields, or None."""
        for check in self.checks:
            message = check(values, features)
            if message:
                return message
        return None

    def make(self, given: Mapping[str, Any], features: Features, *, tensor: Optional[torch.Tensor] = None,
             dtype: Any = None, device: Any = None) -> Request:
        """The routing Request of a call with these given fields and features, on `tensor`'s dtype and device
        (or `dtype` and `device`): every derived field computed, the launch fields in the planner's order,
        the features in the spec's order (an option at its default left out where the spec says so).
        Ops call it on every call with a new signature, so it builds the Request directly."""
        values = self.complete(given, features)
        if len(values) != self._field_count:
            unknown = sorted(set(values) - set(self.field_names))
            raise TypeError(f"{self.op}: no field {', '.join(unknown)} in its request spec")
        if tensor is not None:
            dtype = tensor.dtype if dtype is None else dtype
            device = tensor.device if device is None else device
        if dtype is None or device is None:
            raise TypeError(f"{self.op}: a request needs a tensor, or both dtype and device")
        fields = tuple([(name, values[name]) for name in self._sent])
        if not all(type(value) is int for _, value in fields):
            fields = tuple([(name, int(value)) for name, value in fields])
        return Request(self.family, self.op, fields, dtype if isinstance(dtype, str) else dtype_name(dtype),
                       device if isinstance(device, torch.device) else torch.device(device),
                       tuple(self._ordered(features).items()))

    def unshaped(self, features: Features, *, tensor: torch.Tensor) -> Request:
        """The Request of a call with no fixed shape (nested tensors): no launch fields, so only torch's op
        takes it."""
        return Request.make(self.family, self.op, tensor=tensor, fields={}, features=self._ordered(features))

    def _ordered(self, features: Features) -> Dict[str, Hashable]:
        quiet = self._quiet_defaults
        ordered: Dict[str, Hashable] = {}
        known = 0
        for name in self.features:
            if name in features:
                known += 1
                value = features[name]
                if not quiet or name not in quiet or value != quiet[name]:
                    ordered[name] = value
        if known != len(features):
            unknown = sorted(set(features) - set(self.features))
            raise TypeError(f"{self.op}: no feature {', '.join(unknown)} in its request spec")
        return ordered
