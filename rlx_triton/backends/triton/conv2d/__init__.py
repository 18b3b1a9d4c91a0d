"""Triton 2-D convolutions of the conv family: the WeSpeaker ResNet trunk (implicit-GEMM conv2d with folded
BatchNorm, residual and ReLU), its 5120 -> 256 projection (`linear`) and TSTP statistics pooling.

The op module the router reads for ops conv2d and stats_pool (`backends/triton/conv2d`, OP_MODULES in
backends/triton/__init__.py): `kernels.py` holds the @triton.jit code, `launch.py` the plans, launch
records with their byte and FLOP models, the split and Winograd weights and the autotune bridge, `routing.py` the
coverage, approvals and per-geometry recipes, `audit.py` the audit specs. `conv2d`, `linear` and
`stats_pool` here are what a routed call runs; the candidate helpers are the 1-D conv package's.
"""
from __future__ import annotations

from rlx_triton.backends.triton.conv.launch import all_candidates, candidate_tag, default_candidate, make_candidate
from rlx_triton.backends.triton.conv2d.audit import AUDIT_KERNELS
from rlx_triton.backends.triton.conv2d.launch import (conv2d, conv2d_plan, launch_count, linear, linear_plan,
                                                      split_weights, stats_pool, stats_pool_plan, tuned_kernel,
                                                      winograd_applies, winograd_weights)
from rlx_triton.backends.triton.conv2d.routing import (APPROVALS, CONV2D_MAX_REL_ERR, COVERAGE, RECIPES,
                                                       SPEED_EVIDENCE, recipe_key)

__all__ = ["APPROVALS", "AUDIT_KERNELS", "CONV2D_MAX_REL_ERR", "COVERAGE", "RECIPES", "SPEED_EVIDENCE",
           "all_candidates", "candidate_tag", "conv2d", "conv2d_plan", "default_candidate", "launch_count", "linear",
           "linear_plan", "make_candidate", "recipe_key", "split_weights", "stats_pool", "stats_pool_plan",
           "tuned_kernel", "winograd_applies", "winograd_weights"]
