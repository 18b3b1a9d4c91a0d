"""Tiny kernels for the audit's own tests: one that compiles cleanly (and a second spec that compiles to the same
kernel under other names), one that needs too much shared memory."""
from types import SimpleNamespace

import triton
import triton.language as tl

from rlx_triton.backends.triton.audit import AuditSpec


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_bounds = offsets < n
    values = tl.load(x_ptr + offsets, mask=in_bounds)
    tl.store(y_ptr + offsets, values * 2, mask=in_bounds)


@triton.jit
def big_dot_kernel(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for step in range(STEPS):
        a = tl.load(a_ptr + step * BLOCK * BLOCK + rows[:, None] * BLOCK + rows[None, :])
        b = tl.load(b_ptr + step * BLOCK * BLOCK + rows[:, None] * BLOCK + rows[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * BLOCK + rows[None, :], acc)


class Tagged(SimpleNamespace):
    def tag(self):
        return f"block{self.block}"


class Twin(Tagged):
    def tag(self):
        return f"twin{self.block}"


SMALL, LARGE, TWIN = Tagged(block=128), Tagged(block=256), Twin(block=128)

AUDIT_KERNELS = [
    AuditSpec(name="fixture_scale", family="fixture", kernel=scale_kernel,
              signature={"x_ptr": "*{dt}", "y_ptr": "*{dt}", "n": "i32", "BLOCK": "constexpr"},
              meta=lambda cand, dt: {"BLOCK": cand.block, "num_warps": 4, "num_stages": 2},
              candidates=(SMALL,), default=SMALL, dtypes=("fp32",), expects_mma=False),
    # another name and candidate, the same compile: the audit compiles it once and reports it under both
    AuditSpec(name="fixture_scale_twin", family="fixture", kernel=scale_kernel,
              signature={"x_ptr": "*{dt}", "y_ptr": "*{dt}", "n": "i32", "BLOCK": "constexpr"},
              meta=lambda cand, dt: {"BLOCK": cand.block, "num_warps": 4, "num_stages": 2},
              candidates=(TWIN,), default=TWIN, dtypes=("fp32",), expects_mma=False),
    AuditSpec(name="fixture_big_dot", family="fixture", kernel=big_dot_kernel,
              signature={"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr",
                         "STEPS": "constexpr"},
              meta=lambda cand, dt: {"BLOCK": cand.block, "STEPS": 4, "num_warps": 8, "num_stages": 4},
              candidates=(LARGE,), default=LARGE, dtypes=("fp16",), expects_mma=True),
]
