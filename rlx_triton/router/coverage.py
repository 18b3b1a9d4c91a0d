"""Declarative coverage: what one backend's kernel for one family implements, and typed refusals.

A backend covers a request only if every part of it is inside the statement: the op, the device
kind, the dtype, every ranged launch field, and every feature flag (a feature the statement does
not name is not implemented). Anything else is a typed refusal that the router records and
`explain` shows; refusals fall back to the torch library op.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Mapping, Optional, Tuple

# Refusal kinds: why a backend does not take a request, each a fixed string explain and MissingKernel show.
BACKEND_UNAVAILABLE = "backend-unavailable"  # e.g. no triton installed, no GPU, Metal smoke test failed
DEVICE_UNSUPPORTED = "device-unsupported"  # the kernel does not run on this device kind
SHAPE_UNIMPLEMENTED = "shape-unimplemented"  # op, dtype, range or feature outside the kernel's coverage
WEIGHTS_OUT_OF_CONTRACT = "weights-out-of-contract"  # weights outside the kernel's numeric contract
NOT_APPROVED = "not-approved"  # no candidate with accuracy evidence for this profile
NOT_SELECTED = "not-selected"  # another backend was forced
SLOWER = "slower"  # eligible, but the library op is faster for this call (measured or estimated)


@dataclass(frozen=True)
class Refusal:
    """Why a backend does not take a request; `field` names the ranged launch field that failed, if any."""

    kind: str
    reason: str
    field: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"


@dataclass(frozen=True)
class Coverage:
    ops: Optional[frozenset] = None  # None: every op of the family
    devices: frozenset = frozenset()
    dtypes: frozenset = frozenset()
    ranges: Mapping[str, Tuple[int, int]] = field(default_factory=dict)
    features: Mapping[str, frozenset] = field(default_factory=dict)
    weight_features: frozenset = frozenset()
    covers_all: bool = False

    @classmethod
    def everything(cls) -> "Coverage":
        """The library fallback's statement: it runs whatever torch runs."""
        return cls(covers_all=True)

    def check(self, op: str, device_kind: str, dtype: str, fields: Mapping[str, int],
              features: Mapping[str, Hashable]) -> Optional[Refusal]:
        """None when covered, else the first refusal in a fixed order (op, device, dtype, ranges, features)."""
        if self.covers_all:
            return None
        if self.ops is not None and op not in self.ops:
            return Refusal(SHAPE_UNIMPLEMENTED, f"op {op!r} is not implemented (has {sorted(self.ops)})")
        if device_kind not in self.devices:
            return Refusal(DEVICE_UNSUPPORTED, f"device {device_kind!r} is not covered (runs on {sorted(self.devices)})")
        if dtype not in self.dtypes:
            return Refusal(SHAPE_UNIMPLEMENTED, f"dtype {dtype} is not covered (has {sorted(self.dtypes)})")
        for name, (low, high) in self.ranges.items():
            value = fields.get(name)
            if value is None:
                continue
            if not low <= value <= high:
                return Refusal(SHAPE_UNIMPLEMENTED, f"{name}={value} is outside [{low}, {high}]", field=name)
        for name, feature in features.items():
            allowed = self.features.get(name)
            if allowed is None or feature not in allowed:
                kind = WEIGHTS_OUT_OF_CONTRACT if name in self.weight_features else SHAPE_UNIMPLEMENTED
                shown = "not implemented" if allowed is None else \
                    f"not covered (covered: {', '.join(sorted(map(repr, allowed)))})"
                return Refusal(kind, f"{name}={feature!r} is {shown}")
        return None

    def range_holds(self, name: str, value: int) -> bool:
        if self.covers_all or name not in self.ranges:
            return True
        low, high = self.ranges[name]
        return low <= value <= high
