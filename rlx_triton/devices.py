"""Device profiles: the public figures of the GPUs rlx_triton is analysed against, without one at hand.

Each profile holds what an ahead-of-time analysis of a kernel launch needs (`rlx-triton perf`): SM
count, architecture, registers and shared memory per SM, the resident-CTA and warp limits, L2,
memory bandwidth, peak rates per executing unit and an assumed launch latency. Every number carries
its public source in `sources` (field name -> where it is published). Peak rates are dense (no
sparsity), in FLOP/s with an FMA counted as two FLOPs; bandwidth is the datasheet figure in bytes/s.

Units of `peak`:
- fp32_fma: fp32 on the CUDA cores (FFMA; other fp32 instructions are counted at the same rate);
- tf32: tensor cores on TF32 operands (tl.dot with input_precision "tf32");
- tf32x3: three TF32 products per fp32 product (input_precision "tf32x3"): a third of tf32;
- tf32x4: four TF32 products per fp32 product (both operands split into TF32 halves, every pair of
  halves multiplied, as one dot): a quarter of tf32;
- fp16_mma / bf16_mma: tensor cores on fp16 / bf16 operands with fp32 accumulation;
- fp8_mma: tensor cores on fp8 (e4m3 / e5m2) operands, where the GPU has them (Hopper, Ada's L40S);
- sfu: the special function units (exp2, log2, rcp, rsqrt, sin, cos), in results per second: 16 per SM per
  clock on compute capability 8.x and 9.0. Library kernel models count a softmax's exponentials there; no
  Triton launch record names it.

Dense peaks are datasheet figures. A tensor-core kernel is estimated at `sustained_peak(profile, unit)`: the
datasheet rate times `tensor_sustained`, the fraction a long tensor-core kernel keeps under its clock and
power limits (measured on an H200: an 8192^3 bf16 matmul at 769-798 of 989 TFLOP/s). Floors keep the
datasheet rate.

This module imports neither torch nor triton; `rlx_triton.router.device.profile_facts` turns a
profile into the DeviceFacts the router would read on such a device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

KB = 1024
MB = 1024 * 1024
GiB = 1024 ** 3
TERA = 1e12

UNITS = ("fp32_fma", "tf32", "tf32x3", "tf32x4", "fp16_mma", "bf16_mma", "fp8_mma", "sfu")
# the units whose rate is the tensor cores'
TENSOR_UNITS = ("tf32", "tf32x3", "tf32x4", "fp16_mma", "bf16_mma", "fp8_mma")

# The latency constants of a CUDA profile, in nanoseconds except issue_interval (cycles):
# l2_hit: a dependent load served by L2 (data another SM wrote: .cg loads, merge partials, h rows);
# hbm: a dependent load served by device memory; atomic: a global atomic's round trip (performed at L2);
# cta_barrier: bar.sync of a CTA; issue_interval: cycles between two instructions of one warp on average
# (its own dependences; a scheduler issues one per cycle from all its warps).
LATENCY_KEYS = ("l2_hit", "hbm", "atomic", "cta_barrier", "issue_interval")

# Sources quoted by several profiles.
_CUDA_GUIDE = ("CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
               "(compute capability {cc})")
_OCCUPANCY = ("CUDA Occupancy Calculator / cudaOccupancyMaxActiveBlocksPerMultiprocessor: registers "
              "are allocated per warp in units of 256; 1 KB of shared memory is reserved per block on "
              "compute capability 8.0 and later (CUDA C++ Best Practices Guide, 'Occupancy')")
_LAUNCH = ("assumption: a kernel launch without CUDA graphs costs about 4 us on the GPU timeline "
           "(back-to-back launches of tiny kernels on A100/H100-class devices, 3-5 us)")
_LATENCY = ("ranges read from public microbenchmarks, stated as ranges rather than one figure: Luo et al., "
            "'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture' (IPDPS 2024, arXiv 2402.13499) and "
            "'Dissecting the NVIDIA Hopper Architecture through Microbenchmarking and Multiple Level Analysis' "
            "(arXiv 2501.12084): pointer-chase L2 hits of a few hundred cycles (~150-200 ns on H800/A100 at "
            "their clocks) and global-memory misses about twice that, unloaded; the high ends allow for the far "
            "half of Hopper's partitioned L2 and for loaded memory (0.6-0.8 us under a full read stream); a "
            "global atomic is performed at L2 (one L2 round trip plus the atomic unit)")
_ISSUE = ("Jia et al., 'Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking' (2018) and Luo et "
          "al. (arXiv 2402.13499): dependent FP32 arithmetic takes ~4 cycles on Volta to Hopper; unrolled "
          "Triton code has some independent instructions between dependent ones: 2-4 cycles per warp "
          "instruction on average; CUDA C++ Programming Guide, compute capability 8.x/9.0: 4 warp schedulers "
          "per SM, each issuing one warp instruction per cycle")
_CLOCK = ("derived: peak.fp32_fma / (SMs x FP32 lanes per SM x 2), lanes per SM from the CUDA C++ Programming "
          "Guide's arithmetic instruction throughput table (128 on 8.9/9.0, 64 on 8.0)")
_SFU = ("CUDA C++ Programming Guide, 'Arithmetic Instructions' throughput table: 16 results per clock cycle per "
        "multiprocessor for 32-bit reciprocal, reciprocal square root, base-2 logarithm and exponential, sine and "
        "cosine on compute capability 8.0, 8.6, 8.9 and 9.0; times the clock (clock_hz)")
_H200_TENSOR = ("measured: a 8192^3 bf16 matmul (torch.matmul, cuBLAS) on the H200 this project's GPU runs are lent "
                "sustains 769-798 TFLOP/s, 0.79 of the 989 TFLOP/s dense datasheet figure (the clock a long "
                "tensor-core kernel keeps under the 700 W limit)")
_TENSOR_RATIO = ("assumption: the H200's measured sustained / datasheet tensor-core ratio (0.79, measured on an H200) "
                 "applied to this GPU; not measured on this GPU")
TENSOR_RATIO = 783.5 / 989.4
_H200_COPY = ("measured: a device-to-device copy (torch copy_, 256 MB) on the H200 this project's GPU runs are "
              "lent moves ~4.3 TB/s (bytes read + written), 0.896 of the 4.8 TB/s datasheet figure")
_COPY_RATIO = ("assumption: the H200's measured copy / datasheet ratio (4.3 / 4.8 = 0.896, measured on an "
               "H200) applied to this GPU's datasheet figure; not measured on this GPU")
COPY_RATIO = 4.3 / 4.8
# One range per constant for every CUDA profile (see _LATENCY, _ISSUE): low, nominal, high.
CUDA_LATENCY = {"l2_hit": (150.0, 250.0, 350.0), "hbm": (450.0, 600.0, 800.0), "atomic": (200.0, 300.0, 450.0),
                "cta_barrier": (20.0, 30.0, 50.0), "issue_interval": (2.0, 3.0, 4.0)}
_TF32X3 = "tf32x3 issues three TF32 products per fp32 product: tf32 / 3"
_TF32X4 = "tf32x4 issues four TF32 products per fp32 product: tf32 / 4"
_METAL_TABLES = ("Apple Metal Feature Set Tables (Apple7/Apple8 GPU families): 32 KB threadgroup memory, "
                 "1024 threads per threadgroup, 32 threads per SIMD-group")
_APPLE_LAUNCH = ("assumption: a Metal compute dispatch costs about 10 us from command-buffer commit on "
                 "M-series GPUs")


@dataclass(frozen=True)
class DeviceProfile:
    key: str                      # what --device takes: "h200", "a100-80gb", "m2-max", ...
    name: str
    kind: str                     # "cuda" or "mps": the torch device kind such a GPU appears as
    capability: Optional[Tuple[int, int]]   # CUDA compute capability; None on Apple GPUs
    sm_count: int                 # streaming multiprocessors (CUDA) / GPU cores (Apple)
    memory_bytes: int
    bandwidth: float              # bytes/s, datasheet
    peak: Mapping[str, float]     # FLOP/s per unit (see UNITS), dense
    launch_us: float              # assumed cost of one kernel launch
    registers_per_sm: Optional[int] = None     # 32-bit registers
    shared_per_sm: Optional[int] = None        # bytes of shared memory resident CTAs may use together
    shared_per_cta: Optional[int] = None       # largest (opt-in) shared memory of one CTA, bytes
    shared_reserved_per_cta: int = 0           # bytes the driver reserves per resident CTA
    max_ctas_per_sm: Optional[int] = None
    max_warps_per_sm: Optional[int] = None
    register_alloc_unit: int = 256             # registers per warp are allocated in units of this
    max_registers_per_thread: int = 255
    l2_bytes: Optional[int] = None
    threadgroup_memory: Optional[int] = None   # Apple: bytes per threadgroup
    names: Tuple[str, ...] = ()   # substrings of the device name torch reports (matches results files)
    sources: Mapping[str, str] = field(default_factory=dict)
    achievable_bandwidth: Optional[float] = None   # bytes/s a device-to-device copy reaches; None: the datasheet's
    clock_hz: Optional[float] = None               # SM clock the FP32 peak is quoted at
    schedulers_per_sm: int = 4
    latency: Mapping[str, Tuple[float, float, float]] = field(default_factory=dict)   # LATENCY_KEYS -> range
    calibrated: bool = False                       # constants fitted to a measured run (rlx-triton perf --calibrate)
    tensor_sustained: float = 1.0                  # fraction of the tensor-core peak a long kernel sustains

    def __post_init__(self):
        object.__setattr__(self, "peak", MappingProxyType(dict(self.peak)))
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "latency", MappingProxyType({k: tuple(map(float, v)) for k, v in self.latency.items()}))

    @property
    def achievable_bw(self) -> float:
        """Bytes/s a streaming kernel can reach: the measured (or derived) copy bandwidth, else the datasheet's."""
        return self.achievable_bandwidth or self.bandwidth

    def latency_ns(self, key: str, which: int = 1) -> float:
        """One latency constant (LATENCY_KEYS) of its range: which 0 low, 1 nominal, 2 high."""
        return self.latency[key][which]

    @property
    def arch(self) -> Optional[str]:
        """"sm_90", "sm_80", "sm_89" for CUDA profiles; None for Apple GPUs."""
        return None if self.capability is None else f"sm_{self.capability[0]}{self.capability[1]}"

    @property
    def arch_number(self) -> Optional[int]:
        """The integer triton's GPUTarget takes (90 for sm_90)."""
        return None if self.capability is None else self.capability[0] * 10 + self.capability[1]

    def matches(self, device_name: str) -> bool:
        """Whether a device name (torch.cuda.get_device_name, a results file's "device") is this GPU."""
        lowered = device_name.lower()
        return any(name.lower() in lowered for name in self.names)


