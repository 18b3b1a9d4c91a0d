"""Public fbank op: Kaldi log-mel filterbank features with torchaudio.compliance.kaldi.fbank's keywords.

    feats = rlx_triton.fbank(waveform, num_mel_bins=80, window_type="hamming", dither=0.0)

Every keyword and default of torchaudio's kaldi.fbank is accepted, in the same order, plus one
keyword-only extension, `input_scale` (the waveform is multiplied by it first; pyannote's WeSpeaker
front end uses 32768). Options are validated once per option set (an `FbankOptions`, frozen and
hashable); a bad option, or a waveform shorter than one frame, raises ValueError naming the option
before any kernel runs. The router then picks the backend: the fused Triton kernel
(`backends/triton/fbank/`) or the torch implementation (`backends/torch_ref/fbank.py`).

Shapes (torchaudio's `channel` keyword decides how 2-D input is read):
- (T,)                       -> (frames, bins)
- (1, T), channel=-1         -> (frames, bins): torchaudio's mono form, same values and shape
- (C, T), channel=c >= 0     -> (frames, bins) of row c, as torchaudio
- (B, T), B > 1, channel=-1  -> (B, frames, bins): each row is one mono waveform (rlx extension;
                                torchaudio would read channel 0 only). A batch whose size may be 1
                                should use the 3-D form, whose output shape never collapses.
- (B, C, T)                  -> (B, frames, bins): torch.vmap(kaldi.fbank) over B, as pyannote calls it
                                (channel -1 reads channel 0, as torchaudio does)
bins = num_mel_bins + use_energy. float32 input gives float32 (torchaudio's numbers); float64 gives
float64 (torch path); float16/bfloat16 input is read as is and features are computed and returned in
float32. A signal shorter than min_duration gives an empty tensor, as torchaudio.

dither > 0 adds fresh Gaussian noise per frame sample on every call, as torchaudio does (results
are random); such calls run on the torch path, because the noise is drawn per frame sample (frames
overlap) and cannot be added to the waveform before the kernel. So do calls that need autograd.
"""
from __future__ import annotations

import functools
from typing import Tuple

import torch

from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.caches import LIMITS
from rlx_triton.ops._checks import FLOAT_DTYPES, call_signature, check_dtype, check_is_tensor, needs_grad
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import Route, routed_call

FAMILY = "fbank"


def make_options(**kwargs) -> FbankOptions:
    """FbankOptions from torchaudio keywords (validated once per distinct option set, then cached)."""
    values = tuple(kwargs.values())
    try:
        # the value types are part of the key: 1, 1.0 and True are equal but not equally valid
        return _cached_options(tuple(kwargs), values, tuple(map(type, values)))
    except TypeError:  # an unhashable value, or what validation refuses: validation names the option
        return _validated_options(kwargs)


@functools.lru_cache(maxsize=LIMITS["fbank_options"])  # functools' LRU is thread-safe
def _cached_options(names: Tuple[str, ...], values: tuple, _types: tuple) -> FbankOptions:
    return _validated_options(dict(zip(names, values)))


def _validated_options(kwargs: dict) -> FbankOptions:
    unknown = sorted(set(kwargs) - set(FbankOptions.__dataclass_fields__))
    if unknown:
        raise TypeError(f"fbank: unexpected keyword argument(s) {unknown}")
    return FbankOptions(**kwargs)


