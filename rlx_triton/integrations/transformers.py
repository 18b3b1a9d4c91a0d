"""transformers attention backend: `register()` makes every attention name rt documents usable.

After `register()` (one call, nothing else):
- "rlx_triton" (`register(name)` picks another): `model.set_attn_implementation("rlx_triton")`,
  `from_pretrained(..., attn_implementation="rlx_triton")` or `from_config(..., attn_implementation=...)` routes
  every attention call of the model through `rt.scaled_dot_product_attention`: decode steps, short prompts and
  assisted generation's verification of its drafts (up to 64 query tokens under transformers' mask) run the
  split-K Triton kernel, everything else torch's SDPA. The mask function registered with it is
  transformers' SDPA mask (boolean, True = attend), which the kernel reads in place; GQA comes from
  `module.num_key_value_groups` and is passed as `enable_gqa`, so key/value are never repeated.
- CONTINUOUS_BATCHING_ATTENTION ("rlx_triton_flash_attention_2"), the name continuous batching
  (`model.generate_batch`) takes: transformers' own flash-attention path on rt's FlashAttention 2 API
  (`register_flash`, which register() calls for this name; transformers >= 5).
"""
from __future__ import annotations

from typing import Optional, Set, Tuple

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
    """Register rlx_triton's attention with transformers: every attention name rt documents becomes usable through
    set_attn_implementation, from_pretrained and from_config; returns `name`.

    `name` (default "rlx_triton") runs every attention call through rt.scaled_dot_product_attention: KV-cache
    decode steps and short prompts on the kernel, the rest on torch's SDPA; padding masks and grouped-query heads
    are supported, softcap and position_bias are not (ValueError at the call). The mask function registered
    beside it is transformers' sdpa_mask. With transformers >= 5 it also registers CONTINUOUS_BATCHING_ATTENTION
    (`register_flash`), the name continuous batching (`model.generate_batch`) takes. A name that is not a
    non-empty str raises ValueError. Needs transformers >= 4.56 (the `[transformers]` extra).

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
    if _has_flash_path():
        register_flash(CONTINUOUS_BATCHING_ATTENTION)
    return name


def _has_flash_path() -> bool:
    """Whether this transformers has the flash-attention path register_flash plugs into: transformers >= 5 (its
    flash loader's signature and continuous batching's name rules)."""
    import transformers

    major = transformers.__version__.split(".", 1)[0]
    return major.isdigit() and int(major) >= 5


# ---------------------------------------------------------------------------------------------------
# transformers' flash-attention path, continuous batching included
# ---------------------------------------------------------------------------------------------------
# The attention implementation name continuous batching takes (transformers accepts "paged|eager", "sdpa" or
# names containing "flash" there); "flash...2" also opens its decode fast path on CUDA (flash_attn_with_kvcache).
CONTINUOUS_BATCHING_ATTENTION = "rlx_triton_flash_attention_2"
# the attention names register() makes usable (transformers >= 5 for the second)
ATTENTION_NAMES = ("rlx_triton", CONTINUOUS_BATCHING_ATTENTION)


def _flash_functions():
    """rt's FlashAttention 2 API, in the order transformers' flash loader returns it (with its own pad/unpad)."""
    from transformers import modeling_flash_attention_utils as fa_utils

    from rlx_triton.ops.flash_attn import flash_attn_with_kvcache
    from rlx_triton.ops.varlen_attention import flash_attn_func, flash_attn_varlen_func

    return flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, fa_utils._pad_input, fa_utils._unpad_input


def _install_flash_resolver(name: str) -> None:
    """Makes transformers' flash loader (`modeling_flash_attention_utils._lazy_imports`, which resolves
    "flash_attention_2/3/4" to the flash_attn packages and any other name to a `kernels` hub repo) resolve
    `name` to rt's functions, and hand every other name on to the loader it replaces. Installed once."""
    from transformers import modeling_flash_attention_utils as fa_utils

    loader = fa_utils._lazy_imports
    names = getattr(loader, "rlx_triton_names", None)
    if names is None:
        previous = loader
        registered: Set[str] = set()

        def resolve(implementation, attention_wrapper=None, allow_all_kernels=False):
            if implementation in registered:
                return _flash_functions()
            return previous(implementation, attention_wrapper, allow_all_kernels=allow_all_kernels)

        # kept on the installed loader, where the next call finds it
        resolve.rlx_triton_names = names = registered  # type: ignore[attr-defined]  # a function attribute
        fa_utils._lazy_imports = resolve
    names.add(name)


def register_flash(name: str = CONTINUOUS_BATCHING_ATTENTION) -> str:
    """Register rt's FlashAttention 2 API with transformers' own flash-attention path under `name` (it must
    contain "flash"); returns the name. register() calls it for CONTINUOUS_BATCHING_ATTENTION; call it yourself
    for another flash name (transformers' continuous batching and decode fast path test for "flash" in it).

    After it, `attn_implementation=name` runs transformers' flash integration with rt.flash_attn_func,
    rt.flash_attn_varlen_func and rt.flash_attn_with_kvcache in place of the flash_attn package: padded
    `generate` (unpad -> varlen), and continuous batching (`model.generate_batch(...)`), whose prefill chunks
    and decodes run as one ragged varlen call per layer (rt's varlen kernel), and whose CUDA decode fast path
    runs rt.flash_attn_with_kvcache on the paged cache. Sliding windows, softcap and attention sinks (s_aux)
    pass through. The mask function registered beside it is transformers' flash_attention_mask.
    transformers resolves flash implementation names through `kernels` hub repos; this resolves `name`
    in its flash loader instead, so no `kernels` package is needed. Needs transformers >= 5.

    Example:
        >>> import rlx_triton as rt
        >>> rt.integrations.transformers.register_flash()
        'rlx_triton_flash_attention_2'
    """
    if not isinstance(name, str) or "flash" not in name:
        raise ValueError(f"register_flash: name must be a str containing 'flash' (transformers' test for a flash "
                         f"implementation), got {name!r}")
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    _install_flash_resolver(name)
    AttentionInterface.register(name, flash_attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name
