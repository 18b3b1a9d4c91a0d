"""Backends: triton (CUDA, or CPU under TRITON_INTERPRET=1), metal (MPS), torch_ref (library fallback).

Each backend package declares its BackendSpec as data (`SPEC`); the router's registry registers
`SPECS` on first use. Importing a backend package imports no kernels (and not triton).
"""
from rlx_triton.backends import metal, torch_ref, triton
from rlx_triton.router.backend_spec import BackendSpec

SPECS: "tuple[BackendSpec, ...]" = (triton.SPEC, metal.SPEC, torch_ref.SPEC)
