"""The planner's candidates as the backend family modules read them: every candidate of a family's
plan in plan order, its default, and the APPROVALS table built from them.

Backend modules declare their routing data from these (`backends/<backend>/<family>.py`), so which
candidates exist stays the planner's word (`rlx_triton.planner.candidates.<family>`) alone.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping

from rlx_triton.planner import KernelFamily
from rlx_triton.planner.candidates import FAMILIES
from rlx_triton.router.approvals import Approval, approval_for


def plan_candidates(family: str) -> List[Any]:
    """Every candidate of the family's plan, in plan order (the sweep tests run each one)."""
    return list(FAMILIES[KernelFamily(family)].default_candidates)


def default_candidate(family: str) -> Any:
    """The candidate of the family's default plan (`DEFAULT_VARIANT`)."""
    return FAMILIES[KernelFamily(family)].default_variant.candidate()


def approved_candidates(candidates: Iterable[Any], approvals: Mapping[str, Approval], profile: str) -> List[Any]:
    """The candidates whose accuracy approval covers the precision profile, in their order: what an
    autotuner may time for a call routed under that profile."""
    return [candidate for candidate in candidates if approval_for(approvals, candidate.tag(), profile) is not None]


def approvals_by_precision(family: str, bounds: Mapping[str, float], where: str) -> Dict[str, Approval]:
    """Candidate tag -> Approval against float64 at `bounds[candidate.precision]`, for every plan
    candidate whose precision has a bound; candidates of the other precisions stay unapproved."""
    return {candidate.tag(): Approval(max_rel_err=bounds[candidate.precision], reference="float64", where=where)
            for candidate in plan_candidates(family) if candidate.precision in bounds}
