"""Small @triton.jit kernels the launch-record tests launch, specialise and compile."""
import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, stride, alpha, use_alpha, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs * stride, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs * stride, mask=mask, other=0.0)
    if use_alpha:
        x = x * alpha
    tl.store(out_ptr + offs * stride, x + y, mask=mask)


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["stride"])
def unspecialised_copy_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs * stride, tl.load(x_ptr + offs * stride, mask=mask), mask=mask)