def _cuda(key, name, capability, sm_count, memory_bytes, bandwidth, fp32, tf32, fp16, bf16, *, shared_per_sm,
          shared_per_cta, max_ctas, max_warps, l2_bytes, names, sources, achievable=None,
          tensor_sustained=None, fp8=None) -> DeviceProfile:
    cc = f"{capability[0]}.{capability[1]}"
    fp32_lanes = 64 if capability == (8, 0) else 128
    common = {
        "registers_per_sm": _CUDA_GUIDE.format(cc=cc),
        "shared_per_cta": _CUDA_GUIDE.format(cc=cc),
        "max_ctas_per_sm": _CUDA_GUIDE.format(cc=cc),
        "max_warps_per_sm": _CUDA_GUIDE.format(cc=cc),
        "max_registers_per_thread": _CUDA_GUIDE.format(cc=cc),
        "capability": _CUDA_GUIDE.format(cc=cc),
        "register_alloc_unit": _OCCUPANCY,
        "shared_reserved_per_cta": _OCCUPANCY,
        "launch_us": _LAUNCH,
        "peak.tf32x3": _TF32X3,
        "peak.tf32x4": _TF32X4,
        "achievable_bandwidth": _COPY_RATIO,
        "clock_hz": _CLOCK,
        "peak.sfu": _SFU,
        "tensor_sustained": _TENSOR_RATIO,
        "schedulers_per_sm": _ISSUE,
        **{f"latency.{k}": _ISSUE if k == "issue_interval" else _LATENCY for k in LATENCY_KEYS},
    }
    clock = fp32 / (sm_count * fp32_lanes * 2)
    return DeviceProfile(
        key=key, name=name, kind="cuda", capability=capability, sm_count=sm_count, memory_bytes=memory_bytes,
        bandwidth=bandwidth,
        peak={"fp32_fma": fp32, "tf32": tf32, "tf32x3": tf32 / 3, "tf32x4": tf32 / 4, "fp16_mma": fp16,
              "bf16_mma": bf16, "sfu": 16.0 * sm_count * clock, **({"fp8_mma": fp8} if fp8 else {})},
        launch_us=4.0, registers_per_sm=65536, shared_per_sm=shared_per_sm, shared_per_cta=shared_per_cta,
        shared_reserved_per_cta=1 * KB, max_ctas_per_sm=max_ctas, max_warps_per_sm=max_warps, l2_bytes=l2_bytes,
        names=names, sources={**common, **sources},
        achievable_bandwidth=achievable if achievable is not None else bandwidth * COPY_RATIO,
        clock_hz=clock, schedulers_per_sm=4, latency=CUDA_LATENCY,
        tensor_sustained=TENSOR_RATIO if tensor_sustained is None else tensor_sustained)


