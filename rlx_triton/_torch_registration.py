"""Registers rt's flash attention implementation, "RLX", with torch's registry (torch.nn.attention) on import.

torch asks providers to register on import and leave activation to the user
(`torch.nn.attention.activate_flash_attention_impl("RLX")`). `import rlx_triton` must stay cheap and must not
import torch, so this module uses the standard library only: where torch.nn.attention is imported already it
registers at once; otherwise a finder on sys.meta_path registers right after torch imports it (torch imports it
while it initializes), then removes itself. What is registered is `_activate`, which imports rt's implementation
(rlx_triton/integrations/torch_attention.py) only when the user activates it.
"""
from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Optional, Sequence

NAME = "RLX"
_REGISTRY = "torch.nn.attention"


def _activate() -> Any:
    from rlx_triton.integrations import torch_attention

    return torch_attention.activate()


def _register_with(attention: Any) -> None:
    register = getattr(attention, "register_flash_attention_impl", None)   # a torch without the registry: nothing to do
    if register is not None:
        register(NAME, register_fn=_activate)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for torch.nn.attention it hands back the spec the other finders give, its loader
    wrapped to register "RLX" once the module has run."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None):
        if fullname != _REGISTRY:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:   # the other finders: whichever would have found it
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register_with(module)

        loader.exec_module = exec_module
        return spec


def register_flash_impl() -> None:
    """Registers "RLX" with torch's flash attention registry now, or when torch.nn.attention is first imported."""
    attention = sys.modules.get(_REGISTRY)
    if attention is not None:
        _register_with(attention)
    elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
