"""Accuracy approvals: measured evidence that a candidate's numbers are right, kept apart from coverage.

A backend family module maps candidate tags to an `Approval`. The router runs only approved
candidates; each family's tests re-measure every approval against a float64 reference, so an
approval in the catalogue is a claim the test suite checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ALL_PROFILES = frozenset({"ultra_low_latency", "balanced", "high_fidelity", "deterministic"})


@dataclass(frozen=True)
class Approval:
    max_rel_err: float  # largest relative error measured against the reference (the claim tests hold)
    reference: str = "float64"
    where: str = ""  # how and where it was measured, e.g. "interpreter, tests/triton/test_fbank.py"
    profiles: frozenset = ALL_PROFILES

    def covers_profile(self, profile: str) -> bool:
        return profile in self.profiles

    def label(self) -> str:
        where = f", {self.where}" if self.where else ""
        return f"max rel err {self.max_rel_err:.1e} vs {self.reference}{where}"


def approval_for(approvals, tag: str, profile: str) -> Optional[Approval]:
    approval = (approvals or {}).get(tag)
    if approval is not None and approval.covers_profile(profile):
        return approval
    return None