_H100_DATASHEET = ("NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67 TFLOPS, TF32 Tensor Core "
                   "989 TFLOPS, BF16/FP16 Tensor Core 1979 TFLOPS, FP8 Tensor Core 3958 TFLOPS, all with sparsity "
                   "(dense: half)")
_HOPPER_BLOG = ("NVIDIA Technical Blog 'NVIDIA Hopper Architecture In-Depth' (2022): H100 SXM5 has 132 SMs, "
                "50 MB L2, 228 KB shared memory per SM")
_H200_DATASHEET = ("NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: 141 GB HBM3e at 4.8 TB/s; "
                   "FP32 67 TFLOPS, TF32 989 / BF16 and FP16 1979 / FP8 3958 TFLOPS with sparsity (dense: half); "
                   "the same GH100 configuration as H100 SXM")
_A100_DATASHEET = ("NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: 2039 GB/s, FP32 19.5 TFLOPS, "
                   "TF32 156 TFLOPS, BF16/FP16 312 TFLOPS (dense)")
_A100_WHITEPAPER = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs, 40 MB L2, "
                    "164 KB shared memory per SM")
_L40S_DATASHEET = ("NVIDIA L40S datasheet: 48 GB GDDR6 at 864 GB/s, FP32 91.6 TFLOPS, TF32 183 TFLOPS, "
                   "BF16/FP16 362.05 TFLOPS, FP8 733 TFLOPS (dense; the doubled figures are with sparsity)")
