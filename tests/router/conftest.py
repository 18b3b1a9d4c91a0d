"""Router test fixtures: fake backends registered for one test and removed after it."""
import pytest

from rlx_triton.config import override_settings
from rlx_triton.router import BackendSpec, Request, clear_route_cache, register_backend
from rlx_triton.router import plans
from rlx_triton.router.registry import unregister_backend
from tests.router.fakes import fbank as fake_fbank_module


@pytest.fixture
def fake_module(monkeypatch):
    return fake_fbank_module


@pytest.fixture
def fake_backends():
    """Registers `fast` (precedence -20) and `slow` (precedence -10), both served by tests.router.fakes."""
    probes = {"fast": None, "slow": None}
    names = []

    def add(name, precedence):
        register_backend(BackendSpec(name=name, precedence=precedence, package="tests.router.fakes",
                                     families=("fbank",), probe=lambda facts, n=name: probes[n]))
        names.append(name)

    # interpret=False keeps the real triton backend off CPU tensors, so fallbacks land on torch
    with override_settings(backend="auto", strict=False, profile="balanced", tune_cache_load=False,
                           tune_cache_persist=False, interpret=False):
        add("fast", -20)
        add("slow", -10)
        clear_route_cache()
        yield probes
        for name in names:
            unregister_backend(name)
        clear_route_cache()


@pytest.fixture
def fbank_candidates():
    return list(plans.plan_for("fbank").candidates)


def fbank_request(bins=80, dtype="float32", snip_edges=True, op="fbank", device="cpu", **extra_features):
    import torch

    features = {"snip_edges": snip_edges, **extra_features}
    return Request.make("fbank", op, device=device, dtype=getattr(torch, dtype),
                        fields={"batch": 1, "samples": 16000, "frames": 98, "window": 512, "bins": bins,
                                "tokens": 98}, features=features)