def _select(waveform: torch.Tensor, options: FbankOptions) -> Tuple[torch.Tensor, bool]:
    """The (B, T) rows to featurize and whether the output drops the batch dimension."""
    check_is_tensor("waveform", waveform, "(T,), (C, T) or (B, C, T)", op="fbank")
    check_dtype("waveform", waveform, FLOAT_DTYPES, "float32, float64, float16 or bfloat16", op="fbank")
    channel = options.channel
    if waveform.dim() == 1:
        if channel > 0:
            raise ValueError(f"fbank: channel={channel} needs a (C, T) waveform with more than {channel} rows; got (T,)")
        return waveform.unsqueeze(0), True
    if waveform.dim() == 2:
        rows = waveform.shape[0]
        if channel >= 0:
            if channel >= rows:
                raise ValueError(f"fbank: channel={channel} is out of range for a waveform with {rows} channels")
            return waveform[channel:channel + 1], True
        return waveform, rows == 1
    if waveform.dim() == 3:
        pick = max(channel, 0)
        if pick >= waveform.shape[1]:
            raise ValueError(f"fbank: channel={channel} is out of range for a (B, C, T) waveform with "
                             f"C={waveform.shape[1]}")
        return waveform[:, pick], False
    raise ValueError(f"fbank: waveform must be (T,), (C, T) or (B, C, T), got shape {tuple(waveform.shape)}")


def _prepare(waveform, args, kwargs):
    names = [name for name in FbankOptions.__dataclass_fields__ if name != "input_scale"]
    if len(args) > len(names):
        raise TypeError(f"fbank: takes at most {len(names)} positional options after waveform, got {len(args)}")
    for name, value in zip(names, args):
        if name in kwargs:
            raise TypeError(f"fbank: got multiple values for {name!r}")
        kwargs[name] = value
    options = make_options(**kwargs)
    rows, single = _select(waveform, options)
    return options, rows, single, _request_for(rows, options)


def _request_for(rows: torch.Tensor, options: FbankOptions) -> Request:
    """Validates the length of (B, T) rows against the options and builds the routing request."""
    num_samples = rows.shape[-1]
    if num_samples < options.window_size:
        raise ValueError(f"fbank: waveform has {num_samples} samples, fewer than one frame of {options.window_size} "
                         f"(frame_length={options.frame_length} ms at sample_frequency={options.sample_frequency})")
    frames = options.num_frames(num_samples)
    requires_grad = needs_grad(rows)
    fields = {"batch": rows.shape[0], "samples": num_samples, "frames": frames,
              "window": options.padded_window_size, "bins": options.num_mel_bins, "tokens": frames}
    features = {
        "window_type": options.window_type,
        "snip_edges": options.snip_edges,
        "dither": options.dither != 0.0,
        "use_power": options.use_power,
        "use_log_fbank": options.use_log_fbank,
        "use_energy": options.use_energy,
        "raw_energy": options.raw_energy,
        "htk_compat": options.htk_compat,
        "subtract_mean": options.subtract_mean,
        "remove_dc_offset": options.remove_dc_offset,
        "vtln": options.vtln_warp != 1.0,
        "requires_grad": requires_grad,
    }
    return Request.make(FAMILY, op="fbank", tensor=rows, fields=fields, features=features)


def _fbank_request(waveform, *args, **kwargs) -> Request:
    return _prepare(waveform, args, dict(kwargs))[3]


