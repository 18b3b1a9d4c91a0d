"""Triton 1-D conv family: pyannote's SincNet stage (sinc conv |.| pool, instance norms, Conv1d blocks) and a
general Conv1d with a fused bias -> |x| -> max-pool -> leaky ReLU epilogue.

The family module the router reads (`backends/triton/conv`): `kernels.py` holds the @triton.jit code
(implicit-GEMM conv, the symmetric sinc conv, the epilogue pass, the instance-norm statistics) and the
design notes of its numerics, `weights.py` the weight preparation cached per weight version (packed,
tf32x3 split, sinc half filters), `launch.py` the plans, launch records with their byte and FLOP models,
the autotune bridge and the candidate helpers the conv2d package shares, `routing.py` the coverage,
approvals and recipes, `audit.py` the audit specs. `sincnet` and `conv1d` here are what a routed call runs.
"""
from __future__ import annotations

from rlx_triton.backends.triton.conv.audit import AUDIT_KERNELS, aligned_pointers
from rlx_triton.backends.triton.conv.kernels import dot_split
from rlx_triton.backends.triton.conv.launch import (UNIT_OF_PRECISION, RowNorm, all_candidates, candidate_tag,
                                                    conv1d, conv1d_plan, default_candidate, launch_count,
                                                    make_candidate, sincnet, sincnet_plan, tuned_kernel)
from rlx_triton.backends.triton.conv.routing import APPROVALS, CONV1D_MAX_REL_ERR, COVERAGE, RECIPES, SPEED_EVIDENCE
from rlx_triton.backends.triton.conv.weights import cached_weight, split_terms, symmetric_bank

__all__ = ["APPROVALS", "AUDIT_KERNELS", "CONV1D_MAX_REL_ERR", "COVERAGE", "RECIPES", "SPEED_EVIDENCE",
           "UNIT_OF_PRECISION", "RowNorm", "aligned_pointers", "all_candidates", "cached_weight", "candidate_tag",
           "conv1d", "conv1d_plan", "default_candidate", "dot_split", "launch_count", "make_candidate", "sincnet",
           "sincnet_plan", "split_terms", "symmetric_bank", "tuned_kernel"]
