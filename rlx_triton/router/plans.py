"""The planner objects the router consults: one plan per (family, profile) and the shared winner table."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import threading
from types import ModuleType
from typing import Optional

from rlx_triton.config import settings
from rlx_triton.planner import (ConvertPolicy, KernelPlanBuilder, PrecisionProfile, RolePrecision, ScalarType, TunePolicy,
                                family_spec)

_PROFILES = {
    "ultra_low_latency": PrecisionProfile.ULTRA_LOW_LATENCY,
    "balanced": PrecisionProfile.BALANCED,
    "high_fidelity": PrecisionProfile.HIGH_FIDELITY,
    "deterministic": PrecisionProfile.DETERMINISTIC,
}


def profile_name(profile: PrecisionProfile) -> str:
    for name, member in _PROFILES.items():
        if member == profile:
            return name
    raise ValueError(f"unknown precision profile {profile!r}")


def current_profile() -> PrecisionProfile:
    return _PROFILES[settings().profile]


@functools.lru_cache(maxsize=None)
def plan_for(family: str, profile: Optional[PrecisionProfile] = None, kv_storage: Optional[str] = None):
    """The default plan of a family under a profile, with the winner-table settings of the environment.

    kv_storage: a quantised KV cache's dtype ("float8_e4m3fn", "float8_e5m2", "int8"): the profile's precision
    spec with the kv_cache role stored so and dequantised on load to float32, which the family's precision rule
    must accept (planner InvalidPrecision otherwise)."""
    profile = profile or current_profile()
    env = settings()
    tune = TunePolicy.disabled() if profile == PrecisionProfile.DETERMINISTIC else TunePolicy.balanced_defaults()
    builder = (KernelPlanBuilder(family)
               .precision_profile(profile)
               .autotune(tune)
               .tune_cache(env.tune_cache_load, env.tune_cache_persist, env.tune_cache_max_entries))
    if kv_storage not in (None, "none"):
        role = RolePrecision(ScalarType.from_dtype(kv_storage), ScalarType.F32, ConvertPolicy.DEQUANT_ON_LOAD)
        builder = builder.hybrid_profile(dataclasses.replace(profile.default_spec(), kv_cache=role)).allow_emulation(True)
    return builder.build_plan()


def candidate_module(family: str) -> ModuleType:
    """planner/candidates/<family>.py: the candidate type, its variants, FP32_VARIANT, DEFAULT_VARIANT."""
    return importlib.import_module(f"rlx_triton.planner.candidates.{family}")


def fp32_candidate(family: str):
    return family_spec(family).fp32_variant.candidate()


_table = None
_table_lock = threading.Lock()


def winner_table():
    """The process-wide winner table (loaded lazily on first lookup by the planner's TuneCache)."""
    global _table
    if _table is None:
        with _table_lock:
            if _table is None:
                from rlx_triton.planner.tune_cache import TuneCache

                _table = TuneCache.from_settings(settings(), TunePolicy.balanced_defaults())
    return _table


def reset() -> None:
    """Forgets cached plans and the winner table (after the settings change)."""
    global _table
    plan_for.cache_clear()
    _table = None