_ADA_WHITEPAPER = ("NVIDIA Ada GPU Architecture whitepaper: L40S/AD102 with 142 SMs enabled and 96 MB L2 "
                   "(18176 CUDA cores / 128 per SM); GeForce RTX 4090 (appendix A): 128 SMs, 72 MB L2, "
                   "24 GB GDDR6X at 1008 GB/s, FP32 82.6 TFLOPS, TF32 Tensor 82.6 TFLOPS, FP16/BF16 Tensor "
                   "with FP32 accumulate 165.2 TFLOPS (dense)")


def _apple(key, name, cores, memory_gib, bandwidth_gbs, fp32_tflops, source, bandwidth_source=None) -> DeviceProfile:
    return DeviceProfile(
        key=key, name=name, kind="mps", capability=None, sm_count=cores, memory_bytes=memory_gib * GiB,
        bandwidth=bandwidth_gbs * 1e9, peak={"fp32_fma": fp32_tflops * TERA}, launch_us=10.0,
        threadgroup_memory=32 * KB, names=(name,),
        sources={"sm_count": source, "memory_bytes": source, "bandwidth": bandwidth_source or source,
                 "peak.fp32_fma": source,
                 "threadgroup_memory": _METAL_TABLES, "launch_us": _APPLE_LAUNCH})


