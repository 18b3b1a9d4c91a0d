"""Triton segdense: pyannote's segmentation head (linear layers + leaky ReLU, classifier, activation) in one kernel.

The family module the router reads (`backends/triton/segdense`): `kernels.py` holds the @triton.jit code,
`launch.py` the meta-parameters, the packed head and the launch records with their byte and FLOP models,
`routing.py` the coverage, approvals and recipes, `audit.py` the audit specs. `segdense` here is what a
routed call runs.
"""
from __future__ import annotations

from rlx_triton.backends.triton.segdense.audit import AUDIT_KERNELS
from rlx_triton.backends.triton.segdense.kernels import ACTIVATIONS
from rlx_triton.backends.triton.segdense.launch import (MAX_CLASSES, MAX_FEATURES, launch_count, make_candidate,
                                                        segdense, segdense_plan)
from rlx_triton.backends.triton.segdense.routing import APPROVALS, COVERAGE, RECIPES, SPEED_EVIDENCE

__all__ = ["ACTIVATIONS", "APPROVALS", "AUDIT_KERNELS", "COVERAGE", "MAX_CLASSES", "MAX_FEATURES", "RECIPES",
           "SPEED_EVIDENCE", "launch_count", "make_candidate", "segdense", "segdense_plan"]
