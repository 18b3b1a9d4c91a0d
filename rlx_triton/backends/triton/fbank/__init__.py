"""Triton Kaldi log-mel filterbank: one fused kernel per tile of frames (dense or two-stage DFT), plus CMN.

The family module the router reads (`backends/triton/fbank`): `kernels.py` holds the @triton.jit code,
`launch.py` the per-option-set constants (DFT bases, mel banks, windows, cached per device), the launch
records with their byte and FLOP model and the autotune bridge, `routing.py` the coverage, approvals and
recipes, `audit.py` the audit specs. `fbank` here is what a routed call runs.
"""
from __future__ import annotations

from rlx_triton.backends.triton.fbank.audit import AUDIT_KERNELS
from rlx_triton.backends.triton.fbank.launch import (fbank, fbank_plan, launch_count, runs_split, split_factors,
                                                     split_flops, tuned_split_kernel)
from rlx_triton.backends.triton.fbank.routing import (APPROVAL_BOUND, APPROVALS, COVERAGE, MAX_BINS, MAX_WINDOW,
                                                      RECIPES, SPEED_EVIDENCE)

__all__ = ["APPROVALS", "APPROVAL_BOUND", "AUDIT_KERNELS", "COVERAGE", "MAX_BINS", "MAX_WINDOW", "RECIPES",
           "SPEED_EVIDENCE", "fbank", "fbank_plan", "launch_count", "runs_split", "split_factors", "split_flops",
           "tuned_split_kernel"]
