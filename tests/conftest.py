"""Test set-up: real Triton kernels run on CPU tensors through the interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at collection time.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# tests never read or write the user's winner table
os.environ.setdefault("RLX_TRITON_TUNE_CACHE_LOAD", "0")
os.environ.setdefault("RLX_TRITON_TUNE_CACHE_PERSIST", "0")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_mps = pytest.mark.skip(reason="needs an Apple GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "mps" in item.keywords and not has_mps:
            item.add_marker(skip_mps)
