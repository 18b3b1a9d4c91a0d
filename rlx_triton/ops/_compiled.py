"""How a routed op runs under torch.compile: as one torch.library custom op that routes when the graph runs.

Dynamo cannot trace the router (it reads the use_backend ContextVar, takes the route caches' locks, asks the device
for its facts), and a Triton launch cannot run on the fake tensors it traces with. So while torch.compile traces a
call, each op's wrapper calls the op's custom op (`rlx_triton::<op>`, defined beside the op): its fake
implementation validates the call (the op's own checks, on the fake tensors) and states the output shapes; its
real implementation is the eager op, which validates, routes and launches when the compiled graph runs. The
route is therefore decided outside the traced region, under the use_backend block in force at each call of the
compiled function, and is never baked into the graph; torch._dynamo's settings are never changed.

A custom op takes tensors, lists of tensors, numbers, bools and strings. An op whose options are more than that
(fbank's 26 keywords, a conv epilogue, a padding that is an int or a word) hands them over as one string:
`options_text` writes the values' reprs, which Dynamo folds to a constant while tracing, and `options_from`
reads them back with their exact types (True, 1 and 1.0 stay apart, so validation judges what the caller
passed).

Calls that autograd records never reach a custom op (the kernels are forward-only and the custom ops state no
derivative): under torch.compile they run the eager op (`run_eagerly`, a graph break), which routes them to
torch's differentiable ops as it does outside torch.compile.
"""
from __future__ import annotations

import ast
import functools
from typing import Any, Callable, Dict, Tuple

import torch

from rlx_triton.caches import LIMITS


def compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing the current call."""
    return torch.compiler.is_compiling()


@torch.compiler.disable
def run_eagerly(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """op(*args, **kwargs) outside the compiled graph: a call that autograd records, which the eager op sends to
    torch's differentiable ops (the one place a routed op breaks a graph)."""
    return op(*args, **kwargs)


def options_text(**values: Any) -> str:
    """The op's non-tensor arguments as one string a custom op can take: `name=repr(value)` pairs. Values are
    Python literals (None, bools, numbers, strings, tuples of them)."""
    return repr(tuple(values.items()))


def options_from(text: str) -> Dict[str, Any]:
    """The arguments `options_text` wrote, with their types (a fresh dict: callers may change it)."""
    return dict(_parsed(text))


@functools.lru_cache(maxsize=LIMITS["compiled_options"])   # one parse per option set: a graph repeats its strings
def _parsed(text: str) -> Tuple[Tuple[str, Any], ...]:
    return tuple(ast.literal_eval(text))
