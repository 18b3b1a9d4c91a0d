"""`make demo`: decode attention and the diarization front end through the router, checked against torch.

On a CPU-only machine the real Triton kernels run in the interpreter (TRITON_INTERPRET=1 is set
here, before triton is imported) on small shapes: one decode and one fbank call, each compared with
torch. Then a route table shows which backend and candidate each op would take, and why. On a CUDA
GPU the same calls run as compiled kernels and timing ratios against torch are printed too.
"""
from __future__ import annotations

import math
import os
import time
from typing import TypedDict

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch.nn.functional as F  # noqa: E402

import rlx_triton as rt  # noqa: E402
from rlx_triton._torchaudio import kaldi_compliance  # noqa: E402
from rlx_triton.router.route import DEVICE_DEFAULT, IMPLEMENTED, LIBRARY, PINNED, RECIPE, TUNE_FILE  # noqa: E402
from rlx_triton.router.device import device_facts  # noqa: E402


class FbankKeywords(TypedDict):
    """The kaldi fbank options the demo passes to rt.fbank and torchaudio alike."""

    num_mel_bins: int
    frame_length: float
    frame_shift: float
    dither: float
    window_type: str


def speech_like(seconds: float, rate: int = 16000, seed: int = 0) -> torch.Tensor:
    """A voiced-speech stand-in: harmonics of a gliding pitch, a formant-like envelope, and a little noise."""
    generator = torch.Generator().manual_seed(seed)
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    pitch = 120 + 30 * torch.sin(2 * math.pi * 1.5 * t)
    phase = 2 * math.pi * torch.cumsum(pitch, 0) / rate
    voiced = sum(torch.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * torch.sin(2 * math.pi * 3 * t).clamp(min=0)
    noise = 0.01 * torch.randn(t.shape, generator=generator, dtype=torch.float64)
    return (0.1 * voiced * envelope + noise).float()


def timed(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def demo_decode(device: torch.device) -> dict:
    print("\n1. decode attention: rt.sdpa_decode and rt.scaled_dot_product_attention (GQA 8 query / 2 KV heads)")
    dtype = torch.float16 if ON_GPU else torch.float32
    batch, heads, kv_heads, head_dim, max_len = 2, 8, 2, 64, 96
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, kv_heads, max_len, head_dim, device=device, dtype=dtype)
    lengths = torch.tensor([max_len, 37], device=device, dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, k, v, lengths)
        full = rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert isinstance(out, torch.Tensor)  # without return_lse, the output alone
    reference = torch.cat([
        F.scaled_dot_product_attention(q[b:b + 1].float(), k[b:b + 1, :, :int(lengths[b])].float(),
                                       v[b:b + 1, :, :int(lengths[b])].float(), enable_gqa=True)
        for b in range(batch)])
    err_decode = (out.float() - reference).abs().max().item()
    err_full = (full.float() - F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                              enable_gqa=True)).abs().max().item()
    print(f"   triton kernel vs torch: sdpa_decode max |err| {err_decode:.2e}, "
          f"scaled_dot_product_attention max |err| {err_full:.2e} ({dtype})")
    tolerance = 2e-3 if dtype == torch.float16 else 1e-5
    assert err_decode < tolerance and err_full < tolerance, "decode kernel disagrees with torch"
    result = {"decode_err": err_decode}
    if ON_GPU:
        big_q = torch.randn(16, 32, 1, 128, device=device, dtype=dtype)
        big_k = torch.randn(16, 8, 4096, 128, device=device, dtype=dtype)
        big_v = torch.randn_like(big_k)
        rlx_us = timed(lambda: rt.scaled_dot_product_attention(big_q, big_k, big_v, enable_gqa=True))
        torch_us = timed(lambda: F.scaled_dot_product_attention(big_q, big_k, big_v, enable_gqa=True))
        print(f"   timing (B16 Hq32 Hkv8 D128 S4096 fp16): rlx {rlx_us:.1f} us, torch {torch_us:.1f} us, "
              f"ratio {torch_us / rlx_us:.2f}x")
    return result


def demo_fbank(device: torch.device) -> dict:
    print("\n2. diarization front end: rt.fbank (80 mel bins, hamming window, WeSpeaker's options)")
    wave = speech_like(0.3 if not ON_GPU else 10.0).to(device)
    options = FbankKeywords(num_mel_bins=80, frame_length=25.0, frame_shift=10.0, dither=0.0, window_type="hamming")
    with rt.use_backend("triton", strict=True):
        features = rt.fbank(wave, **options)
    with rt.use_backend("torch"):
        reference = rt.fbank(wave, **options)
    err = (features - reference).abs().max().item()
    print(f"   triton kernel vs torch fallback: {tuple(features.shape)} log-mel, max |err| {err:.2e}")
    kaldi = kaldi_compliance()
    if kaldi is None:
        print("   (torchaudio not installed: compared with rlx_triton's torch fallback only)")
    else:
        stock = kaldi.fbank(wave.unsqueeze(0).cpu(), **options)
        print(f"   vs torchaudio.compliance.kaldi.fbank: max |err| {(features.cpu() - stock).abs().max().item():.2e}")
    assert err < 1e-3, "fbank kernel disagrees with the torch fallback"
    if ON_GPU:
        batch = wave.expand(32, -1).contiguous()
        with rt.use_backend("triton"):
            rlx_us = timed(lambda: rt.fbank(batch, **options))
        with rt.use_backend("torch"):
            torch_us = timed(lambda: rt.fbank(batch, **options))
        print(f"   timing (32 x 10 s): rlx {rlx_us:.1f} us, torch fallback {torch_us:.1f} us, "
              f"ratio {torch_us / rlx_us:.2f}x")
    return {"fbank_err": err}


