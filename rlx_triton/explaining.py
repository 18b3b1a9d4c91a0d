"""rt.explain: the routes a call would take, for a public op, an rt.nn module or a whole model.

An op answers with the Route of its call (router.route.explain); an rt.nn module with the Route of its
forward (its own `explain`); any other nn.Module, such as a model after
rt.integrations.pyannote.optimize or a transformers model with rt attention registered, with
{module path: Route} for every rlx module its forward runs, or else for every rlx_triton op call it makes
(a warning says so when nothing was routed). Integrations build on this module, never the reverse.
"""
from __future__ import annotations

import contextvars
import inspect
import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Union, overload

if TYPE_CHECKING:
    from typing import Protocol

    from torch import nn

    from rlx_triton.router.route import Route

    class _ExplainsItsForward(Protocol):
        """An rt.nn module: its `explain` returns the Route of its forward."""

        def explain(self, *args: Any, **kwargs: Any) -> Route: ...


# ---- typing: explain's overloads (what each kind of target answers with) ----------------------------------
# A type checker takes the first overload that fits. An rt.nn module (an `explain` giving a Route) answers with
# a Route; any other nn.Module, rt.nn's BasicBlock and Bottleneck among them (their explain gives a dict), with
# {module path: Route}; an op with a Route. The module overloads come first: an nn.Module is callable too.
@overload
def explain(target: _ExplainsItsForward, *args: Any, **kwargs: Any) -> Route:
    ...


