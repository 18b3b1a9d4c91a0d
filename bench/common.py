"""Timing helpers shared by the benchmarks: side-by-side medians with their spread, CUDA-event timing, copy bandwidth.

On a GPU, kernels are timed with triton.testing.do_bench (median of CUDA-event timings) or, for
microsecond kernels, with CUDA-graph replay so launch overhead does not dominate. On the CPU the
two sides are alternated call by call and the median wall time of each is reported.

Every bench module has the same two entry points: cases(quick, gpu=None) -> the case descriptions
(dicts), and run(quick, progress=None) -> result rows, which walks its cases through `each_case` so a
progress bar (rlx_triton.progress.Progress, what bench/run.py passes) counts one unit per case.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable, Iterable, Iterator, List, Sequence, Tuple, TypeVar

import torch


_Case = TypeVar("_Case")


def each_case(bench: str, specs: Iterable[_Case], progress=None) -> Iterator[_Case]:
    """Yields the case descriptions one by one; with a progress (anything with set_label(text) and update()),
    labels each case before its body runs and counts it once the body is done."""
    for spec in specs:
        if progress is not None:
            progress.set_label(f"{bench} {case_label(spec)}")
        yield spec
        if progress is not None:
            progress.update()


def case_label(spec) -> str:
    """'label=gqa batch=1 dtype=float32' for a case description dict (the short form of each value)."""
    if not isinstance(spec, dict):
        return str(spec)
    return " ".join(f"{key}={str(value).replace('torch.', '')}" for key, value in spec.items())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timing(float):
    """A median time in microseconds that also carries its spread: the 20th and 80th percentiles of its samples."""

    p20: float
    p80: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Timing":
        ordered = sorted(samples)
        timing = cls(statistics.median(ordered))
        timing.p20, timing.p80 = _percentile(ordered, 0.2), _percentile(ordered, 0.8)
        return timing


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), of sorted samples."""
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def time_samples(fn: Callable[[], object], device: torch.device, quick: bool = False,
                 graph: bool = False) -> List[float]:
    """Times of fn in microseconds, one per measured call (CUDA: triton.testing's per-repetition times)."""
    if device.type == "cuda":
        import triton.testing

        if graph:
            return [1e3 * t for t in triton.testing.do_bench_cudagraph(fn, rep=20 if quick else 100, return_mode="all")]
        return [1e3 * t for t in triton.testing.do_bench(fn, warmup=5 if quick else 25, rep=20 if quick else 100,
                                                         return_mode="all")]
    fn()
    samples = []
    for _ in range(3 if quick else 15):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def time_us(fn: Callable[[], object], device: torch.device, quick: bool = False, graph: bool = False) -> Timing:
    """Median time of fn in microseconds, with its 20th and 80th percentiles."""
    return Timing.of(time_samples(fn, device, quick, graph))


def side_by_side(rlx: Callable[[], object], baseline: Callable[[], object], device: torch.device,
                 quick: bool = False, graph: bool = False, rounds: int = 0) -> Tuple[Timing, Timing]:
    """(rlx_us, baseline_us): warm both, then alternate rounds of each; each side's median and percentiles are
    those of all its samples."""
    rlx()
    baseline()
    _sync(device)
    rounds = rounds or (2 if quick else 5)
    rlx_times: List[float] = []
    base_times: List[float] = []
    for _ in range(rounds):
        rlx_times += time_samples(rlx, device, quick, graph)
        base_times += time_samples(baseline, device, quick, graph)
    return Timing.of(rlx_times), Timing.of(base_times)


def copy_bandwidth_gbps(device: torch.device, quick: bool = False) -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second) in GB/s."""
    numel = (64 if quick else 256) * 2**20 // 4 if device.type == "cuda" else 16 * 2**20 // 4
    src = torch.empty(numel, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), device, quick)
    return 2 * src.numel() * src.element_size() / (us * 1e-6) / 1e9


# what a row measures: "time" compares a kernel with the op it replaces (speedup = baseline / rlx);
# "dispatch_overhead" is the cost of a wrapper over what it wraps, which has no speedup to claim
METRICS = ("time", "dispatch_overhead")


def case(bench: str, shape: str, dtype, rlx_us: float, baseline: str, baseline_us: float,
         bytes_moved: int = 0, metric: str = "time", **extra) -> dict:
    """One result row with the keys bench/run.py writes to the results file; a Timing adds its percentiles
    (rlx_p20_us, rlx_p80_us, baseline_p20_us, baseline_p80_us)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    spread = {f"{side}_{p}_us": round(getattr(value, p), 3) for side, value in (("rlx", rlx_us), ("baseline", baseline_us))
              for p in ("p20", "p80") if hasattr(value, p)}
    timed = metric == "time"
    return {"bench": bench, "shape": shape, "dtype": str(dtype).replace("torch.", ""), "metric": metric,
            "rlx_us": round(rlx_us, 3), "baseline": baseline, "baseline_us": round(baseline_us, 3),
            "speedup": round(baseline_us / rlx_us, 4) if timed and rlx_us > 0 else None,
            "gbps": round(bytes_moved / (rlx_us * 1e-6) / 1e9, 2) if bytes_moved and rlx_us > 0 else None,
            **spread, **extra}


def bench_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def fp32_setup() -> Tuple[torch.device, str]:
    """(device, backend) for a diarization bench.

    TF32 is switched off on CUDA, as pyannote runs its models (TF32 moves diarization error rates). On
    CPU under the interpreter "auto" would time interpreted kernels, so the library route is used.
    """
    from rlx_triton.config import settings

    device = bench_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return device, "torch" if device.type == "cpu" and settings().interpret else "auto"


def run_fp32_cases(bench: str, cases: Callable[..., list], measure: Callable[..., list], quick: bool = False,
                   progress=None) -> list:
    """The rows of a diarization bench: measure(spec, device, backend, quick) for each of cases(quick, gpu=...)
    on fp32_setup()'s device and backend, counted by progress."""
    device, backend = fp32_setup()
    return [row for spec in each_case(bench, cases(quick, gpu=device.type == "cuda"), progress)
            for row in measure(spec, device, backend, quick)]


@contextlib.contextmanager
def cudnn_autotuned() -> Iterator[None]:
    """cuDNN at its best for fp32 (TF32 stays as fp32_setup left it): cudnn.benchmark picks the fastest
    algorithm per shape (Winograd, FFT, implicit GEMM), the baseline a torch user can have; restored after."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: the accuracy each bench reports next to its timing."""
    return ((out - ref).abs().max() / ref.abs().max()).item()
