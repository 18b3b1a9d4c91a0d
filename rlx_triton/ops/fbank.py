"""Public fbank op: Kaldi log-mel filterbank features with torchaudio.compliance.kaldi.fbank's keywords.

    feats = rlx_triton.fbank(waveform, num_mel_bins=80, window_type="hamming", dither=0.0)

Every keyword and default of torchaudio's kaldi.fbank is accepted, in the same order, plus one
keyword-only extension, `input_scale` (the waveform is multiplied by it first; pyannote's WeSpeaker
front end uses 32768). Options are validated once per option set (an `FbankOptions`, frozen and
hashable, declared here and read by every backend); a bad option, or a waveform shorter than one frame,
raises ValueError naming the option before any kernel runs. The routing Request comes from the op's
request spec (`FBANK_REQUEST`, which `rlx-triton explain` reads too). The router then picks the backend: the fused Triton kernel
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
import inspect
import math
from dataclasses import dataclass, fields
from typing import Optional, Tuple

import torch

from rlx_triton.caches import LIMITS
from rlx_triton.ops._compiled import compiling, options_from, options_text, run_eagerly
from rlx_triton.ops._checks import backend_module, call_signature, check_dtype, check_is_tensor, needs_grad
from rlx_triton.ops._request_spec import Derived, Feature, Features, Given, RequestSpec, Values, flag
from rlx_triton.router import Request, routed_op
from rlx_triton.router.route import Route, routed_call

FAMILY = "fbank"
WINDOW_TYPES = ("hamming", "hanning", "povey", "rectangular", "blackman")
MILLISECONDS_TO_SECONDS = 0.001


# ------------------------------------------------------------------------------------ options

def fft_size(window_size: int, round_to_power_of_two: bool) -> int:
    """The FFT size of a frame of `window_size` samples: rounded up to a power of two, as torchaudio's
    round_to_power_of_two does, or the frame itself."""
    if not round_to_power_of_two:
        return window_size
    return 1 if window_size == 0 else 2 ** (window_size - 1).bit_length()


def frame_count(samples: int, window_size: int, window_shift: int, snip_edges: bool) -> int:
    """Frames of a waveform of `samples` samples, as torchaudio counts them."""
    if snip_edges:
        return 1 + (samples - window_size) // window_shift
    return (samples + window_shift // 2) // window_shift


def _fail(option: str, message: str):
    raise ValueError(f"fbank: {option} {message}")


@dataclass(frozen=True)
class FbankOptions:
    """Every keyword of torchaudio.compliance.kaldi.fbank with its default, plus one rlx extension.

    `input_scale` (rlx extension, default 1.0) multiplies the waveform before anything else: the
    WeSpeaker front end uses 32768 (int16 range), which is exact in float32 (a power of two).
    Construction validates every option and raises ValueError naming the offending option.
    """

    blackman_coeff: float = 0.42
    channel: int = -1
    dither: float = 0.0
    energy_floor: float = 1.0
    frame_length: float = 25.0
    frame_shift: float = 10.0
    high_freq: float = 0.0
    htk_compat: bool = False
    low_freq: float = 20.0
    min_duration: float = 0.0
    num_mel_bins: int = 23
    preemphasis_coefficient: float = 0.97
    raw_energy: bool = True
    remove_dc_offset: bool = True
    round_to_power_of_two: bool = True
    sample_frequency: float = 16000.0
    snip_edges: bool = True
    subtract_mean: bool = False
    use_energy: bool = False
    use_log_fbank: bool = True
    use_power: bool = True
    vtln_high: float = -500.0
    vtln_low: float = 100.0
    vtln_warp: float = 1.0
    window_type: str = "povey"
    input_scale: float = 1.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" or isinstance(f.default, bool):
                if not isinstance(value, bool):
                    _fail(f.name, f"must be a bool, got {value!r}")
            elif f.name == "window_type":
                if value not in WINDOW_TYPES:
                    _fail("window_type", f"must be one of {WINDOW_TYPES}, got {value!r}")
            elif f.name in ("channel", "num_mel_bins"):
                if isinstance(value, bool) or not isinstance(value, int):
                    _fail(f.name, f"must be an int, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    _fail(f.name, f"must be a finite number, got {value!r}")
        if self.sample_frequency <= 0:
            _fail("sample_frequency", f"must be greater than zero, got {self.sample_frequency}")
        if self.window_shift <= 0:
            _fail("frame_shift", f"gives a window shift of {self.window_shift} samples; it must be at least 1 "
                  f"(sample_frequency * frame_shift / 1000)")
        if self.window_size < 2:
            _fail("frame_length", f"gives a window of {self.window_size} samples; it must be at least 2 "
                  f"(sample_frequency * frame_length / 1000)")
        if self.padded_window_size % 2 != 0:
            _fail("frame_length", f"gives an odd FFT size {self.padded_window_size}; use round_to_power_of_two "
                  f"or change frame_length")
        if not 0.0 <= self.preemphasis_coefficient <= 1.0:
            _fail("preemphasis_coefficient", f"must be in [0, 1], got {self.preemphasis_coefficient}")
        if self.num_mel_bins <= 3:
            _fail("num_mel_bins", f"must be at least 4 (torchaudio needs more than 3 mel bins), got {self.num_mel_bins}")
        if self.channel < -1:
            _fail("channel", f"must be -1 (mono / batch rows) or a channel index >= 0, got {self.channel}")
        if self.dither < 0:
            _fail("dither", f"must be >= 0, got {self.dither}")
        if self.energy_floor < 0:
            _fail("energy_floor", f"must be >= 0 (0 disables the floor), got {self.energy_floor}")
        if self.min_duration < 0:
            _fail("min_duration", f"must be >= 0, got {self.min_duration}")
        nyquist = 0.5 * self.sample_frequency
        if not 0.0 <= self.low_freq < nyquist:
            _fail("low_freq", f"must be in [0, nyquist={nyquist}), got {self.low_freq}")
        high = self.effective_high_freq
        if not 0.0 < high <= nyquist:
            _fail("high_freq", f"gives {high} Hz, outside (0, nyquist={nyquist}] (values <= 0 are offsets from nyquist)")
        if not self.low_freq < high:
            _fail("high_freq", f"gives {high} Hz, not above low_freq={self.low_freq}")
        if self.vtln_warp <= 0:
            _fail("vtln_warp", f"must be greater than zero, got {self.vtln_warp}")
        if self.vtln_warp != 1.0:
            vtln_high = self.effective_vtln_high
            if not self.low_freq < self.vtln_low < high:
                _fail("vtln_low", f"must lie strictly between low_freq={self.low_freq} and high_freq={high}, "
                      f"got {self.vtln_low}")
            if not 0.0 < vtln_high < high:
                _fail("vtln_high", f"gives {vtln_high} Hz, outside (0, high_freq={high}) "
                      f"(negative values are offsets from nyquist)")
            if not self.vtln_low < vtln_high:
                _fail("vtln_high", f"gives {vtln_high} Hz, not above vtln_low={self.vtln_low}")
            if not self.vtln_low * max(1.0, self.vtln_warp) > self.low_freq:
                _fail("vtln_low", "times max(1, vtln_warp) must stay above low_freq")
            if not vtln_high * min(1.0, self.vtln_warp) < high:
                _fail("vtln_high", "times min(1, vtln_warp) must stay below high_freq")

    # derived sizes, as torchaudio computes them
    @property
    def window_shift(self) -> int:
        return int(self.sample_frequency * self.frame_shift * MILLISECONDS_TO_SECONDS)

    @property
    def window_size(self) -> int:
        return int(self.sample_frequency * self.frame_length * MILLISECONDS_TO_SECONDS)

    @property
    def padded_window_size(self) -> int:
        return fft_size(self.window_size, self.round_to_power_of_two)

    @property
    def effective_high_freq(self) -> float:
        return self.high_freq + 0.5 * self.sample_frequency if self.high_freq <= 0.0 else self.high_freq

    @property
    def effective_vtln_high(self) -> float:
        return self.vtln_high + 0.5 * self.sample_frequency if self.vtln_high < 0.0 else self.vtln_high

    @property
    def num_columns(self) -> int:
        """Output features per frame: the mel bins, plus the log energy column with use_energy."""
        return self.num_mel_bins + int(self.use_energy)

    @property
    def reflect_pad(self) -> int:
        """Samples reflected in front of the waveform when snip_edges=False (negative: samples trimmed)."""
        return self.window_size // 2 - self.window_shift // 2

    def num_frames(self, num_samples: int) -> int:
        return frame_count(num_samples, self.window_size, self.window_shift, self.snip_edges)

    def too_short(self, num_samples: int) -> bool:
        """torchaudio returns an empty tensor for signals shorter than min_duration."""
        return num_samples < self.min_duration * self.sample_frequency



# ------------------------------------------------------------------------------------ request spec


def _shorter_than_a_frame(f: Values, o: Features) -> Optional[str]:
    if f["samples"] < f["window_size"]:
        return f"samples={f['samples']} is shorter than one frame (window_size={f['window_size']} samples)"
    return None


FBANK_REQUEST = RequestSpec(
    FAMILY, "fbank",
    given=(Given("batch"), Given("samples"),
           Given("bins", 23, "torchaudio's default num_mel_bins"),
           Given("window_size", 400, "a 25 ms frame at 16 kHz", "samples per frame (frame_length x sample_frequency)",
                 low=2),
           Given("window_shift", 160, "a 10 ms shift at 16 kHz", "samples between frames (frame_shift x "
                 "sample_frequency)"),
           Given("round_to_power_of_two", True, "torchaudio's default",
                 "whether the FFT size is window_size rounded up to a power of two", low=0, high=1)),
    derived=(Derived("window", lambda f, o: fft_size(f["window_size"], f["round_to_power_of_two"]),
                     "window_size rounded up to a power of two (round_to_power_of_two)",
                     ("window_size", "round_to_power_of_two"), "FFT size"),
             Derived("frames", lambda f, o: frame_count(f["samples"], f["window_size"], f["window_shift"],
                                                        bool(o["snip_edges"])),
                     "1 + (samples - window_size) // window_shift (snip_edges=false: (samples + window_shift // 2) "
                     "// window_shift)", ("samples", "window_size", "window_shift", "snip_edges"), "output frames"),
             Derived("tokens", lambda f, o: f["frames"], "= frames", ("frames",))),
    features={"window_type": Feature("povey", WINDOW_TYPES), "snip_edges": flag(True), "dither": flag(False),
              "use_power": flag(True), "use_log_fbank": flag(True), "use_energy": flag(False),
              "raw_energy": flag(True), "htk_compat": flag(False), "subtract_mean": flag(False),
              "remove_dc_offset": flag(True), "vtln": flag(False), "requires_grad": flag(False)},
    checks=(_shorter_than_a_frame,),
)


# ------------------------------------------------------------------------------------ the op



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
    check_dtype("waveform", waveform, FBANK_REQUEST.dtypes, "float32, float64, float16 or bfloat16", op="fbank")
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


def _request_for(rows: torch.Tensor, options: FbankOptions) -> Request:
    """Validates the length of (B, T) rows against the options and builds the routing request."""
    num_samples = rows.shape[-1]
    if num_samples < options.window_size:
        raise ValueError(f"fbank: waveform has {num_samples} samples, fewer than one frame of {options.window_size} "
                         f"(frame_length={options.frame_length} ms at sample_frequency={options.sample_frequency})")
    requires_grad = needs_grad(rows)
    given = {"batch": rows.shape[0], "samples": num_samples, "bins": options.num_mel_bins,
             "window_size": options.window_size, "window_shift": options.window_shift,
             "round_to_power_of_two": options.round_to_power_of_two}
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
    return FBANK_REQUEST.make(given, features, tensor=rows)


def _fbank_request(waveform, *args, **kwargs) -> Request:
    """fbank's request builder (what rt.explain runs): the call bound to fbank's own signature, so
    positional options take the names they take in a call."""
    try:
        bound = inspect.signature(fbank).bind(waveform, *args, **kwargs)
    except TypeError as error:
        raise TypeError(f"fbank: {error}") from None
    options = make_options(**{name: value for name, value in bound.arguments.items() if name != "waveform"})
    rows, _single = _select(waveform, options)
    return _request_for(rows, options)


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
    if compiling():
        if needs_grad(waveform):
            return run_eagerly(fbank, waveform, **kwargs)
        return _fbank_op(waveform, options_text(**kwargs))
    options = make_options(**kwargs)
    rows, single = _select(waveform, options)
    # the options are validated already (once per option set); the waveform's length against them and the
    # route are what a repeated signature skips
    chosen = routed_call(call_signature(FAMILY, (waveform,), (options,)), lambda: _request_for(rows, options),
                         lambda: (fbank, (waveform,), kwargs))
    return run(rows, options, chosen, single=single)


@torch.library.custom_op("rlx_triton::fbank", mutates_args=())
def _fbank_op(waveform: torch.Tensor, options: str) -> torch.Tensor:
    """fbank under torch.compile (ops/_compiled.py): the eager op, run when the compiled graph runs."""
    return fbank(waveform, **options_from(options)).contiguous()


@_fbank_op.register_fake
def _fbank_fake(waveform, options):
    made = make_options(**options_from(options))
    rows, single = _select(waveform, made)
    _request_for(rows, made)   # the op's checks, on the traced shapes
    out_dtype = torch.float64 if rows.dtype == torch.float64 else torch.float32
    if made.too_short(rows.shape[-1]):
        return waveform.new_empty((0,) if single else (rows.shape[0], 0, made.num_columns), dtype=out_dtype)
    frames = max(made.num_frames(rows.shape[-1]), 0)
    shape = (frames, made.num_columns) if single else (rows.shape[0], frames, made.num_columns)
    return waveform.new_empty(shape, dtype=out_dtype)


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
        out = backend_module(chosen).fbank(rows, options, candidate=chosen.candidate, route=chosen).to(out_dtype)
    return out[0] if single else out
