"""Kernel plans: `KernelPlanBuilder(family)...build_plan()` validates a family's policies, precision
and candidates (the first failing rule is the error) and picks the plan's default candidate.
"""
from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Tuple

from .candidates import FAMILIES, FamilySpec
from .errors import (
    EmptyCandidates,
    InvalidCandidate,
    InvalidObjectiveWeights,
    InvalidPrecision,
    UnsupportedFamily,
)
from .policy import (
    EMULATED_CONVERSIONS,
    HybridPrecisionSpec,
    KernelFamily,
    MemoryPolicy,
    ObjectiveWeights,
    PrecisionProfile,
    ScalarType,
    ThreadPolicy,
    TokenBucketStrategy,
    TuneCacheEviction,
    TunePolicy,
)

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class KernelPlan:
    family: KernelFamily
    precision_profile: PrecisionProfile
    hybrid: HybridPrecisionSpec
    thread_policy: ThreadPolicy
    memory_policy: MemoryPolicy
    tune_policy: TunePolicy
    objective_weights: ObjectiveWeights
    token_buckets: TokenBucketStrategy
    candidates: Tuple[Any, ...]
    default_candidate: Any
    schema_version: int

    @property
    def spec(self) -> FamilySpec:
        """The family's candidate type, rules and launch fields."""
        return FAMILIES[self.family]


def family_spec(family: Any) -> FamilySpec:
    """The FamilySpec of a family (a KernelFamily, a registered family's member, or its value string);
    UnsupportedFamily otherwise."""
    for key, spec in FAMILIES.items():
        if family is key or (isinstance(family, str) and family == key.value):
            return spec
    raise UnsupportedFamily(family)


class KernelPlanBuilder:
    """The plan builder of every family. Methods return a new builder; the old one is unchanged.

    An unknown family raises UnsupportedFamily here, since its default candidates are looked up first.
    """

    def __init__(self, family: Any) -> None:
        spec = family_spec(family)
        self._spec = spec
        self._family = spec.family
        self._precision_profile = PrecisionProfile.BALANCED
        self._hybrid_override: Optional[HybridPrecisionSpec] = None
        self._allow_emulation = False
        self._thread_policy = ThreadPolicy()
        self._memory_policy = MemoryPolicy()
        self._tune_policy = TunePolicy.disabled()
        self._objective_weights = ObjectiveWeights()
        self._token_buckets = TokenBucketStrategy.decode_default()
        self._candidates: Tuple[Any, ...] = spec.default_candidates
        self._schema_version = SCHEMA_VERSION

    def _with(self, **changes: Any) -> "KernelPlanBuilder":
        clone = object.__new__(KernelPlanBuilder)
        clone.__dict__.update(self.__dict__)
        clone.__dict__.update({f"_{k}": v for k, v in changes.items()})
        return clone

    def precision_profile(self, profile: PrecisionProfile) -> "KernelPlanBuilder":
        return self._with(precision_profile=PrecisionProfile(profile))

    def hybrid_profile(self, profile: HybridPrecisionSpec) -> "KernelPlanBuilder":
        return self._with(hybrid_override=profile)

    def allow_emulation(self, enable: bool) -> "KernelPlanBuilder":
        return self._with(allow_emulation=bool(enable))

    def threads(self, policy: ThreadPolicy) -> "KernelPlanBuilder":
        return self._with(thread_policy=policy)

    def memory(self, policy: MemoryPolicy) -> "KernelPlanBuilder":
        return self._with(memory_policy=policy)

    def autotune(self, policy: TunePolicy) -> "KernelPlanBuilder":
        return self._with(tune_policy=policy)

    def tune_cache(self, load: bool, persist: bool, max_entries: int) -> "KernelPlanBuilder":
        """Configure persisted winner-table behaviour (max_entries is raised to at least 1)."""
        policy = dataclasses.replace(
            self._tune_policy, cache_load=bool(load), persist_cache=bool(persist), cache_max_entries=max(int(max_entries), 1)
        )
        return self._with(tune_policy=policy)

    def tune_cache_eviction(self, eviction: TuneCacheEviction) -> "KernelPlanBuilder":
        return self._with(tune_policy=dataclasses.replace(self._tune_policy, cache_eviction=TuneCacheEviction(eviction)))

    def objective_weights(self, weights: ObjectiveWeights) -> "KernelPlanBuilder":
        return self._with(objective_weights=weights)

    def token_buckets(self, strategy: TokenBucketStrategy) -> "KernelPlanBuilder":
        return self._with(token_buckets=strategy)

    def candidates(self, candidates: Iterable[Any]) -> "KernelPlanBuilder":
        return self._with(candidates=tuple(candidates))

    def tile_sizes(self, *sizes: int, **named: int) -> "KernelPlanBuilder":
        """Override tile sizes across all current candidates: positionally in the family's tile order
        (sdpa: tile_m, tile_n, tile_k; conv: tile_pos, tile_co, tile_k; fbank: tile_frames, tile_freq;
        lstm: batch_tile, hidden_tile; segdense: row_tile) or by field name."""
        return self._override_fields(self._spec.tile_fields, sizes, named, "tile_sizes")

    def padding(self, *factors: int, **named: int) -> "KernelPlanBuilder":
        """Override sequence padding factors across all current candidates (sdpa: pad_q, pad_kv)."""
        return self._override_fields(self._spec.padding_fields, factors, named, "padding")

    def _override_fields(self, names: Tuple[str, ...], values: Tuple[int, ...], named: dict, method: str):
        if len(values) > len(names) or set(named) - set(names):
            raise TypeError(f"{method}() of a {self._family.value} plan takes the fields {', '.join(names) or '(none)'}")
        changes = dict(zip(names, values))
        changes.update(named)
        return self._with(candidates=tuple(dataclasses.replace(c, **changes) for c in self._candidates))

    def schema_version(self, schema_version: int) -> "KernelPlanBuilder":
        return self._with(schema_version=int(schema_version))

    def build_plan(self) -> KernelPlan:
        hybrid = self._hybrid_override or self._precision_profile.default_spec()
        validate_objective_weights(self._objective_weights)
        validate_tune_policy(self._tune_policy)
        validate_precision(self._spec, hybrid, self._allow_emulation)
        if not self._candidates:
            raise EmptyCandidates()
        for candidate in self._candidates:
            message = self._spec.candidate_error(candidate, self._thread_policy, self._memory_policy)
            if message:
                raise InvalidCandidate(message)
        default_candidate = self._spec.choose_default(self._precision_profile, self._thread_policy, self._candidates)
        return KernelPlan(
            family=self._family,
            precision_profile=self._precision_profile,
            hybrid=hybrid,
            thread_policy=self._thread_policy,
            memory_policy=self._memory_policy,
            tune_policy=self._tune_policy,
            objective_weights=self._objective_weights,
            token_buckets=self._token_buckets,
            candidates=self._candidates,
            default_candidate=default_candidate,
            schema_version=self._schema_version,
        )


