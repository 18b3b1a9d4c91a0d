"""What the compile tests check of one call (tests/ops/test_compile.py, tests/nn/test_compile.py).

A case builds a call: `make()` returns (fn, args), fresh tensors each time (the same values: seeded), so a call
that updates its inputs in place (a KV-cache append) starts from the same state in eager mode and compiled.

- `assert_one_graph(case)`: torch._dynamo.explain of the call on the torch path: one graph, no break.
- `assert_compiled_equals_eager(name, case, backend)`: torch.compile(fullgraph=True) on `backend` ("eager",
  "aot_eager", "inductor") gives the eager call's outputs and leaves its tensor arguments as the eager call leaves
  them (an in-place cache update is a mutation the graph carries), in each mode: "torch" (rt.use_backend("torch"))
  and "kernels" (rt.use_backend("triton", strict=True): every call runs a Triton kernel, in the interpreter, or
  raises). fullgraph=True fails on any graph break, and the compiling backend counts the graphs: exactly one, for
  both modes (the route is decided when the graph runs, so the same graph serves both). The eager result is
  computed once per case and mode (the interpreter makes a kernel call slow).

The compiled call runs the same op on the same route as the eager one (ops/_compiled.py), so the two agree to the
float32 tolerance 1e-5 (inductor may fuse the torch arithmetic around the ops, e.g. a BatchNorm fold).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch
import torch._dynamo

import rlx_triton as rt

Make = Callable[[], Tuple[Callable[..., Any], tuple]]
RTOL = ATOL = 1e-5
_eager_results: Dict[Tuple[str, str], Tuple[list, list]] = {}


def backend_mode(mode: str):
    return rt.use_backend("triton", strict=True) if mode == "kernels" else rt.use_backend("torch")


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _run(fn, args) -> Tuple[list, list]:
    """(the output's tensors, the argument tensors after the call), detached copies."""
    out = fn(*args)
    return [t.detach().clone() for t in _tensors(out)], [t.detach().clone() for t in _tensors(args)]


def assert_one_graph(make: Make) -> None:
    torch._dynamo.reset()
    fn, args = make()
    with torch.no_grad(), backend_mode("torch"):
        explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def assert_compiled_equals_eager(name: str, make: Make, backend: str, modes=("torch", "kernels"),
                                 grad_mode=torch.no_grad) -> None:
    """One compiled function (the route is decided when its graph runs, so one compile serves every mode), run
    under each mode and compared with the eager call under that mode, both under `grad_mode` (torch.no_grad, or
    torch.inference_mode)."""
    torch._dynamo.reset()
    graphs = []
    compiling_backend = torch._dynamo.lookup_backend(backend)

    def counting(graph_module, example_inputs):
        graphs.append(graph_module)
        return compiling_backend(graph_module, example_inputs)

    fn, _ = make()
    compiled = torch.compile(fn, fullgraph=True, backend=counting)
    for mode in modes:
        with grad_mode(), backend_mode(mode):
            if (name, mode) not in _eager_results:
                _eager_results[name, mode] = _run(*make())
            want_out, want_args = _eager_results[name, mode]
            got_out, got_args = _run(compiled, make()[1])
        assert len(graphs) == 1, f"{mode}: {len(graphs)} graphs"
        assert len(got_out) == len(want_out) and len(got_args) == len(want_args)
        for got, want in zip(got_out + got_args, want_out + want_args):
            torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{mode}: {m}")
