"""A bad RLX_TRITON_* variable: one line and exit 2 from every command, a ValueError naming it from the library."""
import os
import subprocess
import sys

import pytest


def run_with(env_changes, *argv):
    env = {**os.environ, **env_changes}
    return subprocess.run([sys.executable, "-m", "rlx_triton", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.parametrize("name, value, expected", [
    ("RLX_TRITON_PROFILE", "fast", "environment variable RLX_TRITON_PROFILE must be one of ultra_low_latency"),
    ("RLX_TRITON_STRICT", "maybe", "environment variable RLX_TRITON_STRICT must be 0 or 1, got 'maybe'"),
    ("RLX_TRITON_TUNE_CACHE_MAX_ENTRIES", "-3", "RLX_TRITON_TUNE_CACHE_MAX_ENTRIES must be a positive integer"),
])
def test_a_bad_variable_is_a_one_line_usage_error(name, value, expected):
    result = run_with({name: value}, "info")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("rlx-triton info: ") and expected in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


def test_the_library_raises_a_value_error_naming_the_variable():
    code = ("import torch, rlx_triton as rt\n"
            "try:\n    rt.fbank(torch.zeros(1600))\n"
            "except ValueError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "RLX_TRITON_BACKEND": "cuda"})
    assert result.stdout.strip() == ("environment variable RLX_TRITON_BACKEND must be one of auto, triton, metal, "
                                     "torch, got 'cuda'"), result.stdout + result.stderr
