"""The backend registry: built-in backends are data (rlx_triton.backends.SPECS) registered on first use, never
as a side effect of importing a backend package (those tests run in a fresh interpreter: registration is once
per process). Lookups are typed by the family protocol, and a change of the backends forgets what was read
from them."""
import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_backends_registers_nothing():
    out = _run("""
        import rlx_triton.backends
        from rlx_triton.router import registry
        print(sorted(registry._backends))
    """)
    assert out == "[]"


def test_the_first_lookup_registers_every_built_in_spec_in_precedence_order():
    out = _run("""
        from rlx_triton import backends
        from rlx_triton.router import registry
        assert all(registry.backend(spec.name) is spec for spec in backends.SPECS)
        print(" ".join(spec.name for spec in registry.backends()))
    """)
    assert out == "triton metal torch"


def test_a_backend_registered_before_the_first_lookup_keeps_its_name():
    out = _run("""
        import dataclasses
        from rlx_triton import backends
        from rlx_triton.router import registry
        mine = dataclasses.replace(backends.metal.SPEC, precedence=200)
        registry.register_backend(mine)
        assert registry.backend("metal") is mine
        print(" ".join(spec.name for spec in registry.backends()))
    """)
    assert out == "triton torch metal"


def test_a_kernel_family_module_is_never_the_library_s():
    import pytest

    from rlx_triton.router import registry

    assert registry.kernel_family_module("triton", "fbank").APPROVALS
    with pytest.raises(ValueError, match="'torch' is the library fallback"):
        registry.kernel_family_module("torch", "fbank")


def test_a_change_of_the_backends_forgets_the_device_facts_and_the_routes(fake_backends):
    from rlx_triton.router import BackendSpec, register_backend
    from rlx_triton.router.device import device_facts
    from rlx_triton.router.registry import unregister_backend

    before = device_facts("cpu")
    assert before is device_facts("cpu")
    register_backend(BackendSpec(name="later", precedence=-5, package="tests.router.fakes", families=("fbank",),
                                 probe=lambda facts: "never here"))
    try:
        after = device_facts("cpu")
        assert after is not before and after.unavailable_reason("later") == "never here"
    finally:
        unregister_backend("later")
    assert device_facts("cpu").unavailable_reason("later") == "backend 'later' is not registered"