@overload
def explain(target: nn.Module, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    ...


@overload
def explain(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Route:
    ...
# ---- end of explain's overloads ----------------------------------------------------------------------------


def explain(target: Any, *args: Any, **kwargs: Any) -> "Union[Route, Dict[str, Any]]":
    """The route `target(*args, **kwargs)` would take.

    Args:
        target: a public op of rlx_triton (rt.scaled_dot_product_attention, rt.sdpa_decode, rt.fbank, or
            an op of rlx_triton.ops), an rt.nn module, or any torch.nn.Module holding rt.nn modules.
        *args, **kwargs: the call, as it would be made; an op's call is validated as the op validates it.

    Returns:
        a Route for an op or an rt.nn module (nothing runs); for another nn.Module, {module path: Route} for
        every rlx module its forward runs, else for every rlx_triton op call it makes (the forward runs
        once, under torch.no_grad()); {} with a UserWarning when nothing was routed.

    Raises:
        TypeError: target is neither an rlx_triton op nor an nn.Module, or the call does not fit the op's
            signature (the message names the op).

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

        _check_call(target, args, kwargs)
        return explain_op(target, *args, **kwargs)
    from torch import nn

    if isinstance(target, nn.Module):
        if explains_itself(target):
            own_explain = getattr(target, "explain")  # not an nn.Module attribute torch's types know
            return own_explain(*args, **kwargs)
        return explain_model(target, *args, **kwargs)
    raise TypeError(f"explain: {getattr(target, '__name__', type(target).__name__)!r} is not an rlx_triton op "
                    "or a torch.nn.Module")


def explain_as(device: str, target: Any, *args: Any, **kwargs: Any) -> "Union[Route, Dict[str, Any]]":
    """What `explain(target, *args, **kwargs)` would answer on a named GPU, from this machine (no GPU needed).

    The call is routed as on the device profile (rlx_triton.devices: "h200", "h100-sxm", "a100-80gb", "l40s",
    "rtx-4090", Apple "m1" ... "m2-ultra"; a unique prefix will do), on meta copies of the arguments (a module
    target is copied to the meta device; the original is not touched) with the kernels' launches planned, never
    run. On a CUDA profile each Route says what decided it among the eligible kernels and the library op
    (`decided_by`) and the estimated time of each (`timings`, the perf model's uncalibrated estimates: the
    kernels compiled ahead of time with the triton wheel's ptxas, the first time a configuration is seen).

    Args:
        device: the device profile's key.
        target, *args, **kwargs: as explain takes them.

    Returns:
        what explain returns for the target (a Route, or {module path: Route} for a model).

    Raises:
        ValueError: an unknown device. TypeError: as explain.

    Example:
        >>> import torch, rlx_triton as rt
        >>> q, k = torch.randn(1, 32, 1, 128, dtype=torch.float16), torch.randn(1, 8, 4096, 128, dtype=torch.float16)
        >>> route = rt.explain_as("h200", rt.sdpa_decode, q, k, k)
        >>> route.decided_by in ("estimated", "default")
        True
    """
    import contextlib
    import copy

    import torch

    from rlx_triton import devices

    profile = devices.profile(device)
    with contextlib.ExitStack() as stack:
        from rlx_triton.perf.trace import as_compiled, meta_copy
        from rlx_triton.router.device import routing_as

        from rlx_triton.backends.triton import triton_installed

        if triton_installed():   # plans as the compiled kernels launch, collected and never run
            from rlx_triton.backends.triton import launches

            stack.enter_context(as_compiled())
            stack.enter_context(routing_as(profile))
            stack.enter_context(launches.planning())
        else:
            stack.enter_context(routing_as(profile))
        module_type: Any = _module_type()
        if isinstance(target, module_type):
            target = copy.deepcopy(target).to("meta")
        meta_args, meta_kwargs = meta_copy(tuple(args)), meta_copy(dict(kwargs))
        stack.enter_context(torch.inference_mode())
        return explain(target, *meta_args, **meta_kwargs)


def _module_type() -> type:
    from torch import nn

    return nn.Module


# An object installed as a module's `forward` (a CUDA-graph replay, say) runs the module's own forward while
# a model is explained, so that every rlx module in it is seen running; it may also describe itself through
# `explain_forward` (see explain_model).
_explaining: contextvars.ContextVar[bool] = contextvars.ContextVar("rlx_triton_explaining", default=False)


def explaining_now() -> bool:
    """Whether a model forward runs inside explain_model (installed forwards then run eagerly)."""
    return _explaining.get()


def explain_model(model: Any, *inputs: Any, **kwargs: Any) -> Dict[str, Any]:
    """{module path: Route} for every rlx module of `model` that runs in `model(*inputs, **kwargs)`.

    The forward runs once, eagerly, under torch.no_grad(); each rlx module records the route its call takes
    (a module called twice gets a second key, "<path>#<n>"). A module whose instance `forward` is an object
    with `explain_forward(path, inputs, kwargs, called_directly)` adds the {key: note} that returns (a
    CUDA-graph replay says whether this call would replay). A model that runs no rlx module is explained by
    the op calls its forward makes (routed_calls); a UserWarning says so when nothing was routed at all.
    """
    import torch

    routes: Dict[str, Any] = {}
    with torch.no_grad():
        for path, module in model.named_modules():
            describe = getattr(module.__dict__.get("forward"), "explain_forward", None)
            if describe is not None:
                routes.update(describe(path, inputs, kwargs, called_directly=module is model))
    routed = _routes_of_rlx_modules(model, inputs, kwargs)
    if not routed:   # no rlx module in it: the routes of the op calls its forward makes (registered attention)
        routed = routed_calls(model, *inputs, **kwargs)
    if not routed:
        warnings.warn(f"explain: nothing was routed: the forward of this {type(model).__name__} runs no "
                      "rlx_triton module and makes no rlx_triton op call; rt.integrations.pyannote.optimize(model) "
                      "swaps them into a pyannote model; attention registered with rt.integrations.transformers "
                      "is routed per call (rt.explain(rt.scaled_dot_product_attention, q, k, v) shows one)",
                      stacklevel=3)
    routes.update(routed)
    return routes


def _routes_of_rlx_modules(model: Any, inputs: tuple, kwargs: dict) -> Dict[str, Any]:
    """{module path: Route} from the `explain` of each rlx module, called with the arguments its forward gets."""
    import torch

    routes: Dict[str, Any] = {}

    def hook_for(path: str, explain_call: Any) -> Any:
        def hook(module: Any, args: tuple, kw: dict) -> None:
            route = explain_call(*args, **kw)
            routes[path if path not in routes else f"{path}#{sum(k.startswith(path) for k in routes)}"] = route

        return hook

    handles = [module.register_forward_pre_hook(hook_for(path, module.explain), with_kwargs=True)
               for path, module in model.named_modules() if explains_itself(module)]
    token = _explaining.set(True)
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        _explaining.reset(token)
        for handle in handles:
            handle.remove()
    return routes


def routed_calls(model: Any, *args: Any, **kwargs: Any) -> Dict[str, Any]:
    """{module path: Route} of every rlx_triton op call in one eager no-grad forward of `model`, keyed by the
    innermost module making it (a module whose forward makes several gets "<path>#<n>" keys after the first)."""
    import torch

    from rlx_triton.router.route import recording_routes

    routes: Dict[str, Any] = {}
    stack = [""]
    taken = [0]

    def take(sink: list) -> None:
        for decided in sink[taken[0]:]:
            path = stack[-1]
            key = path if path not in routes else f"{path}#{sum(k == path or k.startswith(path + '#') for k in routes)}"
            routes[key] = decided
        taken[0] = len(sink)

    handles = []
    with recording_routes() as sink:
        for path, module in model.named_modules():
            def enter(module, inputs, path=path):
                take(sink)
                stack.append(path)

            def leave(module, inputs, output):
                take(sink)
                stack.pop()

            handles.append(module.register_forward_pre_hook(enter))
            handles.append(module.register_forward_hook(leave))
        try:
            with torch.no_grad():
                model(*args, **kwargs)
            take(sink)
        finally:
            for handle in handles:
                handle.remove()
    return routes


def _check_call(op: Any, args: tuple, kwargs: dict) -> None:
    """TypeError naming the public op when the call does not fit its signature (not the op's request builder)."""
    try:
        inspect.signature(op).bind(*args, **kwargs)
    except TypeError as error:
        name = getattr(op, "__name__", repr(op))
        raise TypeError(f"explain: {name}() {error} (rt.explain(op, *args, **kwargs) explains the call "
                        "op(*args, **kwargs))") from None
    except ValueError:  # no signature to read: the op's own checks say what is wrong
        pass


def explains_itself(module: Any) -> bool:
    """Whether the module is an rlx module whose `explain` returns the one Route of its forward (not a
    container such as a residual block, whose submodules are explained one by one)."""
    return (type(module).__module__.startswith("rlx_triton.") and callable(getattr(module, "explain", None))
            and not getattr(module, "explains_submodules", False))
