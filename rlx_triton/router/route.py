"""route(request) -> Route: which backend runs one op call, with which candidate, and why.

The rules:
- backends are walked in precedence order (triton, metal); one is taken only if it runs on the
  device and its declared coverage covers the whole request;
- the candidate comes from the winner table, else a built-in recipe for the device class (one for the
  class, or one per request geometry the family module names: recipe_key), else the plan's default;
  accuracy approval is a separate catalogue, and an unapproved candidate is replaced
  by the family's fp32 candidate if that one is approved, else the backend is skipped;
- speed evidence only labels a route, it never decides one;
- every refusal is typed and falls back to the torch library op, or raises MissingKernel in strict mode.

Decisions are cached per bucketed request signature; a cached decision is re-checked against the
exact launch fields that any ranged coverage named, so bucketing never widens a kernel's coverage.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union

from rlx_triton.caches import BoundedCache
from rlx_triton.router import registry
from rlx_triton.router.approvals import Approval, approval_for
from rlx_triton.router.coverage import (BACKEND_UNAVAILABLE, NOT_APPROVED, NOT_SELECTED, SHAPE_UNIMPLEMENTED,
                                        Coverage, Refusal)
from rlx_triton.router.device import DeviceFacts, device_facts
from rlx_triton.router.invalidation import Change, forget_on
from rlx_triton.router.protocol import FamilyModule, KernelFamilyModule
from rlx_triton.router.request import Request
from rlx_triton.router.settings import BackendChoice, current_choice

# Evidence labels, strongest first. "Library" marks the torch fallback, "Pinned" a use_candidate pin.
TUNE_FILE = "TuneFile"
RECIPE = "Recipe"
DEVICE_DEFAULT = "DeviceDefault"
IMPLEMENTED = "Implemented"
PINNED = "Pinned"
LIBRARY = "Library"


class MissingKernel(RuntimeError):
    """Raised in strict mode (rt.use_backend(name, strict=True) or RLX_TRITON_STRICT=1) when no kernel covers a call.

    Attributes:
        family: the op's family ("sdpa_decode", "conv", "fbank", "lstm", "segdense").
        request: the routing Request (shape fields, dtype, device, features).
        reasons: {backend name: Refusal}: why each backend did not take it (Refusal.kind is one of
            backend-unavailable, device-unsupported, shape-unimplemented, weights-out-of-contract,
            not-approved, not-selected; Refusal.reason says the rest).

    Example:
        >>> import torch, rlx_triton as rt
        >>> try:
        ...     with rt.use_backend("metal", strict=True):   # no Apple GPU here
        ...         rt.fbank(torch.randn(16000))
        ... except rt.MissingKernel as error:
        ...     sorted(error.reasons)
        ['metal', 'triton']
    """

    def __init__(self, request: Request, reasons: Dict[str, Refusal]):
        self.family = request.family
        self.request = request
        self.reasons = dict(reasons)
        lines = "\n".join(f"  {name}: {reason}" for name, reason in self.reasons.items())
        super().__init__(f"no kernel covers {request} (strict mode)\n{lines}")


@dataclass(frozen=True)
class Route:
    """Which backend runs one op call, with which candidate, and why (what rt.explain returns for an op).

    Fields:
        family: the kernel family: "sdpa_decode", "varlen_attention", "conv", "fbank", "lstm" or "segdense".
        op: the op of the family ("sdpa_decode", "scaled_dot_product_attention", "flash_attn_with_kvcache",
            "conv1d", "sincnet", "conv2d" (rt.ops.conv2d's linear too), "stats_pool", "fbank", "lstm",
            "segdense").
        backend: "triton", "metal", or "torch" (the library op, the fallback).
        candidate: the candidate dataclass the kernel launches with (None on torch).
        candidate_tag: its text form, e.g. "skp4_tg256_tm1_tn128_tk128_pq1_pk1_f16kv_partial";
            `rlx-triton explain` prints a legend of the parts.
        kernel_name: `<family>_<shape fields>_<tag>_<profile>`, the name the winner table and logs use.
        evidence: where the candidate came from, strongest first: "TuneFile" (winner table), "Recipe"
            (built-in recipe for the device class), "DeviceDefault" (the plan's default), "Implemented"
            (the family's fp32 candidate, standing in for an unapproved one), "Pinned" (use_candidate);
            "Library" for the torch op.
        evidence_detail: the same in words (e.g. "built-in recipe for sm90").
        approval: the Approval (accuracy measured against float64, where it was measured) that lets the
            candidate run; None on torch.
        speed: a speed measurement for the candidate if one was recorded; a label only, it never decides.
        skipped: ((backend, Refusal), ...) for every backend tried before this one, with the typed reason.
        request: the Request routed: family, op, shape fields, dtype, device, features.
        tune_key: the winner-table key of the request's bucket (None on torch).
        module: the backend module whose launcher runs the call (not compared, not printed).
        execution: set by explain where the launcher decides more at launch time (the module's
            `explain_execution(request, candidate)`): how the kernel runs there, and why.

    Properties: skipped_reasons ({backend: Refusal}). str(route) prints every field that is set.
    """

    family: str
    op: str
    backend: str
    candidate: Any = None
    candidate_tag: Optional[str] = None
    kernel_name: Optional[str] = None
    evidence: str = LIBRARY
    evidence_detail: str = ""
    approval: Optional[Approval] = None
    speed: Optional[str] = None
    skipped: Tuple[Tuple[str, Refusal], ...] = ()
    request: Optional[Request] = None
    tune_key: Any = None
    module: Optional[FamilyModule] = field(default=None, compare=False, repr=False)
    execution: Optional[str] = None

    @property
    def skipped_reasons(self) -> Dict[str, Refusal]:
        return dict(self.skipped)

    def __str__(self) -> str:
        rows = [f"route {self.family}.{self.op} -> {self.backend}"]
        if self.request is not None:
            rows.append(f"  request    {self.request}")
        if self.candidate_tag:
            rows.append(f"  candidate  {self.candidate_tag}")
        if self.kernel_name:
            rows.append(f"  kernel     {self.kernel_name}")
        detail = f" ({self.evidence_detail})" if self.evidence_detail else ""
        rows.append(f"  evidence   {self.evidence}{detail}")
        if self.approval is not None:
            rows.append(f"  accuracy   {self.approval.label()}")
        if self.speed:
            rows.append(f"  speed      {self.speed} (label only)")
        if self.execution:
            rows.append(f"  runs       {self.execution}")
        for name, refusal in self.skipped:
            rows.append(f"  skipped    {name}: {refusal}")
        return "\n".join(rows)


# bucketed signature + backend choice -> (route, range checks that must still hold for an exact request)
_cache: BoundedCache[tuple, Tuple[Route, Tuple[Tuple[Coverage, str, bool], ...]]] = BoundedCache("route_buckets")


# exact call signature (what an op's validation reads) + backend choice -> route: lets a repeated call
# skip validation and request building; cleared with the bucketed cache
_exact: BoundedCache[tuple, Route] = BoundedCache("route_signatures")


def clear_route_cache() -> None:
    _cache.clear()
    _exact.clear()


# a remembered route was decided among the backends registered then, on the facts its device reported then
forget_on(Change.BACKENDS, clear_route_cache)
forget_on(Change.DEVICE_VIEW, clear_route_cache)


def exact_route(signature: tuple) -> Optional[Route]:
    """The route remembered for an op call with exactly this signature under the current choice, if any.
    A route found here is the call's route (the op does not route again), so `recording_routes` records it."""
    choice = current_choice()
    # the choice's fields, not the dataclass: its generated __eq__ would run on every hit
    decided = _exact.get((signature, choice.name, choice.strict, choice.candidate))
    if decided is not None:
        sink = _recording.get()
        if sink is not None:
            sink.append(decided)
    return decided


def remember_exact_route(signature: tuple, decided: Route) -> None:
    choice = current_choice()
    _exact.put((signature, choice.name, choice.strict, choice.candidate), decided)


def routed_call(signature: Optional[tuple], build_request: Callable[[], Request]) -> Route:
    """The route of one op call: the one remembered for its exact signature (a repeated call is neither
    validated nor routed again), else `build_request()` (the op's validation and request) routed and
    remembered under the signature. A signature of None (the op could not take one: compiling, unusual
    arguments) always routes. Either way `recording_routes` records the call once.

    The signature must hold everything validation and routing read (rlx_triton.ops._checks.call_signature
    builds it); the backend choice (use_backend, strict mode, a pinned candidate) is added here, and
    settings or device changes clear the remembered routes with the bucketed ones."""
    if signature is not None:
        try:
            decided = exact_route(signature)
        except TypeError:  # an unhashable option: validation says what is wrong with it
            signature, decided = None, None
        if decided is not None:
            return decided
    decided = route(build_request())
    if signature is not None:
        remember_exact_route(signature, decided)
    return decided


def _range_checks(decided: Route) -> Tuple[Tuple[Coverage, str, bool], ...]:
    """The ranged-coverage verdicts a decision rests on: (coverage, field, verdict it had)."""
    checks = []
    for name, refusal in decided.skipped:
        if refusal.field is not None:
            checks.append((registry.family_module(name, decided.family, decided.op).COVERAGE, refusal.field, False))
    if decided.module is not None and decided.candidate is not None:
        checks.extend((decided.module.COVERAGE, name, True) for name in decided.module.COVERAGE.ranges)
    return tuple(checks)


_recording: contextvars.ContextVar[Optional[List[Route]]] = contextvars.ContextVar("rlx_triton_routes",
                                                                                  default=None)


@contextlib.contextmanager
def recording_routes() -> Iterator[List[Route]]:
    """Collects, in call order, the route of every op call inside the with-block, one per call (decided, or
    remembered for the call's exact signature), and the route of every explain."""
    sink: List[Route] = []
    token = _recording.set(sink)
    try:
        yield sink
    finally:
        _recording.reset(token)


def route(request: Request, choice: Optional[BackendChoice] = None) -> Route:
    """The route for a request under the current backend choice (recorded by `recording_routes`)."""
    decided = _route(request, choice)
    _record(decided)
    return decided


def _record(decided: Route) -> None:
    sink = _recording.get()
    if sink is not None:
        sink.append(decided)


def _route(request: Request, choice: Optional[BackendChoice] = None) -> Route:
    """The route for a request under the current backend choice.

    Decisions are cached per bucketed signature; `Route.request` is the request that made the
    decision (one of the same bucket). A cached decision is used only if every ranged-coverage
    verdict it rests on holds for the exact request too.
    """
    choice = choice or current_choice()
    key = (request.bucket_signature(), choice)
    entry = _cache.get(key)
    if entry is not None:
        decided, checks = entry
        if not checks:
            return decided
        fields = request.field_map
        if all(coverage.range_holds(name, fields.get(name, 0)) == verdict for coverage, name, verdict in checks):
            return decided
        return _decide(request, choice)  # the bucket straddles a range bound: decide this one exactly
    decided = _decide(request, choice)
    return _cache.put(key, (decided, _range_checks(decided)))[0]


def _decide(request: Request, choice: BackendChoice) -> Route:
    facts = device_facts(request.device)
    library = registry.library_backend()
    skipped: Dict[str, Refusal] = {}
    for spec in registry.backends():
        if spec.is_library:
            continue
        if choice.name not in ("auto", spec.name):
            skipped[spec.name] = Refusal(NOT_SELECTED, f"backend {choice.name!r} was requested")
            continue
        unavailable = facts.unavailable_reason(spec.name)
        if unavailable is not None:
            skipped[spec.name] = Refusal(BACKEND_UNAVAILABLE, unavailable)
            continue
        if request.family not in spec.families:
            skipped[spec.name] = Refusal(SHAPE_UNIMPLEMENTED, f"no {request.family} kernels in this backend")
            continue
        module = registry.kernel_family_module(spec.name, request.family, request.op)
        refusal = module.COVERAGE.check(request.op, facts.kind, request.dtype, request.field_map,
                                        request.feature_map)
        if refusal is not None:
            skipped[spec.name] = refusal
            continue
        chosen = _choose_candidate(spec.name, module, request, facts, choice.candidate)
        if isinstance(chosen, Refusal):
            skipped[spec.name] = chosen
            continue
        return Route(backend=spec.name, skipped=tuple(skipped.items()), request=request, module=module,
                     family=request.family, op=request.op, **chosen)

    if choice.strict and choice.name != library.name:
        raise MissingKernel(request, skipped)
    fallback = registry.family_module(library.name, request.family, request.op)
    if choice.name == library.name:
        detail = f"backend {library.name!r} was requested"
    elif skipped:
        detail = "no kernel took the request; see skipped"
    else:
        detail = "no kernel backend is registered"
    return Route(family=request.family, op=request.op, backend=library.name, evidence=LIBRARY,
                 evidence_detail=detail, skipped=tuple(skipped.items()), request=request, module=fallback)


def _choose_candidate(backend_name: str, module: KernelFamilyModule, request: Request, facts: DeviceFacts,
                      pinned: Optional[str] = None) -> Union[Dict[str, Any], Refusal]:
    """Winner table > recipe > plan default; then accuracy approval, with the fp32 candidate as replacement.

    A pinned tag (use_candidate) replaces the three sources and gets no fp32 replacement.
    """
    from rlx_triton.planner import LaunchBuilder, LaunchError, tune_cache_key
    from rlx_triton.router import plans

    profile = plans.current_profile()
    profile_name = plans.profile_name(profile)
    plan = plans.plan_for(request.family, profile)
    try:
        launch = LaunchBuilder.from_plan(plan).fields(**request.field_map).build()
    except LaunchError as error:
        return Refusal(SHAPE_UNIMPLEMENTED, f"planner refused the launch: {error}")
    by_tag = {c.tag(): c for c in plan.candidates}
    tune_key = tune_cache_key(plan, launch, f"{backend_name}:{facts.fingerprint}", 0)

    candidate, evidence, detail = None, None, ""
    if pinned is not None:
        approval = approval_for(module.APPROVALS, pinned, profile_name)
        if pinned not in by_tag or approval is None:
            why = "is not a candidate of the plan" if pinned not in by_tag else "has no accuracy approval"
            return Refusal(NOT_APPROVED, f"pinned candidate {pinned} {why}")
        candidate, evidence, detail = by_tag[pinned], PINNED, "pinned with use_candidate"
    if candidate is None and plan.tune_policy.cache_load:
        winner = plans.winner_table().lookup(tune_key)
        if winner in by_tag:
            candidate, evidence, detail = by_tag[winner], TUNE_FILE, "winner table"
    if candidate is None:
        recipe, geometry = _recipe(module, request, facts.device_class)
        if recipe in by_tag:
            candidate, evidence, detail = by_tag[recipe], RECIPE, f"built-in recipe for {facts.device_class}{geometry}"
    if candidate is None:
        candidate, evidence, detail = launch.candidate, DEVICE_DEFAULT, f"plan default ({profile_name} profile)"

    approvals = module.APPROVALS
    approval = approval_for(approvals, candidate.tag(), profile_name)
    if approval is None:
        fp32 = plans.fp32_candidate(request.family)
        approval = approval_for(approvals, fp32.tag(), profile_name)
        if approval is None or fp32.tag() not in by_tag:
            return Refusal(NOT_APPROVED, f"candidate {candidate.tag()} has no accuracy approval for the "
                                         f"{profile_name} profile, nor has the fp32 candidate {fp32.tag()}")
        detail = f"{candidate.tag()} is not approved; fp32 candidate instead"
        candidate, evidence = fp32, IMPLEMENTED

    kernel_name = LaunchBuilder.from_plan(plan).fields(**request.field_map).candidate(candidate).build().kernel_name
    speed = module.SPEED_EVIDENCE.get(candidate.tag())
    return dict(candidate=candidate, candidate_tag=candidate.tag(), kernel_name=kernel_name, evidence=evidence,
                evidence_detail=detail, approval=approval.for_dtype(request.dtype), speed=speed,
                tune_key=tune_key)


def _recipe(module: KernelFamilyModule, request: Request, device_class: str) -> Tuple[Optional[str], str]:
    """(tag, where) of a module's built-in recipe for the device class: RECIPES[class] is a tag, or a mapping
    from the module's `recipe_key(request)` (e.g. a layer geometry) to tags, "*" for any other key."""
    recipe = module.RECIPES.get(device_class)
    if not isinstance(recipe, Mapping):
        return recipe, ""
    key: Hashable = module.recipe_key(request)
    if key in recipe:
        return recipe[key], f", {key}"
    return recipe.get("*"), ""


_Op = TypeVar("_Op", bound=Callable[..., Any])


def routed_op(build_request: Callable[..., Request]) -> Callable[[_Op], _Op]:
    """Marks a public op with the request builder `explain` uses (the same validation the op runs)."""

    def mark(op: _Op) -> _Op:
        op.__rlx_request__ = build_request  # type: ignore[attr-defined]
        return op

    return mark


def explain(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Route:
    """The Route that `op(*args, **kwargs)` would take, without running it (rt.explain's answer for an op;
    rt.explain also takes rt.nn modules and whole models).

    Args:
        op: a public op of rlx_triton (rt.scaled_dot_product_attention, rt.sdpa_decode,
            rt.flash_attn_with_kvcache, rt.fbank, or an op of rlx_triton.ops: conv1d, sincnet, conv2d,
            linear, stats_pool, lstm, segdense); anything else raises TypeError.
        *args, **kwargs: the call, as it would be made; it is validated as the op validates it (the same
            ValueError/TypeError for bad input).

    Returns:
        a Route: backend ("triton", "metal" or "torch"), candidate tag, evidence, accuracy approval, and
        the reason every other backend was skipped. str(route) prints all of it.

    Example:
        >>> import torch, rlx_triton as rt
        >>> route = rt.router.explain(rt.fbank, torch.randn(16000), num_mel_bins=80)
        >>> route.family, route.op
        ('fbank', 'fbank')
        >>> route.backend in ("triton", "metal", "torch")
        True
    """
    build = getattr(op, "__rlx_request__", None)
    if build is None:
        raise TypeError(f"explain: {getattr(op, '__name__', op)!r} is not an rlx_triton op")
    request = build(*args, **kwargs)
    decided = route(request)
    if decided.request != request:
        decided = replace(decided, request=request)
    runs = getattr(decided.module, "explain_execution", None) if decided.candidate is not None else None
    execution = runs(request, decided.candidate) if runs is not None else None
    return replace(decided, execution=execution) if execution else decided
