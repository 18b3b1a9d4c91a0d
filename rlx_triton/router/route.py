"""route(request) -> Route: which backend runs one op call, with which candidate, and why.

The rules:
- backends are walked in precedence order (triton, metal); one is taken only if it runs on the
  device and its declared coverage covers the whole request;
- the candidate comes from the winner table, else a built-in recipe for the device class (one for the
  class, or one per request geometry the family module names: recipe_key), else the plan's default;
  accuracy approval is a separate catalogue, and an unapproved candidate is replaced
  by the family's fp32 candidate if that one is approved, else the backend is skipped;
- coverage and approval make a kernel eligible; among the eligible kernels and the torch library op, speed
  decides (router/speed.py: measured winner > the perf model's estimate > default), so a routed call is not
  slower than the op it replaces; a forced backend, strict mode or a pinned candidate takes the kernel;
- every refusal is typed and falls back to the torch library op, or raises MissingKernel in strict mode.

Decisions are cached per bucketed request signature; a cached decision is re-checked against the
exact launch fields that any ranged coverage named, so bucketing never widens a kernel's coverage.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Hashable, Iterator, List, Mapping, NamedTuple, Optional, Tuple, TypeVar, Union

from rlx_triton.caches import BoundedCache
from rlx_triton.planner.policy import PrecisionProfile
from rlx_triton.planner.tune_cache import LIBRARY_WINNER
from rlx_triton.router import registry
from rlx_triton.router.approvals import Approval, approval_for
from rlx_triton.router import speed as speed_rules
from rlx_triton.router.coverage import (BACKEND_UNAVAILABLE, NOT_APPROVED, NOT_SELECTED, SHAPE_UNIMPLEMENTED, SLOWER,
                                        Coverage, Refusal)
from rlx_triton.router.device import DeviceFacts, device_facts
from rlx_triton.router.invalidation import Change, forget_on
from rlx_triton.router.protocol import FamilyModule, KernelFamilyModule
from rlx_triton.router.request import Request
from rlx_triton.router.settings import BackendChoice, choice_in_block, current_choice
from rlx_triton.router.speed import Call, Timing

# Evidence labels, strongest first. "Library" marks the torch fallback, "Pinned" a use_candidate pin.
TUNE_FILE = "TuneFile"
RECIPE = "Recipe"
DEVICE_DEFAULT = "DeviceDefault"
RANKED = "Ranked"
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
        speed: a speed measurement the family module states for the candidate, if any (a label).
        decided_by: what chose between the eligible kernels and the library op: "measured" (the winner
            table), "estimated" (the perf model on the device's profile), "default" (no time to compare: the
            first eligible kernel, or the library where no kernel is eligible) or "forced" (use_backend,
            strict mode, a pinned candidate).
        timings: (Timing, ...): each option weighed, the eligible kernels' candidates and the library op, with
            its measured or estimated time for this call and which one was chosen (empty where nothing was
            timed or estimated).
        skipped: ((backend, Refusal), ...) for every backend tried before this one, with the typed reason
            (kind "slower" where the kernel was eligible and the library op is faster).
        request: the Request routed: family, op, shape fields, dtype, device, features.
        tune_key: the winner-table key of the request's bucket (None on torch).
        ranking: (speed.Ranked, ...): the approved candidates nothing has timed, weighed by the plan's
            ObjectiveWeights where the speed model priced them (empty otherwise; evidence "Ranked").
        precision: the plan's precision spec (planner.HybridPrecisionSpec) where it is not the profile's own: a
            quantised KV cache, stored as fp8 or int8 and dequantised on load (None otherwise).
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
    decided_by: str = speed_rules.DEFAULT
    timings: Tuple[Timing, ...] = ()
    precision: Any = None
    ranking: Tuple[Any, ...] = ()

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
        if self.precision is not None:
            rows.append(f"  precision  {_roles(self.precision)}")
        if self.approval is not None:
            rows.append(f"  accuracy   {self.approval.label()}")
        if self.speed:
            rows.append(f"  speed      {self.speed} (label only)")
        rows.append(f"  decided by {self.decided_by}")
        for ranked in self.ranking:
            rows.append(f"  ranked     {ranked}")
        for timing in self.timings:
            rows.append(f"  time       {timing}")
        if self.execution:
            rows.append(f"  runs       {self.execution}")
        for name, refusal in self.skipped:
            rows.append(f"  skipped    {name}: {refusal}")
        return "\n".join(rows)


def _roles(spec: Any) -> str:
    """A precision spec's roles in words: storage -> compute (conversion), the kv_cache role first."""
    def role(name: str) -> str:
        r = getattr(spec, name)
        convert = "" if r.convert.value == "native" else f", {r.convert.value.replace('_', ' ')}"
        return f"{name} {r.storage.value} -> {r.compute.value}{convert}"
    return "; ".join(role(name) for name in ("kv_cache", "activations", "weights", "accum"))


