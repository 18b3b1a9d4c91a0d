"""The Triton backend: @triton.jit kernels, one module per family, plus the autotune bridge and audit.

It runs on CUDA devices, and on CPU tensors when TRITON_INTERPRET=1 was set before triton was
imported (the interpreter CI and the tests use). Family modules import triton, so they are loaded
only once the probe below says the backend runs on the device at hand.
"""
import importlib.util

from rlx_triton.router.backend_spec import BackendSpec

FAMILIES = ("sdpa_decode", "conv", "fbank", "lstm", "segdense", "varlen_attention")
# the 2-D convolutions of the conv family live in their own module
OP_MODULES = (("conv2d", "conv2d"), ("stats_pool", "conv2d"))
# beyond the family protocol: what `rlx-triton audit` compiles and `rlx-triton perf` checks
MODULE_ATTRIBUTES = ("AUDIT_KERNELS", "launch_count")


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def probe(facts) -> "str | None":
    from rlx_triton.config import settings

    if not triton_installed():
        return "triton is not installed"
    if facts.kind == "cuda":
        return None
    if facts.kind == "cpu":
        if settings().interpret:
            return None
        return "CPU tensors run triton kernels only under TRITON_INTERPRET=1"
    return f"triton does not run on {facts.kind} devices"


# what the router registers (rlx_triton.backends.SPECS)
SPEC = BackendSpec(name="triton", precedence=0, package=__name__, families=FAMILIES, op_modules=OP_MODULES,
                   module_attributes=MODULE_ATTRIBUTES, probe=probe, speed_model="rlx_triton.perf.route_estimate")
