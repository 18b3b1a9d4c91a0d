# Static view of rlx_triton's public surface: at run time these names resolve lazily (__init__.py),
# so that `import rlx_triton` stays cheap; type checkers and IDEs read them here.
# tests/cli/test_packaging.py keeps this list equal to __init__.py's __all__.
from rlx_triton import backends as backends
from rlx_triton import integrations as integrations
from rlx_triton import nn as nn
from rlx_triton import ops as ops
from rlx_triton import planner as planner
from rlx_triton import router as router
from rlx_triton.ops.fbank import fbank as fbank
from rlx_triton.ops.flash_attn import flash_attn_with_kvcache as flash_attn_with_kvcache
from rlx_triton.ops.varlen_attention import flash_attn_func as flash_attn_func
from rlx_triton.ops.varlen_attention import flash_attn_varlen_func as flash_attn_varlen_func
from rlx_triton.ops.varlen_attn import varlen_attn as varlen_attn
from rlx_triton.ops.sdpa import patch_sdpa as patch_sdpa
from rlx_triton.ops.sdpa import scaled_dot_product_attention as scaled_dot_product_attention
from rlx_triton.ops.sdpa_decode import sdpa_decode as sdpa_decode
from rlx_triton.router.route import MissingKernel as MissingKernel
from rlx_triton.router.route import Route as Route
from rlx_triton.explaining import explain as explain
from rlx_triton.explaining import explain_as as explain_as
from rlx_triton.router.settings import use_backend as use_backend

__version__: str
__all__: list[str]
