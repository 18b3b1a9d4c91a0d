"""Metal launcher of the lstm family (metal/lstm.metal): multi-layer, optionally bidirectional LSTM
with nn.LSTM's semantics (gate order i, f, g, o; output, (h_n, c_n)).

Same function name and signature as backends/torch_ref/lstm.py. Per layer: one launch projects
every timestep and both directions (bias = b_ih + b_hh folded in), then the recurrence runs either
persistent (one threadgroup per (direction, batch row) loops over time with h and c in threadgroup
memory: one launch per layer) or stepwise (one launch per timestep, h double-buffered in device
memory). Gates, state and recurrence in fp32; hidden <= 512.
Candidate -> launch: mode -> persistent / stepwise kernel ("onchip" runs the persistent kernel: one
threadgroup already holds a whole direction's state), tg_size -> threadgroup size (multiple of 32).
batch_tile, hidden_tile, stages and precision do not change the Metal kernels (fp32 math). `route` is
accepted for the family's common signature.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from rlx_triton.backends.metal import candidates as _candidates
from rlx_triton.backends.metal import library
from rlx_triton.router.coverage import Coverage

FAMILY = "lstm"
MAX_HIDDEN = 512  # the persistent kernel's threadgroup state arrays
KERNEL_ARGUMENTS = {
    "lstm_input_projection": ("x:T", "w_ih:float32", "bias:float32", "gates_x:float32", "seq:long", "batch:long",
                              "input_size:long", "hidden:long", "directions:long"),
    "lstm_recurrence_step": ("gates_x:float32", "w_hh:float32", "h_in:float32", "h_out:float32",
                             "c_state:float32", "y:T", "step:long", "seq:long", "batch:long", "hidden:long",
                             "directions:long"),
    "lstm_recurrence_persistent": ("gates_x:float32", "w_hh:float32", "h0:float32", "c0:float32", "y:T",
                                   "h_n:float32", "c_n:float32", "seq:long", "batch:long", "hidden:long",
                                   "directions:long"),
}

COVERAGE = Coverage(
    ops=frozenset({"lstm"}),
    devices=frozenset({"mps"}),
    dtypes=frozenset({"float32", "float16", "bfloat16"}),
    ranges={"hidden": (1, MAX_HIDDEN), "layers": (1, 64), "directions": (1, 2), "input_size": (1, 1 << 16),
            "seq": (1, 1 << 20), "batch": (1, 1 << 16)},
    features={
        "dropout_active": frozenset({False}),
        "proj_size": frozenset({0}),
        "packed": frozenset({False}),
        "has_biases": frozenset({True, False}),
        "batch_first": frozenset({True, False}),
        "requires_grad": frozenset({False}),
    },
)
APPROVALS = _candidates.approvals(FAMILY)
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def _f32(t: torch.Tensor, device) -> torch.Tensor:
    return t.detach().to(device=device, dtype=torch.float32).contiguous()


def layer_weights(flat_weights, *, has_biases: bool, layer: int, directions: int, device):
    """(w_ih (dirs, 4H, I), w_hh (dirs, 4H, H), bias (dirs, 4H) = b_ih + b_hh) as float32 for one layer."""
    per_direction = 4 if has_biases else 2
    w_ih, w_hh, bias = [], [], []
    for direction in range(directions):
        base = (layer * directions + direction) * per_direction
        w_ih.append(_f32(flat_weights[base], device))
        w_hh.append(_f32(flat_weights[base + 1], device))
        if has_biases:
            bias.append(_f32(flat_weights[base + 2], device) + _f32(flat_weights[base + 3], device))
        else:
            bias.append(torch.zeros(w_hh[-1].shape[0], dtype=torch.float32, device=device))
    return torch.stack(w_ih).contiguous(), torch.stack(w_hh).contiguous(), torch.stack(bias).contiguous()


def lstm(input: torch.Tensor, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: List[torch.Tensor],
         *, has_biases: bool, num_layers: int, dropout: float, training: bool, bidirectional: bool,
         batch_first: bool, proj_size: int = 0, candidate=None, route=None
         ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """nn.LSTM forward. Dropout is never active here and proj_size is 0: COVERAGE sends those to torch."""
    if proj_size:
        raise ValueError(f"proj_size must be 0 on the Metal path, got {proj_size} (the torch fallback covers it)")
    unbatched = input.dim() == 2
    x = input.unsqueeze(0 if batch_first else 1) if unbatched else input
    if batch_first:
        x = x.transpose(0, 1)
    x = x.contiguous()  # (seq, batch, input)
    seq, batch, _ = x.shape
    dtype, device = x.dtype, x.device
    directions = 2 if bidirectional else 1
    hidden = flat_weights[1].shape[1]
    if hx is None:
        h0_all = torch.zeros(num_layers * directions, batch, hidden, dtype=torch.float32, device=device)
        c0_all = torch.zeros_like(h0_all)
    else:
        h0_all, c0_all = (state.unsqueeze(1) if unbatched else state for state in hx)
        h0_all, c0_all = _f32(h0_all, device), _f32(c0_all, device)
    mode = _candidates.field(candidate, "mode", "persistent")
    group_size = library.group_size_for(int(_candidates.field(candidate, "tg_size", 128)))
    h_n, c_n = [], []
    for layer in range(num_layers):
        w_ih, w_hh, bias = layer_weights(flat_weights, has_biases=has_biases, layer=layer, directions=directions,
                                         device=device)
        gates_x = torch.empty((directions, seq, batch, 4 * hidden), dtype=torch.float32, device=device)
        library.dispatch(FAMILY, "lstm_input_projection", dtype, KERNEL_ARGUMENTS["lstm_input_projection"],
                         groups=library.groups_for(gates_x.numel(), group_size), group_size=group_size,
                         x=x, w_ih=w_ih, bias=bias, gates_x=gates_x, seq=seq, batch=batch, input_size=x.shape[-1],
                         hidden=hidden, directions=directions)
        states = slice(layer * directions, (layer + 1) * directions)
        h0, c0 = h0_all[states].contiguous(), c0_all[states].contiguous()
        y = torch.empty((seq, batch, directions * hidden), dtype=dtype, device=device)
        if mode == "stepwise":
            h_in, h_out, c_state = h0.clone(), torch.empty_like(h0), c0.clone()
            for step in range(seq):
                library.dispatch(FAMILY, "lstm_recurrence_step", dtype, KERNEL_ARGUMENTS["lstm_recurrence_step"],
                                 groups=library.groups_for(h0.numel(), group_size), group_size=group_size,
                                 gates_x=gates_x, w_hh=w_hh, h_in=h_in, h_out=h_out, c_state=c_state, y=y,
                                 step=step, seq=seq, batch=batch, hidden=hidden, directions=directions)
                h_in, h_out = h_out, h_in
            layer_h, layer_c = h_in, c_state
        else:
            layer_h, layer_c = torch.empty_like(h0), torch.empty_like(c0)
            library.dispatch(FAMILY, "lstm_recurrence_persistent", dtype,
                             KERNEL_ARGUMENTS["lstm_recurrence_persistent"], groups=directions * batch,
                             group_size=group_size, gates_x=gates_x, w_hh=w_hh, h0=h0, c0=c0, y=y, h_n=layer_h,
                             c_n=layer_c, seq=seq, batch=batch, hidden=hidden, directions=directions)
        h_n.append(layer_h)
        c_n.append(layer_c)
        x = y
    output = x.transpose(0, 1) if batch_first else x
    h_n_all = torch.cat(h_n).to(dtype)
    c_n_all = torch.cat(c_n).to(dtype)
    if unbatched:
        output = output.squeeze(0 if batch_first else 1)
        h_n_all, c_n_all = h_n_all.squeeze(1), c_n_all.squeeze(1)
    return output, (h_n_all, c_n_all)