def route_rows(device: torch.device):
    """(op, route) for a few representative calls, routed automatically."""
    dtype = torch.float16 if ON_GPU else torch.float32
    q1 = torch.randn(4, 32, 1, 128, device=device, dtype=dtype)
    kv = torch.randn(4, 8, 2048, 128, device=device, dtype=dtype)
    q_prefill = torch.randn(4, 32, 512, 128, device=device, dtype=dtype)
    kv_prefill = torch.randn(4, 8, 512, 128, device=device, dtype=dtype)
    wave = torch.zeros(2, 16000, device=device)
    rows = [
        ("sdpa decode (Lq=1, GQA)", rt.explain(rt.scaled_dot_product_attention, q1, kv, kv, enable_gqa=True)),
        ("sdpa prefill (Lq=512)", rt.explain(rt.scaled_dot_product_attention, q_prefill, kv_prefill, kv_prefill,
                                              enable_gqa=True)),
        ("sdpa dropout_p=0.1", rt.explain(rt.scaled_dot_product_attention, q1, kv, kv, dropout_p=0.1,
                                          enable_gqa=True)),
        ("sdpa_decode (KV cache)", rt.explain(rt.sdpa_decode, q1, kv, kv)),
        ("fbank 80 bins", rt.explain(rt.fbank, wave, num_mel_bins=80)),
        ("fbank dither=1", rt.explain(rt.fbank, wave, dither=1.0)),
    ]
    from rlx_triton.ops.conv2d import conv2d
    from rlx_triton.ops.lstm import lstm
    from rlx_triton.ops.segdense import segdense

    lstm_module = torch.nn.LSTM(60, 128, num_layers=4, bidirectional=True, batch_first=True).to(device)
    frames = torch.randn(2, 589, 60, device=device)
    rows.append(("lstm 4 layers bi h128", rt.explain(lstm, frames, None, list(lstm_module._flat_weights),
                                                     num_layers=4, bidirectional=True, batch_first=True)))
    hidden = torch.randn(2 * 589, 256, device=device)
    layers = [torch.randn(128, 256, device=device), torch.randn(128, 128, device=device)]
    biases = [torch.zeros(128, device=device), torch.zeros(128, device=device)]
    rows.append(("segdense 256-128-128-7", rt.explain(segdense, hidden, layers, biases,
                                                      torch.randn(7, 128, device=device))))
    trunk = torch.randn(2, 32, 40, 100, device=device)
    rows.append(("conv2d 3x3 32->32", rt.explain(conv2d, trunk, torch.randn(32, 32, 3, 3, device=device),
                                                 padding=1, relu=True)))
    return rows


# the router's evidence labels (rlx_triton/router/route.py) in a new user's words
EVIDENCE_WORDS = {
    TUNE_FILE: "the fastest candidate timed on this GPU (the winner table rlx-triton tune writes)",
    RECIPE: "a candidate chosen ahead of time for this kind of device and shape",
    DEVICE_DEFAULT: "the plan's default candidate for this device (not timed)",
    IMPLEMENTED: "the only kernel that covers the call",
    PINNED: "a candidate forced with use_candidate",
    LIBRARY: "torch's own op (no kernel covers the call; the reason follows)",
}


def print_route_table(device: torch.device) -> None:
    print("\n3. route table (automatic choice on this device, inference mode)")
    with torch.inference_mode():
        rows = route_rows(device)
    width = max(len(name) for name, _ in rows)
    print(f"   {'op':{width}}  {'backend':7}  {'evidence':13}  candidate / reason")
    for name, decided in rows:
        if decided.backend == "torch":
            reasons = "; ".join(f"{b}: {r.reason}" for b, r in decided.skipped if r.kind != "not-selected")
            detail = reasons or decided.evidence_detail
        else:
            detail = decided.candidate_tag
        print(f"   {name:{width}}  {decided.backend:7}  {decided.evidence:13}  {detail}")
    print("\n   evidence: why this backend and candidate (strongest first)")
    shown = {decided.evidence for _, decided in rows}
    for label, words in EVIDENCE_WORDS.items():
        if label in shown:
            print(f"   {label:13}  {words}")
    print("   candidate: the kernel's settings as a tag, e.g. tg256 = 256 threads per program; "
          "`rlx-triton explain` prints a legend of each part")


def main() -> int:
    device = torch.device("cuda") if ON_GPU else torch.device("cpu")
    facts = device_facts(device)
    print(f"rlx_triton {rt.__version__} demo on {facts.name} ({facts.device_class})"
          f"{'' if ON_GPU else ': real Triton kernels in the interpreter, small shapes'}")
    for backend, reason in facts.backend_reasons:
        print(f"   backend {backend:7} {'runs here' if reason is None else reason}")
    started = time.perf_counter()
    demo_decode(device)
    demo_fbank(device)
    print_route_table(device)
    print(f"\nall checks passed in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
