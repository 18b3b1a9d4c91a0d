"""Plan vocabulary: families, scalar types, precision roles and profiles, thread/memory/tune policies,
token buckets and objective weights.

Pure data, no torch: every type is a frozen dataclass or an enum, hashable, with its defaults here.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Tuple

U32_MAX = 2**32 - 1


class KernelFamily(enum.Enum):
    """A kernel family; the value is the family's name in kernel names, files and tune-cache rows."""

    SDPA_DECODE = "sdpa_decode"
    CONV = "conv"
    FBANK = "fbank"
    LSTM = "lstm"
    SEGDENSE = "segdense"
    VARLEN_ATTENTION = "varlen_attention"

    @property
    def debug_name(self) -> str:
        """The family in CamelCase (`SdpaDecode`), used in `UnsupportedFamily`'s message."""
        return "".join(part.capitalize() for part in self.value.split("_"))


class ScalarType(enum.Enum):
    """The element types of the precision model, by their short names: floats, fp8 (e4m3, e5m2), integers (i8,
    i4) and block-quantised formats (q8, q4). The kernels take the floats, and fp8 or int8 KV caches dequantised
    on load."""

    F64 = "f64"
    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    I8 = "i8"
    I4 = "i4"
    Q8 = "q8"
    Q4 = "q4"

    @classmethod
    def from_dtype(cls, dtype: str) -> "ScalarType":
        """The element type of a torch dtype name ("float16", "torch.bfloat16", ...); ValueError otherwise."""
        name = str(dtype).removeprefix("torch.")
        if name not in _TORCH_SCALAR_TYPES:
            raise ValueError(f"ScalarType.from_dtype: dtype must be one of {sorted(_TORCH_SCALAR_TYPES)}, got {dtype!r}")
        return cls(_TORCH_SCALAR_TYPES[name])


_TORCH_SCALAR_TYPES = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16",
                       "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "int8": "i8"}


class ConvertPolicy(enum.Enum):
    NATIVE = "native"
    CAST = "cast"
    DEQUANT_ON_LOAD = "dequant_on_load"
    STOCHASTIC_ROUND = "stochastic_round"
    DOUBLE_SINGLE_EMU = "double_single_emu"


# conversions that emulate a format the hardware lacks: refused unless the plan allows emulation
EMULATED_CONVERSIONS = frozenset(
    {ConvertPolicy.STOCHASTIC_ROUND, ConvertPolicy.DOUBLE_SINGLE_EMU, ConvertPolicy.DEQUANT_ON_LOAD}
)


@dataclass(frozen=True)
class RolePrecision:
    """How one tensor role is stored, computed in, and converted between the two."""

    storage: ScalarType
    compute: ScalarType
    convert: ConvertPolicy = ConvertPolicy.NATIVE

    @classmethod
    def native(cls, storage: ScalarType, compute: ScalarType) -> "RolePrecision":
        return cls(storage, compute, ConvertPolicy.NATIVE)


@dataclass(frozen=True)
class HybridPrecisionSpec:
    activations: RolePrecision
    weights: RolePrecision
    accum: RolePrecision
    kv_cache: RolePrecision

    def roles(self) -> Tuple[RolePrecision, ...]:
        return (self.activations, self.weights, self.accum, self.kv_cache)


def _uniform_spec(storage: ScalarType, compute: ScalarType, kv: Tuple[ScalarType, ScalarType]) -> HybridPrecisionSpec:
    role = RolePrecision.native(storage, compute)
    return HybridPrecisionSpec(
        activations=role,
        weights=role,
        accum=RolePrecision.native(ScalarType.F32, ScalarType.F32),
        kv_cache=RolePrecision.native(*kv),
    )


class PrecisionProfile(enum.Enum):
    """The user-facing precision choice; values match `rlx_triton.config.PROFILE_NAMES`."""

    ULTRA_LOW_LATENCY = "ultra_low_latency"
    BALANCED = "balanced"
    HIGH_FIDELITY = "high_fidelity"
    DETERMINISTIC = "deterministic"

    def default_spec(self) -> HybridPrecisionSpec:
        if self is PrecisionProfile.ULTRA_LOW_LATENCY:
            return _uniform_spec(ScalarType.F16, ScalarType.F16, (ScalarType.F16, ScalarType.F16))
        if self is PrecisionProfile.BALANCED:
            return _uniform_spec(ScalarType.BF16, ScalarType.F16, (ScalarType.BF16, ScalarType.F16))
        return _uniform_spec(ScalarType.F32, ScalarType.F32, (ScalarType.F32, ScalarType.F32))

    @property
    def short(self) -> str:
        """The profile's kernel-name suffix: ull, bal, hf, det."""
        return _PROFILE_SHORT[self]


