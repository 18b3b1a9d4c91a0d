"""The planner's candidates as the Metal launchers read them: plan order, field access with
defaults (candidates may be None when a launcher is called directly), and the approval table
every Metal family module declares.
"""
from __future__ import annotations

from typing import Dict

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.router.approvals import Approval

__all__ = ["FP32_MAX_REL_ERR", "MEASURED_WHERE", "approvals", "field", "plan_candidates"]

# Metal kernels compute every candidate in fp32 (no TF32 exists on Apple GPUs), so one bound holds
# for all of a family's candidates; the MPS tests re-measure it against float64.
FP32_MAX_REL_ERR = 1e-5
MEASURED_WHERE = ("float32 inputs vs float64: the shader sources run on the CPU (tests/metal/test_shaders_on_cpu.py) "
                  "and NumPy models of them (tests/metal/test_models.py); re-measured on Apple GPUs by "
                  "tests/metal/test_mps.py")


def field(candidate, name: str, default):
    """candidate.<name>, or the default when no candidate is given."""
    value = getattr(candidate, name, None) if candidate is not None else None
    return default if value is None else value


def approvals(family: str, where: str = MEASURED_WHERE) -> Dict[str, Approval]:
    """Approval of every plan candidate at the fp32 bound, with where it is measured."""
    return {candidate.tag(): Approval(max_rel_err=FP32_MAX_REL_ERR, reference="float64", where=where)
            for candidate in plan_candidates(family)}
