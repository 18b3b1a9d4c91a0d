"""WeSpeaker ResNet34 embedding (pyannote's speaker-embedding model): stock (TF32 off) vs optimized.

End to end: 32 chunks of 10 s at 16 kHz, (32, 1, 160000) -> fbank (32, 998, 80) -> ResNet34 trunk
(m_channels 32, blocks 3/4/6/3) -> TSTP (32, 5120) -> seg_1 (32, 256); random weights with
non-trivial BatchNorm statistics. The stock model is pyannote.audio's WeSpeakerResNet34 when
installed (rlx_triton.perf.stock_models, what `rlx-triton perf` analyses), else the structural copy in
tests/reference/wespeaker_models.py with a batched torch kaldi fbank front end (what pyannote's vmap over
torchaudio computes).

The end-to-end row runs the routed (on a GPU: autotuned among approved candidates) kernels; on a GPU
one more end-to-end row per approved conv candidate pins it as the device recipe (no tuning, no
winner table), the evidence a RECIPES entry needs.

Per layer: every distinct conv geometry of the trunk against the rlx Conv2d with BatchNorm folded and
the epilogue fused; the baseline is the best a torch user has: cuDNN's conv with the same folded weights,
TF32 off and cudnn.benchmark (cuDNN picks its fastest fp32 algorithm per shape, Winograd included), then
the residual and ReLU. Plus the TSTP pooling and the 5120 -> 256 projection. Every torch baseline runs
with cudnn.benchmark on.

On CPU: 1 chunk of 2 s (1 s with quick), routed to the torch fallback (the interpreter is not a speed path).
"""
from __future__ import annotations

import copy
import sys
import types
from pathlib import Path

import torch
from torch import nn

from rlx_triton.perf import stock_models
from rlx_triton.perf.cases import TRUNK_LAYER_KEYS
from rlx_triton.perf.cases import embedding_cases as cases


def _stock_compute_fbank(self, waveforms: torch.Tensor) -> torch.Tensor:
    """BaseWeSpeakerResNet.compute_fbank with the batched torch kaldi fbank (vmap's values)."""
    import rlx_triton as rt

    with rt.use_backend("torch"):
        return self._bench_fbank(waveforms)


def _wespeaker34() -> nn.Module:
    try:
        return stock_models.wespeaker_resnet34()
    except stock_models.StockModelUnavailable:
        pass
    from rlx_triton.nn.fbank import Fbank
    from tests.reference.wespeaker_models import WeSpeakerResNet34

    model = stock_models.randomize(WeSpeakerResNet34())
    options = dict(model._fbank.keywords, input_scale=float(1 << 15), subtract_mean=True)
    object.__setattr__(model, "_bench_fbank", Fbank(**options))
    object.__setattr__(model, "compute_fbank", types.MethodType(_stock_compute_fbank, model))
    return model


def run(quick: bool = False, progress=None) -> list:
    """Rows of every case (end to end, each trunk conv, pool, seg_1); progress (optional) counts each case."""
    from bench.common import cudnn_autotuned, run_fp32_cases

    with cudnn_autotuned():
        return run_fp32_cases("embedding", cases, _measure, quick, progress)


def _measure(spec: dict, device, backend: str, quick: bool) -> list:
    import rlx_triton as rt

    measure = {"end to end": _end_to_end, "pool": _pool, "seg_1": _projection}.get(spec["layer"], _trunk_layer)
    with torch.inference_mode(), rt.use_backend(backend):
        return measure(spec, device, quick)


def _end_to_end(spec: dict, device, quick: bool) -> list:
    from bench.common import case, relative_error, side_by_side
    from rlx_triton.integrations import pyannote

    batch, samples = spec["batch"], spec["samples"]
    with torch.inference_mode(False):  # the models are built as a user builds them, outside inference mode
        stock = _wespeaker34().to(device)
        fast = pyannote.optimize(copy.deepcopy(stock))
    wav = 0.1 * torch.randn(batch, 1, samples, device=device)
    routes = pyannote.explain(fast, wav)
    ref = stock(wav)
    out = fast(wav)
    rel = relative_error(out, ref)
    rlx_us, base_us = side_by_side(lambda: fast(wav), lambda: stock(wav), device, quick=quick)
    backends = sorted({r.backend for r in routes.values()}) or ["torch"]
    conv_route = routes.get("resnet.layer1.0.conv1")
    rows = [case("embedding", f"({batch}, 1, {samples}) -> {tuple(out.shape)} {device.type}", wav.dtype,
                 rlx_us, "WeSpeakerResNet34 (torch, TF32 off)", base_us,
                 bytes_moved=wav.numel() * 4 + out.numel() * 4, backend="+".join(backends),
                 candidate=getattr(conv_route, "candidate_tag", None),
                 max_rel_err=float(f"{rel:.3g}"), layer="end to end")]
    if device.type == "cuda":
        rows += _end_to_end_per_candidate(stock, fast, wav, quick)
    return rows


