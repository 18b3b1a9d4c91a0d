"""Launch plans of the 1-D conv family: candidate -> meta-parameters, the launch records with their byte
and FLOP models, the autotune bridge, and the conv family's candidate helpers.

Launch plans: every launch is a record (rlx_triton/backends/triton/launches.py) built by a plan function
with its launcher's signature (`sincnet_plan`, `conv1d_plan`), buildable from meta tensors; the launchers
run exactly those records and `launch_count(request, candidate)` states how many. Records count the
minimum traffic (each input, weight and output byte once) and the FLOPs the dots execute on full tiles
(masked lanes included; the elementwise prologue and epilogue are not counted).

Candidate mapping (ConvCandidate): tile_pos -> BLOCK_P output positions per program (pooled
positions when a pool is fused), tile_co -> BLOCK_CO (the sinc kernel: `sinc_tile`), tile_k ->
BLOCK_K (reduction per loop iteration, issued as 16-wide tl.dots on GPUs: DOT_K), tg_size // 32 ->
num_warps, stages -> num_stages, precision -> tl.dot input_precision ("ieee", "tf32") or dot_split
("tf32x3"), fuse_epilogue -> abs/pool/leaky in the conv kernel (True) or in a separate `_epilogue_kernel`
pass over the stored conv output (False). A routed fused conv goes through the autotune bridge (keys:
batch and length buckets, channels, stride, taps, pool).
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

import torch
import triton

from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.conv.kernels import (_conv1d_kernel, _epilogue_kernel, _row_combine_stats_kernel,
                                                     _row_norm_kernel, _row_partial_stats_kernel, _sinc_conv_kernel)
from rlx_triton.backends.triton.conv.routing import APPROVALS
from rlx_triton.backends.triton.conv.weights import _packed_weight, _sinc_bank, _split_weight, symmetric_bank
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.config import settings
from rlx_triton.planner.candidates.conv import DEFAULT_VARIANT, ConvCandidate

_ROW_BLOCK_MAX = 1024   # row chunk of the norm and epilogue kernels
_ROW_TILE = 4096        # elements per norm program tile (BLOCK_R x BLOCK_L)
_STATS_CHUNK = 4096     # long rows: elements per statistics program
_STATS_BLOCK = 2048     # ... loaded BLOCK_L at a time (1024 leaves 8 B of stack for fp16 on sm_90)
_SPLIT_ROW_MIN = 16384  # rows longer than this get chunked statistics (the 160000-sample waveform)

# FLOPs per row element of the statistics passes: shift + sum, then shift, centre and square-add
_STATS_FLOPS = 6
# ... and of applying a norm + leaky ReLU: subtract, multiply-add, select
_APPLY_FLOPS = 4
# epilogue pass per pooled input element: bias, |x|, max
_EPILOGUE_FLOPS = 3

# what executes a dot of each precision (rlx_triton.devices.UNITS); the kernels cast every operand to fp32.
# tf32x3 candidates (true fp32 on TF32 tensor cores) run dot_split: four TF32 products per fp32 product
UNIT_OF_PRECISION = {"ieee": "fp32_fma", "tf32": "tf32", "tf32x3": "tf32x4"}


def _dot_k(block_k: int, interpret: bool) -> int:
    """K width of one tl.dot: 16 on GPUs (an fp32 FMA dot keeps its whole K slice of both operands in
    registers; 16-wide dots keep the pooled kernels spill-free); the whole BLOCK_K in the interpreter,
    where the sum is the same and each op costs per call."""
    return block_k if interpret else min(16, block_k)


def _meta(candidate, interpret: bool = False) -> dict:
    """ConvCandidate -> meta-parameters of `_conv1d_kernel`."""
    return dict(
        BLOCK_P=candidate.tile_pos,
        BLOCK_CO=candidate.tile_co,
        BLOCK_K=candidate.tile_k,
        DOT_K=_dot_k(candidate.tile_k, interpret),
        PRECISION=candidate.precision,
        num_warps=max(1, candidate.tg_size // 32),
        num_stages=candidate.stages,
    )


def _sinc_meta(candidate, interpret: bool = False) -> dict:
    """ConvCandidate -> meta-parameters of `_sinc_conv_kernel` that the candidate alone sets (its position and
    filter tiles follow the bank and the pool too: `sinc_tile`, given at launch)."""
    meta = _meta(candidate, interpret)
    meta.pop("BLOCK_CO")
    meta.pop("BLOCK_P")
    return meta


def _conv_out_len(length: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if tensor is not None else 0


class RowNorm(NamedTuple):
    """Per-(batch, channel) instance norm as an affine map of the centred row, each (B * C,) fp32:
    y = (x - center) * scale + shift, center = the row's first element."""

    center: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor


