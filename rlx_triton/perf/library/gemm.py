"""cuBLAS GEMM by its launch rules: the tile a heuristic picks, the grid it launches, split-K for small M x N.

What cuBLAS launches for C (m x n) = A (m x k) @ B (k x n), in the records rlx_triton.perf.roofline prices:

- tiles: one CTA per output tile of tile_m x tile_n, looping over k in steps of tile_k. The tile families are
  the ones cuBLAS's own kernel names show in profiler traces:
  * sm_90, fp16 / bf16 / tf32 / fp8: Hopper warpgroup MMA (wgmma) kernels, e.g.
    `sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_..._cublas` (NVIDIA/TensorRT-LLM
    issue #1541) and `sm90_xmma_gemm_f32f32_tf32f32_f32_*_warpgroupsize2x1x1` for TF32
    (gabrieldemarmiesse/torch-mojo-backend PR #410); tile_k is 128 bytes of a row (128 fp8, 64 halves,
    32 floats: one 128-byte swizzle row);
  * sm_80 / sm_89, fp16 / bf16 / tf32 (and fp8 on sm_89): mma.sync kernels (`ampere_h16816gemm_256x128_...`,
    `..._128x128_...`), tile_k 64 bytes;
  * fp32 with TF32 off, every arch: SIMT SGEMM (`ampere_sgemm_128x64_nn`, `ampere_sgemm_128x32_nn`,
    `ampere_sgemm_32x128_tn`, `ampere_sgemm_64x32_sliced1x4`: names in public nsys traces), 8 x 8 outputs per
    thread, tile_k 8;
- which tile: cuBLAS's heuristic is not public; the model takes the (tile, split) whose priced time is the
  least, which is what a heuristic tuned on the device aims at. A tile that overhangs m, n or k computes its
  whole tile (padded FLOPs), so a bad fit costs what the hardware spends;
- waves: the grid runs in waves of SMs x resident CTAs (wave quantisation: 1.05 waves cost two);
- split-K: where the M x N tiles leave SMs idle, cuBLAS splits k over several CTAs per tile, writes fp32 partial
  tiles to a workspace and sums them in a second kernel (`splitKreduce_kernel` in cuBLAS traces); a split keeps
  at least SPLIT_MIN_K_TILES k-steps;
- bytes: A, B and C once each (tiles re-read from L2 are not memory traffic), plus the split-K partials;
- rate: the unit's sustained rate (rlx_triton.devices.sustained_peak) times the tile's efficiency: 1 for the
  tensor-core tiles (their operands come from shared memory within its bandwidth, see TENSOR_TILE_EFFICIENCY),
  SIMT_EFFICIENCY for SGEMM;
- latency: a CTA's first k-step operands come from device memory before its first MMA can issue: one dependent
  HBM round trip per wave where one CTA fills an SM (the next wave's CTA starts when the last one ends, so
  nothing hides it), one per kernel where several CTAs share an SM (one's fill overlaps another's loop). This is
  what makes small tiles cost more than their waves at small k.

fp8 (e4m3 operands, bf16 output, as torch._scaled_mm runs it) is modelled where the profile states an fp8 rate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.perf.library import Unmodelled, library_model

ELEMENT_BYTES: Mapping[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# C's element: an fp8 GEMM (torch._scaled_mm, cuBLASLt) writes bf16, every other dtype its own
OUTPUT_BYTES: Mapping[str, int] = {**ELEMENT_BYTES, "fp8": 2}
UNIT: Mapping[str, str] = {"fp32": "fp32_fma", "tf32": "tf32", "fp16": "fp16_mma", "bf16": "bf16_mma",
                           "fp8": "fp8_mma"}
# request dtype names (rlx_triton.router.request.dtype_name) -> the published format's
REQUEST_DTYPE: Mapping[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

# SIMT SGEMM main loop per k-step, per thread of an 8 x 8 output micro-tile: 64 FFMA, 4 LDS.128 (8 + 8 operands
# from shared memory), and per 8-step k-tile about 9 more (2 LDG.128 + 2 STS.128 of the next tile, a barrier,
# address and loop arithmetic): a scheduler issues one instruction per cycle, so FFMA fill 64 / 69.1 of the slots
# (the structure of CUTLASS's SIMT SGEMM, which cuBLAS's ampere_sgemm kernels share)
SIMT_EFFICIENCY = 64 / (64 + 4 + 9 / 8)
# wgmma / mma.sync tiles with N >= 64: per k16 step a warpgroup's m64nNk16 reads (64 + N) x 16 operands from shared
# memory (128 B per clock per SM) against 2 x 64 x N x 16 FLOPs at 4096 (fp16) / 2048 (tf32) FLOP per clock per SM
# (H100 dense rates at 1.83 GHz): N = 64 is exactly at the shared-memory limit, wider tiles under it; so the loop
# runs at the tensor rate and the tile choice costs only padding and waves
TENSOR_TILE_EFFICIENCY = 1.0
# a split-K slice keeps at least this many k-steps: cuBLAS's kernels pipeline 3-5 k-tiles in flight (the stage
# count in names such as `ampere_sgemm_128x32_8x5`, cutlass `..._32x5`), and a slice shorter than its pipeline
# is all prologue
SPLIT_MIN_K_TILES = 4
# the largest split considered (cuBLAS's split-K kernels are launched with up to 32 k-slices in public traces of
# small-M GEMMs; more slices than SMs cannot run at once anyway)
SPLIT_MAX = 32
# registers per thread of a SIMT SGEMM CTA: 64 accumulators, 16 operand fragments, addresses (cuobjdump of
# CUTLASS SIMT SGEMM kernels reports 122-128): 128, which sets its resident CTAs
SIMT_REGISTERS = 128


@dataclass(frozen=True)
class Tile:
    """One CTA tile of a GEMM kernel family: its output tile, its k-step, resident CTAs per SM, loop efficiency."""
    name: str
    m: int
    n: int
    k: int
    ctas_per_sm: int
    efficiency: float


def _simt(name: str, m: int, n: int, k_slices: int = 1) -> Tile:
    threads = m * n // 64 * k_slices      # 8 x 8 outputs per thread (sliced: one such group per k-slice)
    return Tile(f"ampere_sgemm_{name}", m, n, 8 * k_slices, max(1, 65536 // (threads * SIMT_REGISTERS)),
                SIMT_EFFICIENCY)


# cuBLAS's SGEMM tiles (kernel names in public traces; sliced1x4: k split four ways inside the CTA)
SIMT_TILES: Tuple[Tile, ...] = (
    _simt("128x128", 128, 128), _simt("128x64", 128, 64), _simt("64x128", 64, 128), _simt("64x64", 64, 64),
    _simt("128x32", 128, 32), _simt("32x128", 32, 128), _simt("64x32_sliced1x4", 64, 32, 4),
    _simt("32x32_sliced1x4", 32, 32, 4))


def _tensor(prefix: str, m: int, n: int, k: int, ctas_per_sm: int = 1) -> Tile:
    return Tile(f"{prefix}_{m}x{n}x{k}", m, n, k, ctas_per_sm, TENSOR_TILE_EFFICIENCY)


def _hopper(k: int) -> Tuple[Tile, ...]:
    # 3-7 pipeline stages of (tile_m + tile_n) x 128 B fill most of the 227 KB of shared memory: one CTA per SM
    return tuple(_tensor("sm90_xmma_gemm", m, n, k) for m, n in ((64, 128), (128, 64), (128, 128), (128, 256),
                                                                  (256, 128)))


def _ampere(k: int) -> Tuple[Tile, ...]:
    # cutlass / cuBLAS sm80 tensor-op tiles: 256x128 and 128x256 use ~the whole 164 KB (one CTA per SM),
    # 128x128 and smaller leave room for a second
    return (_tensor("ampere_gemm", 256, 128, k), _tensor("ampere_gemm", 128, 256, k),
            _tensor("ampere_gemm", 128, 128, k, 2), _tensor("ampere_gemm", 128, 64, k, 2),
            _tensor("ampere_gemm", 64, 128, k, 2), _tensor("ampere_gemm", 64, 64, k, 4))


def tiles_for(dtype: str, profile) -> Tuple[Tuple[Tile, ...], str]:
    """(the tile family cuBLAS runs `dtype` with on `profile`, its unit); Unmodelled where none is modelled."""
    if dtype not in UNIT:
        raise Unmodelled(f"cuBLAS GEMM: unknown dtype {dtype!r}")
    capability = getattr(profile, "capability", None)
    if capability is None:
        raise Unmodelled(f"cuBLAS runs on CUDA GPUs; {getattr(profile, 'name', profile)} is not one")
    if UNIT[dtype] not in profile.peak:
        raise Unmodelled(f"cuBLAS {dtype} GEMM on {profile.name}: its profile states no {UNIT[dtype]} rate")
    if dtype == "fp32":
        return SIMT_TILES, UNIT[dtype]
    if capability[0] < 8:
        raise Unmodelled(f"{dtype} tensor-core GEMM before sm_80 is not modelled")
    k = 128 // ELEMENT_BYTES[dtype]
    if capability == (9, 0):
        return _hopper(k), UNIT[dtype]
    return _ampere(k // 2), UNIT[dtype]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GemmPlan:
    """The launch a (tile, split) choice makes: what gemm_kernels returns the kernels of."""
    tile: Tile
    splits: int
    tiles: int                 # output tiles per GEMM of the batch
    kernels: Tuple[LibraryKernel, ...]


def _plan(m: int, n: int, k: int, batch: int, tile: Tile, splits: int, unit: str, profile_sms: int,
          read_bytes: int, written_bytes: int, label: str, note: str) -> GemmPlan:
    tiles = _ceil(m, tile.m) * _ceil(n, tile.n)
    k_steps = _ceil(_ceil(k, splits), tile.k)          # k-steps of each slice
    flops = 2.0 * tile.m * tile.n * k_steps * tile.k * splits * tiles * batch
    partials = 4 * splits * m * n * batch if splits > 1 else 0   # fp32 partial tiles in the workspace
    grid = tiles * splits * batch
    slots = profile_sms * tile.ctas_per_sm
    fills = _ceil(grid, slots) if tile.ctas_per_sm == 1 else 1
    what = (f"{tile.name}: {tiles * batch} tiles of {tile.m}x{tile.n} (k-step {tile.k})"
            + (f" x {splits} k-slices" if splits > 1 else "") + f", {grid} CTAs, {tile.ctas_per_sm}/SM")
    main = LibraryKernel(f"{label} ({tile.name}{f', split-K {splits}' if splits > 1 else ''})",
                         read_bytes, (partials if splits > 1 else written_bytes), flops, unit,
                         chain={"hbm": fills}, ctas=grid, ctas_per_sm=tile.ctas_per_sm, efficiency=tile.efficiency,
                         note=f"cuBLAS {what}; {note}".rstrip("; "))
    kernels = [main]
    if splits > 1:
        outputs = m * n * batch
        kernels.append(LibraryKernel(f"{label} split-K reduction", partials, written_bytes, float(splits * outputs),
                                     "fp32_fma", note=f"splitKreduce_kernel: sums {splits} fp32 partials of "
                                                      f"{outputs} outputs and writes C"))
    return GemmPlan(tile, splits, tiles, tuple(kernels))


def _profile_key(profile) -> tuple:
    return (profile.key, profile.sm_count, profile.achievable_bw, profile.launch_us, tuple(profile.latency.items()),
            profile.tensor_sustained)


_CHOSEN: Dict[tuple, GemmPlan] = {}


def plan_gemm(m: int, n: int, k: int, dtype: str, profile, *, batch: int = 1, read_bytes: Optional[int] = None,
              written_bytes: Optional[int] = None, label: str = "GEMM", note: str = "",
              only: Optional[Sequence[Tile]] = None) -> GemmPlan:
    """The cheapest (tile, split-K) launch of `batch` GEMMs (m x k) @ (k x n) in `dtype` on `profile`.

    read_bytes / written_bytes default to A + B and C once each in `dtype` (an implicit-GEMM convolution states
    its own: it reads its input, not the im2col matrix); `only`: choose among these tiles of the family alone."""
    from rlx_triton.perf.roofline import constants, kernel_time, library_terms

    if min(m, n, k, batch) < 1:
        raise Unmodelled(f"GEMM {m}x{n}x{k} (batch {batch}) has an empty dimension")
    tiles, unit = tiles_for(dtype, profile)
    if only is not None:
        tiles = tuple(only)
    element = ELEMENT_BYTES[dtype]
    if read_bytes is None:
        read_bytes = (m * k + k * n) * element * batch
    if written_bytes is None:
        written_bytes = m * n * OUTPUT_BYTES[dtype] * batch
    key = (m, n, k, dtype, batch, read_bytes, written_bytes, label, note, tiles, _profile_key(profile))
    chosen = _CHOSEN.get(key)
    if chosen is not None:
        return chosen
    values = constants(profile)
    best: Optional[Tuple[float, GemmPlan]] = None
    for tile in tiles:
        slots = profile.sm_count * tile.ctas_per_sm
        grid = _ceil(m, tile.m) * _ceil(n, tile.n) * batch
        k_tiles = _ceil(k, tile.k)
        splits = [1]
        if grid < slots:   # split only to fill the GPU's first wave
            limit = min(SPLIT_MAX, slots // grid, max(1, k_tiles // SPLIT_MIN_K_TILES))
            splits += [s for s in range(2, limit + 1)]
        for split in splits:
            plan = _plan(m, n, k, batch, tile, split, unit, profile.sm_count, read_bytes, written_bytes, label, note)
            time = sum(kernel_time(library_terms(kernel, profile), values)["est_us"] for kernel in plan.kernels)
            if best is None or time < best[0] - 1e-9:
                best = (time, plan)
    assert best is not None
    if len(_CHOSEN) > 4096:
        _CHOSEN.clear()
    _CHOSEN[key] = best[1]
    return best[1]


def gemm_kernels(m: int, n: int, k: int, dtype: str, profile, **options) -> List[LibraryKernel]:
    """The kernels cuBLAS launches for the GEMM (plan_gemm's choice)."""
    return list(plan_gemm(m, n, k, dtype, profile, **options).kernels)


@library_model("gemm", "cublas")
def cublas_gemm(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    return gemm_kernels(shape["m"], shape["n"], shape["k"], dtype, profile)


@library_model("gemm", "torch")
def torch_matmul(shape: Mapping[str, int], dtype: str, profile) -> List[LibraryKernel]:
    """torch.matmul / torch.mm of 2-D tensors is one cuBLAS call (fp32 rows: TF32 off, torch's default for
    matmul since 1.12; tf32 rows: allow_tf32 on)."""
    return gemm_kernels(shape["m"], shape["n"], shape["k"], dtype, profile)
