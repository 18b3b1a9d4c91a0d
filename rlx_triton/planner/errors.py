"""Planner errors: `PlanError` and `LaunchError`, each a ValueError with one subclass per kind of error.

Each subclass carries its payload (the field, the candidate, ...) as attributes and renders a fixed
message template as `str(error)`. Errors compare equal when their type and payload match, so tests
can write `err == MissingField("seq_kv")`.
"""
from __future__ import annotations

from typing import Any, Tuple


class _PayloadError(ValueError):
    """Shared construction, equality, hashing and pickling for errors defined by (type, payload).

    A subclass names its payload attributes in `_payload_names` and its message in `_template`
    (str.format over the payload)."""

    _template = ""
    _payload_names: Tuple[str, ...] = ()

    def __init__(self, *payload: Any) -> None:
        if len(payload) != len(self._payload_names):
            raise TypeError(f"{type(self).__name__} takes {len(self._payload_names)} argument(s)")
        for name, value in zip(self._payload_names, payload):
            setattr(self, name, value)
        self._payload = payload
        super().__init__(self._message())

    def _message(self) -> str:
        return self._template.format(*self._payload)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._payload == other._payload

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._payload))

    def __reduce__(self):
        return (type(self), self._payload)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(repr(p) for p in self._payload)})"


class PlanError(_PayloadError):
    """A plan could not be built: see the subclasses."""


class EmptyCandidates(PlanError):
    _template = "kernel plan needs at least one candidate"


class UnsupportedFamily(PlanError):
    _payload_names = ("family",)
    family: Any

    def _message(self) -> str:
        # the family in CamelCase (`SdpaDecode`), as KernelFamily.debug_name spells it
        debug = getattr(self.family, "debug_name", None) or repr(self.family)
        return f"unsupported kernel family in plan: {debug}"


class InvalidCandidate(PlanError):
    _template = "invalid candidate: {}"
    _payload_names = ("reason",)


class InvalidPrecision(PlanError):
    _template = "invalid precision configuration: {}"
    _payload_names = ("reason",)


class InvalidObjectiveWeights(PlanError):
    _template = "objective weights must be finite, non-negative, and sum to 1.0 (+/- 1e-3)"


class LaunchError(_PayloadError):
    """A launch configuration could not be built: see the subclasses."""


class MissingField(LaunchError):
    _template = "missing launch field: {}"
    _payload_names = ("field",)


class InvalidField(LaunchError):
    _template = "invalid launch field: {}"
    _payload_names = ("field",)


class CandidateNotPresent(LaunchError):
    _template = "selected candidate is not in the plan"
