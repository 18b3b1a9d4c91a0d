"""Which backend the router may pick, per thread and task: `use_backend` nests through contextvars."""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Iterator, Optional, Tuple

from rlx_triton.config import BACKEND_NAMES, Settings, settings


@dataclass(frozen=True)
class BackendChoice:
    name: str  # auto | triton | metal | torch
    strict: bool
    candidate: Optional[str] = None  # a pinned candidate tag (tuning and sweeps); still needs approval
    # (name, strict, candidate): what a route cache keys a choice by, made once (every op call reads it)
    key: Tuple[str, bool, Optional[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.name, self.strict, self.candidate))


_choice: contextvars.ContextVar[Optional[BackendChoice]] = contextvars.ContextVar("rlx_triton_backend", default=None)
# the innermost use_backend's choice, or None outside every block (where the settings choose): the route cache's
# per-thread hit compares it by identity instead of building the current choice
choice_in_block = _choice.get
# the choice the settings make outside any use_backend block, with the settings it was made from
_default_choice: Optional[Tuple[Settings, BackendChoice]] = None


def current_choice() -> BackendChoice:
    """The innermost `use_backend` of this context, else RLX_TRITON_BACKEND / RLX_TRITON_STRICT."""
    global _default_choice
    choice = _choice.get()
    if choice is not None:
        return choice
    env = settings()
    made = _default_choice
    if made is None or made[0] is not env:
        made = _default_choice = (env, BackendChoice(env.backend, env.strict))
    return made[1]


@contextlib.contextmanager
def use_backend(name: str, strict: bool = False) -> Iterator[BackendChoice]:
    """Force ("triton", "metal", "torch") or free ("auto") the backend choice inside a with-block.

    The choice is per thread and per async context, and nests (the innermost wins); outside any block
    RLX_TRITON_BACKEND and RLX_TRITON_STRICT decide. A forced backend that cannot run a call (not
    installed, another device, shape outside its coverage, no approved candidate) falls back to the
    torch op quietly, with the reason in `rt.explain`, unless strict=True, which raises
    rt.MissingKernel instead. A candidate pinned with use_candidate stays pinned inside.

    Args:
        name: "auto", "triton", "metal" or "torch" (ValueError otherwise).
        strict: bool (TypeError otherwise); True raises rt.MissingKernel where no kernel of the chosen
            backend covers a call ("torch" never raises).

    Returns:
        a context manager whose value is the BackendChoice in force inside the block.

    Raises:
        ValueError: name is not one of the four.
        TypeError: strict is not a bool.

    Example:
        >>> import torch, rlx_triton as rt
        >>> with rt.use_backend("torch"):
        ...     rt.explain(rt.fbank, torch.randn(16000)).backend
        'torch'
    """
    if not isinstance(name, str) or name not in BACKEND_NAMES:
        raise ValueError(f"use_backend: name must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")
    if not isinstance(strict, bool):
        raise TypeError(f"use_backend: strict must be a bool, got {type(strict).__name__}")
    choice = BackendChoice(name, strict, current_choice().candidate)
    token = _choice.set(choice)
    try:
        yield choice
    finally:
        _choice.reset(token)


@contextlib.contextmanager
def use_candidate(tag: str) -> Iterator[BackendChoice]:
    """Pins the candidate with this tag for kernel backends inside a with-block (what `rlx-triton tune` times).

    A pinned candidate still needs an accuracy approval; a backend whose plan lacks the tag, or has
    it unapproved, is skipped with that reason.
    """
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"use_candidate: tag must be a non-empty str, got {tag!r}")
    outer = current_choice()
    pinned = BackendChoice(outer.name, outer.strict, tag)
    token = _choice.set(pinned)
    try:
        yield pinned
    finally:
        _choice.reset(token)
