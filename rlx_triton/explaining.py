"""rt.explain: the routes a call would take, for a public op, an rt.nn module or a whole model.

An op answers with the Route of its call (router.route.explain); an rt.nn module with the Route of its
forward (its own `explain`); any other nn.Module, such as a model after
rt.integrations.pyannote.optimize, with {module path: Route} for every rlx module its forward runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Union

if TYPE_CHECKING:
    from rlx_triton.router.route import Route


def explain(target: Any, *args: Any, **kwargs: Any) -> "Union[Route, Dict[str, Any]]":
    """The route `target(*args, **kwargs)` would take.

    Args:
        target: a public op of rlx_triton (rt.scaled_dot_product_attention, rt.sdpa_decode, rt.fbank, or
            an op of rlx_triton.ops), an rt.nn module, or any torch.nn.Module holding rt.nn modules.
        *args, **kwargs: the call, as it would be made; an op's call is validated as the op validates it.

    Returns:
        a Route for an op or an rt.nn module (nothing runs); for another nn.Module, {module path: Route} for
        every rlx module its forward runs (the forward runs once, under torch.no_grad()).

    Example:
        >>> import torch, rlx_triton as rt
        >>> lstm = rt.nn.LSTM(8, 16, batch_first=True)
        >>> rt.explain(lstm, torch.randn(2, 5, 8)).op
        'lstm'
        >>> sorted(rt.explain(torch.nn.Sequential(lstm), torch.randn(2, 5, 8)))
        ['0']
    """
    if getattr(target, "__rlx_request__", None) is not None:
        from rlx_triton.router.route import explain as explain_op

        return explain_op(target, *args, **kwargs)
    from torch import nn

    if isinstance(target, nn.Module):
        if explains_itself(target):
            return target.explain(*args, **kwargs)
        from rlx_triton.integrations.pyannote import explain as explain_model

        return explain_model(target, *args, **kwargs)
    raise TypeError(f"explain: {getattr(target, '__name__', type(target).__name__)!r} is not an rlx_triton op "
                    "or a torch.nn.Module")


def explains_itself(module: Any) -> bool:
    """Whether the module is an rlx module whose `explain` returns the one Route of its forward (not a
    container such as a residual block, whose submodules are explained one by one)."""
    return (type(module).__module__.startswith("rlx_triton.") and callable(getattr(module, "explain", None))
            and not getattr(module, "explains_submodules", False))
