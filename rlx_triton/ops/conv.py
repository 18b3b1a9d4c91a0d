"""Public 1-D conv ops: pyannote's SincNet stage and F.conv1d with fused epilogues, routed by the router.

- `sinc_filters(...)`: asteroid's ParamSincFB filters from (low_hz_, band_hz_), built with torch ops
  and cached per weight version (parameter `_version` + data_ptr), so an inference loop builds them once
  (inference tensors, which have no version counter, are rebuilt on every call).
- `sincnet(waveforms, sinc_filters, ...)`: the whole non-streaming SincNet forward.
- `conv1d(input, weight, bias, stride, padding, dilation, *, epilogue=ConvEpilogue(...))`: F.conv1d
  (groups=1) followed by an optional |x| -> max-pool -> leaky ReLU epilogue.

Each op validates its input (ValueError/TypeError naming the argument, before any launch; an input
whose channels do not fit the weight raises InputShapeError, a RuntimeError like torch's and a
ValueError), builds a routing Request from its request spec (`SINCNET_REQUEST`, `CONV1D_REQUEST`, which
`rlx-triton explain` reads too) and runs the backend module the router picks
(backends/triton/conv/, or backends/torch_ref/conv.py). Autograd, float64, odd 'same' padding and
groups are typed refusals (Request features, coverage) that fall back to torch.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from rlx_triton.backends.triton.device_cache import capturing
from rlx_triton.caches import BoundedCache
from rlx_triton.ops._compiled import compiling, options_from, options_text, run_eagerly
from rlx_triton.ops._checks import (FLOAT_DTYPES, backend_module, call_signature, check_device, check_dtype,
                                    check_input_channels, check_int, check_is_tensor, check_shape, check_tensor,
                                    needs_grad)
from rlx_triton.ops._request_spec import Derived, Feature, Features, Given, RequestSpec, Values, flag
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import routed_call

FAMILY = "conv"


@dataclass(frozen=True)
class ConvEpilogue:
    """What follows the convolution, in this order: bias -> |x| (abs) -> max-pool(pool, stride=pool,
    floor mode) -> leaky ReLU (negative_slope; None = no activation)."""

    abs: bool = False
    pool: int = 1
    negative_slope: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.abs, bool):
            raise TypeError(f"epilogue.abs must be a bool, got {self.abs!r}")
        if isinstance(self.pool, bool) or not isinstance(self.pool, int) or self.pool < 1:
            raise ValueError(f"epilogue.pool must be an int >= 1, got {self.pool!r}")
        if self.negative_slope is not None and not isinstance(self.negative_slope, (int, float)):
            raise TypeError(f"epilogue.negative_slope must be a float or None, got {self.negative_slope!r}")


# ------------------------------------------------------------------------------------ validation


def _check_like(name: str, value, ref: torch.Tensor, ref_name: str, shape=None) -> torch.Tensor:
    check_is_tensor(name, value)
    check_device(name, value, ref, ref_name)
    check_dtype(name, value, FLOAT_DTYPES)
    return value if shape is None else check_shape(name, value, shape)


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{name} must be an int or a 1-tuple for conv1d, got {value!r}")
        value = value[0]
    return check_int(name, value, low)


def _conv_len(length: int, taps: int, stride: int, padding: int, dilation: int) -> int:
    return (length + 2 * padding - dilation * (taps - 1) - 1) // stride + 1


# ------------------------------------------------------------------------------------ request specs


def _conv1d_output(f: Values, o: Features) -> int:
    """conv1d's output length before the pool ('same' padding with an odd total keeps the length)."""
    if o["padding_mode"] == "same_asymmetric":
        return f["length"]
    return _conv_len(f["length"], f["taps"], f["stride"], f["padding"], f["dilation"])


def _conv1d_too_short(f: Values, o: Features) -> Optional[str]:
    out_len = _conv1d_output(f, o)
    if out_len < 1:
        return (f"length={f['length']} is shorter than the dilated kernel ({f['dilation'] * (f['taps'] - 1) + 1} "
                f"taps) after padding")
    if out_len // int(o["pool"]) < 1:
        return f"pool={o['pool']} is larger than the conv output length {out_len}"
    return None


