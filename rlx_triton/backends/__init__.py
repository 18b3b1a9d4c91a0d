"""Backends: triton (CUDA, or CPU under TRITON_INTERPRET=1), metal (MPS), torch_ref (library fallback)."""
