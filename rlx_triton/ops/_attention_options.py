"""What the attention ops check alike: rt.scaled_dot_product_attention and rt.sdpa_decode (ops/sdpa.py,
ops/sdpa_decode.py), rt.flash_attn_with_kvcache (ops/flash_attn.py) and the varlen ops
(ops/varlen_attention.py).

- FlashAttention's window_size, softcap and alibi_slopes: one check (`check_attention_options`) and the request
  features they turn on (`attention_option_features`), so every op refuses and routes them the same way.
- The score scale (a float, or torch's 0-dim tensor), one dtype and device across query, key and value, and
  `AttentionInputError`, the error of the torch-style ops.
- `values_readable`: whether a check may read index data (cache lengths, block tables, offsets), which on a
  GPU is a host sync.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Union

import torch

from rlx_triton.config import settings
from rlx_triton.ops._checks import FLOAT_DTYPES, check_is_tensor

class AttentionInputError(ValueError, RuntimeError):
    """Bad attention input: a ValueError naming the argument, and a RuntimeError like torch's own checks."""


def check_scale(scale: object, op: str) -> None:
    """TypeError unless scale is a real number or None (a bool is not a scale)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: scale must be a float or None, got {type(scale).__name__}")


def scale_value(scale: Any, op: str) -> Any:
    """scale as a Python number: torch takes a 0-dim tensor for it (its value is read, as torch reads it); any
    other value is returned as given, for check_scale to judge."""
    if isinstance(scale, torch.Tensor):
        if scale.dim() != 0 or scale.is_complex() or scale.dtype == torch.bool:
            raise TypeError(f"{op}: scale must be a float, a 0-dim real tensor or None, got a tensor of shape "
                            f"{tuple(scale.shape)} and dtype {scale.dtype}")
        return scale.item()
    return scale


def check_same_dtype_and_device(op: str, **tensors: torch.Tensor) -> None:
    """The first tensor is floating point, and every other one has its dtype and device (names in the order
    given, as torch's message has them)."""
    (first_name, first), *rest = tensors.items()
    if first.dtype not in FLOAT_DTYPES:
        raise AttentionInputError(f"{op}: {first_name} must be a floating-point tensor, got {first.dtype}")
    for name, tensor in rest:
        if tensor.dtype != first.dtype:
            raise AttentionInputError(f"{op}: expected {', '.join(tensors)} to have the same dtype, but got "
                                      f"{first_name}.dtype: {first.dtype} and {name}.dtype: {tensor.dtype}")
        if tensor.device != first.device:
            raise AttentionInputError(f"{op}: expected {', '.join(tensors)} on one device, but got "
                                      f"{first_name} on {first.device} and {name} on {tensor.device}")


def check_attention_options(op: str, error: type, *, window_size: Any, softcap: Any,
                            alibi_slopes: Optional[torch.Tensor], batch: int, num_heads: int,
                            device: torch.device) -> None:
    """FlashAttention's window_size, softcap and alibi_slopes, checked the same way for every op that takes them:
    TypeError for a wrong type or dtype, `error` (a ValueError) for a wrong value, shape or device."""
    if not isinstance(window_size, (tuple, list)) or not all(
            isinstance(w, int) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"{op}: window_size must be a pair of ints (left, right), got {window_size!r}")
    if len(window_size) != 2 or not all(w >= -1 for w in window_size):
        raise error(f"{op}: window_size must be a pair of ints (left, right), each >= -1 (-1: unbounded), got "
                    f"{tuple(window_size)!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"{op}: softcap must be a float, got {type(softcap).__name__}")
    if not (0 <= softcap < math.inf):
        raise error(f"{op}: softcap must be a finite float >= 0 (0 turns it off), got {softcap}")
    if alibi_slopes is not None:
        check_is_tensor("alibi_slopes", alibi_slopes, op=op)
        if alibi_slopes.dtype != torch.float32:
            raise TypeError(f"{op}: alibi_slopes must have dtype torch.float32, got {alibi_slopes.dtype}")
        if tuple(alibi_slopes.shape) not in ((num_heads,), (batch, num_heads)):
            raise error(f"{op}: alibi_slopes must have shape ({num_heads},) or ({batch}, {num_heads}), got "
                        f"{tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise error(f"{op}: alibi_slopes must be on {device}, got {alibi_slopes.device}")


def attention_option_features(*, paged: bool, local_window: bool, softcap: float,
                              alibi_slopes: Optional[torch.Tensor], cache_batch_idx: Optional[torch.Tensor] = None,
                              cache_leftpad: Optional[torch.Tensor] = None) -> Dict[str, Union[bool, str]]:
    """The request features of FlashAttention's options in use (coverage names each one a kernel takes)."""
    features: Dict[str, Union[bool, str]] = {}
    if paged:
        features["paged"] = True
    if cache_batch_idx is not None:
        features["cache_batch_idx"] = True
    if cache_leftpad is not None:
        features["cache_leftpad"] = True
    if local_window:
        features["window"] = True
    if softcap > 0:
        features["softcap"] = True
    if alibi_slopes is not None:
        features["alibi"] = "per_head" if alibi_slopes.dim() == 1 else "per_batch_head"
    return features


def values_readable(tensor: torch.Tensor) -> bool:
    """Whether a check may read the tensor's values (on a GPU a host sync, so a decode step would wait for
    the GPU), by RLX_TRITON_CHECK_VALUES: "1" always, "0" never, "auto" (the default) only where the tensor
    is on the CPU. Never while compiling, tracing fakes or capturing a CUDA graph. Unchecked values are the
    caller's contract; the kernels clamp and mask them, so none reads or writes out of bounds."""
    if torch.compiler.is_compiling() or is_fake(tensor):
        return False
    policy = settings().check_values
    if policy == "0":
        return False
    if policy == "auto":
        return tensor.device.type == "cpu"
    return not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def is_fake(tensor: torch.Tensor) -> bool:
    """A FakeTensor (tracing) or a meta tensor: it has a shape but no values."""
    from torch._subclasses.fake_tensor import is_fake as is_fake_tensor

    return is_fake_tensor(tensor) or tensor.device.type == "meta"
