"""SincNet stage: rt.nn.SincNet (Triton kernels) against pyannote's torch/cuDNN module sequence.

Shape: 32 chunks of 10 s at 16 kHz, (32, 1, 160000) -> (32, 60, 589), float32, TF32 off (pyannote's
inference setting). Two baselines, side by side in one run:
- "pyannote SincNet module": the module's own forward (rebuilds the sinc filters on every call);
- "cuDNN sequence, cached filters (TF32 off, cudnn.benchmark)": instance_norm, conv1d, abs, max_pool1d,
  instance_norm, leaky_relu, ... with the filters built once and cuDNN free to pick its fastest fp32
  algorithm per shape: the cuDNN work alone, the best alternative a torch user has.
On a GPU one more row per approved candidate pins it (the evidence a RECIPES entry needs).
On CPU: 1 chunk, the rlx op routed to its torch fallback (the interpreter is not a speed
path), so the numbers are context for the dispatch cost, not a kernel claim.
The pyannote module is pyannote.audio's when installed (rlx_triton.perf.stock_models, what `rlx-triton perf`
analyses), else the structural copy in tests/reference/conv.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from rlx_triton.perf import stock_models
from rlx_triton.perf.cases import sincnet_cases as cases


def _pyannote_sincnet():
    try:
        return stock_models.pyannote_sincnet()
    except stock_models.StockModelUnavailable:
        from tests.reference.conv import random_sincnet
        return random_sincnet(stride=stock_models.SINCNET_STRIDE)


def _cached_sequence(module):
    """The module's forward as plain torch ops with the sinc filters computed once."""
    import torch.nn.functional as F

    with torch.no_grad():
        filters = module.conv1d[0].filterbank.filters()
    convs = list(module.conv1d)[1:]

    def forward(wav):
        h = F.instance_norm(wav, weight=module.wav_norm1d.weight, bias=module.wav_norm1d.bias)
        h = F.max_pool1d(F.conv1d(h, filters, stride=10).abs(), 3, 3)
        h = F.leaky_relu(F.instance_norm(h, weight=module.norm1d[0].weight, bias=module.norm1d[0].bias))
        for i, conv in enumerate(convs):
            h = F.max_pool1d(conv(h), 3, 3)
            h = F.leaky_relu(F.instance_norm(h, weight=module.norm1d[i + 1].weight, bias=module.norm1d[i + 1].bias))
        return h

    return forward


def run(quick: bool = False, progress=None) -> list:
    """Rows of every case; progress (optional) counts each case (bench.common.each_case)."""
    from bench.common import run_fp32_cases

    return run_fp32_cases("sincnet", cases, _measure, quick, progress)


def _measure(spec: dict, device: torch.device, backend: str, quick: bool) -> list:
    import rlx_triton as rt
    from bench.common import case, cudnn_autotuned, relative_error, side_by_side
    from rlx_triton.nn.conv import SincNet

    batch, samples = spec["batch"], spec["samples"]
    module = _pyannote_sincnet().to(device)
    rlx = SincNet.from_pyannote(module)
    wav = torch.randn(batch, 1, samples, device=device)

    with torch.inference_mode(), rt.use_backend(backend):
        route = rt.explain(rt.ops.conv.sincnet, wav, rlx.filters(), module.wav_norm1d.weight,
                           module.wav_norm1d.bias, [c.weight for c in list(module.conv1d)[1:]],
                           [c.bias for c in list(module.conv1d)[1:]], [n.weight for n in module.norm1d],
                           [n.bias for n in module.norm1d])
        out = rlx(wav)
        ref = module(wav)
        rel_err = relative_error(out, ref)
        frames = out.shape[-1]
        moved = wav.numel() * wav.element_size() + out.numel() * out.element_size()
        shape = f"({batch}, 1, {samples}) -> ({batch}, {out.shape[1]}, {frames}) {device.type}"
        rows = []
        sequence = _cached_sequence(module)
        rlx_us, base_us = side_by_side(lambda: rlx(wav), lambda: module(wav), device, quick=quick)
        rows.append(case("sincnet", shape, wav.dtype, rlx_us, "pyannote SincNet module", base_us, bytes_moved=moved,
                         backend=route.backend, candidate=route.candidate_tag, max_rel_err=float(f"{rel_err:.3g}")))
        runs = [(route.candidate_tag, lambda: rlx(wav))]
        if device.type == "cuda":
            runs += _pinned_runs(rlx, wav, route.candidate_tag)
        sequence_name = ("cuDNN sequence, cached filters (TF32 off, cudnn.benchmark)" if device.type == "cuda"
                         else "torch CPU sequence, cached filters")
        with cudnn_autotuned():
            for tag, fn in runs:
                rel = relative_error(fn(), ref)
                rlx_us, base_us = side_by_side(fn, lambda: sequence(wav), device, quick=quick)
                rows.append(case("sincnet", shape, wav.dtype, rlx_us, sequence_name, base_us,
                                 bytes_moved=moved, backend=route.backend if tag == route.candidate_tag else "triton",
                                 candidate=tag, max_rel_err=float(f"{rel:.3g}")))
    return rows


def _pinned_runs(rlx, wav, routed_tag) -> list:
    """(tag, call) of every other approved candidate, pinned with use_candidate."""
    from rlx_triton.backends.triton import conv as kernels
    from rlx_triton.router import use_candidate

    runs = []
    for candidate in kernels.all_candidates():
        tag = kernels.candidate_tag(candidate)
        if tag in kernels.APPROVALS and tag != routed_tag:
            def pinned(tag=tag):
                with use_candidate(tag):
                    return rlx(wav)
            runs.append((tag, pinned))
    return runs


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
