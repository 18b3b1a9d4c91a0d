"""Backends: triton (CUDA, or CPU under TRITON_INTERPRET=1), metal (MPS), torch_ref (library fallback).

Importing this package registers each backend with the router. Registration is data only: no
backend imports its kernels (or triton) here.
"""
from rlx_triton.backends import metal, torch_ref, triton  # noqa: F401  (each registers itself)
