"""rt's kernels behind torch's own flash-attention door: the "RLX" implementation of torch.nn.attention's registry.

    import rlx_triton                                             # registers "RLX" (never activates it)
    torch.nn.attention.activate_flash_attention_impl("RLX")       # F.scaled_dot_product_attention on CUDA runs rt

torch's flash SDPA path calls `aten::_scaled_dot_product_flash_attention` on CUDA tensors (F.sdpa with no mask,
16-bit inputs, equal head dims: the calls torch's own flash kernel would take). Activating "RLX" registers
`flash_sdpa_forward` as that op's CUDA kernel (registering a CUDA kernel needs no GPU): each call is routed as
rt.scaled_dot_product_attention routes the same call (the same request, coverage, approvals and speed rules, so
`rt.explain(rt.scaled_dot_product_attention, q, k, v, is_causal=..., scale=..., enable_gqa=...)` says what it
runs), and runs the decode kernel where that route names one, torch's own flash kernel
(`aten::_flash_attention_forward`, what torch's flash SDPA calls) everywhere else: dropout, the debug mask,
calls autograd records (torch's backward reads its forward's LSE and random state), shapes no kernel covers.
The kernel route returns torch's outputs: the attention with query's strides, the LSE (B, H, L) float32 and
empty random state (no dropout). Calls on other devices never reach this op's CUDA kernel, so CPU calls of F.sdpa
are unchanged. `activate` returns the handle torch keeps; `restore_flash_attention_impl()` removes the kernel
(torch's own is back).

The registration itself (`rlx_triton/_torch_registration.py`) imports nothing heavy: `import rlx_triton` stays
cheap, whether torch is imported before or after it.
"""
from __future__ import annotations

from typing import Optional

import torch

from rlx_triton.ops.sdpa import _build_sdpa_request, scaled_dot_product_attention
from rlx_triton.router import Route, route

NAME = "RLX"
_OP = "_scaled_dot_product_flash_attention"


class FlashImplHandle:
    """What activate returns and torch's registry keeps: remove() drops the CUDA kernel (torch's own comes back)."""

    def __init__(self, library: torch.library.Library):
        self.library: Optional[torch.library.Library] = library

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


def activate() -> FlashImplHandle:
    """Registers `flash_sdpa_forward` as the CUDA kernel of aten::_scaled_dot_product_flash_attention (what
    torch.nn.attention.activate_flash_attention_impl("RLX") calls)."""
    library = torch.library.Library("aten", "IMPL", "CUDA")
    library.impl(_OP, flash_sdpa_forward, "CUDA")
    return FlashImplHandle(library)


def flash_sdpa_request(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                       is_causal: bool = False):
    """The routing request of a flash SDPA call: rt.scaled_dot_product_attention's for the same call (grouped heads
    are enable_gqa; torch's flash path takes is_causal only with as many queries as keys, where top-left is
    bottom-right)."""
    return _build_sdpa_request(query, key, value, None, dropout_p, is_causal, key.shape[1] != query.shape[1])


def flash_sdpa_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                       is_causal: bool = False, return_debug_mask: bool = False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention under "RLX": (B, H, L, E) query, (B, Hkv, S, E) key and value;
    returns torch's tuple (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused,
    debug_attn_mask)."""
    decided = None
    if not return_debug_mask:
        decided = route(flash_sdpa_request(query, key, value, dropout_p, is_causal),
                        call=lambda: (scaled_dot_product_attention, (query, key, value),
                                      dict(dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                           enable_gqa=key.shape[1] != query.shape[1])))
    if decided is None or decided.backend == "torch":
        return torch_flash_forward(query, key, value, dropout_p, is_causal, return_debug_mask, scale)
    return _kernel_forward(decided, query, key, value, is_causal, scale)


def _kernel_forward(decided: Route, query, key, value, is_causal: bool, scale):
    module = decided.module
    assert module is not None, "route() names the module that runs the call"
    options = {"route": decided} if decided.backend == "triton" else {}
    out, lse = module.sdpa_decode(query, key, value, causal="top_left" if is_causal else "none", scale=scale,
                                  candidate=decided.candidate, **options)
    attention = torch.empty_like(query)   # the strides torch's flash kernel (and its meta function) give
    attention.copy_(out)
    device = query.device
    return (attention, lse.contiguous(), None, None, query.shape[2], key.shape[2],
            torch.zeros((2,), dtype=torch.uint64, device=device), torch.zeros((), dtype=torch.uint64, device=device),
            torch.empty(0, dtype=query.dtype, device=device))


def torch_flash_forward(query, key, value, dropout_p, is_causal, return_debug_mask, scale):
    """torch's own flash SDPA on (B, H, L, E) tensors, as torch's CUDA kernel of the op computes it: its flash
    forward on the (B, L, H, E) views, the output given back as (B, H, L, E)."""
    max_q, max_k = query.shape[2], key.shape[2]
    out, lse, rng_state, unused, debug_mask = torch.ops.aten._flash_attention_forward(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), None, None, max_q, max_k, dropout_p,
        is_causal, return_debug_mask, scale=scale)
    return out.transpose(1, 2), lse, None, None, max_q, max_k, rng_state, unused, debug_mask
