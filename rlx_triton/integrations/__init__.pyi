# Static view of rlx_triton.integrations: at run time the submodules load on first access (__init__.py).
# tests/cli/test_packaging.py keeps this list equal to __init__.py's __all__.
from rlx_triton.integrations import pyannote as pyannote
from rlx_triton.integrations import torch_attention as torch_attention
from rlx_triton.integrations import transformers as transformers

__all__: list[str]
