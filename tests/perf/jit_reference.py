"""The specialisation triton's JIT itself computes for a call: the reference launch records are checked against."""


def jit_specialization(kernel, args, meta):
    """What triton's JIT itself computes for kernel[grid](*args, **meta) on sm_90 (its own binder)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    jit = kernel if hasattr(kernel, "params") else JITFunction(
        kernel.fn, **{name: kernel.kwargs.get(name) for name in ("do_not_specialize", "do_not_specialize_on_alignment")})
    backend = make_backend(GPUTarget("cuda", 90, 32))
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    bound, specialization, options = binder(*args, **meta, num_warps=4)
    _options, signature, constexprs, attrs = jit._pack_args(backend, dict(meta, num_warps=4), bound,
                                                           specialization, options)
    return signature, constexprs, attrs