_APPLE_M1 = "Apple Newsroom, 'Apple unleashes M1' (2020-11-10): 8-core GPU, 2.6 teraflops, up to 16 GB unified memory"
_APPLE_M1_BANDWIDTH = ("AnandTech, 'The 2020 Mac Mini Unleashed: Putting Apple Silicon M1 To The Test' (2020-11-17): "
                       "LPDDR4X-4266 on a 128-bit bus, 68.25 GB/s (Apple publishes no figure for M1)")
_APPLE_M1_PRO_MAX = ("Apple Newsroom, 'Introducing M1 Pro and M1 Max' (2021-10-18): M1 Pro 16-core GPU, 200 GB/s, "
                     "up to 32 GB, 5.2 teraflops; M1 Max 32-core GPU, 400 GB/s, up to 64 GB, 10.4 teraflops")
_APPLE_M1_ULTRA = "Apple Newsroom, 'Apple unveils M1 Ultra' (2022-03-08): 64-core GPU, 800 GB/s, up to 128 GB, 21 teraflops"
_APPLE_M2 = "Apple Newsroom, 'Apple unveils M2' (2022-06-06): 10-core GPU, 100 GB/s, up to 24 GB, 3.6 teraflops"
_APPLE_M2_PRO_MAX = ("Apple Newsroom, 'Apple unveils M2 Pro and M2 Max' (2023-01-17): M2 Pro 19-core GPU, 200 GB/s, "
                     "up to 32 GB, 6.8 teraflops; M2 Max 38-core GPU, 400 GB/s, up to 96 GB, 13.6 teraflops")
_APPLE_M2_ULTRA = "Apple Newsroom, 'Apple introduces M2 Ultra' (2023-06-05): 76-core GPU, 800 GB/s, up to 192 GB, 27.2 teraflops"

