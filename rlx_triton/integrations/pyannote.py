"""Optimize pyannote.audio models and pipelines in place by swapping in rlx_triton modules.

    model = rlx_triton.integrations.pyannote.optimize(model)      # a PyanNet, or any nn.Module
    pipeline = rlx_triton.integrations.pyannote.optimize(pipeline)  # every model the pipeline holds
    routes = rlx_triton.integrations.pyannote.explain(model, waveforms)  # {module path: Route}

Models are recognised by structure (class names and attributes as pyannote.audio 3.x and 4.x define
them); pyannote is never imported. Recognition is a table of recognisers, each a structure predicate
and a swap function; other modules add theirs with `register_recogniser`:

    register_recogniser("wespeaker_resnet", matches=lambda module: ..., swap=lambda module: module)

`optimize` imports `rlx_triton.integrations._wespeaker` (if that module exists) so that its
registrations are in the table. Modules and models no recogniser matches are left unchanged.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
from torch import nn


@dataclass(frozen=True)
class Recogniser:
    name: str
    matches: Callable[[nn.Module], bool]  # structure predicate; must not raise for unknown modules
    swap: Callable[[nn.Module], nn.Module]  # swaps rlx modules in, in place; returns the module to keep


_RECOGNISERS: Dict[str, Recogniser] = {}
_EXTENSIONS = ("rlx_triton.integrations._wespeaker",)


def register_recogniser(name: str, matches: Callable[[nn.Module], bool],
                        swap: Callable[[nn.Module], nn.Module]) -> None:
    """Add (or replace, by name) a recogniser. `optimize` walks every module of a model top-down; the
    first recogniser whose `matches(module)` is true gets `swap(module)`, whose result replaces the
    module in its parent (return the module itself for an in-place swap), and the walk does not
    descend into a swapped module."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")
    if not callable(matches) or not callable(swap):
        raise TypeError("matches and swap must be callables taking an nn.Module")
    _RECOGNISERS[name] = Recogniser(name, matches, swap)


def recognisers() -> List[Recogniser]:
    _load_extensions()
    return list(_RECOGNISERS.values())


def _load_extensions() -> None:
    for module_name in _EXTENSIONS:
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name)


# ---------------------------------------------------------------------------------------------
# PyanNet
# ---------------------------------------------------------------------------------------------
def _class_name(obj) -> str:
    return type(obj).__name__


def _is_lstm_stack(lstm) -> bool:
    if isinstance(lstm, nn.LSTM):
        return True
    return isinstance(lstm, nn.ModuleList) and len(lstm) > 0 and all(isinstance(m, nn.LSTM) for m in lstm)


def is_pyannet(module: nn.Module) -> bool:
    """pyannote.audio's PyanNet: sincnet (SincNet), lstm (nn.LSTM or ModuleList of them), optional
    linear (ModuleList of nn.Linear), classifier (nn.Linear) and activation (nn.Module)."""
    if _class_name(module) != "PyanNet" or not isinstance(module, nn.Module):
        return False
    linear = module._modules.get("linear")
    return (_class_name(module._modules.get("sincnet")) == "SincNet"
            and _is_lstm_stack(module._modules.get("lstm"))
            and (linear is None or isinstance(linear, nn.ModuleList) and all(isinstance(l, nn.Linear) for l in linear))
            and isinstance(module._modules.get("classifier"), nn.Linear)
            and isinstance(module._modules.get("activation"), nn.Module))


class _HeadLinears(nn.ModuleList):
    """The model's `linear` list once the fused head runs them: still registered (state_dict keys,
    .to(), parameters) but empty to iteration, so the model's own forward loop skips them."""

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(())

    def layers(self) -> List[nn.Module]:
        return list(self._modules.values())

    def __repr__(self) -> str:
        return nn.Module.__repr__(self)

    def extra_repr(self) -> str:
        return "run by the fused head (classifier)"


def _swap_sincnet(model: nn.Module) -> None:
    if _class_name(model.sincnet) != "SincNet" or not importlib.util.find_spec("rlx_triton.nn.conv"):
        return
    try:
        from rlx_triton.nn import SincNet
    except (ImportError, AttributeError):
        return
    if isinstance(model.sincnet, SincNet):
        return
    try:
        model.sincnet = SincNet.from_pyannote(model.sincnet)
    except ValueError:  # a SincNet configuration the rlx forward does not reproduce stays as it is
        return


def _swap_lstm(model: nn.Module) -> None:
    from rlx_triton.nn.lstm import LSTM

    lstm = model.lstm
    if isinstance(lstm, nn.LSTM):
        if not isinstance(lstm, LSTM):
            model.lstm = LSTM.from_torch(lstm)
    else:
        for i, layer in enumerate(lstm):
            if not isinstance(layer, LSTM):
                lstm[i] = LSTM.from_torch(layer)


