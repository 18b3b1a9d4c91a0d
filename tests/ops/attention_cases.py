"""Attention inputs and torch's values shared by the tests of rt.scaled_dot_product_attention
(tests/ops/test_sdpa.py) and rt.sdpa_decode (tests/ops/test_sdpa_decode.py): random q/k/v of given shapes,
torch's SDPA in float64 with the per-dtype tolerances, and rows of non-finite scores."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def qkv(*shape_q, kv_heads=None, seq_kv=23, head_dim_v=None, dtype=torch.float32, device="cpu"):
    """query (..., H, Lq, D); key/value (..., Hkv, S, D/Dv)."""
    *lead, heads, seq_q, head_dim = shape_q
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    make = lambda *s: torch.randn(*s, device=device).to(dtype)  # noqa: E731
    return make(*shape_q), make(*lead, kv_heads, seq_kv, head_dim), make(*lead, kv_heads, seq_kv, head_dim_v)


def torch_sdpa64(q, k, v, **kw):
    mask = kw.pop("attn_mask", None)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, **kw)


def assert_like_torch(out, q, k, v, **kw):
    expected = torch_sdpa64(q, k, v, **kw)
    assert out.shape == expected.shape and out.dtype == q.dtype
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * 4)


def non_finite_rows(case, dtype):
    """The reported shapes: query (1, 2, 1, 16) x keys (1, 2, 5, 16), one query row all NaN or every key +-inf."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=generator) for n in (1, 5, 5))
    if case == "nan_query_row":
        q[0, 0] = float("nan")
    else:
        k.fill_(float("inf") if case == "inf_keys" else float("-inf"))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def math_sdpa64(q, k, v, **kw):
    with sdpa_kernel([SDPBackend.MATH]):
        return torch_sdpa64(q, k, v, **kw)

