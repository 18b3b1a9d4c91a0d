"""Fixtures the integration tests share."""
import pytest
import torch

import rlx_triton as rt


@pytest.fixture
def torch_route_off_cuda():
    """Off CUDA, every routed call runs torch's op: the whole-pipeline tests compare pyannote's stock pipeline
    with the optimized one, and the Triton interpreter would make each of their many forwards slow."""
    if torch.cuda.is_available():
        yield
        return
    with rt.use_backend("torch"):
        yield