PROFILES: Dict[str, DeviceProfile] = {profile.key: profile for profile in (
    _cuda("h100-sxm", "NVIDIA H100 SXM", (9, 0), 132, 80 * GiB, 3.35e12, 67 * TERA, 494.7 * TERA, 989.4 * TERA,
          989.4 * TERA, shared_per_sm=228 * KB, shared_per_cta=227 * KB, max_ctas=32, max_warps=64,
          l2_bytes=50 * MB, names=("H100 80GB HBM3", "H100 SXM"), fp8=1979 * TERA,
          sources={"sm_count": _HOPPER_BLOG, "l2_bytes": _HOPPER_BLOG, "shared_per_sm": _HOPPER_BLOG,
                   "memory_bytes": _H100_DATASHEET, "bandwidth": _H100_DATASHEET,
                   "peak.fp32_fma": _H100_DATASHEET, "peak.tf32": _H100_DATASHEET,
                   "peak.fp16_mma": _H100_DATASHEET, "peak.bf16_mma": _H100_DATASHEET,
                   "peak.fp8_mma": _H100_DATASHEET}),
    _cuda("h200", "NVIDIA H200", (9, 0), 132, 141 * 10**9, 4.8e12, 67 * TERA, 494.7 * TERA, 989.4 * TERA,
          989.4 * TERA, shared_per_sm=228 * KB, shared_per_cta=227 * KB, max_ctas=32, max_warps=64,
          l2_bytes=50 * MB, names=("H200",), achievable=4.3e12, fp8=1979 * TERA,
          tensor_sustained=TENSOR_RATIO,
          sources={"achievable_bandwidth": _H200_COPY, "tensor_sustained": _H200_TENSOR,
                   "sm_count": _H200_DATASHEET + "; " + _HOPPER_BLOG, "l2_bytes": _HOPPER_BLOG,
                   "shared_per_sm": _HOPPER_BLOG, "memory_bytes": _H200_DATASHEET, "bandwidth": _H200_DATASHEET,
                   "peak.fp32_fma": _H200_DATASHEET, "peak.tf32": _H200_DATASHEET,
                   "peak.fp16_mma": _H200_DATASHEET, "peak.bf16_mma": _H200_DATASHEET,
                   "peak.fp8_mma": _H200_DATASHEET}),
    _cuda("a100-80gb", "NVIDIA A100 80GB SXM", (8, 0), 108, 80 * GiB, 2.039e12, 19.5 * TERA, 156 * TERA,
          312 * TERA, 312 * TERA, shared_per_sm=164 * KB, shared_per_cta=163 * KB, max_ctas=32, max_warps=64,
          l2_bytes=40 * MB, names=("A100-SXM4-80GB", "A100 80GB"),
          sources={"sm_count": _A100_WHITEPAPER, "l2_bytes": _A100_WHITEPAPER, "shared_per_sm": _A100_WHITEPAPER,
                   "memory_bytes": _A100_DATASHEET, "bandwidth": _A100_DATASHEET,
                   "peak.fp32_fma": _A100_DATASHEET, "peak.tf32": _A100_DATASHEET,
                   "peak.fp16_mma": _A100_DATASHEET, "peak.bf16_mma": _A100_DATASHEET}),
    _cuda("l40s", "NVIDIA L40S", (8, 9), 142, 48 * GiB, 864e9, 91.6 * TERA, 183 * TERA, 362.05 * TERA,
          362.05 * TERA, shared_per_sm=100 * KB, shared_per_cta=99 * KB, max_ctas=24, max_warps=48,
          l2_bytes=96 * MB, names=("L40S",), fp8=733 * TERA,
          sources={"sm_count": _ADA_WHITEPAPER, "l2_bytes": _ADA_WHITEPAPER,
                   "shared_per_sm": _CUDA_GUIDE.format(cc="8.9"), "memory_bytes": _L40S_DATASHEET,
                   "bandwidth": _L40S_DATASHEET, "peak.fp32_fma": _L40S_DATASHEET, "peak.tf32": _L40S_DATASHEET,
                   "peak.fp16_mma": _L40S_DATASHEET, "peak.bf16_mma": _L40S_DATASHEET,
                   "peak.fp8_mma": _L40S_DATASHEET}),
    _cuda("rtx-4090", "NVIDIA GeForce RTX 4090", (8, 9), 128, 24 * GiB, 1008e9, 82.6 * TERA, 82.6 * TERA,
          165.2 * TERA, 165.2 * TERA, shared_per_sm=100 * KB, shared_per_cta=99 * KB, max_ctas=24, max_warps=48,
          l2_bytes=72 * MB, names=("RTX 4090",),
          sources={"sm_count": _ADA_WHITEPAPER, "l2_bytes": _ADA_WHITEPAPER,
                   "shared_per_sm": _CUDA_GUIDE.format(cc="8.9"), "memory_bytes": _ADA_WHITEPAPER,
                   "bandwidth": _ADA_WHITEPAPER, "peak.fp32_fma": _ADA_WHITEPAPER, "peak.tf32": _ADA_WHITEPAPER,
                   "peak.fp16_mma": _ADA_WHITEPAPER, "peak.bf16_mma": _ADA_WHITEPAPER}),
    _apple("m1", "Apple M1", 8, 16, 68.25, 2.6, _APPLE_M1, _APPLE_M1_BANDWIDTH),
    _apple("m1-pro", "Apple M1 Pro", 16, 32, 200, 5.2, _APPLE_M1_PRO_MAX),
    _apple("m1-max", "Apple M1 Max", 32, 64, 400, 10.4, _APPLE_M1_PRO_MAX),
    _apple("m1-ultra", "Apple M1 Ultra", 64, 128, 800, 21.0, _APPLE_M1_ULTRA),
    _apple("m2", "Apple M2", 10, 24, 100, 3.6, _APPLE_M2),
    _apple("m2-pro", "Apple M2 Pro", 19, 32, 200, 6.8, _APPLE_M2_PRO_MAX),
    _apple("m2-max", "Apple M2 Max", 38, 96, 400, 13.6, _APPLE_M2_PRO_MAX),
    _apple("m2-ultra", "Apple M2 Ultra", 76, 192, 800, 27.2, _APPLE_M2_ULTRA),
)}

