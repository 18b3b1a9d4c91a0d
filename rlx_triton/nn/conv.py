"""Drop-in 1-D conv modules: pyannote's SincNet stage and nn.Conv1d, running on rlx_triton's conv ops.

`SincNet.from_pyannote(module)` takes pyannote's SincNet (pyannote/audio/models/blocks/sincnet.py)
and keeps its submodules (wav_norm1d, conv1d, pool1d, norm1d) as its own: the parameters are the
same nn.Parameter objects (no copy, training or load_state_dict on either is seen by both) and the
state_dict keys are pyannote's. Its forward is one `rlx_triton.ops.conv.sincnet` call; the sinc
filters are rebuilt only when low_hz_/band_hz_ change (ops.conv.sinc_filters caches per version).

`Conv1d` is an nn.Conv1d whose forward is `rlx_triton.ops.conv.conv1d` (groups=1, zero padding;
other settings run nn.Conv1d's own forward), with an optional fused `epilogue`.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
import torch.nn as nn

from rlx_triton.ops import conv as conv_ops
from rlx_triton.ops.conv import ConvEpilogue


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"SincNet.from_pyannote: {message}")


class SincNet(nn.Module):
    """pyannote SincNet (non-streaming) with an rlx_triton forward; build it with `from_pyannote`.

    (batch, 1, samples) waveforms -> (batch, 60, frames), in the parameters' dtype. `from_pyannote` takes
    pyannote.audio's SincNet (model.sincnet of a PyanNet), or any module with its layout, which is what it
    reads: wav_norm1d, conv1d (an encoder whose filterbank holds asteroid ParamSincFB's low_hz_ and
    band_hz_, then Conv1d blocks), pool1d and norm1d.

    Example (a module with pyannote's SincNet layout, built by hand; with pyannote.audio installed,
    `rt.nn.SincNet.from_pyannote(model.sincnet)`):
        >>> import torch, rlx_triton as rt
        >>> from torch import nn
        >>> sinc = nn.Module()                              # asteroid's ParamSincFB(80, 251): 40 bands
        >>> sinc.low_hz_ = nn.Parameter(torch.linspace(30.0, 6000.0, 40).unsqueeze(1))
        >>> sinc.band_hz_ = nn.Parameter(torch.full((40, 1), 150.0))
        >>> sinc.kernel_size, sinc.sample_rate, sinc.min_low_hz, sinc.min_band_hz = 251, 16000, 50.0, 50.0
        >>> encoder = nn.Module()
        >>> encoder.filterbank, encoder.stride = sinc, 10
        >>> stock = nn.Module()
        >>> stock.wav_norm1d = nn.InstanceNorm1d(1, affine=True)
        >>> stock.conv1d = nn.ModuleList([encoder, nn.Conv1d(80, 60, 5), nn.Conv1d(60, 60, 5)])
        >>> stock.pool1d = nn.ModuleList([nn.MaxPool1d(3, stride=3) for _ in range(3)])
        >>> stock.norm1d = nn.ModuleList([nn.InstanceNorm1d(c, affine=True) for c in (80, 60, 60)])
        >>> fast = rt.nn.SincNet.from_pyannote(stock)      # shares stock's parameters, no copy
        >>> fast.conv1d[1].weight is stock.conv1d[1].weight
        True
        >>> fast(torch.randn(2, 1, 16000)).shape            # 1 s at 16 kHz
        torch.Size([2, 60, 56])
    """

    def __init__(self, wav_norm1d: nn.InstanceNorm1d, conv1d: nn.ModuleList, pool1d: nn.ModuleList,
                 norm1d: nn.ModuleList, *, sample_rate: int = 16000, stride: int = 10,
                 negative_slope: float = 0.01):
        super().__init__()
        self.sample_rate = sample_rate
        self.stride = stride
        self.streaming = False
        self.negative_slope = negative_slope
        self.wav_norm1d = wav_norm1d
        self.conv1d = conv1d
        self.pool1d = pool1d
        self.norm1d = norm1d

    @classmethod
    def from_pyannote(cls, module: nn.Module) -> "SincNet":
        """Shares the parameters of pyannote's SincNet module (no copy); raises ValueError for a
        configuration this forward does not reproduce (streaming, non-affine norms, padded convs...)."""
        # pyannote's SincNet is read by structure: what each part is gets checked here at run time
        stock: Any = module
        _check(not getattr(stock, "streaming", False), "streaming SincNet (no instance norms) is not supported")
        for name in ("wav_norm1d", "conv1d", "pool1d", "norm1d"):
            _check(hasattr(stock, name), f"module has no {name!r}: not a pyannote SincNet")
        norms = [stock.wav_norm1d, *stock.norm1d]
        for norm in norms:
            _check(isinstance(norm, nn.InstanceNorm1d) and norm.affine and not norm.track_running_stats,
                   "every norm must be InstanceNorm1d(affine=True, track_running_stats=False)")
            _check(norm.eps == norms[0].eps, "every instance norm must use the same eps")
        _check(len(stock.conv1d) == len(stock.pool1d) == len(stock.norm1d) >= 1,
               "conv1d, pool1d and norm1d must have one entry per block")
        pool = stock.pool1d[0]
        for p in stock.pool1d:
            _check(isinstance(p, nn.MaxPool1d) and p.kernel_size == pool.kernel_size
                   and p.stride == p.kernel_size and p.padding == 0 and p.dilation == 1 and not p.ceil_mode,
                   "every pool must be MaxPool1d(k, stride=k) with the same k")
        encoder = stock.conv1d[0]
        fb = getattr(encoder, "filterbank", None)
        _check(fb is not None and hasattr(fb, "low_hz_") and hasattr(fb, "band_hz_"),
               "conv1d[0] must be an asteroid Encoder(ParamSincFB)")
        _check(getattr(encoder, "padding", 0) == 0, "the sinc Encoder must have padding=0")
        for conv in stock.conv1d[1:]:
            _check(isinstance(conv, nn.Conv1d) and conv.groups == 1 and conv.stride == (1,)
                   and conv.padding == (0,) and conv.dilation == (1,) and conv.bias is not None,
                   "conv1d[1:] must be Conv1d(stride=1, padding=0, dilation=1, groups=1, bias=True)")
        return cls(stock.wav_norm1d, stock.conv1d, stock.pool1d, stock.norm1d,
                   sample_rate=getattr(stock, "sample_rate", 16000), stride=encoder.stride)

    def filters(self) -> torch.Tensor:
        """The (80, 1, 251) sinc filters of the current (low_hz_, band_hz_), cached per weight version."""
        fb: Any = self.conv1d[0].filterbank  # asteroid's ParamSincFB (untyped here)
        return conv_ops.sinc_filters(fb.low_hz_, fb.band_hz_, window_=getattr(fb, "window_", None),
                                     n_=getattr(fb, "n_", None), kernel_size=fb.kernel_size,
                                     sample_rate=fb.sample_rate, min_low_hz=fb.min_low_hz,
                                     min_band_hz=fb.min_band_hz)

    def _weights(self) -> tuple:
        """(conv weights, conv biases, norm weights, norm biases) of the blocks after the sinc conv."""
        convs = list(self.conv1d)[1:]
        norms = list(self.norm1d)
        return ([c.weight for c in convs], [c.bias for c in convs], [n.weight for n in norms],
                [n.bias for n in norms])

    def _options(self) -> dict:
        return dict(stride=self.conv1d[0].stride, pool=self.pool1d[0].kernel_size, eps=self.wav_norm1d.eps,
                    negative_slope=self.negative_slope, sample_rate=int(self.sample_rate))

    def _op_call(self, waveforms: torch.Tensor) -> Tuple[tuple, dict]:
        """The arguments of the `ops.conv.sincnet` call that forward makes."""
        args = (waveforms, self.filters(), self.wav_norm1d.weight, self.wav_norm1d.bias, *self._weights())
        return args, self._options()

    def forward(self, waveforms: torch.Tensor) -> torch.Tensor:
        """(batch, 1, samples) -> (batch, channels, frames): the filters of the current (low_hz_, band_hz_), then
        the sincnet op (`ops.conv.sincnet_from_bands`, which under torch.compile builds the filters where the op
        runs)."""
        fb: Any = self.conv1d[0].filterbank  # asteroid's ParamSincFB (untyped here)
        return conv_ops.sincnet_from_bands(
            waveforms, fb.low_hz_, fb.band_hz_, self.wav_norm1d.weight, self.wav_norm1d.bias, *self._weights(),
            window_=getattr(fb, "window_", None), n_=getattr(fb, "n_", None), kernel_size=fb.kernel_size,
            filter_sample_rate=fb.sample_rate, min_low_hz=fb.min_low_hz, min_band_hz=fb.min_band_hz,
            **self._options())

    def explain(self, waveforms: torch.Tensor):
        """The Route forward(waveforms) takes, without running it."""
        from rlx_triton.router import explain

        args, kwargs = self._op_call(waveforms)
        return explain(conv_ops.sincnet, *args, **kwargs)


class Conv1d(nn.Conv1d):
    """nn.Conv1d with rlx_triton's conv1d forward (groups=1, padding_mode='zeros'), plus an optional
    fused epilogue (ConvEpilogue: |x| -> max-pool -> leaky ReLU) applied after the bias.

    Example:
        >>> import torch, rlx_triton as rt
        >>> conv = rt.nn.Conv1d.from_torch(torch.nn.Conv1d(80, 60, 5))
        >>> conv(torch.randn(2, 80, 100)).shape
        torch.Size([2, 60, 96])
    """

    epilogue: Optional[ConvEpilogue] = None

    @classmethod
    def from_torch(cls, module: nn.Conv1d, epilogue: Optional[ConvEpilogue] = None) -> "Conv1d":
        """A Conv1d sharing `module`'s weight and bias Parameters (no copy)."""
        if not isinstance(module, nn.Conv1d):
            raise TypeError(f"Conv1d.from_torch: module must be a torch.nn.Conv1d, got {type(module).__name__}")
        padding = module.padding if isinstance(module.padding, str) else module.padding[0]
        new = cls(module.in_channels, module.out_channels, module.kernel_size[0], stride=module.stride[0],
                  padding=padding, dilation=module.dilation[0], groups=module.groups,
                  bias=module.bias is not None, padding_mode=module.padding_mode, device="meta")
        new.weight = module.weight
        new.bias = module.bias
        new.epilogue = epilogue
        new.train(module.training)
        return new

    def _routed(self) -> bool:
        """Whether forward calls the routed conv1d op (groups=1, zero padding) or nn.Conv1d's own forward."""
        return self.groups == 1 and self.padding_mode == "zeros"

    def _op_args(self, input: torch.Tensor) -> tuple:
        padding = self.padding if isinstance(self.padding, str) else self.padding[0]
        return input, self.weight, self.bias, self.stride[0], padding, self.dilation[0]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._routed():
            out = super().forward(input)
            if self.epilogue is not None:
                out = _epilogue_torch(out, self.epilogue)
            return out
        return conv_ops.conv1d(*self._op_args(input), epilogue=self.epilogue)

    def explain(self, input: torch.Tensor):
        """The Route forward(input) takes, without running it (the torch library op where forward runs
        nn.Conv1d's own forward)."""
        from rlx_triton.router import Route, explain

        if not self._routed():
            return Route(family="conv", op="conv1d", backend="torch",
                         evidence_detail=f"groups={self.groups}, padding_mode={self.padding_mode!r}: nn.Conv1d's "
                                         "own forward (the conv1d op takes groups=1 with zero padding)")
        return explain(conv_ops.conv1d, *self._op_args(input), epilogue=self.epilogue)


def _epilogue_torch(y: torch.Tensor, epilogue: ConvEpilogue) -> torch.Tensor:
    if epilogue.abs:
        y = y.abs()
    if epilogue.pool > 1:
        y = torch.nn.functional.max_pool1d(y, epilogue.pool, epilogue.pool)
    if epilogue.negative_slope is not None:
        y = torch.nn.functional.leaky_relu(y, epilogue.negative_slope)
    return y
