"""The table of recognisers `rt.integrations.pyannote.optimize` walks a model with: each a structure predicate
and a swap function, by name.

Modules register theirs with `register_recogniser` (re-exported by rlx_triton.integrations.pyannote): the
PyanNet one when rlx_triton.integrations.pyannote is imported, the WeSpeaker ResNet ones when
rlx_triton.integrations._wespeaker is, which the table loads on first use (`recognisers()`, `recognised()`).
The table sits below both, so that code which asks it a question (the pipeline optimizer:
`recognised("wespeaker_resnet", model)`) imports neither of them.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Callable, Dict, List

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
        raise ValueError(f"register_recogniser: name must be a non-empty str, got {name!r}")
    if not callable(matches) or not callable(swap):
        raise TypeError("register_recogniser: matches and swap must be callables taking an nn.Module")
    _RECOGNISERS[name] = Recogniser(name, matches, swap)


def recognisers() -> List[Recogniser]:
    _load_extensions()
    return list(_RECOGNISERS.values())


def _load_extensions() -> None:
    for module_name in _EXTENSIONS:
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name)


def recognised(name: str, module: nn.Module) -> bool:
    """Whether the recogniser registered as `name` matches `module` (False when none is registered)."""
    _load_extensions()
    recogniser = _RECOGNISERS.get(name)
    return recogniser is not None and bool(recogniser.matches(module))


__all__ = ["Recogniser", "recognised", "recognisers", "register_recogniser"]