_PROFILE_SHORT = {
    PrecisionProfile.ULTRA_LOW_LATENCY: "ull",
    PrecisionProfile.BALANCED: "bal",
    PrecisionProfile.HIGH_FIDELITY: "hf",
    PrecisionProfile.DETERMINISTIC: "det",
}


class PrecisionProfileTag(enum.Enum):
    """A profile as recorded in tune-cache keys; CUSTOM names hand-built hybrid specs."""

    ULTRA_LOW_LATENCY = "ultra_low_latency"
    BALANCED = "balanced"
    HIGH_FIDELITY = "high_fidelity"
    DETERMINISTIC = "deterministic"
    CUSTOM = "custom"

    @classmethod
    def from_profile(cls, profile: PrecisionProfile) -> "PrecisionProfileTag":
        return cls(profile.value)


@dataclass(frozen=True)
class ThreadPolicy:
    max_threads_per_tg: int = 256
    prefer_simdgroups: bool = True


class MemoryKind(enum.Enum):
    ARENA_ONLY = "arena_only"
    SHARED_IF_FITS = "shared_if_fits"
    FORCE_SHARED = "force_shared"


@dataclass(frozen=True)
class MemoryPolicy:
    """Where a kernel may stage data: arena only, shared memory if it fits in max_tg_bytes, or always shared.

    The default is `shared_if_fits(32 KiB)`, Apple's threadgroup-memory size.
    """

    kind: MemoryKind = MemoryKind.SHARED_IF_FITS
    max_tg_bytes: int = 32 * 1024

    @classmethod
    def arena_only(cls) -> "MemoryPolicy":
        return cls(MemoryKind.ARENA_ONLY, 0)

    @classmethod
    def shared_if_fits(cls, max_tg_bytes: int = 32 * 1024) -> "MemoryPolicy":
        return cls(MemoryKind.SHARED_IF_FITS, max_tg_bytes)

    @classmethod
    def force_shared(cls) -> "MemoryPolicy":
        return cls(MemoryKind.FORCE_SHARED, 0)


class TuneCacheEviction(enum.Enum):
    """Which winners survive a full table; values match `rlx_triton.config.EVICTION_NAMES`."""

    KEEP_LOW_BUCKETS = "keep-low"
    KEEP_HIGH_BUCKETS = "keep-high"
    LRU = "lru"


@dataclass(frozen=True)
class TunePolicy:
    enabled: bool = False
    warmup_iters: int = 0
    measure_iters: int = 0
    cache_load: bool = True
    persist_cache: bool = False
    cache_max_entries: int = 256
    cache_eviction: TuneCacheEviction = TuneCacheEviction.KEEP_LOW_BUCKETS
    deterministic_mode: bool = True

    @classmethod
    def disabled(cls) -> "TunePolicy":
        return cls()

    @classmethod
    def balanced_defaults(cls) -> "TunePolicy":
        return replace(
            cls(), enabled=True, warmup_iters=2, measure_iters=8, persist_cache=True, deterministic_mode=False
        )


@dataclass(frozen=True)
class TokenBucketStrategy:
    """Token counts grouped by inclusive upper edges; counts above the last edge share one bucket."""

    edges: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

    @classmethod
    def decode_default(cls) -> "TokenBucketStrategy":
        return cls()

    def bucket_of(self, tokens: int) -> int:
        for index, edge in enumerate(self.edges):
            if tokens <= edge:
                return index
        return len(self.edges)


@dataclass(frozen=True)
class ObjectiveWeights:
    latency: float = 0.6
    error: float = 0.3
    memory: float = 0.1


def bucket_pow2(value: int) -> int:
    """ceil(log2(value)) for value >= 2, else 0: the shape bucket (1 -> 0, 2 -> 1, 3..4 -> 2)."""
    if value <= 1:
        return 0
    return (value - 1).bit_length()
