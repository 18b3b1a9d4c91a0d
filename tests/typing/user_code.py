"""User code that type-checks against rlx_triton's public surface: every return type an op's flag selects is
the one its annotation here says (tests/typing/test_overloads.py runs mypy on this file and expects no error,
and calls check() to see that the values are of those types when it runs).

Not collected by pytest (not a test_*.py file); kept as real code so that editors and mypy read it as a user's.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

import rlx_triton as rt


def decode(q: torch.Tensor, cache: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out: torch.Tensor = rt.sdpa_decode(q, cache, cache, lengths)
    out_too: torch.Tensor = rt.sdpa_decode(q, cache, cache, lengths, return_lse=False)
    with_lse: Tuple[torch.Tensor, torch.Tensor] = rt.sdpa_decode(q, cache, cache, lengths, return_lse=True)
    lse: torch.Tensor = with_lse[1]
    assert out.shape == out_too.shape
    return out, lse


def decode_with_a_flag(q: torch.Tensor, cache: torch.Tensor, flag: bool) -> torch.Tensor:
    # a flag known only when it runs: either result, which the caller tells apart
    result = rt.sdpa_decode(q, cache, cache, return_lse=flag)
    return result[0] if isinstance(result, tuple) else result


def flash_decode(q: torch.Tensor, cache: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    out: torch.Tensor = rt.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths, causal=True)
    softmax_lse: torch.Tensor
    out, softmax_lse = rt.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths, return_softmax_lse=True)
    return out, softmax_lse


def varlen(q: torch.Tensor, k: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor) -> Optional[torch.Tensor]:
    out: torch.Tensor = rt.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 5, causal=True)
    probs: Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]] = rt.flash_attn_varlen_func(
        q, k, k, cu_q, cu_k, 3, 5, return_attn_probs=True)
    batched: torch.Tensor = rt.flash_attn_func(q[None], k[None], k[None])
    lse: torch.Tensor = rt.flash_attn_func(q[None], k[None], k[None], return_attn_probs=True)[1]
    assert out.shape[0] == probs[0].shape[0] and batched.dim() == 4 and lse.dim() == 3
    return probs[2]


def explained(q: torch.Tensor, cache: torch.Tensor, frames: torch.Tensor) -> Dict[str, Any]:
    op_route: rt.Route = rt.explain(rt.sdpa_decode, q, cache, cache)
    module_route: rt.Route = rt.explain(rt.nn.LSTM(8, 16, batch_first=True), frames)
    model_routes: Dict[str, Any] = rt.explain(torch.nn.Sequential(rt.nn.LSTM(8, 16, batch_first=True)), frames)
    assert op_route.op == "sdpa_decode" and module_route.op == "lstm"
    return model_routes


def check() -> None:
    """Runs every function above on small CPU tensors; each result has the type its annotation says."""
    q, cache = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 20, 16)
    lengths = torch.tensor([20, 7], dtype=torch.int32)
    out, lse = decode(q, cache, lengths)
    assert isinstance(out, torch.Tensor) and lse.shape == (2, 4, 1)
    assert isinstance(decode_with_a_flag(q, cache, True), torch.Tensor)
    flash_q, flash_cache = q.transpose(1, 2), cache.transpose(1, 2).contiguous()
    out, softmax_lse = flash_decode(flash_q, flash_cache, lengths)
    assert out.shape == (2, 1, 4, 16) and softmax_lse.shape == (2, 4, 1)
    packed_q, packed_k = torch.randn(5, 4, 16), torch.randn(9, 2, 16)
    offsets_q, offsets_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    assert varlen(packed_q, packed_k, offsets_q, offsets_k) is None   # S_dmask: None without dropout
    assert list(explained(q, cache, torch.randn(2, 5, 8))) == ["0"]
