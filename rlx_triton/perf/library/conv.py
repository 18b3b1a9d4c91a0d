"""cuDNN convolution forward by its launch rules: implicit GEMM on cuBLAS's tile rules, and Winograd for 3x3.

What cuDNN runs for y = conv(x, w) (NCHW, groups 1, dilation 1), as rlx_triton.perf.library.gemm states GEMMs:

- implicit GEMM (every shape and dtype): M = batch x output pixels, N = c_out, K = c_in x kernel height x kernel
  width; the CTA gathers its im2col tile from the input on the fly, so the kernel reads the input, the filters and
  writes the output once each (each input pixel's reuse by the kernel taps is served from L2 / shared memory).
  cuDNN's implicit-GEMM kernels carry the same tiles as cuBLAS's (`sm80_xmma_fprop_implicit_gemm_..._tilesize
  128x128x...`, `..._ffma_...` for fp32 with TF32 off), so the same tile, wave and split rules apply, with the
  same loop efficiency (the gather's address arithmetic is precomputed: cuDNN's "indexed" / "precomp" variants);
- Winograd (fp32 with TF32 off, 3x3 kernels, stride 1): cuDNN's CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, modelled as
  F(2x2, 3x3): a small kernel transforms the filters to 4x4 tiles (16 x c_in x c_out values), then one kernel
  transforms each 4x4 input tile in registers, runs 16 GEMMs of (batch x output tiles) x c_in @ c_in x c_out
  (16 products per 4 outputs instead of 36: 2.25x fewer FMAs) and transforms back; the transforms' adds
  (32 per input tile and channel, 24 per output tile and channel, B^T d B and A^T m A) are work beside the loop,
  each add one issue slot (two FLOPs' worth of an FMA's rate);
- which algorithm: cudnn.benchmark (what the project's benches and a tuned torch user run) times every
  algorithm and keeps the fastest; the model prices the algorithms above and keeps the cheapest. FFT-based
  algorithms (large kernels) and Winograd on tensor cores are not modelled, so a shape they would win is
  over-estimated.

Layout: torch's tensors, and cuDNN's legacy descriptors, are NCHW by default. The fp32 FFMA kernels read NCHW
natively (`..._nchwkcrs_nchw` in their names); cuDNN's tensor-core kernels (tf32, fp16, bf16) read and write NHWC,
so on NCHW tensors cuDNN transposes the input to NHWC before and the output back after (`nchwToNhwcKernel` and
`nhwcToNchwKernel` in profiles of such calls; NVIDIA's Deep Learning Performance Guide, "Convolutional Layers",
recommends NHWC for Tensor Cores for this reason): each a bandwidth-bound pass reading and writing the tensor. The
published rows state no layout, so they are priced in NCHW (`layout="nhwc"` leaves the transposes out). fp8
convolutions are not modelled.
"""
from __future__ import annotations

import dataclasses
from typing import List, Mapping, Optional, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.perf.library import Unmodelled, library_model
from rlx_triton.perf.library.eager import elementwise
from rlx_triton.perf.library.gemm import ELEMENT_BYTES, plan_gemm

# F(2x2, 3x3): 4x4 input tiles (16 transformed positions) per 2x2 output tile
WINOGRAD_POSITIONS = 16
WINOGRAD_OUTPUT = 2
# adds of the transforms: B^T d B on a 4x4 tile (8 row + 8 column combinations of 2 adds each: 32), A^T m A
# from 4x4 to 2x2 (4 x 3 + 2 x 6 adds: 24) (Lavin and Gray, "Fast Algorithms for Convolutional Neural
# Networks", 2016, section 4.1)
WINOGRAD_INPUT_ADDS = 32
WINOGRAD_OUTPUT_ADDS = 24


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def implicit_gemm(batch: int, c_in: int, c_out: int, in_pixels: int, out_pixels: int, taps: int, dtype: str,
                  profile, label: str = "convolution") -> List[LibraryKernel]:
    """cuDNN's implicit-GEMM convolution: M = batch x out_pixels, N = c_out, K = c_in x taps."""
    element = ELEMENT_BYTES[dtype]
    read = (batch * c_in * in_pixels + c_out * c_in * taps) * element
    written = batch * c_out * out_pixels * element
    plan = plan_gemm(batch * out_pixels, c_out, c_in * taps, dtype, profile, read_bytes=read, written_bytes=written,
                     label=f"{label} (cuDNN implicit GEMM)",
                     note=f"implicit GEMM M = {batch} x {out_pixels} output pixels, N = {c_out}, K = {c_in} x {taps}")
    return list(plan.kernels)