# Fields every CUDA profile must state (the analysis reads all of them).
CUDA_FIELDS = ("capability", "sm_count", "memory_bytes", "bandwidth", "launch_us", "registers_per_sm",
               "shared_per_sm", "shared_per_cta", "shared_reserved_per_cta", "max_ctas_per_sm", "max_warps_per_sm",
               "register_alloc_unit", "max_registers_per_thread", "l2_bytes", "achievable_bandwidth", "clock_hz",
               "schedulers_per_sm")


def profile(key: str) -> DeviceProfile:
    """The profile `key` names: a key ("h200", "a100-80gb"; case, dashes and underscores aside) or a unique
    prefix of one ("a100", "h100", "rtx4090"); ValueError naming the choices otherwise."""
    def plain(text: str) -> str:
        return text.strip().lower().replace("-", "").replace("_", "")

    wanted = plain(key)
    exact = [p for name, p in PROFILES.items() if plain(name) == wanted]
    if exact:
        return exact[0]
    prefixed = [p for name, p in PROFILES.items() if wanted and plain(name).startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise ValueError(f"device {key!r} is ambiguous: {', '.join(p.key for p in prefixed)}")
    raise ValueError(f"unknown device {key!r}; choose from {', '.join(PROFILES)}")


def sustained_peak(gpu: DeviceProfile, unit: str) -> float:
    """The rate an estimate prices `unit` at: the datasheet peak, times tensor_sustained for tensor-core units."""
    rate = gpu.peak[unit]
    return rate * gpu.tensor_sustained if unit in TENSOR_UNITS else rate


def cuda_profiles() -> Tuple[DeviceProfile, ...]:
    return tuple(p for p in PROFILES.values() if p.kind == "cuda")


def profile_for_name(device_name: str) -> Optional[DeviceProfile]:
    """The profile of a device by the name torch reports (or a results file records), if one matches."""
    lowered = device_name.lower()
    best, best_length = None, 0
    for candidate in PROFILES.values():
        for name in candidate.names:   # the longest name that matches: "Apple M1 Pro" before "Apple M1"
            if name.lower() in lowered and len(name) > best_length:
                best, best_length = candidate, len(name)
    return best


# ---------------------------------------------------------------------------------------------------
# The constants the performance model reads, and profiles calibrated against a measured run
# ---------------------------------------------------------------------------------------------------
CALIBRATION_KEYS = ("achievable_bw", "launch_us") + LATENCY_KEYS


def profile_block(gpu: DeviceProfile) -> dict:
    """The profile's figures and constants as `rlx-triton perf` writes them (JSON key "profile"), with sources."""
    keys = ("bandwidth", "achievable_bandwidth", "clock_hz", "schedulers_per_sm", "launch_us", "tensor_sustained")
    sources = {key: gpu.sources.get(key) for key in keys}
    sources.update({f"latency.{key}": gpu.sources.get(f"latency.{key}") for key in gpu.latency})
    return {"key": gpu.key, "name": gpu.name, "arch": gpu.arch, "sm_count": gpu.sm_count, "bandwidth": gpu.bandwidth,
            "achievable_bw": gpu.achievable_bw, "clock_hz": gpu.clock_hz, "schedulers_per_sm": gpu.schedulers_per_sm,
            "launch_us": gpu.launch_us, "tensor_sustained": gpu.tensor_sustained,
            "latency": {key: list(span) for key, span in gpu.latency.items()},
            "latency_units": {key: "cycles" if key == "issue_interval" else "ns" for key in gpu.latency},
            "calibrated": gpu.calibrated, "sources": sources}


def calibrated(base: DeviceProfile, values: Mapping[str, float], fitted_from: str) -> DeviceProfile:
    """`base` with the fitted constants (CALIBRATION_KEYS; a latency's range keeps its spread around the new value)."""
    import dataclasses

    latency = dict(base.latency)
    sources = dict(base.sources)
    note = f"calibrated: least-squares fit to the measured run {fitted_from} (rlx-triton perf --calibrate)"
    for key in LATENCY_KEYS:
        if key in values and key in latency:
            low, nominal, high = latency[key]
            value = float(values[key])
            latency[key] = (value * low / nominal, value, value * high / nominal)
            sources[f"latency.{key}"] = note
    changes: Dict[str, Any] = {"latency": latency, "calibrated": True}
    if "achievable_bw" in values:
        changes["achievable_bandwidth"] = float(values["achievable_bw"])
        sources["achievable_bandwidth"] = note
    if "launch_us" in values:
        changes["launch_us"] = float(values["launch_us"])
        sources["launch_us"] = note
    return dataclasses.replace(base, sources=sources, **changes)


def profile_file(gpu: DeviceProfile, fitted_from: str) -> dict:
    """What --calibrate writes: the base profile's key and the fitted constants (load_profile reads it back)."""
    return {"profile": gpu.key, "calibrated": gpu.calibrated, "fitted_from": fitted_from,
            "achievable_bw": gpu.achievable_bw, "launch_us": gpu.launch_us,
            "latency": {key: list(span) for key, span in gpu.latency.items()}}


def load_profile(data: Mapping) -> DeviceProfile:
    """The profile a calibrated profile file (profile_file) describes; ValueError naming what is wrong."""
    if not isinstance(data, Mapping) or "profile" not in data:
        raise ValueError("a calibrated profile file must be a JSON object with a \"profile\" key")
    base = profile(str(data["profile"]))
    latency = data.get("latency", {})
    unknown = [key for key in latency if key not in LATENCY_KEYS]
    if unknown:
        raise ValueError(f"calibrated profile: unknown latency constants {', '.join(unknown)}")
    values = {key: float(span[1]) for key, span in latency.items()}
    for key in ("achievable_bw", "launch_us"):
        if key in data:
            values[key] = float(data[key])
    return calibrated(base, values, str(data.get("fitted_from", "")))


# ------------------------------------------------------------------------------------------ occupancy

@dataclass(frozen=True)
class Occupancy:
    """Resident CTAs per SM a kernel's registers, shared memory and warps each allow, the hardware's cap,
    and the least of them."""

    by_registers: int
    by_shared: int
    by_warps: int
    hardware: int
    ctas_per_sm: int

    @property
    def limiter(self) -> str:
        limits = {"registers": self.by_registers, "shared": self.by_shared, "warps": self.by_warps,
                  "hardware": self.hardware}
        return min(limits, key=lambda name: limits[name])


def occupancy(profile: DeviceProfile, registers: int, shared: int, num_warps: int) -> Occupancy:
    """Resident CTAs per SM of a kernel on a CUDA profile (the CUDA occupancy calculator's rules)."""
    unit, registers_per_sm = profile.register_alloc_unit, profile.registers_per_sm
    shared_per_cta, shared_per_sm = profile.shared_per_cta, profile.shared_per_sm
    max_warps, max_ctas = profile.max_warps_per_sm, profile.max_ctas_per_sm
    if (unit is None or registers_per_sm is None or shared_per_cta is None or shared_per_sm is None
            or max_warps is None or max_ctas is None):
        raise ValueError(f"occupancy: profile {profile.key!r} has no CUDA occupancy limits (a CUDA profile is needed)")
    per_warp = math.ceil(max(1, registers) * 32 / unit) * unit
    by_registers = registers_per_sm // (per_warp * num_warps)
    if shared > shared_per_cta:
        by_shared = 0
    else:
        by_shared = shared_per_sm // (shared + profile.shared_reserved_per_cta)
    by_warps = max_warps // num_warps
    hardware = max_ctas
    return Occupancy(by_registers, by_shared, by_warps, hardware, min(by_registers, by_shared, by_warps, hardware))
