"""Test set-up: real Triton kernels run on CPU tensors through the interpreter.

TRITON_INTERPRET must be set before triton is imported, so it is set here, at collection time.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# tests never read or write the user's winner table
os.environ.setdefault("RLX_TRITON_TUNE_CACHE_LOAD", "0")
os.environ.setdefault("RLX_TRITON_TUNE_CACHE_PERSIST", "0")
# pyannote.audio posts telemetry by default (a background exporter to its endpoint) unless this is set before
# its first import, whichever test module imports it first
os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")

import pytest  # noqa: E402
import torch  # noqa: E402


REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory) -> Path:
    """`pip wheel` of a copy of the files a clean clone has (no egg-info, no caches), built once per run
    for every test that inspects or installs the wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE-MIT", "LICENSE-APACHE"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "metal", source / "metal")
    shutil.copytree(REPO / "rlx_triton", source / "rlx_triton", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(tmp / "w")],
                   check=True, capture_output=True, timeout=300)
    return next((tmp / "w").glob("*.whl"))


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