# bucketed signature + backend choice -> (route, range checks that must still hold for an exact request)
_cache: BoundedCache[tuple, Tuple[Route, Tuple[Tuple[Coverage, str, bool], ...]]] = BoundedCache("route_buckets")


# exact call signature (what an op's validation reads) + backend choice -> route: lets a repeated call
# skip validation and request building; cleared with the bucketed cache
_exact: BoundedCache[tuple, Route] = BoundedCache("route_signatures")


# Each thread's last exact hit: (generation, signature, choice key, route). A loop calling one op with one
# signature (a decode step per layer) finds it with one comparison, not the LRU's lock and two hashes; clearing
# the caches starts a new generation, which no held hit matches.
_last_hit = threading.local()
_generation = 0


def clear_route_cache() -> None:
    global _generation
    _generation += 1
    _cache.clear()
    _exact.clear()


# a remembered route was decided among the backends registered then, on the facts its device reported then
forget_on(Change.BACKENDS, clear_route_cache)
forget_on(Change.DEVICE_VIEW, clear_route_cache)


def exact_route(signature: tuple) -> Optional[Route]:
    """The route remembered for an op call with exactly this signature under the current choice, if any.
    A route found here is the call's route (the op does not route again), so `recording_routes` records it."""
    watched = _watched.get()
    if watched is not None and watched.forced is not None:
        return watched.forced
    # the thread's last hit holds if its signature is equal, within the same generation (settings changes start a
    # new one, so outside use_backend blocks the choice is the same) and under the same use_backend block
    block = choice_in_block()
    try:
        last = _last_hit.entry
    except AttributeError:
        last = None
    if last is not None and last[1] == signature and last[2] is block and last[0] == _generation:
        decided = last[3]
    else:
        generation = _generation   # read before the lookup: a clear while it runs leaves a stale hit unmatched
        # the choice's fields, not the dataclass: its generated __eq__ would run on every hit
        decided = _exact.get((signature, current_choice().key))
        if decided is None:
            return None
        _last_hit.entry = (generation, signature, block, decided)
    if watched is not None and watched.sink is not None:
        watched.sink.append(decided)
    return decided


def unrecord(decided: Route) -> None:
    """Takes back the last route `exact_route` recorded, where it is `decided`: an op that looked up a route
    and then found the call is not the one it was remembered for (it looks again under another signature)."""
    watched = _watched.get()
    sink = None if watched is None else watched.sink
    if sink and sink[-1] is decided:
        sink.pop()


def remember_exact_route(signature: tuple, decided: Route) -> None:
    choice = current_choice()
    _exact.put((signature, choice.key), decided)