@routed_op(_fbank_request)
def fbank(waveform: torch.Tensor, blackman_coeff: float = 0.42, channel: int = -1, dither: float = 0.0,
          energy_floor: float = 1.0, frame_length: float = 25.0, frame_shift: float = 10.0,
          high_freq: float = 0.0, htk_compat: bool = False, low_freq: float = 20.0, min_duration: float = 0.0,
          num_mel_bins: int = 23, preemphasis_coefficient: float = 0.97, raw_energy: bool = True,
          remove_dc_offset: bool = True, round_to_power_of_two: bool = True, sample_frequency: float = 16000.0,
          snip_edges: bool = True, subtract_mean: bool = False, use_energy: bool = False,
          use_log_fbank: bool = True, use_power: bool = True, vtln_high: float = -500.0, vtln_low: float = 100.0,
          vtln_warp: float = 1.0, window_type: str = "povey", *, input_scale: float = 1.0) -> torch.Tensor:
    """Kaldi log-mel filterbank features, as torchaudio.compliance.kaldi.fbank computes them.

    Every keyword of torchaudio's kaldi.fbank is accepted with the same default and in the same
    positional order; `input_scale` (keyword only) multiplies the waveform first (pyannote's WeSpeaker
    front end passes 32768 for waveforms in [-1, 1]).

    Args:
        waveform: float32, float64, float16 or bfloat16 tensor, on any device:
            (T,) -> (frames, bins); (1, T), or (C, T) with channel=c -> (frames, bins) of one channel, as
            torchaudio; (B, T) with B > 1 and channel=-1 -> (B, frames, bins), each row a mono waveform;
            (B, C, T) -> (B, frames, bins), torch.vmap(kaldi.fbank) over B as pyannote calls it.
        num_mel_bins, frame_length (ms), frame_shift (ms), window_type ("povey", "hamming", "hanning",
            "rectangular", "blackman"), snip_edges, dither, use_energy, ...: torchaudio's meaning.

    Returns:
        float32 features (float64 for a float64 waveform); bins = num_mel_bins, + 1 with use_energy.
        frames = 1 + (T - window) // shift with snip_edges (window, shift in samples), else
        (T + shift // 2) // shift. A waveform of at least one frame but shorter than min_duration gives an
        empty tensor, as torchaudio.

    Raises ValueError naming the option for a bad option, or for a waveform shorter than one frame,
    before any kernel runs. dither > 0 and calls that need autograd run on the torch path.

    Example:
        >>> import torch, rlx_triton as rt
        >>> wave = torch.randn(16000) * 0.1                   # 1 s at 16 kHz
        >>> rt.fbank(wave, num_mel_bins=80, window_type="hamming").shape
        torch.Size([98, 80])
        >>> rt.fbank(torch.randn(4, 1, 16000), num_mel_bins=80).shape   # a batch, as pyannote calls it
        torch.Size([4, 98, 80])
    """
    kwargs = dict(
        blackman_coeff=blackman_coeff, channel=channel, dither=dither, energy_floor=energy_floor,
        frame_length=frame_length, frame_shift=frame_shift, high_freq=high_freq, htk_compat=htk_compat,
        low_freq=low_freq, min_duration=min_duration, num_mel_bins=num_mel_bins,
        preemphasis_coefficient=preemphasis_coefficient, raw_energy=raw_energy, remove_dc_offset=remove_dc_offset,
        round_to_power_of_two=round_to_power_of_two, sample_frequency=sample_frequency, snip_edges=snip_edges,
        subtract_mean=subtract_mean, use_energy=use_energy, use_log_fbank=use_log_fbank, use_power=use_power,
        vtln_high=vtln_high, vtln_low=vtln_low, vtln_warp=vtln_warp, window_type=window_type,
        input_scale=input_scale)
    options = make_options(**kwargs)
    rows, single = _select(waveform, options)
    # the options are validated already (once per option set); the waveform's length against them and the
    # route are what a repeated signature skips
    chosen = routed_call(call_signature(FAMILY, (waveform,), (options,)), lambda: _request_for(rows, options))
    return run(rows, options, chosen, single=single)


def run(rows: torch.Tensor, options: FbankOptions, chosen: Route, *, single: bool = False) -> torch.Tensor:
    """Features of (B, T) rows chosen by fbank() on their route: launches, drops the batch dimension when
    `single`. Every call is routed, empty results too: strict mode and explain see the same decision."""
    out_dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
    if options.too_short(rows.shape[-1]):
        if single:
            return torch.empty(0, device=rows.device, dtype=out_dtype)
        return torch.empty(rows.shape[0], 0, options.num_columns, device=rows.device, dtype=out_dtype)
    frames = options.num_frames(rows.shape[-1])
    if frames <= 0 or rows.shape[0] == 0:
        out = torch.empty(rows.shape[0], max(frames, 0), options.num_columns, device=rows.device, dtype=out_dtype)
    else:
        out = chosen.module.fbank(rows, options, candidate=chosen.candidate, route=chosen).to(out_dtype)
    return out[0] if single else out
