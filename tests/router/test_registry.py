"""The backend registry: built-in backends are data (rlx_triton.backends.SPECS) registered on first use, never
as a side effect of importing a backend package. Each test runs in a fresh interpreter (registration is once
per process)."""
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