def _trunk_layer(spec: dict, device, quick: bool) -> list:
    """One trunk conv against cuDNN conv + BatchNorm (+ residual) + ReLU: the routed candidate, then (on a GPU)
    every approved candidate launched directly."""
    import torch.nn.functional as F

    from bench.common import case, relative_error, side_by_side
    from rlx_triton.nn.conv2d import Conv2d

    name, batch = spec["layer"], spec["batch"]
    c_in, c_out, h, w, k, s, p, with_residual = (spec[key] for key in TRUNK_LAYER_KEYS)
    layer_baseline = ("cuDNN conv, BatchNorm folded, + residual, relu (TF32 off, cudnn.benchmark)"
                      if device.type == "cuda" else "torch CPU conv, BatchNorm folded, + residual, relu")
    conv = nn.Conv2d(c_in, c_out, k, stride=s, padding=p, bias=False)
    bn = nn.BatchNorm2d(c_out)
    stock_models.randomize(nn.Sequential(conv, bn))
    conv, bn = conv.to(device), bn.to(device)
    x = torch.randn(batch, c_in, h, w, device=device)
    fused = Conv2d.from_torch(conv, bn=bn, relu=True).to(device)
    out_h, out_w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    res = torch.randn(batch, c_out, out_h, out_w, device=device) if with_residual else None

    folded_weight, folded_bias = fused.folded()

    def stock_layer():
        y = F.conv2d(x, folded_weight, folded_bias, stride=s, padding=p)
        if res is not None:
            y = y + res
        return torch.relu(y)

    def fast_layer():
        return fused(x, residual=res)

    moved = 4 * (x.numel() + batch * c_out * out_h * out_w * (2 if res is not None else 1) + conv.weight.numel())
    route = fused.explain(x, residual=res)
    runs = [(route.candidate_tag, fast_layer)]
    if device.type == "cuda":
        from rlx_triton.backends.triton import conv2d as kernels

        for cand in kernels.all_candidates():
            tag = kernels.candidate_tag(cand)
            if tag in kernels.APPROVALS and tag != route.candidate_tag:
                runs.append((tag, lambda cand=cand: kernels.conv2d(
                    x, folded_weight, folded_bias, stride=s, padding=p, residual=res, relu=True, candidate=cand)))
    rows = []
    for tag, fn in runs:
        expected = stock_layer()
        rel = relative_error(fn(), expected)
        rlx_us, base_us = side_by_side(fn, stock_layer, device, quick=quick)
        rows.append(case("embedding", f"{name} ({batch}, {c_in}, {h}, {w}) -> {c_out} {device.type}",
                         torch.float32, rlx_us, layer_baseline, base_us, bytes_moved=moved,
                         backend=route.backend if tag == route.candidate_tag else "triton",
                         candidate=tag, max_rel_err=float(f"{rel:.3g}"), layer=name))
    return rows


def _pool(spec: dict, device, quick: bool) -> list:
    """TSTP pooling against torch's mean and std."""
    from bench.common import case, side_by_side
    from rlx_triton.nn.conv2d import StatsPool

    frames_4 = torch.randn(spec["batch"], spec["channels"], spec["height"], spec["width"], device=device)
    pool = StatsPool()
    tstp = _tstp()
    rlx_us, base_us = side_by_side(lambda: pool(frames_4), lambda: tstp(frames_4), device, quick=quick)
    return [case("embedding", f"TSTP {tuple(frames_4.shape)} {device.type}", torch.float32, rlx_us,
                 "torch mean+std", base_us, bytes_moved=frames_4.numel() * 4,
                 backend=pool.explain(frames_4).backend, layer="pool")]


def _projection(spec: dict, device, quick: bool) -> list:
    """The seg_1 projection against torch's linear."""
    from bench.common import case, side_by_side
    from rlx_triton.nn.conv2d import Projection

    batch = spec["batch"]
    linear = nn.Linear(spec["in_features"], spec["out_features"]).to(device)
    proj = Projection.from_torch(linear).to(device)
    stats = torch.randn(batch, spec["in_features"], device=device)
    rlx_us, base_us = side_by_side(lambda: proj(stats), lambda: linear(stats), device, quick=quick)
    return [case("embedding", f"seg_1 ({batch}, {stats.shape[1]}) -> {spec['out_features']} {device.type}",
                 torch.float32, rlx_us, "torch linear (TF32 off)", base_us,
                 bytes_moved=4 * (stats.numel() + linear.weight.numel() + batch * spec["out_features"]),
                 backend=proj.explain(stats).backend, layer="seg_1")]


def _end_to_end_per_candidate(stock, fast, wav, quick) -> list:
    """Evidence for a device recipe: the optimized model with each approved conv candidate pinned as the
    recipe of this device class (the route cache is cleared around each run)."""
    import rlx_triton as rt
    from bench.common import case, side_by_side
    from rlx_triton.backends.triton import conv2d as kernels
    from rlx_triton.router import clear_route_cache
    from rlx_triton.router.device import device_facts

    from rlx_triton.config import override_settings

    device_class = device_facts(wav.device).device_class
    saved = dict(kernels.RECIPES)
    rows = []
    try:
        for cand in kernels.all_candidates():
            tag = kernels.candidate_tag(cand)
            if tag not in kernels.APPROVALS:
                continue
            kernels.RECIPES[device_class] = tag
            clear_route_cache()
            # no tuning and no winner table, so the pinned recipe is what runs
            with override_settings(tune=False, tune_cache_load=False), torch.inference_mode(), \
                    rt.use_backend("triton"):
                ref, out = stock(wav), fast(wav)
                rel = relative_error(out, ref)
                rlx_us, base_us = side_by_side(lambda: fast(wav), lambda: stock(wav), wav.device, quick=quick)
            rows.append(case("embedding", f"{tuple(wav.shape)} -> {tuple(out.shape)} cuda, conv recipe {tag}",
                             wav.dtype, rlx_us, "WeSpeakerResNet34 (torch, TF32 off)", base_us,
                             bytes_moved=wav.numel() * 4 + out.numel() * 4, backend="triton", candidate=tag,
                             max_rel_err=float(f"{rel:.3g}"), layer="end to end (recipe)"))
    finally:
        kernels.RECIPES.clear()
        kernels.RECIPES.update(saved)
        clear_route_cache()
    return rows


def _tstp() -> nn.Module:
    try:
        from pyannote.audio.models.embedding.wespeaker.resnet import TSTP  # type: ignore
    except ImportError:
        from tests.reference.wespeaker_models import TSTP
    return TSTP()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