def _swap_head(model: nn.Module) -> None:
    from rlx_triton.nn.segdense import SegDense, activation_name

    if isinstance(model.classifier, SegDense) or activation_name(model.activation) is None:
        return
    linear = model._modules.get("linear")
    head_linears = None
    if linear is not None:
        head_linears = _HeadLinears(list(linear))
    model.classifier = SegDense(head_linears if head_linears is not None else nn.ModuleList(), model.classifier,
                                activation_name(model.activation), register_linears=False)
    if head_linears is not None:
        model.linear = head_linears
    model.activation = nn.Identity()


def swap_pyannet(model: nn.Module) -> nn.Module:
    """SincNet -> rlx SincNet, the LSTM stack -> rlx LSTMs (shared parameters), the dense head
    (linear + leaky ReLU stack, classifier, activation) -> one SegDense; state_dict keys unchanged
    for the LSTM and the head."""
    _swap_sincnet(model)
    _swap_lstm(model)
    _swap_head(model)
    return model


register_recogniser("pyannet", is_pyannet, swap_pyannet)


# ---------------------------------------------------------------------------------------------
# optimize / explain
# ---------------------------------------------------------------------------------------------
def _optimize_module(module: nn.Module, table: List[Recogniser]) -> nn.Module:
    for recogniser in table:
        if recogniser.matches(module):
            return recogniser.swap(module)
    for name, child in list(module._modules.items()):
        if child is None:
            continue
        new_child = _optimize_module(child, table)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def _held_modules(obj, depth: int, seen: set) -> Iterator[Tuple[Any, str, nn.Module]]:
    """(owner, attribute, module) for every nn.Module reachable through a pipeline's attributes
    (e.g. `_segmentation.model`, `_embedding.model_`), at most `depth` attributes deep."""
    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return
    for name, value in list(attrs.items()):
        if isinstance(value, nn.Module):
            if id(value) not in seen:
                seen.add(id(value))
                yield obj, name, value
        elif isinstance(value, (str, bytes, int, float, bool, torch.Tensor)) or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from _held_modules(item, depth - 1, seen)
        elif isinstance(value, dict):
            for item in value.values():
                yield from _held_modules(item, depth - 1, seen)
        else:
            yield from _held_modules(value, depth - 1, seen)


def optimize(model):
    """Swap rlx modules into `model` (an nn.Module) or into every model a pipeline object holds, in
    place; returns the same object. Unknown modules and objects are left unchanged."""
    table = recognisers()
    if isinstance(model, nn.Module):
        return _optimize_module(model, table)
    for owner, name, module in list(_held_modules(model, depth=4, seen=set())):
        new_module = _optimize_module(module, table)
        if new_module is not module:
            setattr(owner, name, new_module)
    return model


def _sincnet_route(module: nn.Module, waveforms: torch.Tensor):
    """The route of rlx SincNet's forward: the same `ops.conv.sincnet` call, explained."""
    from rlx_triton.ops import conv as conv_ops
    from rlx_triton.router import explain as explain_op

    convs, norms = list(module.conv1d)[1:], list(module.norm1d)
    return explain_op(conv_ops.sincnet, waveforms, module.filters(), module.wav_norm1d.weight,
                      module.wav_norm1d.bias, [c.weight for c in convs], [c.bias for c in convs],
                      [n.weight for n in norms], [n.bias for n in norms], stride=module.conv1d[0].stride,
                      pool=module.pool1d[0].kernel_size, eps=module.wav_norm1d.eps,
                      negative_slope=module.negative_slope, sample_rate=int(module.sample_rate))


def _route_of(module: nn.Module):
    """The module's own `explain` if it has one, else a known forward's route, else None."""
    if not type(module).__module__.startswith("rlx_triton."):
        return None
    if callable(getattr(module, "explain", None)):
        return module.explain
    if type(module).__module__ == "rlx_triton.nn.conv" and type(module).__name__ == "SincNet":
        return lambda waveforms: _sincnet_route(module, waveforms)
    return None


def explain(model: nn.Module, *inputs, **kwargs) -> Dict[str, Any]:
    """{module path: Route} for every rlx module of `model` that runs when `model(*inputs, **kwargs)`
    runs (the forward runs once, under no_grad; each rlx module reports the route its call takes)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    routes: Dict[str, Any] = {}
    handles = []

    def hook_for(path: str, explain_call):
        def hook(module, args, kw):
            route = explain_call(*args, **kw)
            routes[path if path not in routes else f"{path}#{sum(k.startswith(path) for k in routes)}"] = route

        return hook

    for path, module in model.named_modules():
        explain_call = _route_of(module)
        if explain_call is not None:
            handles.append(module.register_forward_pre_hook(hook_for(path, explain_call), with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return routes
