"""Public lstm op: nn.LSTM's forward with torch.lstm's arguments, routed to a Triton kernel or torch.

    output, (h_n, c_n) = lstm(x, None, module._flat_weights, num_layers=2, bidirectional=True,
                              batch_first=True)

The op validates its input (errors name the argument, before any launch), builds a routing Request
from its request spec (`LSTM_REQUEST`, which `rlx-triton explain` reads too) and runs `lstm` of the
backend module the router picks (`backends/triton/lstm/`, or `backends/torch_ref/lstm.py`). Training with active dropout, proj_size > 0, packed sequences and
autograd are typed refusals (Request features) that fall back to torch.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch.nn.utils.rnn import PackedSequence

from rlx_triton.ops._compiled import compiling, options_from, options_text, run_eagerly
from rlx_triton.ops._checks import (InputDtypeError, InputShapeError, backend_module, call_signature, check_bool,
                                    check_device, check_dtype, check_int, check_is_tensor, check_same_dtype, needs_grad)
from rlx_triton.ops._request_spec import Derived, Feature, Given, RequestSpec, flag
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import routed_call

FAMILY = "lstm"
OP = "lstm"   # the prefix of every error message

LSTM_REQUEST = RequestSpec(
    FAMILY, "lstm",
    given=(Given("batch"), Given("seq"), Given("input_size"), Given("hidden"),
           Given("layers", 1, "nn.LSTM's default num_layers"),
           Given("directions", 1, "nn.LSTM's default (2: bidirectional)")),
    derived=(Derived("tokens", lambda f, o: f["seq"], "= seq", ("seq",)),),
    features={"dropout_active": flag(False), "proj_size": Feature(0), "packed": flag(False),
              "has_biases": flag(True), "batch_first": flag(False), "requires_grad": flag(False)},
)


def _lstm_request(input, hx=None, flat_weights=(), *, has_biases: bool = True, num_layers: int = 1,
                  dropout: float = 0.0, training: bool = False, bidirectional: bool = False,
                  batch_first: bool = False, proj_size: int = 0) -> Request:
    num_layers = check_int("num_layers", num_layers, 1, op=OP)
    proj_size = check_int("proj_size", proj_size, 0, op=OP)
    for name, value in (("has_biases", has_biases), ("training", training), ("bidirectional", bidirectional),
                        ("batch_first", batch_first)):
        check_bool(name, value, op=OP)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout <= 1.0:
        raise ValueError(f"{OP}: dropout must be a number in [0, 1], got {dropout!r}")
    packed = isinstance(input, PackedSequence)
    data = input.data if packed else input
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"{OP}: input must be a torch.Tensor or PackedSequence, got {type(input).__name__}")
    check_dtype("input", data, LSTM_REQUEST.dtypes, "a floating tensor (float32, float16, bfloat16, float64)", op=OP)
    expected_dims = (2,) if packed else (2, 3)
    if data.dim() not in expected_dims:
        shape = "(seq, input_size) or " + ("(batch, seq, input_size)" if batch_first else "(seq, batch, input_size)")
        raise ValueError(f"{OP}: input must be {shape}, got shape {tuple(data.shape)}")

    directions = 2 if bidirectional else 1
    per_direction = (4 if has_biases else 2) + (1 if proj_size > 0 else 0)
    weights = list(flat_weights)
    if len(weights) != num_layers * directions * per_direction:
        raise ValueError(f"{OP}: flat_weights must hold {num_layers * directions * per_direction} tensors "
                         f"(num_layers={num_layers} x directions={directions} x {per_direction}), got {len(weights)}")
    for i, w in enumerate(weights):
        check_is_tensor(f"flat_weights[{i}]", w, op=OP)
        check_device(f"flat_weights[{i}]", w, data, "input", op=OP)
    if weights[0].dtype != data.dtype:  # the input's mistake (a model's weights share one dtype)
        raise InputDtypeError(f"{OP}: input dtype ({data.dtype}) does not match the weights' dtype "
                              f"({weights[0].dtype}): "
                              f"convert the input (input.to({weights[0].dtype})) or the weights")
    for i, w in enumerate(weights[1:], start=1):
        check_same_dtype(f"flat_weights[{i}]", w, weights[0], "flat_weights[0]", op=OP)
    w_ih0, w_hh0 = weights[0], weights[1]
    hidden = w_hh0.shape[0] // 4 if w_hh0.dim() == 2 else 0
    h_size = proj_size if proj_size > 0 else hidden
    if w_hh0.dim() != 2 or hidden < 1 or tuple(w_hh0.shape) != (4 * hidden, h_size):
        raise ValueError(f"{OP}: flat_weights[1] (weight_hh_l0) must be "
                         f"(4*hidden, {'proj_size' if proj_size else 'hidden'}), "
                         f"got {tuple(w_hh0.shape)}")
    if w_ih0.dim() != 2 or w_ih0.shape[0] != 4 * hidden:
        raise ValueError(f"{OP}: flat_weights[0] (weight_ih_l0) must be (4*hidden={4 * hidden}, input_size), "
                         f"got {tuple(w_ih0.shape)}")
    input_size = data.shape[-1]
    if input_size != w_ih0.shape[1]:  # worded as nn.LSTM words it
        raise InputShapeError(f"{OP}: input.size(-1) must be equal to input_size. Expected {w_ih0.shape[1]}, "
                              f"got {input_size} (input of shape {tuple(data.shape)})")

    if packed:
        batch, seq = int(input.batch_sizes[0]), int(input.batch_sizes.numel())
    elif data.dim() == 2:
        batch, seq = 1, data.shape[0]
    else:
        batch, seq = (data.shape[0], data.shape[1]) if batch_first else (data.shape[1], data.shape[0])
    if hx is not None:
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"{OP}: hx must be a tuple (h0, c0) or None")
        unbatched = not packed and data.dim() == 2
        for name, t, size in (("hx[0] (h0)", hx[0], h_size), ("hx[1] (c0)", hx[1], hidden)):
            want = (num_layers * directions, size) if unbatched else (num_layers * directions, batch, size)
            check_is_tensor(name, t, op=OP)
            if tuple(t.shape) != want:  # nn.LSTM raises RuntimeError for a state of the wrong size
                raise InputShapeError(f"{OP}: {name} must have shape {want}, got {tuple(t.shape)}")
            check_device(name, t, data, "input", op=OP)
            check_same_dtype(name, t, data, "input", op=OP)

    tensors = [data, *weights] + ([] if hx is None else list(hx))
    requires_grad = needs_grad(*tensors)
    given = {"batch": batch, "seq": seq, "input_size": input_size, "hidden": hidden, "layers": num_layers,
             "directions": directions}
    features = {"dropout_active": bool(training and dropout > 0 and num_layers > 1), "proj_size": proj_size,
                "packed": packed, "has_biases": has_biases, "batch_first": batch_first,
                "requires_grad": requires_grad}
    return LSTM_REQUEST.make(given, features, tensor=data)


@routed_op(_lstm_request)
def lstm(input, hx: Optional[Tuple[torch.Tensor, torch.Tensor]], flat_weights: Sequence[torch.Tensor], *,
         has_biases: bool = True, num_layers: int = 1, dropout: float = 0.0, training: bool = False,
         bidirectional: bool = False, batch_first: bool = False, proj_size: int = 0):
    """(output, (h_n, c_n)) exactly as nn.LSTM returns them; flat_weights in nn.LSTM's _flat_weights order.

    A call whose signature (shapes, dtypes, devices, autograd, options) repeats an earlier one is not
    validated or routed again; packed sequences always are."""
    if compiling():
        options = dict(has_biases=has_biases, num_layers=num_layers, dropout=dropout, training=training,
                       bidirectional=bidirectional, batch_first=batch_first, proj_size=proj_size)
        # autograd and packed sequences run eagerly, where torch's LSTM takes them (no kernel covers them)
        if isinstance(input, PackedSequence) or not isinstance(hx, (tuple, list, type(None))) \
                or needs_grad(input, *(hx or ()), *flat_weights):
            return run_eagerly(lstm, input, hx, flat_weights, **options)
        h0, c0 = (None, None) if hx is None else hx
        output, h_n, c_n = _lstm_op(input, h0, c0, list(flat_weights), options_text(**options))
        return output, (h_n, c_n)
    signature = call_signature(OP, (input, hx, flat_weights),
                               (has_biases, num_layers, dropout, training, bidirectional, batch_first, proj_size))
    r = routed_call(signature, lambda: _lstm_request(
        input, hx, flat_weights, has_biases=has_biases, num_layers=num_layers, dropout=dropout, training=training,
        bidirectional=bidirectional, batch_first=batch_first, proj_size=proj_size),
        lambda: (lstm, (input, hx, flat_weights),
                 dict(has_biases=has_biases, num_layers=num_layers, dropout=dropout, training=training,
                      bidirectional=bidirectional, batch_first=batch_first, proj_size=proj_size)))
    return backend_module(r).lstm(input, None if hx is None else tuple(hx), list(flat_weights), has_biases=has_biases,
                         num_layers=num_layers, dropout=float(dropout), training=training,
                         bidirectional=bidirectional, batch_first=batch_first, proj_size=proj_size,
                         candidate=r.candidate, route=r)


@torch.library.custom_op("rlx_triton::lstm", mutates_args=())
def _lstm_op(input: torch.Tensor, h0: Optional[torch.Tensor], c0: Optional[torch.Tensor],
             flat_weights: List[torch.Tensor], options: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lstm under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs. The state is
    given as h0 and c0 (both or neither) and returned as h_n and c_n beside the output."""
    state = None if h0 is None or c0 is None else (h0, c0)   # the wrapper passes both or neither
    output, (h_n, c_n) = lstm(input, state, flat_weights, **options_from(options))
    return output.contiguous(), h_n.contiguous(), c_n.contiguous()


@_lstm_op.register_fake
def _lstm_fake(input, h0, c0, flat_weights, options):
    values = options_from(options)
    request = _lstm_request(input, None if h0 is None or c0 is None else (h0, c0), flat_weights, **values)
    fields = request.field_map
    batch, seq, hidden = fields["batch"], fields["seq"], fields["hidden"]
    states = fields["layers"] * fields["directions"]
    width = values["proj_size"] or hidden
    if input.dim() == 2:   # unbatched
        return (input.new_empty((seq, fields["directions"] * width)), input.new_empty((states, width)),
                input.new_empty((states, hidden)))
    output = (batch, seq, fields["directions"] * width) if values["batch_first"] else \
        (seq, batch, fields["directions"] * width)
    return input.new_empty(output), input.new_empty((states, batch, width)), input.new_empty((states, batch, hidden))