def _block_taps(f: Values, o: Features) -> tuple:
    """The kernel size of each SincNet conv block: one int for every block, or one per block."""
    taps = f["block_taps"]
    return tuple(taps) if isinstance(taps, (tuple, list)) else (taps,) * int(o["blocks"])


def _sincnet_frames(f: Values, o: Features) -> int:
    """Frames out of SincNet: the strided sinc conv, then each conv block, every one max-pooled by `pool`."""
    pool = int(o["pool"])
    length = _conv_len(f["length"], f["taps"], f["stride"], 0, 1) // pool
    for taps in _block_taps(f, o):
        length = _conv_len(length, taps, 1, 0, 1) // pool
    return length


def _sincnet_too_short(f: Values, o: Features) -> Optional[str]:
    if len(_block_taps(f, o)) != int(o["blocks"]):
        return f"block_taps names {len(_block_taps(f, o))} conv blocks, but blocks={o['blocks']}"
    frames = _sincnet_frames(f, o)
    if frames < 2:
        # torch's instance_norm refuses a single element per channel ("Expected more than 1 spatial
        # element"), so pyannote's SincNet needs two output frames; so does this op
        return (f"length={f['length']} samples is too short for SincNet, which needs at least two output frames "
                f"(got {max(frames, 0)})")
    return None


_CONV1D_DEFAULTS = "F.conv1d's default"

CONV1D_REQUEST = RequestSpec(
    FAMILY, "conv1d",
    given=(Given("batch"), Given("c_in"), Given("c_out"), Given("length"), Given("taps"),
           Given("stride", 1, _CONV1D_DEFAULTS),
           Given("padding", 0, _CONV1D_DEFAULTS, "zeros added on each side ('same': half the dilated kernel)",
                 low=0),
           Given("dilation", 1, _CONV1D_DEFAULTS, "spacing between kernel taps")),
    derived=(Derived("tokens", lambda f, o: _conv1d_output(f, o) // int(o["pool"]),
                     "((length + 2 x padding - dilation x (taps - 1) - 1) // stride + 1) // pool",
                     ("length", "taps", "stride", "padding", "dilation", "pool", "padding_mode"),
                     "output length after the pool ('same' padding: length // pool)"),),
    features={"groups": Feature(1, (1,)), "padding_mode": Feature("zeros", ("zeros", "same_asymmetric")),
              "pool": Feature(1), "abs": flag(False), "leaky": flag(False), "requires_grad": flag(False)},
    checks=(_conv1d_too_short,),
)

SINCNET_REQUEST = RequestSpec(
    FAMILY, "sincnet",
    given=(Given("batch"), Given("length"),
           Given("c_out", 80, "pyannote's 80 sinc filters"),
           Given("taps", 251, "pyannote's sinc filter length"),
           Given("stride", 10, "pyannote's sinc stride"),
           Given("block_taps", 5, "pyannote's conv blocks",
                 "kernel size of each conv block after the sinc conv (the op may send one per block)")),
    derived=(Derived("c_in", lambda f, o: 1, "1", (), "mono waveforms"),
             Derived("tokens", _sincnet_frames,
                     "frames after the sinc conv (taps, stride) and each conv block (block_taps), each pooled",
                     ("length", "taps", "stride", "block_taps", "pool", "blocks"))),
    features={"groups": Feature(1, (1,)), "padding_mode": Feature("zeros", ("zeros",)), "pool": Feature(3),
              "blocks": Feature(2), "streaming": Feature(False, (False,)), "sample_rate": Feature(16000),
              "requires_grad": flag(False)},
    checks=(_sincnet_too_short,),
)


# ------------------------------------------------------------------------------------ sinc filters

# (parameter versions, options) -> (weak refs to low_hz_ and band_hz_, filters); pinned when a CUDA graph
# capture reads it, and a miss during capture is built in the graph and not cached (its values exist only there)
_FILTER_CACHE: BoundedCache[tuple, tuple] = BoundedCache("sinc_filters")


