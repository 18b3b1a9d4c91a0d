"""Autotune bridge: a plan's candidates become `triton.Config`s of one `triton.autotune` wrapper.

- The autotune key holds bucket arguments only (token bucket and the shape buckets a family needs),
  never raw lengths and never tensors, so decode steps with a growing KV length do not re-tune.
- The route's candidate (winner table > recipe > plan default, accuracy-approved) is injected into
  the autotuner's cache before the launch, so nothing is benchmarked on a routed call.
- A cold bucket is benchmarked only when tuning is on for this call: the tune policy allows it, the
  profile is not DETERMINISTIC, no CUDA graph is being captured, and the route's candidate came from
  neither the winner table nor a built-in recipe (both are evidence; `rlx-triton tune` refines them).
  The winner is recorded in the winner table (if the policy persists) and the route cache is cleared
  so the next call routes to it. A per-kernel lock guards cold tuning
  (triton's Autotuner keeps per-call state on the object and is not safe to tune concurrently).
- On a GPU candidates are timed with `triton.testing.do_bench` (median); under the interpreter the
  benchmark is deterministic: every candidate runs once (a correctness sweep) and the first
  candidate of the plan wins.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import triton

from rlx_triton.config import settings


def interpreter_bench(fn: Callable[[], Any], quantiles=None):
    """Deterministic benchmark for the interpreter: runs the candidate once, ranks by declaration order."""
    fn()
    rank = float(interpreter_bench.counter)
    interpreter_bench.counter += 1
    return [rank, rank, rank] if quantiles else rank


interpreter_bench.counter = 0


def gpu_bench(fn: Callable[[], Any], quantiles=None):
    return triton.testing.do_bench(fn, quantiles=quantiles, return_mode="median") if quantiles is None \
        else triton.testing.do_bench(fn, quantiles=quantiles)


def _bench(fn, quantiles=None):
    if settings().interpret:
        return interpreter_bench(fn, quantiles)
    return gpu_bench(fn, quantiles)


def autotune_key(kernel_arg_names: Sequence[str], key: Sequence[str], args: Sequence[Any],
                 kwargs: Dict[str, Any]) -> tuple:
    """The key triton's Autotuner stores a winner under: the key arguments, then every tensor argument's dtype."""
    named = dict(zip(kernel_arg_names, args))
    named.update(kwargs)
    values: List[Any] = [named[name] for name in key if name in named]
    values.extend(str(value.dtype) for value in named.values() if hasattr(value, "dtype"))
    return tuple(values)


def tuning_allowed(route, device: torch.device) -> bool:
    """Whether this call may benchmark a cold bucket (see the module docstring)."""
    from rlx_triton.router import plans
    from rlx_triton.planner import PrecisionProfile

    if route is None or route.evidence in ("TuneFile", "Recipe"):
        return False
    plan = plans.plan_for(route.family)
    if plan.precision_profile == PrecisionProfile.DETERMINISTIC:
        return False
    policy = plan.tune_policy
    if not policy.enabled or policy.deterministic_mode:
        return False
    enabled = settings().tune
    if enabled is None:
        enabled = device.type == "cuda"
    if not enabled:
        return False
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    return True


class TunedKernel:
    """One @triton.jit kernel under `triton.autotune`, with configs made from a family's candidates."""

    def __init__(self, kernel, candidates: Sequence[Any], to_config: Callable[[Any], triton.Config],
                 key: Sequence[str], **autotune_kwargs):
        self.kernel = kernel
        self.candidates = list(candidates)
        self.tags = [candidate.tag() for candidate in self.candidates]
        self.configs = [to_config(candidate) for candidate in self.candidates]
        self.key = list(key)
        self.autotuner = triton.autotune(configs=self.configs, key=self.key, do_bench=_bench,
                                         **autotune_kwargs)(kernel)
        self.arg_names = list(self.autotuner.arg_names)
        self.lock = threading.Lock()

    def config_of(self, candidate) -> triton.Config:
        return self.configs[self.tags.index(candidate.tag())]

    def inject(self, key: tuple, candidate) -> None:
        """Puts a chosen candidate in the autotuner's cache, so the launch runs it without benchmarking."""
        self.autotuner.cache[key] = self.config_of(candidate)

    def winner(self, key: tuple) -> Optional[str]:
        config = self.autotuner.cache.get(key)
        if config is None:
            return None
        for tag, candidate_config in zip(self.tags, self.configs):
            if candidate_config is config:
                return tag
        return None

    def launch(self, grid, route, *args, **kwargs) -> Optional[str]:
        """Launches with the route's candidate, or tunes a cold bucket when allowed; returns the tag that ran."""
        key = autotune_key(self.arg_names, self.key, args, kwargs)
        device = next((value.device for value in list(args) + list(kwargs.values()) if isinstance(value, torch.Tensor)),
                      torch.device("cpu"))
        if tuning_allowed(route, device) and key not in self.autotuner.cache:
            with self.lock:
                cold = key not in self.autotuner.cache
                self.autotuner[grid](*args, **kwargs)
            winner = self.winner(key)
            if cold and winner is not None:
                _record_winner(route, winner)
            return winner
        if route is not None and route.candidate is not None and route.candidate.tag() in self.tags:
            self.inject(key, route.candidate)
        elif key not in self.autotuner.cache:
            self.autotuner.cache[key] = self.configs[0]
        self.autotuner[grid](*args, **kwargs)
        return self.winner(key)


def _record_winner(route, tag: str) -> None:
    from rlx_triton.router import clear_route_cache, plans

    if route.tune_key is not None:
        plans.winner_table().record(route.tune_key, tag)  # the table persists it if its policy says so
    clear_route_cache()
