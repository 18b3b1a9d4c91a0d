"""A spec listed in fp16 and bf16 with two candidates, for the audit's variant listing (never compiled)."""
from rlx_triton.backends.triton.audit import AuditSpec
from tests.triton.audit_fixture import LARGE, SMALL, scale_kernel

AUDIT_KERNELS = [
    AuditSpec(name="fixture_two_dtypes", family="fixture", kernel=scale_kernel,
              signature={"x_ptr": "*{dt}", "y_ptr": "*{dt}", "n": "i32", "BLOCK": "constexpr"},
              meta=lambda cand, dt: {"BLOCK": cand.block, "num_warps": 4, "num_stages": 2},
              candidates=(SMALL, LARGE), default=SMALL, dtypes=("fp16", "bf16"), expects_mma=False),
]
