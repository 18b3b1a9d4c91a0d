"""The library fallback: torch-native implementations of every op, one module per family.

It runs wherever torch runs and covers every request, so the router can always fall back to it.
"""
from rlx_triton.router.backend_spec import BackendSpec

FAMILIES = ("sdpa_decode", "conv", "fbank", "lstm", "segdense", "varlen_attention")
# the 2-D convolutions of the conv family live in their own module
OP_MODULES = (("conv2d", "conv2d"), ("stats_pool", "conv2d"))

# what the router registers (rlx_triton.backends.SPECS)
SPEC = BackendSpec(name="torch", precedence=100, package=__name__, families=FAMILIES, op_modules=OP_MODULES,
                   probe=lambda facts: None, is_library=True, speed_model="rlx_triton.perf.route_estimate")
