"""Float64 references for the conv family's 2-D ops (conv2d with epilogue, linear, stats pooling)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

# Relative tolerances per dtype (DESIGN.md), atol scaled by the reduced length in `assert_close_ref`.
RTOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
TF32_RTOL = 1e-3


def conv2d64(x, weight, bias=None, *, stride=1, padding=0, residual=None, relu=False) -> torch.Tensor:
    y = F.conv2d(x.double(), weight.double(), None if bias is None else bias.double(), stride=stride, padding=padding)
    if residual is not None:
        y = y + residual.double()
    return torch.relu(y) if relu else y


def linear64(x, weight, bias=None) -> torch.Tensor:
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


def stats_pool64(x: torch.Tensor, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """pyannote StatsPool in float64. weights: None, (B, T) or (B, S, T) at x's frame count."""
    seq = x.double()
    if weights is None:
        mean = seq.mean(-1)
        std = seq.std(-1, correction=1) if seq.shape[-1] > 1 else torch.zeros_like(mean)
        return torch.cat([mean, std], -1)
    w = weights.double()
    squeeze = w.dim() == 2
    w = w.unsqueeze(1) if squeeze else w
    outs = []
    for s in range(w.shape[1]):
        ws = w[:, s].unsqueeze(1)
        v1 = ws.sum(2) + 1e-8
        mean = (seq * ws).sum(2) / v1
        v2 = ws.square().sum(2)
        var = ((seq - mean.unsqueeze(2)).square() * ws).sum(2) / (v1 - v2 / v1 + 1e-8)
        outs.append(torch.cat([mean, var.sqrt()], 1))
    out = torch.stack(outs, 1)
    return out[:, 0] if squeeze else out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|: the relative error the approvals state."""
    ref = ref.double()
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def assert_close_ref(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, reduced: int, rtol=None) -> None:
    """torch.testing.assert_close against the float64 reference: rtol per dtype, atol = rtol * reduced length
    scaled by the reference magnitude."""
    rtol = RTOL[dtype] if rtol is None else rtol
    scale = ref.abs().max().clamp_min(1.0).item()
    torch.testing.assert_close(out.double(), ref.double(), rtol=rtol, atol=rtol * scale * max(1, reduced) ** 0.5)
