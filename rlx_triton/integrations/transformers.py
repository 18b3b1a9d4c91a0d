"""transformers attention backend: `register(name)` makes `attn_implementation=name` run rt's attention.

After `register("rlx_triton")`, `model.set_attn_implementation("rlx_triton")` (or
`from_pretrained(..., attn_implementation="rlx_triton")`) routes every attention call of the model
through `rt.scaled_dot_product_attention`: decode steps and short prompts run the split-K Triton
kernel, everything else torch's SDPA. The mask function registered with it is transformers' SDPA mask
(boolean, True = attend), which the kernel reads in place; GQA comes from `module.num_key_value_groups`
and is passed as `enable_gqa`, so key/value are never repeated.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from rlx_triton.ops.sdpa_decode import scaled_dot_product_attention


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                      scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                      **kwargs) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q/k/v (B, H, L, D) in, (B, L, Hq, Dv) out, no weights.

    Causality follows transformers' SDPA integration: `is_causal` only when there are several query
    tokens and no mask (the mask carries causality otherwise).
    """
    if kwargs.get("softcap") is not None:
        raise ValueError("rlx_triton attention does not support softcap; use attn_implementation='eager'")
    if kwargs.get("position_bias") is not None:
        raise ValueError("rlx_triton attention does not support position_bias; use attn_implementation='sdpa'")
    groups = getattr(module, "num_key_value_groups", 1)
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(query.shape[2] > 1 and attention_mask is None and is_causal)
    out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                       is_causal=is_causal, scale=scaling, enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register(name: str = "rlx_triton") -> str:
    """Register rlx_triton's attention with transformers under `name` (default "rlx_triton"); returns the name.

    After it, `model.set_attn_implementation(name)` (or `from_pretrained(..., attn_implementation=name)`)
    runs every attention call through rt.scaled_dot_product_attention: KV-cache decode steps and short
    prompts on the kernel, the rest on torch's SDPA; padding masks and grouped-query heads are supported,
    softcap and position_bias are not (ValueError at the call). The mask function registered beside it is
    transformers' sdpa_mask. A name that is not a non-empty str raises ValueError. Needs
    transformers >= 4.56 (the `[transformers]` extra).

    Example:
        >>> import rlx_triton as rt
        >>> rt.integrations.transformers.register()
        'rlx_triton'
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register: name must be a non-empty string, got {name!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