def conv_flops(grid, meta: dict, reduction: int, pool: int) -> int:
    """FLOPs the dots of a `_conv1d_kernel` launch execute: every program runs POOL phases of the
    reduction in BLOCK_K steps on a full BLOCK_P x BLOCK_CO tile (masked lanes included)."""
    programs = 1
    for g in grid:
        programs *= g
    steps = triton.cdiv(reduction, meta["BLOCK_K"]) * meta["BLOCK_K"]
    return 2 * programs * pool * steps * meta["BLOCK_P"] * meta["BLOCK_CO"]


def _buckets(x) -> tuple:
    """(batch, length) of a (B, C, L) input as the autotune key's powers of two."""
    return triton.next_power_of_2(max(1, x.shape[0])), triton.next_power_of_2(max(1, x.shape[2]))


def _config(candidate) -> triton.Config:
    meta = _meta(candidate, interpret=settings().interpret)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


def _sinc_config(candidate) -> triton.Config:
    meta = _sinc_meta(candidate, interpret=settings().interpret)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    return triton.Config(meta, num_warps=num_warps, num_stages=num_stages)


# Autotune keys: shape buckets and the constexprs that shape the loops (never raw lengths, never tensors).
_TUNE_KEY = ["batch_bucket", "length_bucket", "C_in", "C_out", "conv_stride", "TAPS", "POOL"]
_SINC_TUNE_KEY = ["batch_bucket", "length_bucket", "C_out", "conv_stride", "HALF", "POOL"]
_tuned: dict = {}


def tuned_kernel(name: str = "conv1d"):
    """`_conv1d_kernel` ("conv1d") or `_sinc_conv_kernel` ("sinc") under the autotune bridge, with a config
    per approved fused-epilogue candidate."""
    if name not in _tuned:
        from rlx_triton.backends.triton.autotune import TunedKernel

        candidates = [c for c in all_candidates() if c.fuse_epilogue and c.tag() in APPROVALS]
        kernel, to_config, key = ((_conv1d_kernel, _config, _TUNE_KEY) if name == "conv1d"
                                  else (_sinc_conv_kernel, _sinc_config, _SINC_TUNE_KEY))
        _tuned[name] = TunedKernel(kernel, candidates, to_config, key=key)
    return _tuned[name]


def _tuned_or_none(name: str, candidate, route):
    """The tuned kernel a routed call launches through (None: launch the candidate directly)."""
    if route is None or not candidate.fuse_epilogue:
        return None
    tuned = tuned_kernel(name)
    return tuned if candidate.tag() in tuned.tags else None


def _record(kernel, tuned, candidate, route, grid_for, args, flags, counts, flops_of) -> Launch:
    """A plain launch of `kernel` with the candidate's meta, or a tuned one through the bridge."""
    if tuned is not None:
        config = tuned.config_of(candidate)
        return Launch.tuned(tuned, candidate, grid_for, args, flags, route=route,
                            flops=flops_of(grid_for(config.kwargs), config.kwargs), **counts)
    config = (_sinc_config if kernel is _sinc_conv_kernel else _config)(candidate)
    meta = config.kwargs
    return Launch(kernel, grid_for(meta), args, meta={**flags, **meta}, num_warps=config.num_warps,
                  num_stages=config.num_stages, flops=flops_of(grid_for(meta), meta), **counts)


