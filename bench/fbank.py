"""Kaldi fbank: rt.nn.Fbank.wespeaker() (the fused Triton kernel) against the torch paths, side by side.

Shape: 32 chunks of 10 s at 16 kHz, (32, 1, 160000) -> (32, 998, 80) float32, pyannote's WeSpeaker
front end (x32768, 80-bin hamming log-mel, mean over frames subtracted), TF32 off (on sm_80 / sm_90
the route is the two-stage DFT in tf32x3, fp32 accuracy on tensor cores). Baselines, in the same run
and on the same device, the best a user has without rlx_triton:
- "torch fallback": rlx_triton's own torch path (backends/torch_ref/fbank.py: batched over the chunks,
  cuFFT's rfft and a cuBLAS mel matmul);
- "torchaudio kaldi.fbank (vmap)": pyannote's exact call, torch.vmap over the batch, when torchaudio's
  compliance module is found (rlx_triton._torchaudio.kaldi_compliance: also the copy `make venv`
  installs outside sys.path).
On CPU (quick mode and under the interpreter): 2 chunks, and the rlx side routes to its torch
fallback (the interpreter is not a speed path), so the numbers are context, not a kernel claim.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from rlx_triton.perf.cases import fbank_cases as cases

WESPEAKER = dict(num_mel_bins=80, frame_length=25, frame_shift=10, round_to_power_of_two=True, snip_edges=True,
                 dither=0.0, sample_frequency=16000, window_type="hamming", use_energy=False)


def _torchaudio_front_end():
    """pyannote's BaseWeSpeakerResNet.compute_fbank, or None without torchaudio."""
    from rlx_triton._torchaudio import kaldi_compliance

    kaldi = kaldi_compliance()
    if kaldi is None:
        return None

    def compute(waveforms):
        features = torch.vmap(lambda w: kaldi.fbank(w, **WESPEAKER))(waveforms * (1 << 15))
        return features - torch.mean(features, dim=1, keepdim=True)

    return compute


def run(quick: bool = False, progress=None) -> list:
    """Rows of every case; progress (optional) counts each case (bench.common.each_case)."""
    from bench.common import run_fp32_cases

    return run_fp32_cases("fbank", cases, _measure, quick, progress)


def _measure(spec: dict, device: torch.device, backend: str, quick: bool) -> list:
    import rlx_triton as rt
    from bench.common import case, side_by_side

    batch, samples = spec["batch"], spec["samples"]
    gen = torch.Generator().manual_seed(0)
    waves = (0.1 * torch.randn(batch, 1, samples, generator=gen)).to(device)
    front_end = rt.nn.Fbank.wespeaker()

    def rlx():
        with rt.use_backend(backend):
            return front_end(waves)

    def torch_fallback():
        with rt.use_backend("torch"):
            return front_end(waves)

    baselines = [("torch fallback", torch_fallback)]
    torchaudio_fn = _torchaudio_front_end()
    if torchaudio_fn is not None:
        baselines.append(("torchaudio kaldi.fbank (vmap)", lambda: torchaudio_fn(waves)))

    with torch.inference_mode():
        with rt.use_backend(backend):
            route = rt.explain(rt.fbank, waves, **WESPEAKER, subtract_mean=True, input_scale=32768.0)
        out = rlx()
        reference = baselines[-1][1]()
        max_abs_err = (out - reference).abs().max().item()
        moved = waves.numel() * waves.element_size() + out.numel() * out.element_size()
        shape = f"({batch}, 1, {samples}) -> ({batch}, {out.shape[1]}, {out.shape[2]}) {device.type}"
        rows = []
        for name, baseline in baselines:
            rlx_us, base_us = side_by_side(rlx, baseline, device, quick=quick)
            rows.append(case("fbank", shape, waves.dtype, rlx_us, name, base_us, bytes_moved=moved,
                              backend=route.backend, candidate=route.candidate_tag,
                              max_abs_err=float(f"{max_abs_err:.3g}")))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    for row in run(quick="--quick" in sys.argv):
        print(row)
