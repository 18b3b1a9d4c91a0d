"""`make demo` runs `python -m rlx_triton.demo`: it must pass its own numeric checks on a CPU-only machine."""
import os
import subprocess
import sys


def test_demo_runs_the_kernels_checks_them_and_prints_the_route_table():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "rlx_triton.demo"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "sdpa_decode max |err|" in out and "log-mel, max |err|" in out
    assert "route table" in out and "sdpa prefill (Lq=512)    torch" in out
    assert "all checks passed" in out
    # its words come with a legend, and no Python reprs
    assert "evidence: why this backend and candidate" in out
    assert "DeviceDefault  the plan's default candidate for this device" in out
    assert "Library        torch's own op" in out
    assert "['" not in out and "dither=True is not covered (covered: False)" in out
