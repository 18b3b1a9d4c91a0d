"""Settings from the environment, read once in this one module and passed to the planner and router.

RLX_TRITON_BACKEND          auto | triton | metal | torch        (default auto)
RLX_TRITON_STRICT           1 raises MissingKernel instead of falling back to torch
RLX_TRITON_PROFILE          ultra_low_latency | balanced | high_fidelity | deterministic (default balanced)
RLX_TRITON_TUNE             1 benchmarks candidates on a cold bucket (default 1 on CUDA, never in the interpreter)
RLX_TRITON_TUNE_CACHE       path of the winner table (default $XDG_CACHE_HOME/rlx_triton/tune-v1.tsv)
RLX_TRITON_TUNE_CACHE_LOAD, RLX_TRITON_TUNE_CACHE_PERSIST   0/1 (default 1)
RLX_TRITON_TUNE_CACHE_MAX_ENTRIES                          positive int (default 256)
RLX_TRITON_TUNE_CACHE_EVICTION                             keep-low | keep-high | lru (default keep-low)
RLX_TRITON_CHECK_VALUES     1 | 0 | auto: the input checks that read index tensors' values (cache lengths, pages,
                            cache rows; a host sync on a GPU) run always, never, or only where those tensors
                            are on the CPU (default auto)
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Mapping, Optional

BACKEND_NAMES = ("auto", "triton", "metal", "torch")
PROFILE_NAMES = ("ultra_low_latency", "balanced", "high_fidelity", "deterministic")
EVICTION_NAMES = ("keep-low", "keep-high", "lru")
CHECK_VALUES_NAMES = ("auto", "1", "0")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    backend: str = "auto"
    strict: bool = False
    profile: str = "balanced"
    tune: Optional[bool] = None  # None: decided per device (on for CUDA, off in the interpreter)
    tune_cache_path: str = ""
    tune_cache_load: bool = True
    tune_cache_persist: bool = True
    tune_cache_max_entries: int = 256
    tune_cache_eviction: str = "keep-low"
    interpret: bool = False  # TRITON_INTERPRET=1: triton kernels run on CPU tensors
    check_values: str = "auto"  # "1" always, "0" never, "auto" where the index tensors are on the CPU


def _flag(env: Mapping[str, str], name: str, default: Optional[bool]) -> Optional[bool]:
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be 0 or 1, got {raw!r}")


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple) -> str:
    value = env.get(name, default).strip().lower().replace("_", "-") if name.endswith("EVICTION") \
        else env.get(name, default).strip().lower()
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {env.get(name)!r}")
    return value


def default_tune_cache_path(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rlx_triton", "tune-v1.tsv")


def settings_from(env: Mapping[str, str]) -> Settings:
    """Parses settings from a mapping (tests pass their own); bad values raise ValueError naming the variable."""
    raw_max = env.get("RLX_TRITON_TUNE_CACHE_MAX_ENTRIES", "256")
    try:
        max_entries = int(raw_max)
    except ValueError:
        max_entries = 0
    if max_entries < 1:
        raise ValueError(f"RLX_TRITON_TUNE_CACHE_MAX_ENTRIES must be a positive integer, got {raw_max!r}")
    return Settings(
        backend=_choice(env, "RLX_TRITON_BACKEND", "auto", BACKEND_NAMES),
        strict=bool(_flag(env, "RLX_TRITON_STRICT", False)),
        profile=_choice(env, "RLX_TRITON_PROFILE", "balanced", PROFILE_NAMES),
        tune=_flag(env, "RLX_TRITON_TUNE", None),
        tune_cache_path=env.get("RLX_TRITON_TUNE_CACHE") or default_tune_cache_path(env),
        tune_cache_load=bool(_flag(env, "RLX_TRITON_TUNE_CACHE_LOAD", True)),
        tune_cache_persist=bool(_flag(env, "RLX_TRITON_TUNE_CACHE_PERSIST", True)),
        tune_cache_max_entries=max_entries,
        tune_cache_eviction=_choice(env, "RLX_TRITON_TUNE_CACHE_EVICTION", "keep-low", EVICTION_NAMES),
        interpret=bool(_flag(env, "TRITON_INTERPRET", False)),
        check_values=_check_values(env),
    )


def _check_values(env: Mapping[str, str]) -> str:
    """RLX_TRITON_CHECK_VALUES as "1", "0" or "auto" (true/false words are taken as 1/0)."""
    raw = env.get("RLX_TRITON_CHECK_VALUES")
    if raw is None or raw.strip().lower() in ("auto", ""):
        return "auto"
    try:
        return "1" if _flag(env, "RLX_TRITON_CHECK_VALUES", None) else "0"
    except ValueError:
        raise ValueError(f"RLX_TRITON_CHECK_VALUES must be one of 1, 0, auto, got {raw!r}") from None


@functools.lru_cache(maxsize=1)
def _environment_settings() -> Settings:
    try:
        return settings_from(os.environ)
    except ValueError as error:  # said once, where the user set it: not as a failure of the op being called
        raise ValueError(f"environment variable {error}") from None


_overrides: list = []


def settings() -> Settings:
    """The process-wide settings, read from os.environ on first use (innermost `override_settings` wins)."""
    return _overrides[-1] if _overrides else _environment_settings()


@contextlib.contextmanager
def override_settings(**changes):
    """Replaces some settings inside a with-block (for tests and for applications that embed rlx_triton).

    Plans and the winner table built from the old settings are dropped on entry and exit.
    """
    updated = dataclasses.replace(settings(), **changes)
    _overrides.append(updated)
    _forget_derived_state()
    try:
        yield updated
    finally:
        _overrides.remove(updated)
        _forget_derived_state()


def _forget_derived_state() -> None:
    import sys

    plans = sys.modules.get("rlx_triton.router.plans")
    if plans is not None:
        plans.reset()
    route = sys.modules.get("rlx_triton.router.route")
    if route is not None:
        route.clear_route_cache()
    device = sys.modules.get("rlx_triton.router.device")
    if device is not None:
        device.clear_device_cache()
