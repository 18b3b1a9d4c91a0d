"""cuFFT batched 1-D real-to-complex transforms (torch.fft.rfft) by their launch rules: bandwidth-bound passes.

What cuFFT runs for `batch` R2C transforms of n real points (n / 2 + 1 complex outputs each):
- a size whose factors are 2, 3, 5 and 7 is computed in passes; one pass is one kernel that reads every
  transform once and writes it once, each CTA holding whole sub-transforms in shared memory. One pass covers up to
  SINGLE_PASS_POINTS complex points (their 8-byte fp32 values in 32 KB of a CTA's 48 KB static shared memory);
  a larger transform takes ceil(log(n / 2) / log(SINGLE_PASS_POINTS)) passes, each a kernel over the whole
  signal (cuFFT's documentation: sizes 2^a 3^b 5^c 7^d are its optimised radices; large sizes decompose into
  several kernels). The R2C packing (n real points as n / 2 complex, then a twiddled split) is fused into the
  first and last pass; a CTA's 32 KB of shared memory lets several CTAs share an SM (its occupancy);
- the work is 2.5 n log2 n FLOPs per transform (the published format's count), issued as separate adds and
  multiplies: one FLOP per instruction slot, so the loop reaches half the FMA rate (BUTTERFLY_EFFICIENCY); at any
  size this is under the bytes' time, so the passes are bandwidth-bound;
- each pass loads its inputs before it can compute and write: one dependent HBM round trip per pass.
- fp16 transforms (power-of-two sizes only, cuFFT's half-precision rule) move half the bytes; bf16, tf32 and fp8
  are not modelled; sizes with a prime factor above 7 (Bluestein's algorithm in cuFFT: several transforms of a
  padded size and chirp multiplies) are not modelled.
"""
from __future__ import annotations

import math
from typing import List, Mapping

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.perf.library import Unmodelled, library_model

SINGLE_PASS_POINTS = 4096
# butterflies are adds and multiplies (the FMA share of a radix-2/4 butterfly is small): half the FMA rate
BUTTERFLY_EFFICIENCY = 0.5
ELEMENT_BYTES: Mapping[str, int] = {"fp32": 4, "fp16": 2}


def _factors_ok(n: int) -> bool:
    for radix in (2, 3, 5, 7):
        while n % radix == 0:
            n //= radix
    return n == 1


def passes(n: int) -> int:
    """Kernels (passes over the whole signal) cuFFT's R2C of n real points takes."""
    points = max(1, n // 2)
    return max(1, math.ceil(math.log(points) / math.log(SINGLE_PASS_POINTS) - 1e-12))


def rfft_kernels(batch: int, n: int, dtype: str, profile, *, label: str = "rfft") -> List[LibraryKernel]:
    """The kernels of `batch` batched R2C transforms of n points."""
    if dtype not in ELEMENT_BYTES:
        raise Unmodelled(f"cuFFT {dtype} transforms are not modelled (fp32 and fp16 are)")
    if n < 2 or batch < 1:
        raise Unmodelled(f"rfft of {n} points (batch {batch}) is not a transform")
    if not _factors_ok(n):
        raise Unmodelled(f"rfft n={n} has a prime factor above 7: cuFFT uses Bluestein's algorithm, not modelled")
    if dtype == "fp16" and n & (n - 1):
        raise Unmodelled(f"cuFFT half precision takes power-of-two sizes only, n={n} is not one")
    element = ELEMENT_BYTES[dtype]
    real_bytes = batch * n * element
    complex_bytes = batch * (n // 2 + 1) * 2 * element
    count = passes(n)
    flops = 2.5 * n * math.log2(n) * batch
    per_cta = max(1, SINGLE_PASS_POINTS // max(1, n // 2)) if count == 1 else 1
    ctas = max(1, -(-batch // per_cta)) if count == 1 else None
    # resident CTAs: as many as their shared memory (SINGLE_PASS_POINTS fp32 complex values each) allows
    resident = max(1, (profile.shared_per_sm or 0) // (SINGLE_PASS_POINTS * 8 + profile.shared_reserved_per_cta))
    kernels = []
    for index in range(count):
        read = real_bytes if index == 0 else complex_bytes
        kernels.append(LibraryKernel(
            f"{label} (cuFFT R2C{f' pass {index + 1}/{count}' if count > 1 else ''})", read, complex_bytes,
            flops / count, "fp32_fma", chain={"hbm": 1}, ctas=ctas, ctas_per_sm=resident,
            efficiency=BUTTERFLY_EFFICIENCY,
            note=f"{batch} transforms of {n} points, {count} pass(es) of at most {SINGLE_PASS_POINTS} complex points "
                 f"in shared memory; 2.5 n log2 n FLOPs at half the FMA rate"))
    return kernels


@library_model("rfft", "cufft")
def cufft_rfft(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    return rfft_kernels(shape["batch"], shape["n"], dtype, profile)


@library_model("rfft", "torch")
def torch_rfft(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """torch.fft.rfft on a contiguous (batch, n) tensor: one cuFFT plan execution (plans are cached)."""
    return rfft_kernels(shape["batch"], shape["n"], dtype, profile)
