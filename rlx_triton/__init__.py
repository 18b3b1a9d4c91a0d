"""rlx_triton: Triton (CUDA) and Metal (MPS) kernels for attention decode and speaker diarization.

Every public op asks the router which backend runs it: a Triton kernel, a Metal shader, or the
torch library op as the always-correct fallback. Names resolve lazily so that `import rlx_triton`
stays cheap and works without triton or a GPU; `__init__.pyi` shows them to type checkers and IDEs.
Importing it also registers "RLX" with torch's flash attention registry (without importing torch).
"""
from __future__ import annotations

import importlib

from rlx_triton._torch_registration import register_flash_impl as _register_flash_impl

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it from here

# public name -> (module, attribute)
_EXPORTS = {
    "scaled_dot_product_attention": ("rlx_triton.ops.sdpa", "scaled_dot_product_attention"),
    "sdpa_decode": ("rlx_triton.ops.sdpa_decode", "sdpa_decode"),
    "patch_sdpa": ("rlx_triton.ops.sdpa", "patch_sdpa"),
    "flash_attn_with_kvcache": ("rlx_triton.ops.flash_attn", "flash_attn_with_kvcache"),
    "flash_attn_varlen_func": ("rlx_triton.ops.varlen_attention", "flash_attn_varlen_func"),
    "flash_attn_func": ("rlx_triton.ops.varlen_attention", "flash_attn_func"),
    "varlen_attn": ("rlx_triton.ops.varlen_attn", "varlen_attn"),
    "fbank": ("rlx_triton.ops.fbank", "fbank"),
    "explain": ("rlx_triton.explaining", "explain"),
    "explain_as": ("rlx_triton.explaining", "explain_as"),
    "use_backend": ("rlx_triton.router.settings", "use_backend"),
    "MissingKernel": ("rlx_triton.router.route", "MissingKernel"),
    "Route": ("rlx_triton.router.route", "Route"),
}
_SUBMODULES = {"nn", "integrations", "planner", "router", "ops", "backends"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES)

# torch asks attention providers to register on import and leave activation to the user:
# torch.nn.attention.activate_flash_attention_impl("RLX") (rlx_triton/integrations/torch_attention.py)
_register_flash_impl()


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"rlx_triton.{name}")
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rlx_triton' has no attribute {name!r}")


def __dir__():
    return __all__