def sinc_filters(low_hz_: torch.Tensor, band_hz_: torch.Tensor, *, window_: Optional[torch.Tensor] = None,
                 n_: Optional[torch.Tensor] = None, kernel_size: int = 251, sample_rate: float = 16000,
                 min_low_hz: float = 50, min_band_hz: float = 50) -> torch.Tensor:
    """asteroid ParamSincFB.filters(): (2 * n_pairs, 1, kernel_size) cos (even) then sin (odd) filters.

    Built with torch ops in asteroid's exact order (so float32 filters equal pyannote's), once per
    weight version: the cache key holds each parameter's data_ptr and `_version` (bumped by in-place
    updates such as optimizer steps or load_state_dict). When autograd needs the graph, it is rebuilt.
    Inference tensors (parameters created inside torch.inference_mode()) have no version counter and
    can still be changed in place inside inference mode, so their filters are rebuilt on every call
    (80 x 251 values: a few small ops).
    """
    for name, value in (("low_hz_", low_hz_), ("band_hz_", band_hz_)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() != 2 or value.shape[1] != 1:
            raise ValueError(f"{name} must have shape (n_pairs, 1), got {tuple(value.shape)}")
    if low_hz_.shape != band_hz_.shape:
        raise ValueError(f"band_hz_ must have the shape of low_hz_ {tuple(low_hz_.shape)}, "
                         f"got {tuple(band_hz_.shape)}")
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd, got {kernel_size}")
    grad = needs_grad(low_hz_, band_hz_)
    cacheable = not grad and not any(t is not None and t.is_inference() for t in (low_hz_, band_hz_, window_, n_))
    if cacheable:
        extra = tuple((t.data_ptr(), t._version) if t is not None else None for t in (window_, n_))
        key = (low_hz_.data_ptr(), low_hz_._version, band_hz_.data_ptr(), band_hz_._version, low_hz_.device,
               low_hz_.dtype, extra, kernel_size, float(sample_rate), float(min_low_hz), float(min_band_hz))
        cached = _FILTER_CACHE.get(key)
        # a freed parameter's memory can be reused at version 0: the entry holds weak references to
        # the parameters it was built from and counts only for those very tensors
        if cached is not None and cached[0]() is low_hz_ and cached[1]() is band_hz_:
            if capturing(low_hz_.device):
                _FILTER_CACHE.pin(key)
            return cached[2]
        cacheable = not capturing(low_hz_.device)
    half = kernel_size // 2
    if window_ is None:
        n = torch.arange(kernel_size, dtype=torch.float64)
        window_ = (0.54 - 0.46 * torch.cos(2 * math.pi * n / (kernel_size - 1)))[:half].float()
    if n_ is None:
        n_ = 2 * math.pi * (torch.arange(-half, 0.0).view(1, -1) / sample_rate)
    # float16/bfloat16 parameters: the phases (up to ~400 rad) need float32 math; the filters are
    # rounded to the parameter dtype once at the end
    math_dtype = torch.float32 if low_hz_.dtype in (torch.float16, torch.bfloat16) else low_hz_.dtype
    window_ = window_.to(device=low_hz_.device, dtype=math_dtype)
    n_ = n_.to(device=low_hz_.device, dtype=math_dtype)
    # a cached result is built as a normal tensor even inside inference mode: a later call outside it
    # may hand it to autograd (gradients with respect to the waveform), which cannot save inference tensors
    with torch.inference_mode(torch.is_inference_mode_enabled() and not cacheable), torch.set_grad_enabled(grad):
        low = min_low_hz + torch.abs(low_hz_.to(math_dtype))
        high = torch.clamp(low + min_band_hz + torch.abs(band_hz_.to(math_dtype)), min_low_hz, sample_rate / 2)
        band = (high - low)[:, 0]
        ft_low = torch.matmul(low, n_)
        ft_high = torch.matmul(high, n_)
        cos_left = ((torch.sin(ft_high) - torch.sin(ft_low)) / (n_ / 2)) * window_
        cos_bp = torch.cat([cos_left, 2 * band.view(-1, 1), torch.flip(cos_left, dims=[1])], dim=1)
        sin_left = ((torch.cos(ft_low) - torch.cos(ft_high)) / (n_ / 2)) * window_
        sin_bp = torch.cat([sin_left, torch.zeros_like(band.view(-1, 1)), -torch.flip(sin_left, dims=[1])], dim=1)
        pairs = low_hz_.shape[0]
        filters = torch.cat([(cos_bp / (2 * band[:, None])).view(pairs, 1, kernel_size),
                             (sin_bp / (2 * band[:, None])).view(pairs, 1, kernel_size)], dim=0)
        filters = filters.to(low_hz_.dtype)
    if cacheable:
        filters = _FILTER_CACHE.put(key, (weakref.ref(low_hz_), weakref.ref(band_hz_), filters),
                                    replace_stale=lambda held: held[0]() is None or held[1]() is None)[2]
    _remember_sinc_bank(filters)
    return filters


# filter banks sinc_filters built: id -> (weak reference, data_ptr, version or None for inference tensors)
_SINC_BANKS: BoundedCache[int, tuple] = BoundedCache("sinc_banks")


def _remember_sinc_bank(filters: torch.Tensor) -> None:
    version = None if filters.is_inference() else filters._version
    entry = (weakref.ref(filters), filters.data_ptr(), version)
    # an id outlives its tensor: an entry of a dead bank is replaced, a live one is the same bank
    _SINC_BANKS.put(id(filters), entry, replace_stale=lambda held: held[0]() is not filters)


def is_sinc_filter_bank(filters: torch.Tensor) -> bool:
    """Whether `filters` is a bank sinc_filters built, unchanged since: its first half symmetric about the
    centre tap and its second half antisymmetric, exactly (cos_bp and sin_bp are built from one flipped
    half), which kernels may exploit. An in-place edit of a normal tensor shows in its version counter;
    an inference tensor has none, so an edit of it inside inference mode between sinc_filters and the op
    is not seen (pass a copy, which is not a registered bank, to use arbitrary filters)."""
    entry = _SINC_BANKS.get(id(filters))
    if entry is None or entry[0]() is not filters or entry[1] != filters.data_ptr():
        return False
    return entry[2] is None or (not filters.is_inference() and entry[2] == filters._version)


def mark_copy_of_sinc_bank(original: torch.Tensor, copy: torch.Tensor) -> None:
    """Registers `copy` as a sinc_filters bank where `original` is one: a speed model plans a call on meta
    copies of its arguments, and the plan must take the kernel the call itself takes (the symmetric one)."""
    if is_sinc_filter_bank(original):
        _remember_sinc_bank(copy)


# ------------------------------------------------------------------------------------ sincnet


def _sincnet_request(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                     norm_weights, norm_biases, *, stride: int = 10, pool: int = 3, eps: float = 1e-5,
                     negative_slope: float = 0.01, sample_rate: int = 16000) -> Request:
    check_tensor("waveforms", waveforms, (3,), SINCNET_REQUEST.dtypes)
    if waveforms.shape[1] != 1:
        # pyannote's SincNet raises ValueError here too (its InstanceNorm1d(1) sees the channels)
        raise ValueError(f"waveforms must have shape (batch, 1, samples): expected 1 channel, got "
                         f"{waveforms.shape[1]} (shape {tuple(waveforms.shape)})")
    _check_like("sinc_filters", sinc_filters, waveforms, "waveforms")
    if sinc_filters.dim() != 3 or sinc_filters.shape[1] != 1:
        raise ValueError(f"sinc_filters must have shape (filters, 1, taps), got {tuple(sinc_filters.shape)}")
    stride = _check_int("stride", stride, 1)
    pool = _check_int("pool", pool, 1)
    conv_weights, conv_biases = list(conv_weights), list(conv_biases)
    norm_weights, norm_biases = list(norm_weights), list(norm_biases)
    if len(conv_biases) != len(conv_weights):
        raise ValueError(f"conv_biases must have one entry per conv weight ({len(conv_weights)}), "
                         f"got {len(conv_biases)}")
    if len(norm_weights) != len(conv_weights) + 1 or len(norm_biases) != len(conv_weights) + 1:
        raise ValueError(f"norm_weights and norm_biases need one entry per block ({len(conv_weights) + 1}), "
                         f"got {len(norm_weights)} and {len(norm_biases)}")
    _check_like("wav_norm_weight", wav_norm_weight, waveforms, "waveforms", (1,))
    _check_like("wav_norm_bias", wav_norm_bias, waveforms, "waveforms", (1,))
    channels = sinc_filters.shape[0]
    for i in range(len(conv_weights) + 1):
        _check_like(f"norm_weights[{i}]", norm_weights[i], waveforms, "waveforms", (channels,))
        _check_like(f"norm_biases[{i}]", norm_biases[i], waveforms, "waveforms", (channels,))
        if i == len(conv_weights):
            break
        w = _check_like(f"conv_weights[{i}]", conv_weights[i], waveforms, "waveforms")
        if w.dim() != 3 or w.shape[1] != channels:
            raise ValueError(f"conv_weights[{i}] must have shape (out, {channels}, taps), got {tuple(w.shape)}")
        _check_like(f"conv_biases[{i}]", conv_biases[i], waveforms, "waveforms", (w.shape[0],))
        channels = w.shape[0]
    given = {"batch": waveforms.shape[0], "length": waveforms.shape[2], "c_out": sinc_filters.shape[0],
             "taps": sinc_filters.shape[2], "stride": stride, "block_taps": tuple(w.shape[2] for w in conv_weights)}
    tensors = [waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, *conv_weights, *conv_biases,
               *norm_weights, *norm_biases]
    features = {"groups": 1, "padding_mode": "zeros", "pool": pool, "blocks": len(conv_weights), "streaming": False,
                "sample_rate": int(sample_rate), "requires_grad": needs_grad(*tensors)}
    frames = _sincnet_frames(given, features)
    if frames < 2:
        # torch's instance_norm refuses a single element per channel ("Expected more than 1 spatial
        # element"), so pyannote's SincNet needs two output frames; so does this op
        raise ValueError(f"waveforms has {waveforms.shape[2]} samples: too short for SincNet, which needs at "
                         f"least two output frames (got {max(frames, 0)})")
    if not (isinstance(eps, float) and eps > 0):
        raise ValueError(f"eps must be a positive float, got {eps!r}")
    return SINCNET_REQUEST.make(given, features, tensor=waveforms)


@routed_op(_sincnet_request)
def sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
            norm_weights, norm_biases, *, stride: int = 10, pool: int = 3, eps: float = 1e-5,
            negative_slope: float = 0.01, sample_rate: int = 16000) -> torch.Tensor:
    """pyannote SincNet (non-streaming) on (batch, 1, samples) waveforms -> (batch, channels, frames).

    waveform InstanceNorm1d(1, affine) -> conv(sinc_filters, stride) -> |x| -> max-pool(pool) ->
    InstanceNorm1d(affine) -> leaky ReLU, then per (conv_weights[i], conv_biases[i]): conv -> max-pool ->
    InstanceNorm1d(norm_weights[i+1], norm_biases[i+1]) -> leaky ReLU. A call whose signature (shapes,
    dtypes, devices, autograd, options) repeats an earlier one is not validated or routed again.
    """
    if compiling():
        tensors = (waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                   norm_biases)
        options = dict(stride=stride, pool=pool, eps=eps, negative_slope=negative_slope, sample_rate=sample_rate)
        if needs_grad(*tensors, *conv_weights, *conv_biases, *norm_weights, *norm_biases):
            return run_eagerly(sincnet, *tensors, **options)
        return _sincnet_op(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, list(conv_weights),
                           list(conv_biases), list(norm_weights), list(norm_biases), options_text(**options))
    signature = call_signature("sincnet", (waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights,
                                           conv_biases, norm_weights, norm_biases),
                               (stride, pool, eps, negative_slope, sample_rate))
    r = routed_call(signature, lambda: _sincnet_request(
        waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
        norm_biases, stride=stride, pool=pool, eps=eps, negative_slope=negative_slope, sample_rate=sample_rate),
        lambda: (sincnet, (waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                           norm_weights, norm_biases),
                 dict(stride=stride, pool=pool, eps=eps, negative_slope=negative_slope, sample_rate=sample_rate)))
    return backend_module(r).sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, list(conv_weights),
                            list(conv_biases), list(norm_weights), list(norm_biases), sinc_stride=stride,
                            pool=pool, eps=eps, negative_slope=negative_slope, candidate=r.candidate, route=r)