def routed_call(signature: Optional[tuple], build_request: Callable[[], Request], call: Optional[Call] = None) -> Route:
    """The route of one op call: the one remembered for its exact signature (a repeated call is neither
    validated nor routed again), else `build_request()` (the op's validation and request) routed and
    remembered under the signature. A signature of None (the op could not take one: compiling, unusual
    arguments) always routes. Either way `recording_routes` records the call once.

    The signature must hold everything validation and routing read (rlx_triton.ops._checks.call_signature
    builds it); the backend choice (use_backend, strict mode, a pinned candidate) is added here, and
    settings or device changes clear the remembered routes with the bucketed ones. `call` (the public op and its
    arguments) lets a new decision estimate the kernel's time (router/speed.py)."""
    forced = planning_route()
    if forced is not None:
        return forced
    if signature is not None:
        try:
            decided = exact_route(signature)
        except TypeError:  # an unhashable option: validation says what is wrong with it
            signature, decided = None, None
        if decided is not None:
            return decided
    decided = route(build_request(), call=call)
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


class _Watch(NamedTuple):
    """What a block watching the routes holds: the route a speed model plans calls under (`planning_with`),
    and the list `recording_routes` fills. One context variable for both, as every repeated call reads it."""
    forced: Optional[Route]
    sink: Optional[List[Route]]


# None outside both blocks (the common case: one read tells a repeated call that nothing watches)
_watched: contextvars.ContextVar[Optional[_Watch]] = contextvars.ContextVar("rlx_triton_watched_routes",
                                                                           default=None)


@contextlib.contextmanager
def recording_routes() -> Iterator[List[Route]]:
    """Collects, in call order, the route of every op call inside the with-block, one per call (decided, or
    remembered for the call's exact signature), and the route of every explain."""
    sink: List[Route] = []
    outer = _watched.get()
    token = _watched.set(_Watch(None if outer is None else outer.forced, sink))
    try:
        yield sink
    finally:
        _watched.reset(token)


@contextlib.contextmanager
def planning_with(decided: Route) -> Iterator[None]:
    """Inside the block, the op calls of `decided`'s family and op take `decided` without routing, and no route is
    recorded: how a speed model plans a call's launches on a candidate the router is weighing."""
    token = _watched.set(_Watch(decided, None))
    try:
        yield
    finally:
        _watched.reset(token)


def planning_route() -> Optional[Route]:
    """The route `planning_with` holds, or None: an op whose launcher sits behind a custom op calls the launcher
    directly while it is set (a custom op on meta tensors would only reach its fake, which launches nothing)."""
    watched = _watched.get()
    return None if watched is None else watched.forced


def route(request: Request, choice: Optional[BackendChoice] = None, call: Optional[Call] = None) -> Route:
    """The route for a request under the current backend choice (recorded by `recording_routes`). `call`: the
    public op and its arguments, from which a speed model plans the kernel's launches (router/speed.py)."""
    forced = planning_route()
    if forced is not None and forced.family == request.family and forced.op == request.op:
        return forced
    decided = _route(request, choice, call)
    _record(decided)
    return decided


def _record(decided: Route) -> None:
    watched = _watched.get()
    if watched is not None and watched.sink is not None:
        watched.sink.append(decided)


def _route(request: Request, choice: Optional[BackendChoice] = None, call: Optional[Call] = None) -> Route:
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
        return _decide(request, choice, call)  # the bucket straddles a range bound: decide this one exactly
    decided = _decide(request, choice, call)
    return _cache.put(key, (decided, _range_checks(decided)))[0]


def _decide(request: Request, choice: BackendChoice, call: Optional[Call] = None) -> Route:
    facts = device_facts(request.device)
    library = registry.library_backend()
    skipped: Dict[str, Refusal] = {}
    eligible: List[Route] = []
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
        free = choice.name == "auto" and not choice.strict and choice.candidate is None
        ranker = _ranker(spec.speed_model, spec.name, module, request, facts, call) if free else None
        chosen = _choose_candidate(spec.name, module, request, facts, choice.candidate, ranker)
        if isinstance(chosen, Refusal):
            skipped[spec.name] = chosen
            continue
        eligible.append(Route(backend=spec.name, skipped=tuple(skipped.items()), request=request, module=module,
                              family=request.family, op=request.op, **chosen))

    if eligible:
        if choice.name != "auto" or choice.strict or choice.candidate is not None:
            return replace(eligible[0], decided_by=speed_rules.FORCED)
        from rlx_triton.router import plans

        if plans.current_profile() is PrecisionProfile.DETERMINISTIC:
            # one answer for every batch and GPU: a speed estimate may differ with the batch or the device, and the
            # library op computes other bits than the kernel
            return eligible[0]
        return _fastest(request, eligible, facts, call)
    if choice.strict and choice.name != library.name:
        raise MissingKernel(request, skipped)
    if choice.name == library.name:
        detail = f"backend {library.name!r} was requested"
    elif skipped:
        detail = "no kernel took the request; see skipped"
    else:
        detail = "no kernel backend is registered"
    return _library_route(request, detail, skipped,
                          speed_rules.FORCED if choice.name == library.name else speed_rules.DEFAULT, ())


