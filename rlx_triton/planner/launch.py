"""Launch configurations of a plan: fields validated in declared order, the launch candidate, the
kernel name, and the shape buckets and tune-cache keys the winner table is indexed by.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from .candidates import FAMILIES
from .candidates.base import as_u32
from .errors import CandidateNotPresent, InvalidField, MissingField
from .plan import KernelPlan
from .policy import KernelFamily, PrecisionProfileTag, bucket_pow2


class FrozenFields(Mapping[str, int]):
    """An immutable, hashable name -> value mapping that keeps its declared order."""

    __slots__ = ("_items",)
    _items: Tuple[Tuple[str, int], ...]

    def __init__(self, items: Any = ()) -> None:
        pairs = tuple(items.items()) if isinstance(items, Mapping) else tuple(items)
        object.__setattr__(self, "_items", pairs)

    def __getitem__(self, name: str) -> int:
        for key, value in self._items:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenFields):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenFields is immutable")

    def __reduce__(self):
        return (FrozenFields, (self._items,))

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self._items) + "}"


class _FieldAttributes:
    """Attribute access to the entries of `self.<store>` (launch.m, bucket.seq_kv_bucket)."""

    _store = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == self._store:
            raise AttributeError(name)
        store = self.__dict__.get(self._store)
        if store is not None and name in store:
            return store[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")


@dataclass(frozen=True)
class LaunchConfig(_FieldAttributes):
    """One validated launch. `fields` holds every given launch field in declared order; each is also
    an attribute (launch.m, launch.seq_kv, launch.c_in, ...)."""

    _store = "fields"

    family: KernelFamily
    fields: FrozenFields
    tokens: int
    token_bucket: int
    candidate: Any
    kernel_name: str


@dataclass(frozen=True)
class ShapeBucket(_FieldAttributes):
    """pow2 buckets of a launch's shape fields, hashable. For sdpa_decode the attributes
    m_bucket, batch_bucket, heads_bucket, head_dim_bucket, seq_q_bucket, seq_kv_bucket; for the
    other families `<field>_bucket` for every launch field but `tokens`."""

    _store = "buckets"

    buckets: FrozenFields = field(default_factory=FrozenFields)

    @classmethod
    def of(cls, **buckets: int) -> "ShapeBucket":
        return cls(FrozenFields(buckets))

    def values(self) -> Tuple[int, ...]:
        return tuple(self.buckets.values())


@dataclass(frozen=True)
class TuneCacheKey:
    schema_version: int
    family: KernelFamily
    precision_profile: PrecisionProfileTag
    token_bucket: int
    shape_bucket: ShapeBucket
    device_fingerprint: str
    env_mask: int


class LaunchBuilder:
    """The launch builder of every family. Setters return a new builder.

    `field(name, value)` / `fields(**values)` set any launch field of the plan's family (an unknown
    name raises InvalidField at once); `m`, `tokens`, `batch`, `num_heads`, `head_dim`, `seq_q` and
    `seq_kv` are named setters for sdpa_decode's fields.
    """

    def __init__(self, plan: KernelPlan, values: Optional[Dict[str, Any]] = None, candidate: Any = None) -> None:
        self._plan = plan
        self._values: Dict[str, Any] = dict(values or {})
        self._candidate_override = candidate

    @classmethod
    def from_plan(cls, plan: KernelPlan) -> "LaunchBuilder":
        return cls(plan)

    def field(self, name: str, value: Any) -> "LaunchBuilder":
        if name not in {f.name for f in self._plan.spec.launch_fields}:
            raise InvalidField(name)
        return LaunchBuilder(self._plan, {**self._values, name: value}, self._candidate_override)

    def fields(self, **values: Any) -> "LaunchBuilder":
        builder = self
        for name, value in values.items():
            builder = builder.field(name, value)
        return builder

    def m(self, m: int) -> "LaunchBuilder":
        return self.field("m", m)

    def tokens(self, tokens: int) -> "LaunchBuilder":
        return self.field("tokens", tokens)

    def batch(self, batch: int) -> "LaunchBuilder":
        return self.field("batch", batch)

    def num_heads(self, num_heads: int) -> "LaunchBuilder":
        return self.field("num_heads", num_heads)

    def head_dim(self, head_dim: int) -> "LaunchBuilder":
        return self.field("head_dim", head_dim)

    def seq_q(self, seq_q: int) -> "LaunchBuilder":
        return self.field("seq_q", seq_q)

    def seq_kv(self, seq_kv: int) -> "LaunchBuilder":
        return self.field("seq_kv", seq_kv)

    def candidate(self, candidate: Any) -> "LaunchBuilder":
        return LaunchBuilder(self._plan, self._values, candidate)

    def build(self) -> LaunchConfig:
        spec = self._plan.spec
        for f in spec.launch_fields:
            if f.required and f.name not in self._values:
                raise MissingField(f.name)
        checked = []
        for f in spec.launch_fields:
            if f.name not in self._values:
                continue
            value = as_u32(self._values[f.name])
            if value is None or not f.low <= value <= f.high:
                raise InvalidField(f.error_name)
            checked.append((f.name, value))
        values = FrozenFields(checked)
        broken = spec.check_launch(values)
        if broken:
            raise InvalidField(broken)

        selected = self._candidate_override
        if selected is None:
            selected = spec.choose_launch(self._plan, values)
        if selected not in self._plan.candidates:
            raise CandidateNotPresent()

        tokens = values[spec.token_field]
        return LaunchConfig(
            family=self._plan.family,
            fields=values,
            tokens=tokens,
            token_bucket=self._plan.token_buckets.bucket_of(tokens),
            candidate=selected,
            kernel_name=render_kernel_name(self._plan, values, selected),
        )


def render_kernel_name(plan: KernelPlan, values: Mapping[str, int], candidate: Any) -> str:
    """`<family>_<label><value>..._<candidate tag>_<profile>` over the required launch fields in
    declared order; for sdpa_decode
    `sdpa_decode_m{}_tok{}_b{}_h{}_d{}_sq{}_sk{}_skp{}_tg{}_tm{}_tn{}_tk{}_pq{}_pk{}_{kv}_{red}_{profile}`."""
    shape = "_".join(f"{f.label}{values[f.name]}" for f in plan.spec.launch_fields if f.required)
    return f"{plan.family.value}_{shape}_{candidate.tag()}_{plan.precision_profile.short}"


def shape_bucket(launch: LaunchConfig) -> ShapeBucket:
    spec = FAMILIES[launch.family]
    return ShapeBucket(
        FrozenFields((f.bucket, bucket_pow2(launch.fields[f.name])) for f in spec.launch_fields if f.bucket)
    )


def tune_cache_key(plan: KernelPlan, launch: LaunchConfig, device_fingerprint: str, env_mask: int) -> TuneCacheKey:
    return TuneCacheKey(
        schema_version=plan.schema_version,
        family=plan.family,
        # a plan whose precision spec is not its profile's own (a quantised KV cache) is a custom one
        precision_profile=(PrecisionProfileTag.from_profile(plan.precision_profile)
                           if plan.hybrid == plan.precision_profile.default_spec() else PrecisionProfileTag.CUSTOM),
        token_bucket=launch.token_bucket,
        shape_bucket=shape_bucket(launch),
        device_fingerprint=str(device_fingerprint),
        env_mask=int(env_mask),
    )
