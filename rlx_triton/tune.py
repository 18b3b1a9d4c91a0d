"""Pre-tuning for named model shape sets (`rlx-triton tune MODEL`): time every approved candidate, keep the fastest.

For each case of a shape set the op's kernel route is found (strict mode: the kernel, whatever speed would pick);
every candidate of that backend's plan that has an accuracy approval is pinned in turn (`use_candidate`) and
timed, and so is the torch library op (`use_backend("torch")`); the fastest is recorded in the winner table
under the route's tune key with its time, `library` where the library op won, so later calls in the same bucket
route to it (decided_by "measured"). Only approved candidates are timed: speed picks among correct kernels.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List, Tuple, Union

import torch

from rlx_triton.progress import Progress

Case = Tuple[str, Callable[[torch.device], Callable[[], object]]]


def _decode_case(batch: int, heads: int, kv_heads: int, head_dim: int, seq_kv: int, dtype=torch.float16) -> Case:
    def build(device):
        import rlx_triton as rt

        q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
        k = torch.randn(batch, kv_heads, seq_kv, head_dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        lengths = torch.full((batch,), seq_kv, device=device, dtype=torch.int32)
        return lambda: rt.sdpa_decode(q, k, v, lengths)

    return f"sdpa_decode b{batch} h{heads}/{kv_heads} d{head_dim} s{seq_kv}", build


def _fbank_case(batch: int, seconds: float, bins: int) -> Case:
    def build(device):
        import rlx_triton as rt

        wave = torch.randn(batch, int(16000 * seconds), device=device) * 0.1
        return lambda: rt.fbank(wave, num_mel_bins=bins, window_type="hamming", dither=0.0)

    return f"fbank b{batch} {seconds}s {bins} bins", build


def _lstm_case(batch: int, steps: int, input_size: int, hidden: int, layers: int) -> Case:
    def build(device):
        from rlx_triton.ops.lstm import lstm

        module = torch.nn.LSTM(input_size, hidden, num_layers=layers, bidirectional=True, batch_first=True).to(device)
        x = torch.randn(batch, steps, input_size, device=device)
        weights = [w for w in module._flat_weights if w is not None]  # a module with biases has no None
        return lambda: lstm(x, None, weights, num_layers=layers, bidirectional=True, batch_first=True)

    return f"lstm b{batch} t{steps} in{input_size} h{hidden} x{layers} bi", build


def _segdense_case(rows: int, features: int, hidden: int, classes: int) -> Case:
    def build(device):
        from rlx_triton.ops.segdense import segdense

        x = torch.randn(rows, features, device=device)
        w1, w2 = torch.randn(hidden, features, device=device) / 16, torch.randn(hidden, hidden, device=device) / 16
        b1, b2 = torch.zeros(hidden, device=device), torch.zeros(hidden, device=device)
        wc, bc = torch.randn(classes, hidden, device=device) / 16, torch.zeros(classes, device=device)
        return lambda: segdense(x, [w1, w2], [b1, b2], wc, bc, activation="log_softmax")

    return f"segdense r{rows} {features}->{hidden}->{classes}", build


def _conv2d_case(batch: int, c_in: int, c_out: int, height: int, width: int, kernel: int, stride: int,
                 residual: bool) -> Case:
    def build(device):
        from rlx_triton.ops.conv2d import conv2d

        padding = kernel // 2
        x = torch.randn(batch, c_in, height, width, device=device)
        weight = torch.randn(c_out, c_in, kernel, kernel, device=device) / (c_in * kernel * kernel) ** 0.5
        bias = torch.randn(c_out, device=device)
        out_shape = (batch, c_out, (height + 2 * padding - kernel) // stride + 1,
                     (width + 2 * padding - kernel) // stride + 1)
        res = torch.randn(out_shape, device=device) if residual else None
        return lambda: conv2d(x, weight, bias, stride=stride, padding=padding, residual=res, relu=True)

    return f"conv2d b{batch} {c_in}->{c_out} {height}x{width} k{kernel} s{stride}", build


def _wespeaker_trunk(batch: int = 32, frames: int = 998, m: int = 32) -> List[Case]:
    """Each distinct conv geometry of the WeSpeaker ResNet34 trunk on (batch, 1, 80, frames) features."""
    cases = [_conv2d_case(batch, 1, m, 80, frames, 3, 1, False), _conv2d_case(batch, m, m, 80, frames, 3, 1, True)]
    h, w, c = 80, frames, m
    for _ in range(3):
        cases += [_conv2d_case(batch, c, 2 * c, h, w, 3, 2, False), _conv2d_case(batch, c, 2 * c, h, w, 1, 2, False)]
        h, w, c = (h - 1) // 2 + 1, (w - 1) // 2 + 1, 2 * c
        cases.append(_conv2d_case(batch, c, c, h, w, 3, 1, True))
    return cases


def _sincnet_case(batch: int, samples: int) -> Case:
    """pyannote's SincNet (80 sinc filters, 80 -> 60 -> 60 Conv1d blocks of 5 taps) on random weights."""
    def build(device):
        from rlx_triton.ops.conv import sinc_filters, sincnet

        filters = sinc_filters(torch.linspace(30.0, 7000.0, 40, device=device).view(-1, 1),
                               torch.full((40, 1), 100.0, device=device))
        convs = [torch.randn(60, 80, 5, device=device) / 20, torch.randn(60, 60, 5, device=device) / 17]
        biases = [torch.zeros(60, device=device), torch.zeros(60, device=device)]
        gammas = [torch.ones(n, device=device) for n in (80, 60, 60)]
        betas = [torch.zeros(n, device=device) for n in (80, 60, 60)]
        one, zero = torch.ones(1, device=device), torch.zeros(1, device=device)
        wave = torch.randn(batch, 1, samples, device=device)
        return lambda: sincnet(wave, filters, one, zero, convs, biases, gammas, betas)

    return f"sincnet b{batch} {samples} samples", build