def _library_route(request: Request, detail: str, skipped: Mapping[str, Refusal], decided_by: str,
                   timings: Tuple[Timing, ...]) -> Route:
    library = registry.library_backend()
    fallback = registry.family_module(library.name, request.family, request.op)
    return Route(family=request.family, op=request.op, backend=library.name, evidence=LIBRARY,
                 evidence_detail=detail, skipped=tuple(skipped.items()), request=request, module=fallback,
                 decided_by=decided_by, timings=timings)


def _fastest(request: Request, eligible: List[Route], facts: DeviceFacts, call: Optional[Call]) -> Route:
    """Among the eligible kernel routes and the library op, the fastest by the strongest evidence there is
    (router/speed.py): a winner-table winner, else the speed models' estimates, else the first kernel."""
    library = registry.library_backend()
    winners = [(decided, _winner_entry(decided)) for decided in eligible]
    measured = [(decided, entry) for decided, entry in winners if entry is not None]
    if measured:
        decided, entry = measured[0]
        timings: Tuple[Timing, ...]
        if entry.tag == LIBRARY_WINNER:
            timings = (Timing(library.name, None, entry.time_us, speed_rules.MEASURED, True, "winner table"),)
        else:
            timings = (Timing(decided.backend, entry.tag, entry.time_us, speed_rules.MEASURED, True, "winner table"),)
        if entry.tag == LIBRARY_WINNER:
            return _library_route(request, f"faster than every {decided.backend} candidate in the winner table "
                                           f"(rlx-triton tune)", _slower(decided, "the winner table names the "
                                           "library op for this bucket"), speed_rules.MEASURED, timings)
        return replace(decided, decided_by=speed_rules.MEASURED, timings=timings)
    profile = _profile_of(facts)
    library_model = speed_rules.speed_model(library.speed_model) if profile is not None else None
    library_us = library_model.library_us(request, profile) if library_model is not None else None
    if library_us is None:
        return eligible[0]
    options = []
    for decided in eligible:
        model = speed_rules.speed_model(registry.backend(decided.backend).speed_model)
        kernel_us = model.kernel_us(request, decided, call, profile) if model is not None else None
        options.append((decided, kernel_us))
    timed = [(decided, us) for decided, us in options if us is not None]
    if not timed:
        return eligible[0]
    label = f"{'calibrated' if profile.calibrated else 'uncalibrated'} estimate, {profile.key} profile"
    best, best_us = min(timed, key=lambda option: option[1])
    take_library = library_us < best_us
    timings = tuple(Timing(decided.backend, decided.candidate_tag, us,
                           speed_rules.ESTIMATED if us is not None else None, not take_library and decided is best,
                           label if us is not None else "no launch plan")
                    for decided, us in options)
    timings += (Timing(library.name, None, library_us, speed_rules.ESTIMATED, take_library, label),)
    if take_library:
        why = f"estimated {best_us:.1f} us, the library op {library_us:.1f} us"
        return _library_route(request, f"faster than {best.backend} {best.candidate_tag} ({why})",
                              _slower(best, why), speed_rules.ESTIMATED, timings)
    return replace(best, decided_by=speed_rules.ESTIMATED, timings=timings)


def _slower(decided: Route, why: str) -> Dict[str, Refusal]:
    """The refusals of a kernel route the library op beat: what it skipped, and its own "slower" refusal."""
    skipped = dict(decided.skipped)
    skipped[decided.backend] = Refusal(SLOWER, f"{decided.candidate_tag}: {why}")
    return skipped