def _conv_record(x, w2d, w_split, bias, out, *, taps, stride, padding, dilation, pool, abs_, out_slope, in_norm,
                 in_slope, candidate, route=None) -> Launch:
    """out[b, co, q] = leaky(max_j |conv(prologue(x))[b, co, q*pool + j] + bias|); x is (B, C_in, L).

    prologue(x) = leaky((x - center) * scale + shift, in_slope) per input row (in_norm, a RowNorm)."""
    B, C_in, L_in = x.shape
    C_out, L_out = out.shape[1], out.shape[2]
    norm_bytes = 3 * B * C_in * 4 if in_norm is not None else 0
    weight_bytes = _nbytes(w_split) if candidate.precision == "tf32x3" else _nbytes(w2d)
    args = (x, w2d, w_split, bias if bias is not None else w2d, *(in_norm if in_norm is not None else (w2d, w2d, w2d)),
            out,
            C_in, L_in, C_out, L_out,
            x.stride(0), x.stride(1), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            stride, padding, dilation,
            0.0 if in_slope is None else float(in_slope),
            0.0 if out_slope is None else float(out_slope),
            *_buckets(x))
    flags = dict(TAPS=taps, POOL=pool, HAS_BIAS=bias is not None, IN_AFFINE=in_norm is not None,
                 IN_LEAKY=in_slope is not None, ABS=bool(abs_), OUT_LEAKY=out_slope is not None)
    counts = dict(bytes_read=_nbytes(x) + weight_bytes + _nbytes(bias) + norm_bytes, bytes_written=_nbytes(out),
                  unit=UNIT_OF_PRECISION[candidate.precision])

    def grid_for(meta):
        return (triton.cdiv(L_out, meta["BLOCK_P"]), triton.cdiv(C_out, meta["BLOCK_CO"]), B)

    return _record(_conv1d_kernel, _tuned_or_none("conv1d", candidate, route), candidate, route, grid_for, args,
                   flags, counts, lambda grid, meta: conv_flops(grid, meta, C_in * taps, pool))


