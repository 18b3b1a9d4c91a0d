"""Without triton installed (macOS, or a CPU box), the package imports and every op runs on torch."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import importlib.abc, sys

    class NoTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NoTriton())
    import os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import rlx_triton as rt
    from rlx_triton.backends import triton as backend

    backend.triton_installed = lambda: False  # find_spec would still see the wheel on disk
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8)
    out = rt.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    route = rt.explain(rt.scaled_dot_product_attention, q, k, k, enable_gqa=True)
    feats = rt.fbank(torch.randn(4000))
    assert route.backend == "torch", route
    assert "triton is not installed" in str(route.skipped_reasons["triton"])
    assert "triton" not in sys.modules
    print("ok", tuple(out.shape), tuple(feats.shape))
""")


def test_package_imports_and_runs_on_torch_without_triton():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok (1, 4, 1, 8)")
