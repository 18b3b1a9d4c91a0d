"""The Metal backend: shaders in metal/*.metal compiled with torch.mps.compile_shader, one launcher module per family.

It runs only where a compile-and-run smoke test passes on an MPS device, not merely where
torch.backends.mps.is_available() says so.
"""
from rlx_triton.router.backend_spec import BackendSpec

# families with a shader in metal/<family>.metal
SHADER_FAMILIES = ("sdpa_decode", "conv", "fbank", "lstm", "segdense")
# every family the router asks Metal about: ragged attention has no shader, its coverage refuses it by name
FAMILIES = SHADER_FAMILIES + ("varlen_attention",)


def probe(facts) -> "str | None":
    if facts.kind != "mps":
        return f"Metal shaders run on MPS devices, not {facts.kind}"
    from rlx_triton.backends.metal.library import smoke_test

    return smoke_test()


# what the router registers (rlx_triton.backends.SPECS)
SPEC = BackendSpec(name="metal", precedence=10, package=__name__, families=FAMILIES, probe=probe)
