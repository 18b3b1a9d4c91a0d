"""LSTM stack: rt.nn.LSTM (Triton input-projection GEMM + recurrence) against cuDNN's nn.LSTM.

Shape (pyannote segmentation-3.0): batch 32, 589 steps, input 60, hidden 128, 4 layers,
bidirectional, batch_first, float32 with TF32 off (pyannote's inference setting). On a GPU the
routed module runs once per case, the routed module again replayed from a CUDA graph (the launch
overheads gone: how it runs inside the graph-captured segmentation forward), plus one row per
approved Triton candidate called directly (the measurements a recipe for the device class would be
chosen from); the baseline is cuDNN's nn.LSTM, called eagerly, in every row. On CPU (quick): batch 2, 50
steps, routed to the torch fallback (the interpreter is not a speed path), so the numbers are
context for the dispatch cost, not a kernel claim.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from rlx_triton.perf.cases import lstm_cases as cases


def _bytes_moved(module: torch.nn.LSTM, x: torch.Tensor, out: torch.Tensor) -> int:
    weights = sum(p.numel() * p.element_size() for p in module.parameters())
    return x.numel() * x.element_size() + out.numel() * out.element_size() + weights


def run(quick: bool = False, progress=None) -> list:
    """Rows of every case; progress (optional) counts each case (bench.common.each_case)."""
    from bench.common import run_fp32_cases

    return run_fp32_cases("lstm", cases, _measure, quick, progress)


def _measure(spec: dict, device: torch.device, backend: str, quick: bool) -> list:
    import rlx_triton as rt
    from bench.common import case, relative_error, side_by_side
    from rlx_triton.nn import LSTM

    batch, seq = spec["batch"], spec["seq"]
    module = torch.nn.LSTM(spec["input_size"], spec["hidden"], spec["layers"], bidirectional=True,
                           batch_first=True).to(device).eval()
    fast = LSTM.from_torch(module)
    x = torch.randn(batch, seq, spec["input_size"], device=device)
    shape = f"({batch}, {seq}, 60) h128 x4 bi {device.type}"
    rows = []
    with torch.inference_mode(), rt.use_backend(backend):
        route = fast.explain(x)
        ref = module(x)[0]
        out = fast(x)[0]
        rel_err = relative_error(out, ref)
        moved = _bytes_moved(module, x, out)
        rlx_us, base_us = side_by_side(lambda: fast(x), lambda: module(x), device, quick=quick)
        rows.append(case("lstm", shape, x.dtype, rlx_us, "nn.LSTM (cuDNN)" if device.type == "cuda" else "nn.LSTM",
                          base_us, bytes_moved=moved, backend=route.backend, candidate=route.candidate_tag,
                          max_rel_err=float(f"{rel_err:.3g}")))
        if device.type == "cuda":
            from bench.common import time_us
            from rlx_triton.backends.triton import lstm as triton_lstm
            from rlx_triton.planner import LstmVariant

            graph_us = time_us(lambda: fast(x), device, quick, graph=True)
            rows.append(case("lstm", f"{shape}, cuda graph", x.dtype, graph_us, "nn.LSTM (cuDNN)", base_us,
                             bytes_moved=moved, backend=route.backend, candidate=route.candidate_tag,
                             variant="cuda graph", max_rel_err=float(f"{rel_err:.3g}")))

            kwargs = dict(has_biases=True, num_layers=4, dropout=0.0, training=False, bidirectional=True,
                          batch_first=True)
            for variant in LstmVariant:
                cand = variant.candidate()
                if cand.tag() not in triton_lstm.APPROVALS or cand.tag() == route.candidate_tag:
                    continue
                run_cand = lambda cand=cand: triton_lstm.lstm(x, None, module._flat_weights, candidate=cand, **kwargs)
                err = relative_error(run_cand()[0], ref)
                rlx_us, base_us = side_by_side(run_cand, lambda: module(x), device, quick=quick)
                rows.append(case("lstm", shape, x.dtype, rlx_us, "nn.LSTM (cuDNN)", base_us, bytes_moved=moved,
                                  backend="triton", candidate=cand.tag(), max_rel_err=float(f"{err:.3g}")))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
