"""Device facts: computed once per device, with a stable fingerprint and each backend's verdict."""
import torch

from rlx_triton.router.device import device_facts


def test_cpu_facts_name_kind_and_class():
    facts = device_facts("cpu")
    assert facts.kind == "cpu" and facts.capability is None
    assert facts.device_class in {"cpu", "interpreter"}


def test_facts_are_cached_per_device_and_accept_tensors():
    assert device_facts(torch.ones(1)) is device_facts(torch.device("cpu"))


def test_fingerprint_is_stable_and_names_the_kind():
    facts = device_facts("cpu")
    assert facts.fingerprint.startswith("cpu-") and facts.fingerprint == device_facts("cpu").fingerprint


def test_every_registered_backend_has_a_verdict():
    facts = device_facts("cpu")
    verdicts = dict(facts.backend_reasons)
    assert {"triton", "metal", "torch"} <= set(verdicts)
    assert verdicts["torch"] is None
    assert "MPS" in verdicts["metal"]


def test_triton_runs_on_cpu_tensors_only_under_the_interpreter():
    from rlx_triton.config import override_settings

    with override_settings(interpret=False):
        assert "TRITON_INTERPRET" in device_facts("cpu").unavailable_reason("triton")
    with override_settings(interpret=True):
        assert device_facts("cpu").triton_ok
