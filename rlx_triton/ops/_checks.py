"""Input validation shared by the public ops (ops/*.py).

Every check raises before any launch, naming the argument and what was expected: TypeError for a
wrong type or dtype, ValueError for a wrong shape, value or device. `op` (optional) prefixes the
message with the op's name ("fbank: waveform must be ..."). Each check returns its value, so a
call can validate and bind in one line.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import torch

if TYPE_CHECKING:
    from rlx_triton.router.protocol import FamilyModule
    from rlx_triton.router.route import Route

# the dtypes the kernels take; float64 inputs are accepted where the op falls back to torch for them
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FLOAT_DTYPES = KERNEL_DTYPES + (torch.float64,)


def _prefix(op: str) -> str:
    return f"{op}: " if op else ""


def dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    """'float32, float16 or bfloat16' for (torch.float32, torch.float16, torch.bfloat16)."""
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def check_is_tensor(name: str, value, expected: str = "", *, op: str = ""):
    """TypeError unless value is a torch.Tensor; `expected` (a layout such as "(B, T)") joins the message."""
    if not isinstance(value, torch.Tensor):
        layout = f" {expected}" if expected else ""
        raise TypeError(f"{_prefix(op)}{name} must be a torch.Tensor{layout}, got {type(value).__name__}")
    return value


def check_dtype(name: str, value: torch.Tensor, dtypes: Sequence[torch.dtype], expected: str = "", *,
                op: str = "") -> torch.Tensor:
    """TypeError unless value.dtype is one of dtypes; the message lists them (or says `expected`)."""
    if value.dtype not in dtypes:
        raise TypeError(f"{_prefix(op)}{name} must be {expected or dtype_names(dtypes)}, got {value.dtype}")
    return value


def check_tensor(name: str, value, ndims: Sequence[int], dtypes: Sequence[torch.dtype], layout: str = "", *,
                 op: str = ""):
    """A tensor with one of `ndims` dimensions and one of `dtypes`. With a layout text ("(batch, c_in, h, w)")
    the messages show it; without, they count dimensions."""
    check_is_tensor(name, value, layout, op=op)
    if value.dim() not in ndims:
        expected = (f"be {' or '.join(f'{n}-D' for n in ndims)} {layout}" if layout
                    else f"have {' or '.join(map(str, ndims))} dimensions")
        raise ValueError(f"{_prefix(op)}{name} must {expected}, got shape {tuple(value.shape)}")
    return check_dtype(name, value, dtypes, op=op)


def check_shape(name: str, value: torch.Tensor, shape: Sequence[int], *, op: str = "") -> torch.Tensor:
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{_prefix(op)}{name} must have shape {tuple(shape)}, got {tuple(value.shape)}")
    return value


def check_device(name: str, value: torch.Tensor, ref: torch.Tensor, ref_name: str, *, op: str = "") -> torch.Tensor:
    """ValueError unless value is on ref's device (ref_name names ref in the message)."""
    if value.device != ref.device:
        raise ValueError(f"{_prefix(op)}{name} is on {value.device} but {ref_name} is on {ref.device}")
    return value


def check_same_dtype(name: str, value: torch.Tensor, ref: torch.Tensor, ref_name: str, *,
                     op: str = "") -> torch.Tensor:
    if value.dtype != ref.dtype:
        raise TypeError(f"{_prefix(op)}{name} is {value.dtype} but {ref_name} is {ref.dtype}: they must match")
    return value


class InputShapeError(RuntimeError, ValueError):
    """An input whose size does not fit a weight (wrong number of input channels or features).

    torch raises RuntimeError for this mistake (F.conv1d: "Given groups=1, weight of size ...,
    expected input[...] to have 3 channels, but got 5 channels instead"), so this is one; it is also a
    ValueError, like every other bad-shape error of rlx_triton."""


class InputDtypeError(TypeError, ValueError):
    """An input whose dtype differs from the weights'. torch raises ValueError for this mistake (nn.LSTM:
    "RNN input dtype ... does not match weight dtype"), so this is one; it is also a TypeError, like
    every other wrong-dtype error of rlx_triton."""


