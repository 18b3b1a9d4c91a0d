"""The backend family protocol: a family module that lacks what the router reads is refused when it loads."""
import types

import pytest

from rlx_triton.router import Coverage, registry
from rlx_triton.router.protocol import BackendProtocolError, check_family_module


def _kernel_module(**drop) -> types.ModuleType:
    module = types.ModuleType("fake_backend.lstm")
    module.COVERAGE = Coverage(ops=frozenset({"lstm"}), devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}))
    module.APPROVALS, module.RECIPES, module.SPEED_EVIDENCE = {}, {}, {}
    module.lstm = lambda *args, **kwargs: None
    for name in drop:
        delattr(module, name)
    return module


def test_a_complete_kernel_module_passes():
    module = _kernel_module()
    assert check_family_module(module, backend="fake") is module


@pytest.mark.parametrize("attribute", ["COVERAGE", "APPROVALS", "RECIPES", "SPEED_EVIDENCE", "lstm"])
def test_a_kernel_module_missing_one_attribute_is_refused_naming_module_and_attribute(attribute):
    with pytest.raises(BackendProtocolError, match=rf"fake_backend\.lstm does not define {attribute} "):
        check_family_module(_kernel_module(**{attribute: None}), backend="fake")


def test_recipes_by_request_key_need_recipe_key():
    module = _kernel_module()
    module.RECIPES = {"sm90": {"*": "tag"}}
    with pytest.raises(BackendProtocolError, match="does not define recipe_key"):
        check_family_module(module, backend="fake")
    module.recipe_key = lambda request: "*"
    check_family_module(module, backend="fake")


def test_the_library_needs_only_coverage_and_the_backend_its_own_attributes():
    module = types.ModuleType("fake_backend.lstm")
    module.COVERAGE = Coverage.everything()
    check_family_module(module, backend="fake", is_library=True)
    with pytest.raises(BackendProtocolError, match="does not define AUDIT_KERNELS"):
        check_family_module(module, backend="fake", is_library=True, extra=("AUDIT_KERNELS",))


def test_a_registered_backend_module_is_checked_when_it_loads(fake_backends, fake_module, monkeypatch):
    monkeypatch.delattr(fake_module, "APPROVALS")
    with pytest.raises(BackendProtocolError, match=r"backend 'fast': family module tests\.router\.fakes\.fbank "
                                                   r"does not define APPROVALS"):
        registry.family_module("fast", "fbank")


def _real_modules():
    """(backend, family, op) naming each module of each registered backend once."""
    seen = {}
    for spec in registry.backends():
        for family in spec.families:
            for op in (None, *(op for op, _module in spec.op_modules)):
                seen.setdefault((spec.name, spec.module_name(family, op) if op else family), (spec.name, family, op))
    return seen


@pytest.mark.parametrize("backend, family, op", list(_real_modules().values()),
                         ids=[f"{backend}.{module}" for backend, module in _real_modules()])
def test_every_real_family_module_follows_the_protocol(backend, family, op):
    if backend == "triton":
        pytest.importorskip("triton", reason="the triton backend's modules import triton")
    registry.family_module(backend, family, op)   # raises BackendProtocolError otherwise
