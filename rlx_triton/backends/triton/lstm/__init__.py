"""Triton LSTM: multi-layer, uni- or bidirectional nn.LSTM inference as two kernels per layer (the input
projection of every step, then the recurrence: on chip and synchronised, persistent, or one launch per step).

The family module the router reads (`backends/triton/lstm`): `kernels.py` holds the @triton.jit code (the
projection GEMM, the recurrences, the on-chip exchange of h) and the design notes of its numerics, `weights.py` the
weight packing cached per weight version, `launch.py` the plans, launch records with their byte and FLOP
models, the co-residency check and fallback of the on-chip recurrence, the autotune bridge and the
candidate helpers, `routing.py` the coverage, approvals and recipes, `audit.py` the audit specs. `lstm`
here is what a routed call runs.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.lstm.audit import AUDIT_HIDDEN, AUDIT_KERNELS
from rlx_triton.backends.triton.lstm.kernels import GATES, MIN_DOT
from rlx_triton.backends.triton.lstm.launch import (PROJ_TILE, THREADS_PER_WARP, co_residency_refusal,
                                                    explain_execution, fallback_candidate, launch_count, lstm_plan,
                                                    make_candidate, recurrence_mode, remember_refused_launch,
                                                    synchronised_refusal, tuned_kernels, warn_fallback)
from rlx_triton.backends.triton.lstm.routing import APPROVALS, COVERAGE, MAX_HIDDEN, RECIPES, SPEED_EVIDENCE
from rlx_triton.router.device import device_facts

__all__ = ["APPROVALS", "AUDIT_HIDDEN", "AUDIT_KERNELS", "COVERAGE", "GATES", "MAX_HIDDEN", "MIN_DOT",
           "PROJ_TILE", "RECIPES", "SPEED_EVIDENCE", "THREADS_PER_WARP", "co_residency_refusal", "explain_execution",
           "fallback_candidate", "launch_count", "lstm", "lstm_plan", "make_candidate", "recurrence_mode",
           "remember_refused_launch", "synchronised_refusal", "tuned_kernels", "warn_fallback"]


def lstm(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, proj_size: int = 0, candidate, route=None,
         step_launches: Optional[bool] = None) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """nn.LSTM's forward (torch.lstm's arguments) on Triton kernels; returns (output, (h_n, c_n)).

    input: (T, B, I), or (B, T, I) when batch_first, or unbatched (T, I). hx: (h0, c0), each
    (layers*D, B, H) (or (layers*D, H) unbatched), or None for zeros. dropout/training are accepted
    for signature parity; covered requests have no active dropout and proj_size == 0. route: the
    router's route of the call (the on-chip kernels then go through the autotune bridge);
    step_launches: run an on-chip candidate one launch per step (see `recurrence_mode`).
    """
    def planned():
        return lstm_plan(input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers, dropout=dropout,
                         training=training, bidirectional=bidirectional, batch_first=batch_first,
                         proj_size=proj_size, candidate=candidate, route=route, step_launches=step_launches,
                         on_fallback=lambda reason: warn_fallback(candidate, device_facts(input.device), reason))

    plan, (output, h_n, c_n) = planned()
    try:
        launches.run(plan)
    except RuntimeError as error:
        refused = next((record for record in plan if record.cooperative), None)
        if refused is None:
            raise
        # the driver refused the cooperative launch (other work, MPS or a green context holds SMs): remembered,
        # so this call and the later ones plan the persistent fallback
        remember_refused_launch(refused, device_facts(input.device), f"the driver refused the cooperative "
                                f"launch of {refused.ctas} programs: {error}")
        plan, (output, h_n, c_n) = planned()
        launches.run(plan)
    out_dtype = input.dtype
    output, h_n, c_n = output.to(out_dtype), h_n.to(out_dtype), c_n.to(out_dtype)
    if input.dim() == 2:
        output = output.squeeze(1 if not batch_first else 0)
        h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
    return output, (h_n, c_n)