MODEL_SHAPES: Dict[str, List[Case]] = {
    "llama3-8b": [_decode_case(b, 32, 8, 128, s) for b in (1, 4, 16, 64) for s in (512, 4096, 16384)],
    "pyannote-segmentation": [_sincnet_case(32, 160000), _lstm_case(32, 589, 60, 128, 4),
                              _segdense_case(32 * 589, 256, 128, 7)],
    "wespeaker": [_fbank_case(32, 10.0, 80)] + _wespeaker_trunk(),
}


def _time_ms(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    fn()
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _tune_case(label: str, call: Callable[[], object], device: torch.device, table, shown: Progress) -> dict:
    """Times every approved candidate of the case's kernel route and the library op, and records the fastest in
    the winner table (LIBRARY_WINNER where the library op is fastest), with its time."""
    from rlx_triton.planner.tune_cache import LIBRARY_WINNER
    from rlx_triton.router import MissingKernel, plans, recording_routes, use_backend, use_candidate
    from rlx_triton.router.approvals import approval_for

    try:   # strict: the kernel route, whose bucket the winner table keys, whatever speed would pick today
        with use_backend("auto", strict=True), recording_routes() as recorded:
            call()
    except MissingKernel as refused:
        return {"case": label, "backend": None, "winner": None, "why": str(refused).splitlines()[0]}
    decided = recorded[0] if recorded else None
    if decided is None or decided.module is None or decided.candidate is None:
        return {"case": label, "backend": decided.backend if decided else None, "winner": None}
    profile = plans.profile_name(plans.current_profile())
    plan = plans.plan_for(decided.family)
    timings: Dict[str, float] = {}
    for candidate in plan.candidates:
        if approval_for(getattr(decided.module, "APPROVALS", {}), candidate.tag(), profile) is None:
            continue
        shown.set_label(f"{label}: {candidate.tag()}")
        with use_candidate(candidate.tag()):
            timings[candidate.tag()] = _time_ms(call, device)
    shown.set_label(f"{label}: the library op")
    with use_backend("torch"):
        timings[LIBRARY_WINNER] = _time_ms(call, device)
    winner = min(timings, key=timings.__getitem__)
    table.record(decided.tune_key, winner, time_us=timings[winner] * 1e3)
    return {"case": label, "backend": decided.backend, "winner": winner,
            "ms": {tag: round(ms, 4) for tag, ms in timings.items()}}


def tune_model(model: str, device: Union[str, torch.device] = "cuda", progress: bool = True) -> dict:
    """Times every approved candidate of each case and records the winners; returns a summary.

    `progress` shows one unit per case on stderr (rlx_triton/progress.py), with the candidate being timed.
    """
    from rlx_triton.router import plans
    from rlx_triton.router.device import device_facts

    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to torch")
    facts = device_facts(target)
    runnable = [name for name, reason in facts.backend_reasons if reason is None and name != "torch"]
    if not runnable:
        raise RuntimeError(f"no kernel backend runs on {target} ({dict(facts.backend_reasons)}); nothing to tune")
    table = plans.winner_table()
    results = []
    cases = MODEL_SHAPES[model]
    with Progress(len(cases), f"tune {model}", unit="case", enabled=progress) as shown:
        for label, build in cases:
            shown.set_label(label)
            results.append(_tune_case(label, build(target), target, table, shown))
            shown.set_label(label)
            shown.update()
    from rlx_triton.router import clear_route_cache

    clear_route_cache()
    return {"model": model, "device": str(target), "cases": len(cases), "results": results,
            "tune_cache": table.path, "entries": len(table)}