def _winner_entry(decided: Route) -> Any:
    """The winner-table entry of a kernel route's bucket, where the table is read and holds one."""
    from rlx_triton.router import plans

    if decided.tune_key is None or not plans.plan_for(decided.family, plans.current_profile()).tune_policy.cache_load:
        return None
    entry = plans.winner_table().lookup_entry(decided.tune_key)
    if entry is None or (entry.tag != LIBRARY_WINNER and entry.tag != decided.candidate_tag):
        return None   # a candidate the approvals replaced is no measurement of the route's candidate
    return entry


def _profile_of(facts: DeviceFacts) -> Any:
    """The device profile that prices calls on this device (a CUDA GPU with a profile), or None."""
    if facts.kind != "cuda":
        return None
    from rlx_triton.devices import profile_for_name

    return profile_for_name(facts.name)


def _choose_candidate(backend_name: str, module: KernelFamilyModule, request: Request, facts: DeviceFacts,
                      pinned: Optional[str] = None,
                      ranker: Optional[Callable[[Any, List[Any]], Tuple[Any, ...]]] = None
                      ) -> Union[Dict[str, Any], Refusal]:
    """Winner table > recipe > the approved candidates ranked by the plan's ObjectiveWeights (`ranker`, where it
    can price them) > plan default; then accuracy approval, with the fp32 candidate as replacement.

    A pinned tag (use_candidate) replaces the sources and gets no fp32 replacement.
    """
    from rlx_triton.planner import LaunchBuilder, LaunchError, PlanError, tune_cache_key
    from rlx_triton.router import plans

    profile = plans.current_profile()
    profile_name = plans.profile_name(profile)
    # a quantised KV cache is planned through the precision model: its storage, dequantised on load
    storage = request.feature_map.get("kv_dtype")
    try:
        plan = plans.plan_for(request.family, profile, storage)
    except PlanError as error:
        return Refusal(SHAPE_UNIMPLEMENTED, f"planner refused the precision: {error}")
    try:
        launch = LaunchBuilder.from_plan(plan).fields(**request.field_map).build()
    except LaunchError as error:
        return Refusal(SHAPE_UNIMPLEMENTED, f"planner refused the launch: {error}")
    by_tag = {c.tag(): c for c in plan.candidates}
    # the winner table's environment bits tell a quantised cache's storage apart (its plan's profile is custom)
    tune_key = tune_cache_key(plan, launch, f"{backend_name}:{facts.fingerprint}", _STORAGE_BITS.get(str(storage), 0))

    # the deterministic profile takes the plan's candidate for the launch fields whatever the device: a winner
    # or a recipe is a choice per GPU, and a different tile there would give other bits
    deterministic = profile is PrecisionProfile.DETERMINISTIC
    candidate, evidence, detail = None, None, ""
    if pinned is not None:
        approval = approval_for(module.APPROVALS, pinned, profile_name, storage)
        if pinned not in by_tag or approval is None:
            why = "is not a candidate of the plan" if pinned not in by_tag else "has no accuracy approval"
            return Refusal(NOT_APPROVED, f"pinned candidate {pinned} {why}")
        candidate, evidence, detail = by_tag[pinned], PINNED, "pinned with use_candidate"
    if candidate is None and plan.tune_policy.cache_load and not deterministic:
        winner = plans.winner_table().lookup(tune_key)
        if winner in by_tag:
            candidate, evidence, detail = by_tag[winner], TUNE_FILE, "winner table"
    if candidate is None and not deterministic:
        recipe, geometry = _recipe(module, request, facts.device_class)
        if recipe in by_tag:
            candidate, evidence, detail = by_tag[recipe], RECIPE, f"built-in recipe for {facts.device_class}{geometry}"
    ranking: Tuple[Any, ...] = ()
    if candidate is None and ranker is not None and not deterministic:
        approved = [c for c in plan.candidates
                    if approval_for(module.APPROVALS, c.tag(), profile_name, storage) is not None]
        ranking = ranker(plan, approved) if len(approved) > 1 else ()
        if ranking:
            weights = plan.objective_weights
            candidate = by_tag[next(r.candidate_tag for r in ranking if r.chosen)]
            evidence, detail = RANKED, (f"objective weights latency {weights.latency:g}, error {weights.error:g}, "
                                        f"memory {weights.memory:g} over {len(ranking)} untimed candidates")
    if candidate is None:
        candidate, evidence, detail = launch.candidate, DEVICE_DEFAULT, f"plan default ({profile_name} profile)"

    approvals = module.APPROVALS
    approval = approval_for(approvals, candidate.tag(), profile_name, storage)
    if approval is None:
        fp32 = plans.fp32_candidate(request.family)
        approval = approval_for(approvals, fp32.tag(), profile_name, storage)
        if approval is None or fp32.tag() not in by_tag:
            cache = f" with a {storage} KV cache" if storage not in (None, "none") else ""
            return Refusal(NOT_APPROVED, f"candidate {candidate.tag()} has no accuracy approval for the "
                                         f"{profile_name} profile{cache}, nor has the fp32 candidate {fp32.tag()}")
        detail = f"{candidate.tag()} is not approved; fp32 candidate instead"
        candidate, evidence = fp32, IMPLEMENTED

    kernel_name = LaunchBuilder.from_plan(plan).fields(**request.field_map).candidate(candidate).build().kernel_name
    speed = module.SPEED_EVIDENCE.get(candidate.tag())
    return dict(candidate=candidate, candidate_tag=candidate.tag(), kernel_name=kernel_name, evidence=evidence,
                evidence_detail=detail, approval=approval.for_dtype(request.dtype), speed=speed,
                tune_key=tune_key, precision=plan.hybrid if storage not in (None, "none") else None,
                ranking=ranking)