def check_input_channels(input: torch.Tensor, weight: torch.Tensor, channel_dim: int = 1) -> torch.Tensor:
    """InputShapeError, worded like torch's, unless input's channel_dim matches weight's input channels
    (groups=1)."""
    if input.shape[channel_dim] != weight.shape[1]:
        raise InputShapeError(
            f"Given groups=1, weight of size {list(weight.shape)}, expected input{list(input.shape)} to have "
            f"{weight.shape[1]} channels, but got {input.shape[channel_dim]} channels instead")
    return input


# the two attention layouts: rt.sdpa_decode (like torch's SDPA) puts heads before tokens, FlashAttention's API
# (rt.flash_attn_with_kvcache) tokens before heads
ATTENTION_LAYOUTS = {"sdpa_decode": ("(B, H, S, D)", 1, "flash_attn_with_kvcache"),
                     "flash_attn_with_kvcache": ("(B, S, H, D)", 2, "sdpa_decode")}


def attention_layout_hint(op: str, query: torch.Tensor, k_cache: torch.Tensor) -> str:
    """What to add to a head-count error of `op`: the layout it takes and, where the tensors would fit the other
    op's layout, that they look like it (the usual mix-up between the two)."""
    layout, heads_dim, other = ATTENTION_LAYOUTS[op]
    hint = f" ({op} takes {layout} tensors"
    heads, kv_heads = query.shape[3 - heads_dim], k_cache.shape[3 - heads_dim]
    if kv_heads and heads % kv_heads == 0:
        hint += (f"; these look like rt.{other}'s {ATTENTION_LAYOUTS[other][0]}: call rt.{other}, or "
                 f".transpose(1, 2) each of them")
    return hint + ")"


def check_int(name: str, value, low: int, *, op: str = "") -> int:
    """An int (not a bool) >= low."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_prefix(op)}{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{_prefix(op)}{name} must be >= {low}, got {value}")
    return value


def check_bool(name: str, value, *, op: str = "") -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{_prefix(op)}{name} must be a bool, got {type(value).__name__}")
    return value


def needs_grad(*tensors) -> bool:
    """Autograd wants this call recorded (the kernels are forward-only, so such calls go to torch).
    Entries that are not tensors (None) are ignored."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def call_signature(op: str, tensors: Sequence, options: Sequence = ()) -> Optional[tuple]:
    """What an op's validation and routing read from one call, as the key of the exact-signature route cache
    (rlx_triton.router.route.routed_call): the op, each tensor's type, shape, dtype and device (None entries
    kept; a list or tuple of tensors by its length and entries), whether autograd records the call (grad mode
    and requires_grad), and each option value with its type (1, 1.0 and True are equal but not equally valid).
    Strides, values and versions are left out: no check and no route reads them.

    None while torch.compile traces (the op routes when it runs there) and where an argument is none of
    these (a PackedSequence, a generator, a nested tensor): such calls are validated and routed every time.
    """
    if torch.compiler.is_compiling():
        return None
    parts: list = [op]
    try:
        wants_grad = _describe_tensors(tensors, parts)
        parts.append(wants_grad and torch.is_grad_enabled())
        parts.extend(_typed(option) for option in options)
    except (TypeError, RuntimeError):  # RuntimeError: the shape of a nested tensor
        return None
    return tuple(parts)


def _describe_tensors(values: Sequence, parts: list) -> bool:
    """Appends (type, shape, dtype, device) per tensor to parts; returns whether any requires grad."""
    wants_grad = False
    for value in values:
        if value is None:
            parts.append(None)
        elif isinstance(value, torch.Tensor):
            if value.is_nested:
                raise TypeError("a nested tensor")
            parts.append((type(value), value.shape, value.dtype, value.device))
            wants_grad = wants_grad or value.requires_grad
        elif type(value) in (list, tuple):
            parts.append((type(value), len(value)))
            wants_grad = _describe_tensors(value, parts) or wants_grad
        else:
            raise TypeError(f"{type(value).__name__} is not a tensor")
    return wants_grad


def _typed(option):
    if type(option) in (list, tuple):
        return (type(option), *map(_typed, option))
    return (type(option), option)


def backend_module(route: "Route") -> "FamilyModule":
    """The backend module that runs a routed call: route() always names one, so a Route without one (built by
    hand) is a bug, not bad input."""
    if route.module is None:
        raise RuntimeError(f"the route of {route.family}.{route.op} names no backend module to run it")
    return route.module