@torch.library.custom_op("rlx_triton::sincnet", mutates_args=())
def _sincnet_op(waveforms: torch.Tensor, sinc_filters: torch.Tensor, wav_norm_weight: torch.Tensor,
                wav_norm_bias: torch.Tensor, conv_weights: List[torch.Tensor], conv_biases: List[torch.Tensor],
                norm_weights: List[torch.Tensor], norm_biases: List[torch.Tensor], options: str) -> torch.Tensor:
    """sincnet under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return sincnet(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                   norm_biases, **options_from(options)).contiguous()


@_sincnet_op.register_fake
def _sincnet_fake(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                  norm_biases, options):
    request = _sincnet_request(waveforms, sinc_filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                               norm_weights, norm_biases, **options_from(options))
    channels = conv_weights[-1].shape[0] if conv_weights else sinc_filters.shape[0]
    return waveforms.new_empty((waveforms.shape[0], channels, request.field_map["tokens"]))


def sincnet_from_bands(waveforms, low_hz_, band_hz_, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases,
                       norm_weights, norm_biases, *, window_: Optional[torch.Tensor] = None,
                       n_: Optional[torch.Tensor] = None, kernel_size: int = 251, filter_sample_rate: float = 16000,
                       min_low_hz: float = 50, min_band_hz: float = 50, stride: int = 10, pool: int = 3,
                       eps: float = 1e-5, negative_slope: float = 0.01, sample_rate: int = 16000) -> torch.Tensor:
    """sincnet on the filters sinc_filters builds from (low_hz_, band_hz_): rt.nn.SincNet's forward. Under
    torch.compile the filters are built where the op runs, when the graph runs (cached per parameter version, the
    symmetric kernel's banks, as in eager mode), so the compiled forward takes the eager one's route."""
    options: Dict[str, Any] = dict(stride=stride, pool=pool, eps=eps, negative_slope=negative_slope,
                                   sample_rate=sample_rate)
    if compiling():
        if needs_grad(waveforms, low_hz_, band_hz_, wav_norm_weight, wav_norm_bias, *conv_weights, *conv_biases,
                      *norm_weights, *norm_biases):
            return run_eagerly(sincnet_from_bands, waveforms, low_hz_, band_hz_, wav_norm_weight, wav_norm_bias,
                               conv_weights, conv_biases, norm_weights, norm_biases, window_=window_, n_=n_,
                               kernel_size=kernel_size, filter_sample_rate=filter_sample_rate, min_low_hz=min_low_hz,
                               min_band_hz=min_band_hz, **options)
        return _sincnet_bands_op(waveforms, low_hz_, band_hz_, window_, n_, wav_norm_weight, wav_norm_bias,
                                 list(conv_weights), list(conv_biases), list(norm_weights), list(norm_biases),
                                 options_text(kernel_size=kernel_size, filter_sample_rate=filter_sample_rate,
                                              min_low_hz=min_low_hz, min_band_hz=min_band_hz, **options))
    filters = sinc_filters(low_hz_, band_hz_, window_=window_, n_=n_, kernel_size=kernel_size,
                           sample_rate=filter_sample_rate, min_low_hz=min_low_hz, min_band_hz=min_band_hz)
    return sincnet(waveforms, filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                   norm_biases, **options)


def _bands_options(options: str) -> tuple:
    """(filter options, sincnet options) of a `_sincnet_bands_op` option string."""
    values = options_from(options)
    filters = dict(kernel_size=values.pop("kernel_size"), sample_rate=values.pop("filter_sample_rate"),
                   min_low_hz=values.pop("min_low_hz"), min_band_hz=values.pop("min_band_hz"))
    return filters, values


@torch.library.custom_op("rlx_triton::sincnet_bands", mutates_args=())
def _sincnet_bands_op(waveforms: torch.Tensor, low_hz_: torch.Tensor, band_hz_: torch.Tensor,
                      window_: Optional[torch.Tensor], n_: Optional[torch.Tensor], wav_norm_weight: torch.Tensor,
                      wav_norm_bias: torch.Tensor, conv_weights: List[torch.Tensor], conv_biases: List[torch.Tensor],
                      norm_weights: List[torch.Tensor], norm_biases: List[torch.Tensor],
                      options: str) -> torch.Tensor:
    """sincnet_from_bands under torch.compile: filters and sincnet, eagerly, when the compiled graph runs."""
    filter_options, sincnet_options = _bands_options(options)
    filters = sinc_filters(low_hz_, band_hz_, window_=window_, n_=n_, **filter_options)
    return sincnet(waveforms, filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                   norm_biases, **sincnet_options).contiguous()


@_sincnet_bands_op.register_fake
def _sincnet_bands_fake(waveforms, low_hz_, band_hz_, window_, n_, wav_norm_weight, wav_norm_bias, conv_weights,
                        conv_biases, norm_weights, norm_biases, options):
    filter_options, sincnet_options = _bands_options(options)
    filters = low_hz_.new_empty((2 * low_hz_.shape[0], 1, filter_options["kernel_size"]))
    return _sincnet_fake(waveforms, filters, wav_norm_weight, wav_norm_bias, conv_weights, conv_biases, norm_weights,
                         norm_biases, options_text(**sincnet_options))


# ------------------------------------------------------------------------------------ conv1d


def _padding(padding, taps: int, stride: int, dilation: int):
    """(left == right padding or None, padding_mode feature) for torch's int / 1-tuple / 'valid' / 'same'."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, "zeros"
        if padding == "same":
            if stride != 1:
                raise ValueError("padding='same' is not supported for strided convolutions (stride must be 1)")
            total = dilation * (taps - 1)
            return (total // 2, "zeros") if total % 2 == 0 else (None, "same_asymmetric")
        raise ValueError(f"padding must be an int, 'valid' or 'same', got {padding!r}")
    return _check_int("padding", padding, 0), "zeros"


def _conv1d_request(input, weight, bias=None, stride=1, padding=0, dilation=1, *,
                    epilogue: Optional[ConvEpilogue] = None) -> Request:
    check_tensor("input", input, (2, 3), CONV1D_REQUEST.dtypes)
    check_tensor("weight", weight, (3,), FLOAT_DTYPES)
    if weight.device != input.device:
        raise ValueError(f"weight is on {weight.device} but input is on {input.device}")
    if weight.dtype != input.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match input dtype {input.dtype}")
    check_input_channels(input, weight, channel_dim=input.dim() - 2)
    c_in = input.shape[-2]
    if bias is not None:
        _check_like("bias", bias, input, "input", (weight.shape[0],))
        if bias.dtype != input.dtype:
            raise TypeError(f"bias dtype {bias.dtype} must match input dtype {input.dtype}")
    stride = _check_int("stride", stride, 1)
    dilation = _check_int("dilation", dilation, 1)
    if epilogue is not None and not isinstance(epilogue, ConvEpilogue):
        raise TypeError(f"epilogue must be a ConvEpilogue or None, got {type(epilogue).__name__}")
    taps = weight.shape[2]
    pad, mode = _padding(padding, taps, stride, dilation)
    length = input.shape[-1]
    pool = 1 if epilogue is None else epilogue.pool
    given = {"batch": input.shape[0] if input.dim() == 3 else 1, "c_in": c_in, "c_out": weight.shape[0],
             "length": length, "taps": taps, "stride": stride, "padding": 0 if pad is None else pad,
             "dilation": dilation}
    features = {"groups": 1, "padding_mode": mode, "pool": pool,
                "abs": False if epilogue is None else epilogue.abs,
                "leaky": epilogue is not None and epilogue.negative_slope is not None,
                "requires_grad": needs_grad(input, weight, bias)}
    out_len = _conv1d_output(given, features)
    if out_len < 1:
        raise ValueError(f"input length {length} is shorter than the dilated kernel "
                         f"({dilation * (taps - 1) + 1} taps) after padding")
    if out_len // pool < 1:
        raise ValueError(f"epilogue.pool={pool} is larger than the conv output length {out_len}")
    return CONV1D_REQUEST.make(given, features, tensor=input)


@routed_op(_conv1d_request)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, *,
           epilogue: Optional[ConvEpilogue] = None) -> torch.Tensor:
    """torch.nn.functional.conv1d (groups=1) on (batch, c_in, length) or (c_in, length) input, then the
    optional epilogue (ConvEpilogue: |x| -> max-pool -> leaky ReLU) fused into the kernel. A call whose
    signature (shapes, dtypes, devices, autograd, options) repeats an earlier one is not validated or routed
    again."""
    if compiling():
        if needs_grad(input, weight, bias):
            return run_eagerly(conv1d, input, weight, bias, stride, padding, dilation, epilogue=epilogue)
        return _conv1d_op(input, weight, bias, options_text(stride=stride, padding=padding, dilation=dilation,
                                                            epilogue=_epilogue_values(epilogue)))
    signature = call_signature("conv1d", (input, weight, bias), (stride, padding, dilation, epilogue))
    r = routed_call(signature, lambda: _conv1d_request(input, weight, bias, stride, padding, dilation,
                                                       epilogue=epilogue),
                    lambda: (conv1d, (input, weight, bias, stride, padding, dilation), {"epilogue": epilogue}))
    stride, dilation = _check_int("stride", stride, 1), _check_int("dilation", dilation, 1)
    pad, mode = _padding(padding, weight.shape[2], stride, dilation)
    unbatched = input.dim() == 2
    x = input.unsqueeze(0) if unbatched else input
    out = backend_module(r).conv1d(x, weight, bias, stride, padding if mode != "zeros" else pad, dilation,
                          epilogue=epilogue, candidate=r.candidate, route=r)
    return out.squeeze(0) if unbatched else out


def _epilogue_values(epilogue):
    """A ConvEpilogue as the literal a custom op's option string holds (anything else as is: validation judges it)."""
    if isinstance(epilogue, ConvEpilogue):
        return ("ConvEpilogue", epilogue.abs, epilogue.pool, epilogue.negative_slope)
    return epilogue


def _conv1d_options(options: str) -> dict:
    values = options_from(options)
    epilogue = values["epilogue"]
    if isinstance(epilogue, tuple) and epilogue[:1] == ("ConvEpilogue",):
        values["epilogue"] = ConvEpilogue(*epilogue[1:])
    return values


@torch.library.custom_op("rlx_triton::conv1d", mutates_args=())
def _conv1d_op(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], options: str) -> torch.Tensor:
    """conv1d under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return conv1d(input, weight, bias, **_conv1d_options(options)).contiguous()


@_conv1d_op.register_fake
def _conv1d_fake(input, weight, bias, options):
    values = _conv1d_options(options)
    request = _conv1d_request(input, weight, bias, values["stride"], values["padding"], values["dilation"],
                              epilogue=values["epilogue"])
    length = request.field_map["tokens"]
    return input.new_empty((weight.shape[0], length) if input.dim() == 2 else (input.shape[0], weight.shape[0], length))