def winograd(batch: int, c_in: int, c_out: int, in_pixels: int, out_tiles: int, out_pixels: int, profile,
             label: str = "convolution") -> List[LibraryKernel]:
    """cuDNN's fp32 Winograd F(2x2, 3x3): the filter transform, then the fused transform-GEMM-transform kernel
    over `out_tiles` 2x2 output tiles per image."""
    element = ELEMENT_BYTES["fp32"]
    rows = batch * out_tiles
    transformed_filters = WINOGRAD_POSITIONS * c_in * c_out * element
    read = batch * c_in * in_pixels * element + transformed_filters
    written = batch * c_out * out_pixels * element
    plan = plan_gemm(rows, c_out, c_in, "fp32", profile, batch=WINOGRAD_POSITIONS, read_bytes=read,
                     written_bytes=written, label=f"{label} (cuDNN Winograd F(2x2,3x3))",
                     note=f"{WINOGRAD_POSITIONS} GEMMs of {rows} tiles x {c_in} @ {c_in} x {c_out}")
    main, *rest = plan.kernels
    n_tiles = _ceil(c_out, plan.tile.n)   # each column tile of a CTA transforms its input tiles again
    adds = rows * (WINOGRAD_INPUT_ADDS * c_in * n_tiles + WINOGRAD_OUTPUT_ADDS * c_out)
    side = dict(main.side_ops)
    side["fp32_fma"] = side.get("fp32_fma", 0.0) + 2.0 * adds   # one issue slot per add: an FMA's two FLOPs
    main = dataclasses.replace(main, side_ops=side, note=main.note + "; input and output tile transforms in the "
                                                                     "kernel (work beside the loop)")
    filters = LibraryKernel(f"{label} Winograd filter transform", c_out * c_in * 9 * element, transformed_filters,
                            2.0 * 32 * c_in * c_out, "fp32_fma",
                            note="G g G^T of every 3x3 filter to 4x4 (cuDNN's generateWinogradTilesKernel)")
    return [filters, main, *rest]


def convolution_kernels(batch: int, c_in: int, c_out: int, in_pixels: int, out_pixels: int, kernel: Tuple[int, int],
                        stride: int, dtype: str, profile, *, out_tiles: Optional[int] = None,
                        label: str = "convolution", layout: str = "nchw") -> List[LibraryKernel]:
    """The kernels of cuDNN's fastest modelled algorithm (cudnn.benchmark's choice) for one convolution.

    out_tiles: 2x2 output tiles per image for Winograd (default: out_pixels / 4 rounded up); layout: the tensors'
    ("nchw": tensor-core dtypes add cuDNN's transposes to NHWC and back)."""
    from rlx_triton.perf.roofline import library_estimate

    if dtype not in ELEMENT_BYTES or dtype == "fp8":
        raise Unmodelled(f"cuDNN {dtype} convolution is not modelled (fp32, tf32, fp16 and bf16 are)")
    taps = kernel[0] * kernel[1]
    options = [implicit_gemm(batch, c_in, c_out, in_pixels, out_pixels, taps, dtype, profile, label)]
    if dtype == "fp32" and tuple(kernel) == (3, 3) and stride == 1:
        tiles = out_tiles if out_tiles is not None else _ceil(out_pixels, WINOGRAD_OUTPUT ** 2)
        options.append(winograd(batch, c_in, c_out, in_pixels, tiles, out_pixels, profile, label))
    chosen = min(options, key=lambda kernels: library_estimate(kernels, profile)["est_us"])
    if dtype == "fp32" or layout == "nhwc":
        return chosen
    element = ELEMENT_BYTES[dtype]
    inputs, outputs = batch * c_in * in_pixels * element, batch * c_out * out_pixels * element
    return ([elementwise(f"{label} input NCHW to NHWC (nchwToNhwcKernel)", inputs, inputs)] + chosen
            + [elementwise(f"{label} output NHWC to NCHW (nhwcToNchwKernel)", outputs, outputs)])


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def conv2d_kernels(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """A published conv2d row's shape (batch, c_in, c_out, h, w, kernel, stride, padding)."""
    k, s, p = shape["kernel"], shape["stride"], shape["padding"]
    out_h, out_w = _out_size(shape["h"], k, s, p), _out_size(shape["w"], k, s, p)
    if out_h < 1 or out_w < 1:
        raise Unmodelled(f"conv2d {shape}: the kernel is larger than the padded input")
    tiles = _ceil(out_h, WINOGRAD_OUTPUT) * _ceil(out_w, WINOGRAD_OUTPUT)
    return convolution_kernels(shape["batch"], shape["c_in"], shape["c_out"], shape["h"] * shape["w"], out_h * out_w,
                               (k, k), s, dtype, profile, out_tiles=tiles)


@library_model("conv2d", "cudnn")
def cudnn_conv2d(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    return conv2d_kernels(shape, dtype, profile)


@library_model("conv2d", "torch")
def torch_conv2d(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """F.conv2d without bias: one cuDNN convolution (fp32 rows: TF32 off; with cudnn.benchmark, the fastest)."""
    return conv2d_kernels(shape, dtype, profile)
