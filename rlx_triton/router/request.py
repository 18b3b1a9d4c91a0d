"""A routing request: one op call reduced to what routing needs (family, op, shape fields, dtype, device, features)."""
from __future__ import annotations

from typing import Hashable, Mapping, NamedTuple, Optional, Tuple

import torch


_DTYPE_NAMES = {dtype: str(dtype).replace("torch.", "") for dtype in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool)}


def dtype_name(dtype: torch.dtype) -> str:
    """"float16", "bfloat16", "float32", ...: how requests and coverage name dtypes."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


class Request(NamedTuple):
    """Immutable and hashable; a NamedTuple because one is built on every op call and tuples build fastest."""

    family: str
    op: str
    fields: Tuple[Tuple[str, int], ...]
    dtype: str  # "float16" | "bfloat16" | "float32" | ...
    device: torch.device
    features: Tuple[Tuple[str, Hashable], ...] = ()

    @classmethod
    def make(cls, family, op: str, *, tensor: Optional[torch.Tensor] = None, device=None, dtype=None,
             fields: Mapping[str, int], features: Optional[Mapping[str, Hashable]] = None) -> "Request":
        if tensor is not None:
            device = tensor.device if device is None else device
            dtype = tensor.dtype if dtype is None else dtype
        if device is None or dtype is None:
            raise TypeError("Request.make needs a tensor, or both device and dtype")
        # this runs on every op call: the common cases (ints from tensor shapes, torch.device) take no conversion
        items = tuple(fields.items())
        if not all(type(value) is int for _, value in items):
            items = tuple((name, int(value)) for name, value in items)
        return cls(
            family=getattr(family, "value", family),
            op=op,
            fields=items,
            dtype=dtype_name(dtype),
            device=device if isinstance(device, torch.device) else torch.device(device),
            features=tuple(features.items()) if features else (),
        )

    @property
    def field_map(self) -> dict:
        return dict(self.fields)

    @property
    def feature_map(self) -> dict:
        return dict(self.features)

    def bucket_signature(self) -> tuple:
        """Shape fields reduced to power-of-two buckets: requests that share it share a route."""
        return (self.family, self.op, self.dtype, self.device, self.features,
                tuple((name, (value - 1).bit_length() if value > 1 else 0) for name, value in self.fields))

    def __str__(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.fields)
        feats = ", ".join(f"{k}={v!r}" for k, v in self.features)
        extra = f"; {feats}" if feats else ""
        return f"{self.family}.{self.op}({shape}{extra}) {self.dtype} on {self.device}"
