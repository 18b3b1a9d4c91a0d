"""PyanNet forward (pyannote segmentation-3.0 shape): stock model with TF32 off vs rt.integrations.pyannote.optimize.

Shape: 32 chunks of 10 s at 16 kHz, (32, 1, 160000) -> (32, 589, 7); SincNet, a 4-layer
bidirectional LSTM (hidden 128), two linear layers (128) and the powerset classifier (7 classes,
log-softmax); random weights. The model is pyannote.audio's PyanNet when installed
(rlx_triton.perf.stock_models, what `rlx-triton perf` analyses), else the structural copy in
tests/reference/pyannote_models.py. On a GPU a second row times optimize(model, cuda_graphs=True): the forward replayed from a CUDA graph captured for the shape. On CPU (quick): 1 chunk of 2 s, routed to
the torch fallback (the interpreter is not a speed path): context for the dispatch cost only.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from rlx_triton.perf import stock_models
from rlx_triton.perf.cases import pyannote_segmentation_cases as cases


def _pyannet():
    try:
        return stock_models.pyannet()
    except stock_models.StockModelUnavailable:
        from tests.reference.pyannote_models import make_pyannet
        return make_pyannet(hidden=128, lstm_layers=4, linear_layers=2, linear_hidden=128, powerset=True)


def run(quick: bool = False, progress=None) -> list:
    """Rows of every case; progress (optional) counts each case (bench.common.each_case)."""
    from bench.common import run_fp32_cases

    return run_fp32_cases("pyannote_segmentation", cases, _measure, quick, progress)


def _measure(spec: dict, device: torch.device, backend: str, quick: bool) -> list:
    import rlx_triton as rt
    from bench.common import case, side_by_side
    from rlx_triton.integrations import pyannote

    batch, samples = spec["batch"], spec["samples"]
    stock = _pyannet().to(device)
    fast = pyannote.optimize(copy.deepcopy(stock))
    wav = torch.randn(batch, 1, samples, device=device)
    with torch.inference_mode(), rt.use_backend(backend):
        routes = pyannote.explain(fast, wav)
        ref = stock(wav)
        out = fast(wav)
        max_abs_err = (out - ref).abs().max().item()
        moved = wav.numel() * wav.element_size() + out.numel() * out.element_size()
        rlx_us, base_us = side_by_side(lambda: fast(wav), lambda: stock(wav), device, quick=quick)
    shape = f"({batch}, 1, {samples}) -> {tuple(out.shape)} {device.type}"
    summary = ", ".join(f"{path}={route.backend}" for path, route in routes.items())
    backends = "+".join(sorted({r.backend for r in routes.values()})) or "torch"
    rows = [case("pyannote_segmentation", shape, wav.dtype, rlx_us, "PyanNet (torch, TF32 off)", base_us,
                 bytes_moved=moved, backend=backends, routes=summary, max_abs_err=float(f"{max_abs_err:.3g}"))]
    if device.type == "cuda":
        graphed = pyannote.optimize(copy.deepcopy(stock), cuda_graphs=True)
        with torch.inference_mode(), rt.use_backend(backend):
            graphed(wav)                      # the first call of the shape runs eagerly, the next one captures
            graph_err = (graphed(wav) - ref).abs().max().item()
            note = str(pyannote.explain(graphed, wav)["#cuda_graphs"])
            rlx_us, base_us = side_by_side(lambda: graphed(wav), lambda: stock(wav), device, quick=quick)
        rows.append(case("pyannote_segmentation", f"{shape}, cuda graph", wav.dtype, rlx_us,
                         "PyanNet (torch, TF32 off)", base_us, bytes_moved=moved, backend=backends, routes=summary,
                         variant="cuda graph",
                         cuda_graphs=note, max_abs_err=float(f"{graph_err:.3g}")))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
