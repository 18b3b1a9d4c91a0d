"""The backend family protocol: what a module at `<backend package>.<family>` must define.

The router finds a backend's family modules by string import (registry.family_module, typed as
FamilyModule; registry.kernel_family_module, typed as KernelFamilyModule) and reads them as data. What it
reads is written down here once, as typing.Protocols for readers and type checkers, and checked (names,
and that each is a Coverage, a function or a mapping) when a module is first loaded, so a module that
lacks a piece is refused with its name and the missing attribute instead of failing later inside a
routed call.

Every family module (the library fallback's too):
    COVERAGE        a Coverage: what its kernels implement (Coverage.everything() for the library);
    one function per op that COVERAGE names (e.g. `lstm`, `sdpa_decode`), which the public op calls as
    `route.module.<op>(..., candidate=route.candidate)`.
Every kernel backend's family module (not the library's) also:
    APPROVALS       {candidate tag: Approval}, the accuracy evidence a candidate needs to run;
    RECIPES         {device class: tag} or {device class: {recipe_key(request): tag, "*": tag}};
    SPEED_EVIDENCE  {candidate tag: text}, a label that never decides a route;
    recipe_key(request) -> hashable, only where a RECIPES value is a mapping.
A backend may name more (BackendSpec.module_attributes): the Triton backend's modules state
AUDIT_KERNELS (what `rlx-triton audit` compiles) and launch_count(request, candidate).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Hashable, Iterator, Mapping, Protocol, Sequence, Union

from rlx_triton.router.approvals import Approval
from rlx_triton.router.coverage import Coverage


class FamilyModule(Protocol):
    """A backend's module for one kernel family (the library fallback's modules need only this).

    Its other names are read by name: the function of each op COVERAGE names, and what a backend states
    beyond the protocol (recipe_key, AUDIT_KERNELS, launch_count, library_kernels, explain_execution)."""

    COVERAGE: Coverage

    def __getattr__(self, name: str) -> Any: ...


class KernelFamilyModule(FamilyModule, Protocol):
    """A kernel backend's family module: coverage plus the routing tables the router reads."""

    APPROVALS: Mapping[str, Approval]
    RECIPES: Mapping[str, Union[str, Mapping[Hashable, str]]]
    SPEED_EVIDENCE: Mapping[str, str]


class BackendProtocolError(TypeError):
    """A backend family module that does not define what the router reads."""


# attribute -> (what it must be, what it is for), for the kernel backends' tables
KERNEL_TABLES = {
    "APPROVALS": "a mapping of candidate tag -> Approval",
    "RECIPES": "a mapping of device class -> candidate tag (or -> {recipe_key(request): tag})",
    "SPEED_EVIDENCE": "a mapping of candidate tag -> text",
}


def _missing(module: ModuleType, is_library: bool, extra: Sequence[str]) -> Iterator[str]:
    """What `module` lacks, one line each ("COVERAGE (a Coverage)", "function lstm (an op COVERAGE names)")."""
    coverage = getattr(module, "COVERAGE", None)
    if not isinstance(coverage, Coverage):
        yield "COVERAGE (a rlx_triton.router.Coverage)"
    else:
        for op in sorted(coverage.ops or ()):
            if not callable(getattr(module, op, None)):
                yield f"{op} (the function of op {op!r}, which its COVERAGE names)"
    if not is_library:
        for name, expected in KERNEL_TABLES.items():
            if not isinstance(getattr(module, name, None), Mapping):
                yield f"{name} ({expected})"
        recipes: Any = getattr(module, "RECIPES", None)
        if isinstance(recipes, Mapping) and any(isinstance(value, Mapping) for value in recipes.values()) \
                and not callable(getattr(module, "recipe_key", None)):
            yield "recipe_key (a function of the request: RECIPES maps a device class to per-key tags)"
    for name in extra:
        if not hasattr(module, name):
            yield f"{name} (every module of this backend states it)"


def check_family_module(module: ModuleType, *, backend: str, is_library: bool = False,
                        extra: Sequence[str] = ()) -> ModuleType:
    """The module itself if it follows the protocol, else BackendProtocolError naming it and what is missing."""
    missing = list(_missing(module, is_library, extra))
    if missing:
        raise BackendProtocolError(f"backend {backend!r}: family module {module.__name__} does not define "
                                   + "; ".join(missing) + " (see rlx_triton.router.protocol)")
    return module