def sinc_tile(c_out: int, pool: int, candidate, interpret: bool = False) -> Tuple[int, int]:
    """(BLOCK_P, BLOCK_F) of `_sinc_conv_kernel`: pooled positions and filters of each parity (symmetric,
    antisymmetric) one program holds.

    Filters: as many as the candidate's channel tile allows, all of them where they fit (SincNet's 40 + 40
    in 64 + 64 lanes: each sample's preparation, not the MMAs, is what an output costs, and every filter a
    program holds shares it); at least the 8 lanes of a TF32 MMA's N. Positions: the candidate's tile_pos,
    halved while the two accumulators (PHASES x BLOCK_P rows by BLOCK_F, fp32) would take more than 64
    registers of a thread on tensor cores or 16 on the FMA path (its dot holds broadcast operand rows beside
    them), past which they spill (the compile audit's sm_80 and sm_90 counts). The interpreter has no
    register file to outgrow: it takes the candidate's tile, where fewer programs cost less."""
    block_f = max(8, min(candidate.tile_co, triton.next_power_of_2(max(1, c_out // 2))))
    block_p = candidate.tile_pos
    if not interpret:
        budget = (64 if candidate.precision != "ieee" else 16) * candidate.tg_size
        rows = triton.next_power_of_2(pool)
        while 2 * rows * block_p * block_f > budget and rows * block_p > 16:
            block_p //= 2
    return block_p, block_f


def sinc_flops(grid, meta, half: int, pool: int, block_p: int, block_f: int) -> int:
    """FLOPs the dots of a `_sinc_conv_kernel` launch execute: HALF + 1 pre-added taps in BLOCK_K steps on
    PHASES x BLOCK_P rows (POOL rounded up to a power of two) x 2 BLOCK_F filters per program (masked lanes
    and rows included)."""
    programs = 1
    for g in grid:
        programs *= g
    steps = triton.cdiv(half + 1, meta["BLOCK_K"]) * meta["BLOCK_K"]
    return 2 * programs * triton.next_power_of_2(pool) * steps * block_p * 2 * block_f


def _sinc_record(x, bank, out, *, stride, pool, abs_, in_norm, candidate, route=None) -> Launch:
    """out[b, c, q] = max_j |sinc conv(n(x))[b, c, q*pool + j]| with the filters' symmetry (_sinc_conv_kernel)."""
    w_half, w_split, tap_sum = bank
    B, _, L_in = x.shape
    C_out, L_out = out.shape[1], out.shape[2]
    half = w_half.shape[0] - 1
    weight_bytes = _nbytes(w_split) if candidate.precision == "tf32x3" else _nbytes(w_half)
    args = (x, w_half, w_split, tap_sum, *in_norm, out,
            L_in, C_out, L_out,
            x.stride(0), x.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            stride, *_buckets(x))
    counts = dict(bytes_read=_nbytes(x) + weight_bytes + _nbytes(tap_sum) + 3 * B * 4, bytes_written=_nbytes(out),
                  unit=UNIT_OF_PRECISION[candidate.precision])

    block_p, block_f = sinc_tile(C_out, pool, candidate, interpret=settings().interpret)

    def grid_for(meta):
        return (triton.cdiv(L_out, block_p), triton.cdiv(C_out // 2, block_f), B)

    return _record(_sinc_conv_kernel, _tuned_or_none("sinc", candidate, route), candidate, route, grid_for, args,
                   dict(HALF=half, POOL=pool, PHASES=triton.next_power_of_2(pool), ABS=bool(abs_), BLOCK_P=block_p,
                        BLOCK_F=block_f), counts,
                   lambda grid, meta: sinc_flops(grid, meta, half, pool, block_p, block_f))


def _epilogue_record(y, bias, out, *, pool, abs_, out_slope) -> Launch:
    B, C, L_conv = y.shape
    L_out = out.shape[2]
    BLOCK = min(_ROW_BLOCK_MAX, triton.next_power_of_2(max(L_out, 16)))
    pooled = B * C * L_out * pool
    return Launch(
        _epilogue_kernel, (B * C, triton.cdiv(L_out, BLOCK)),
        (y, bias if bias is not None else y, out,
         C, L_conv, L_out,
         y.stride(0), y.stride(1), y.stride(2),
         out.stride(0), out.stride(1), out.stride(2),
         0.0 if out_slope is None else float(out_slope)),
        meta=dict(POOL=pool, HAS_BIAS=bias is not None, ABS=bool(abs_), OUT_LEAKY=out_slope is not None,
                  BLOCK=BLOCK),
        num_warps=4, bytes_read=pooled * y.element_size() + _nbytes(bias), bytes_written=_nbytes(out),
        flops=_EPILOGUE_FLOPS * pooled)


def _conv_block_plan(x, weight, bias, *, stride, padding, dilation, pool, abs_, out_slope, out_dtype,
                     in_norm=None, in_slope=None, candidate, route=None, symmetric=False):
    """(records, out) of one conv with its epilogue, fused in the conv kernel or as a second pass
    (fuse_epilogue); no records for an empty output. symmetric: the conv is SincNet's sinc conv of a
    symmetric bank (symmetric_bank) with the waveform norm and no bias, run by `_sinc_conv_kernel`."""
    B, _, L_in = x.shape
    taps = weight.shape[2]
    L_conv = _conv_out_len(L_in, taps, stride, padding, dilation)
    L_out = L_conv // pool
    out = torch.empty((B, weight.shape[0], L_out), device=x.device, dtype=out_dtype)
    if out.numel() == 0:
        return [], out
    plain = pool == 1 and not abs_ and out_slope is None
    fused = candidate.fuse_epilogue or plain
    target = out if fused else torch.empty((B, weight.shape[0], L_conv), device=x.device, dtype=torch.float32)
    if symmetric:
        conv = _sinc_record(x, _sinc_bank(weight), target, stride=stride, pool=pool if fused else 1,
                            abs_=abs_ and fused, in_norm=in_norm, candidate=candidate, route=route)
    else:
        w2d = _packed_weight(weight)
        # the split weights, for a tf32x3 launch or a tuned one (whose configs include tf32x3 candidates)
        split = candidate.precision == "tf32x3" or _tuned_or_none("conv1d", candidate, route) is not None
        w_split = _split_weight(weight) if split else w2d
        conv = _conv_record(x, w2d, w_split, bias.contiguous() if bias is not None and fused else None, target,
                            taps=taps, stride=stride, padding=padding, dilation=dilation, pool=pool if fused else 1,
                            abs_=abs_ and fused, out_slope=out_slope if fused else None, in_norm=in_norm,
                            in_slope=in_slope, candidate=candidate, route=route)
    if fused:
        return [conv], out
    bias = bias.contiguous() if bias is not None else None
    return [conv, _epilogue_record(target, bias, out, pool=pool, abs_=abs_, out_slope=out_slope)], out


def _split_rows(length: int) -> bool:
    """Whether rows of `length` get chunked statistics (two launches) instead of one serial walk per row."""
    return length > _SPLIT_ROW_MIN


def _row_norm_plan(x, weight, bias, *, eps, slope=None, out=None, split=None):
    """(records, RowNorm) of the instance-norm statistics of every (batch, channel) row of x.

    With `out` given, the one-pass kernel also writes out = leaky_relu((x - center) * scale + shift, slope).
    split: chunked statistics (default: rows longer than _SPLIT_ROW_MIN; never with `out`)."""
    B, C, L = x.shape
    n_rows = B * C
    center, scale, shift = (torch.empty(n_rows, device=x.device, dtype=torch.float32) for _ in range(3))
    weight = weight.contiguous() if weight is not None else None
    bias = bias.contiguous() if bias is not None else None
    affine_bytes = _nbytes(weight) + _nbytes(bias)
    stats_bytes = 3 * n_rows * 4
    split = _split_rows(L) if split is None else split
    if out is None and split:
        # long rows: chunk statistics in parallel, then one merge, instead of a serial walk per row
        n_chunks = triton.cdiv(L, _STATS_CHUNK)
        part = torch.empty((n_rows, n_chunks, 2), device=x.device, dtype=torch.float32)
        partial = Launch(
            _row_partial_stats_kernel, (n_rows, n_chunks),
            (x, part, center, C, L, n_chunks, x.stride(0), x.stride(1), x.stride(2)),
            meta=dict(CHUNK=_STATS_CHUNK, BLOCK_L=min(_STATS_BLOCK, _STATS_CHUNK)), num_warps=4,
            bytes_read=_nbytes(x), bytes_written=_nbytes(part) + n_rows * 4, flops=_STATS_FLOPS * x.numel())
        BLOCK_C = triton.next_power_of_2(n_chunks)
        BLOCK_R = max(1, min(16, _ROW_TILE // BLOCK_C))
        combine = Launch(
            _row_combine_stats_kernel, (triton.cdiv(n_rows, BLOCK_R),),
            (part, weight if weight is not None else scale, bias if bias is not None else shift,
             scale, shift, n_rows, C, L, n_chunks, float(eps)),
            meta=dict(HAS_AFFINE=weight is not None, CHUNK=_STATS_CHUNK, BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C),
            num_warps=4, bytes_read=_nbytes(part) + affine_bytes, bytes_written=2 * n_rows * 4,
            flops=_STATS_FLOPS * part.numel())
        return [partial, combine], RowNorm(center, scale, shift)
    BLOCK_L = min(_ROW_BLOCK_MAX, triton.next_power_of_2(max(L, 16)))
    # rows that fit a tile whole are packed several per program; long rows get a program each
    BLOCK_R = max(1, min(16, _ROW_TILE // triton.next_power_of_2(max(L, 1))))
    target = out if out is not None else x
    record = Launch(
        _row_norm_kernel, (triton.cdiv(n_rows, BLOCK_R),),
        (x, weight if weight is not None else scale, bias if bias is not None else shift,
         center, scale, shift, target,
         n_rows, C, L,
         x.stride(0), x.stride(1), x.stride(2),
         target.stride(0), target.stride(1), target.stride(2),
         float(eps), 0.0 if slope is None else float(slope)),
        meta=dict(HAS_AFFINE=weight is not None, APPLY=out is not None, BLOCK_R=BLOCK_R, BLOCK_L=BLOCK_L),
        num_warps=4, bytes_read=_nbytes(x) + affine_bytes, bytes_written=stats_bytes + _nbytes(out),
        flops=(_STATS_FLOPS + (_APPLY_FLOPS if out is not None else 0)) * x.numel())
    return [record], RowNorm(center, scale, shift)


def _conv_block(x, weight, bias, *, candidate, **options):
    """Runs `_conv_block_plan` (one conv and its epilogue); returns the output."""
    records, out = _conv_block_plan(x, weight, bias, candidate=candidate, **options)
    launches.run(records)
    return out


def _row_norm(x, weight, bias, *, eps, slope=None, out=None) -> RowNorm:
    """Runs `_row_norm_plan`: the RowNorm of every (batch, channel) row of x (and `out`, when given)."""
    records, norm = _row_norm_plan(x, weight, bias, eps=eps, slope=slope, out=out)
    launches.run(records)
    return norm


def conv1d_plan(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate,
                route=None):
    """(records, out) of `conv1d`."""
    pool = 1 if epilogue is None else int(epilogue.pool)
    abs_ = False if epilogue is None else bool(epilogue.abs)
    slope = None if epilogue is None else epilogue.negative_slope
    return _conv_block_plan(input, weight, bias, stride=stride, padding=padding, dilation=dilation, pool=pool,
                            abs_=abs_, out_slope=slope, out_dtype=input.dtype, candidate=candidate, route=route)


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *, epilogue=None, candidate, route=None):
    """F.conv1d (groups=1) on a (B, C_in, L) input, then the optional epilogue
    (epilogue.abs, epilogue.pool, epilogue.negative_slope: bias -> |x| -> max-pool -> leaky ReLU).

    With the router's `route` a fused launch goes through the autotune bridge (the routed candidate is
    injected; a cold bucket may be tuned among the approved candidates where tuning is on)."""
    plan, out = conv1d_plan(input, weight, bias, stride, padding, dilation, epilogue=epilogue, candidate=candidate,
                            route=route)
    launches.run(plan)
    return out


def _sinc_length(samples: int, taps: int, stride: int, pool: int) -> int:
    """Frames after the sinc conv and its pool: the longest row SincNet normalizes after the waveform."""
    return _conv_out_len(samples, taps, stride, 0, 1) // pool


def sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                 norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
                 candidate, route=None):
    """(records, out) of `sincnet`.

    The sinc conv runs `_sinc_conv_kernel` (the filters' symmetry) for a bank sinc_filters built
    (symmetric_bank), else `_conv1d_kernel`. The block statistics are chunked for every block when the
    sinc output is longer than _SPLIT_ROW_MIN (so the launch count follows from the request: launch_count)."""
    x = waveforms
    records = []
    # 1. waveform instance norm, folded into the sinc conv's input prologue
    step, norm = _row_norm_plan(x, wav_norm_weight, wav_norm_bias, eps=eps)
    records += step
    step, h = _conv_block_plan(x, sinc_filters, None, stride=sinc_stride, padding=0, dilation=1, pool=pool,
                               abs_=True, out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=None,
                               candidate=candidate, route=route, symmetric=symmetric_bank(sinc_filters, x.shape[1]))
    records += step
    split = _split_rows(h.shape[2])
    # 2. each Conv1d block reads the previous block's norm + leaky in its prologue
    for i, (w, b) in enumerate(zip(conv_weights, conv_biases)):
        step, norm = _row_norm_plan(h, norm_weights[i], norm_biases[i], eps=eps, split=split)
        records += step
        step, h = _conv_block_plan(h, w, b, stride=1, padding=0, dilation=1, pool=pool, abs_=False,
                                   out_slope=None, out_dtype=torch.float32, in_norm=norm, in_slope=negative_slope,
                                   candidate=candidate, route=route)
        records += step
    # 3. the last block's norm + leaky, written once
    out = torch.empty(h.shape, device=h.device, dtype=waveforms.dtype)
    last = len(conv_weights)
    step, _ = _row_norm_plan(h, norm_weights[last], norm_biases[last], eps=eps, slope=negative_slope, out=out)
    return records + step, out


def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
            norm_weights, norm_biases, *, sinc_stride=10, pool=3, eps=1e-5, negative_slope=0.01,
            candidate, route=None):
    """pyannote SincNet forward (non-streaming) on (B, 1, T) waveforms -> (B, C, frames).

    waveform instance norm -> sinc conv |.| pool -> norm+leaky -> [conv pool -> norm+leaky] per
    entry of conv_weights. norm_weights/norm_biases hold one (affine) instance norm per block. With the
    router's `route` the fused convolutions go through the autotune bridge."""
    plan, out = sincnet_plan(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                             norm_weights, norm_biases, sinc_stride=sinc_stride, pool=pool, eps=eps,
                             negative_slope=negative_slope, candidate=candidate, route=route)
    launches.run(plan)
    return out


def launch_count(request, candidate) -> int:
    """Launches `sincnet` / `conv1d` run for a routed request (the request's fields and features)."""
    fields, features = request.field_map, request.feature_map
    if request.op == "conv1d":
        if fields["batch"] == 0 or fields["c_out"] == 0 or fields["tokens"] == 0:
            return 0
        plain = features["pool"] == 1 and not features["abs"] and not features["leaky"]
        return 1 if candidate.fuse_epilogue or plain else 2
    pool = features["pool"]
    conv_launches = 1 if candidate.fuse_epilogue else 2              # the sinc conv has |x|
    block_launches = 1 if candidate.fuse_epilogue or pool == 1 else 2
    block_stats = 2 if _split_rows(_sinc_length(fields["length"], fields["taps"], fields["stride"], pool)) else 1
    waveform_stats = 2 if _split_rows(fields["length"]) else 1
    blocks = features["blocks"]
    return waveform_stats + conv_launches + blocks * (block_stats + block_launches) + 1


# ----------------------------------------------------------------------------------------------
# candidates (the planner's ConvCandidate; the conv2d package shares these helpers)
# ----------------------------------------------------------------------------------------------


def make_candidate(tile_pos=64, tile_co=32, tile_k=32, tg_size=128, stages=2, precision="ieee",
                   fuse_epilogue=True) -> ConvCandidate:
    return ConvCandidate(tile_pos=tile_pos, tile_co=tile_co, tile_k=tile_k, tg_size=tg_size, stages=stages,
                         precision=precision, fuse_epilogue=fuse_epilogue)


def candidate_tag(candidate: ConvCandidate) -> str:
    return candidate.tag()


def all_candidates() -> list:
    """Every conv candidate of the plan, in plan order (the sweep tests run each one)."""
    return plan_candidates("conv")


def default_candidate() -> ConvCandidate:
    return DEFAULT_VARIANT.candidate()
