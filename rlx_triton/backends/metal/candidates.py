"""The planner's candidates as the Metal launchers read them: plan order, field access with
defaults (candidates may be None when a launcher is called directly), and the approval table
every Metal family module declares.

The planner's candidate modules (rlx_triton.planner.candidates.<family>) are imported lazily so
that this backend imports even where the planner is being rebuilt.
"""
from __future__ import annotations

import importlib
from typing import Dict, List

from rlx_triton.router.approvals import Approval

# Metal kernels compute every candidate in fp32 (no TF32 exists on Apple GPUs), so one bound holds
# for all of a family's candidates; the MPS tests re-measure it against float64.
FP32_MAX_REL_ERR = 1e-5
MEASURED_WHERE = ("float32 inputs vs float64: the shader sources run on the CPU (tests/metal/test_shaders_on_cpu.py) "
                  "and NumPy models of them (tests/metal/test_models.py); re-measured on Apple GPUs by "
                  "tests/metal/test_mps.py")


def plan_candidates(family: str) -> List[object]:
    """Every candidate of the family's plan, in plan order ([] if the planner module is absent)."""
    try:
        module = importlib.import_module(f"rlx_triton.planner.candidates.{family}")
    except ImportError:
        return []
    entries = getattr(module, "ALL", None)
    if entries is None:
        variants = [value for value in vars(module).values()
                    if isinstance(value, type) and value.__name__.endswith("Variant")]
        entries = list(variants[0]) if variants else []
    return [entry.candidate() if hasattr(entry, "candidate") else entry for entry in entries]


def field(candidate, name: str, default):
    """candidate.<name>, or the default when no candidate is given."""
    value = getattr(candidate, name, None) if candidate is not None else None
    return default if value is None else value


def approvals(family: str, where: str = MEASURED_WHERE) -> Dict[str, Approval]:
    """Approval of every plan candidate at the fp32 bound, with where it is measured."""
    table = {}
    for candidate in plan_candidates(family):
        tag = candidate.tag() if callable(getattr(candidate, "tag", None)) else str(candidate)
        table[tag] = Approval(max_rel_err=FP32_MAX_REL_ERR, reference="float64", where=where)
    return table
