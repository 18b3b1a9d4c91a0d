"""Autotune bridge: a plan's candidates become `triton.Config`s of one `triton.autotune` wrapper.

- The autotune key holds bucket arguments only (token bucket and the shape buckets a family needs),
  never raw lengths and never tensors, so decode steps with a growing KV length do not re-tune.
- The route's candidate (winner table > recipe > plan default, accuracy-approved) is launched with its
  own config and recorded in the autotuner's cache, so nothing is benchmarked on a routed call and a
  concurrent call for the same bucket cannot swap the config another call checked.
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

import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import triton

from rlx_triton.backends.triton.launches import one_interpreted_launch_at_a_time
from rlx_triton.config import settings


_interpreter_ranks = itertools.count()


def interpreter_bench(fn: Callable[[], Any], quantiles=None):
    """Deterministic benchmark for the interpreter: runs the candidate once, ranks by declaration order."""
    fn()
    rank = float(next(_interpreter_ranks))
    return [rank, rank, rank] if quantiles else rank


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
    """One @triton.jit kernel under `triton.autotune`, with configs made from a family's candidates.

    Safe for concurrent callers: a routed call launches its own candidate's config directly (the shared
    autotuner cache only records it for the bucket, it never decides what another call runs), and a cold
    bucket is tuned under the kernel's lock. `check(config, grid, args)` (optional) says why a config does
    not fit a launch's buffers, or None: every config a call may run is checked before anything launches.
    """

    def __init__(self, kernel, candidates: Sequence[Any], to_config: Callable[[Any], triton.Config],
                 key: Sequence[str], check: Optional[Callable[[triton.Config, tuple, tuple], Optional[str]]] = None,
                 **autotune_kwargs):
        self.kernel = kernel
        self.candidates = list(candidates)
        self.tags = [candidate.tag() for candidate in self.candidates]
        self.configs = [to_config(candidate) for candidate in self.candidates]
        self.key = list(key)
        self.check = check
        self.autotuner = triton.autotune(configs=self.configs, key=self.key, do_bench=_bench,
                                         **autotune_kwargs)(kernel)
        self.arg_names = list(self.autotuner.arg_names)
        self.lock = threading.Lock()

    def config_of(self, candidate) -> triton.Config:
        return self.configs[self.tags.index(candidate.tag())]

    def inject(self, key: tuple, candidate) -> None:
        """Records a chosen candidate as the bucket's config in the autotuner's cache (no benchmark for it)."""
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
            for config in self.configs:
                self._check(config, grid, args, kwargs)
            with self.lock, one_interpreted_launch_at_a_time():
                cold = key not in self.autotuner.cache
                self.autotuner[grid](*args, **kwargs)
                winner = self.winner(key)
            if cold and winner is not None:
                _record_winner(route, winner)
            return winner
        if route is not None and route.candidate is not None and route.candidate.tag() in self.tags:
            tag = route.candidate.tag()
            self.inject(key, route.candidate)
        else:
            tag = self.winner(key) or self.tags[0]
            self.autotuner.cache.setdefault(key, self.configs[self.tags.index(tag)])
        config = self.configs[self.tags.index(tag)]
        self._check(config, grid, args, kwargs)
        with one_interpreted_launch_at_a_time():
            self.kernel[grid](*args, **kwargs, **config.all_kwargs())
        return tag

    def _check(self, config: triton.Config, grid, args: tuple, kwargs: Dict[str, Any]) -> None:
        if self.check is None:
            return
        if callable(grid):
            grid = grid({**dict(zip(self.arg_names, args)), **kwargs, **config.all_kwargs()})
        why = self.check(config, tuple(grid), args)
        if why is not None:
            raise RuntimeError(f"autotune bridge: config {config} of {getattr(self.kernel, '__name__', 'the kernel')} does not fit this "
                               f"launch ({why}); nothing was launched")


def _record_winner(route, tag: str) -> None:
    from rlx_triton.router import clear_route_cache, plans

    if route.tune_key is not None:
        plans.winner_table().record(route.tune_key, tag)  # the table persists it if its policy says so
    clear_route_cache()