def _f32(value: float) -> float:
    """Rounds to IEEE single precision: the objective weights and their sum are checked in f32."""
    return struct.unpack("f", struct.pack("f", value))[0]


def validate_objective_weights(weights: ObjectiveWeights) -> None:
    values = (weights.latency, weights.error, weights.memory)
    try:
        if not all(math.isfinite(v) and v >= 0.0 for v in values):
            raise InvalidObjectiveWeights()
        as_f32 = [_f32(float(v)) for v in values]
    except (TypeError, OverflowError):  # not a number, or beyond f32 range (inf in f32)
        raise InvalidObjectiveWeights() from None
    total = _f32(_f32(as_f32[0] + as_f32[1]) + as_f32[2])
    if abs(total - 1.0) > 1e-3:
        raise InvalidObjectiveWeights()


def validate_tune_policy(policy: TunePolicy) -> None:
    # a tune policy's bad field is reported as InvalidCandidate, the error of a plan's candidate settings
    if policy.cache_max_entries < 1:
        raise InvalidCandidate("cache_max_entries must be at least 1")
    if not isinstance(policy.cache_eviction, TuneCacheEviction):
        raise InvalidCandidate("cache_eviction must be a TuneCacheEviction")


LOW_ACCUM_COMPUTE = frozenset({ScalarType.F16, ScalarType.F8E4M3, ScalarType.F8E5M2})


def validate_precision(spec: FamilySpec, hybrid: HybridPrecisionSpec, allow_emulation: bool) -> None:
    if hybrid.accum.compute in LOW_ACCUM_COMPUTE:
        raise InvalidPrecision("accumulator compute precision too low for stable reductions")
    if not allow_emulation and any(role.convert in EMULATED_CONVERSIONS for role in hybrid.roles()):
        raise InvalidPrecision("emulation policies are disabled in this plan")
    message = spec.validate_precision(hybrid)
    if message:
        raise InvalidPrecision(message)