def _ranker(speed_model_name: Optional[str], backend_name: str, module: KernelFamilyModule, request: Request,
            facts: DeviceFacts, call: Optional[Call]) -> Optional[Callable[[Any, List[Any]], Tuple[Any, ...]]]:
    """What ranks a backend's approved candidates for `request` where nothing has timed them: each priced by the
    backend's speed model (`kernel_cost`: its estimate and the bytes it moves) on the device's profile, weighed
    by the plan's ObjectiveWeights (router/speed.py `rank`); None where nothing can price them (no profile, no
    call to plan, a model without costs)."""
    profile = _profile_of(facts)
    model = speed_rules.speed_model(speed_model_name) if profile is not None and call is not None else None
    cost = getattr(model, "kernel_cost", None)
    if cost is None:
        return None

    def ranked(plan: Any, approved: List[Any]) -> Tuple[Any, ...]:
        from rlx_triton.router import plans

        profile_name = plans.profile_name(plan.precision_profile)
        storage = request.feature_map.get("kv_dtype")
        options = []
        for candidate in approved:
            probe = Route(family=request.family, op=request.op, backend=backend_name, candidate=candidate,
                          candidate_tag=candidate.tag(), request=request, module=module)
            priced = cost(request, probe, call, profile)
            approval = approval_for(module.APPROVALS, candidate.tag(), profile_name, storage)
            if priced is not None and approval is not None:
                options.append((candidate.tag(), priced[0], approval.error_bound(request.dtype), priced[1]))
        return speed_rules.rank(options, plan.objective_weights) if len(options) > 1 else ()

    return ranked


# the winner-table key's environment bits per quantised KV-cache storage
_STORAGE_BITS = {"float8_e4m3fn": 1, "float8_e5m2": 2, "int8": 3}


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
    decided = route(request, call=lambda: (op, args, kwargs))
    if decided.request != request:
        decided = replace(decided, request=request)
    runs = getattr(decided.module, "explain_execution", None) if decided.candidate is not None else None
    execution = runs(request, decided.candidate) if runs is not None else None
    return replace(decided, execution=execution) if execution else decided
