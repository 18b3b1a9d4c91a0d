"""A routing request: one op call reduced to what routing needs (family, op, shape fields, dtype, device, features)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Optional, Tuple

import torch


def family_name(family) -> str:
    """KernelFamily member or its string value -> the string value ("sdpa_decode", ...)."""
    return getattr(family, "value", family)


def pow2_bucket(value: int) -> int:
    """The seed's bucket_pow2: 0 for values <= 1, else ceil(log2(value))."""
    return 0 if value <= 1 else (int(value) - 1).bit_length()


@dataclass(frozen=True)
class Request:
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
        dtype_name = str(dtype).replace("torch.", "")
        return cls(
            family=family_name(family),
            op=op,
            fields=tuple((name, int(value)) for name, value in fields.items()),
            dtype=dtype_name,
            device=torch.device(device),
            features=tuple((features or {}).items()),
        )

    @property
    def field_map(self) -> dict:
        return dict(self.fields)

    @property
    def feature_map(self) -> dict:
        return dict(self.features)

    def bucket_signature(self) -> tuple:
        """Shape fields reduced to power-of-two buckets: requests that share it share a route."""
        return (self.family, self.op, self.dtype, self.device.type, self.device.index, self.features,
                tuple((name, pow2_bucket(value)) for name, value in self.fields))

    def __str__(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.fields)
        feats = ", ".join(f"{k}={v!r}" for k, v in self.features)
        extra = f"; {feats}" if feats else ""
        return f"{self.family}.{self.op}({shape}{extra}) {self.dtype} on {self.device}"
