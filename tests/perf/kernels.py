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


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """One program sums a row of n values BLOCK at a time: a loop of cdiv(n, BLOCK) passes."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc))


@triton.jit
def stepped_barrier_kernel(x_ptr, counter_ptr, steps, BLOCK: tl.constexpr):
    """Each step scales a row and meets every program at a grid barrier: a step loop around a spin loop."""
    offs = tl.arange(0, BLOCK)
    programs = tl.num_programs(0)
    row = x_ptr + tl.program_id(0) * BLOCK + offs
    value = tl.load(row)
    for step in range(steps):
        value = value * 1.5 + 0.25
        tl.store(row, value)
        tl.debug_barrier()
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        while arrived < programs * (step + 1):
            arrived = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
