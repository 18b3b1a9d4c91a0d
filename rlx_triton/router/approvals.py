"""Accuracy approvals: measured evidence that a candidate's numbers are right, kept apart from coverage.

A backend family module maps candidate tags to an `Approval`. The router runs only approved
candidates; each family's tests re-measure every approval against a float64 reference, so an
approval in the catalogue is a claim the test suite checks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional, Tuple

ALL_PROFILES = frozenset({"ultra_low_latency", "balanced", "high_fidelity", "deterministic"})


@dataclass(frozen=True)
class Approval:
    max_rel_err: float  # largest relative error measured against the reference (the claim tests hold)
    reference: str = "float64"
    where: str = ""  # how and where it was measured, e.g. "interpreter, tests/triton/test_fbank.py"
    profiles: frozenset = ALL_PROFILES
    # (request dtype, its own measured bound) where a dtype runs the candidate differently: a 16-bit-operand
    # candidate keeps fp32 operands on an fp32 request, so its fp16 error is no claim about fp32
    dtype_errors: Tuple[Tuple[str, float], ...] = ()
    # (KV-cache storage dtype, its measured bound): a candidate reading a quantised cache ("float8_e4m3fn",
    # "float8_e5m2", "int8") is approved for that storage only where its error with it was measured
    storage_errors: Tuple[Tuple[str, float], ...] = ()

    def covers_profile(self, profile: str) -> bool:
        return profile in self.profiles

    def for_storage(self, storage: Optional[str]) -> Optional["Approval"]:
        """The approval for a KV cache stored as `storage` (None or "none": a float cache, the approval itself),
        with the storage's measured bound, or None where it was not measured."""
        if storage in (None, "none"):
            return self
        bound = dict(self.storage_errors).get(storage)
        return None if bound is None else replace(self, max_rel_err=bound, dtype_errors=(), storage_errors=())

    def for_dtype(self, dtype: str) -> "Approval":
        """The approval as a request of `dtype` reads it: its own measured bound where it has one."""
        bound = dict(self.dtype_errors).get(dtype)
        if bound is None:
            return self
        return replace(self, max_rel_err=bound, dtype_errors=())

    def error_bound(self, dtype: str) -> float:
        """The largest relative error measured for a request of `dtype`."""
        return self.for_dtype(dtype).max_rel_err

    def label(self) -> str:
        """The accuracy line a user reads (explain, the demo): a test file of the source checkout is named by
        what it is, since a wheel does not ship tests/."""
        where = f", {_TEST_FILE.sub(_in_words, self.where)}" if self.where else ""
        return f"max rel err {self.max_rel_err:.1e} vs {self.reference}{where}"


# "tests/triton/test_fbank.py" or "tests/triton/test_fbank.py::test_name": a file of the source checkout's test suite
_TEST_FILE = re.compile(r"tests/(?:[\w.]+/)*test_(\w+)\.py(?:::\w+)?")


def _in_words(match: "re.Match[str]") -> str:
    return f"rlx_triton's {match.group(1)} tests"


def approval_for(approvals, tag: str, profile: str, storage: Optional[str] = None) -> Optional[Approval]:
    """The approval of `tag` under `profile`, for a KV cache stored as `storage` (None: not a quantised cache)."""
    approval = (approvals or {}).get(tag)
    if approval is not None and approval.covers_profile(profile):
        return approval.for_storage(storage)
    return None
