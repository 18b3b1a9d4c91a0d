"""The torch fallback of decode attention against the float64 reference and torch's own SDPA."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rlx_triton.backends.torch_ref import sdpa_decode as ref_backend
from tests.reference.sdpa_decode import DEGENERATE_CASES, assert_outcome, attention_reference, degenerate_inputs


def make_qkv(batch, num_heads, num_kv_heads, seq_q, seq_kv, head_dim, head_dim_v=None):
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    return (torch.randn(batch, num_heads, seq_q, head_dim), torch.randn(batch, num_kv_heads, seq_kv, head_dim),
            torch.randn(batch, num_kv_heads, seq_kv, head_dim_v))


def check(q, k, v, **kw):
    out, lse = ref_backend.sdpa_decode(q, k, v, candidate=None, **kw)
    ref_out, ref_lse = attention_reference(q, k, v, **kw)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5, equal_nan=True)
    return out, lse


def test_gqa_with_value_dim_and_scale():
    check(*make_qkv(2, 6, 2, 3, 17, 7, head_dim_v=11), scale=0.3)


@pytest.mark.parametrize("causal", ["top_left", "bottom_right"])
def test_causal_alignments_with_ragged_lengths(causal):
    check(*make_qkv(3, 2, 1, 4, 12, 8), causal=causal, cache_seqlens=torch.tensor([12, 5, 2]))


def test_bool_and_float_masks():
    q, k, v = make_qkv(2, 4, 2, 2, 9, 8)
    check(q, k, v, attn_mask=torch.rand(2, 1, 2, 9) > 0.5)
    check(q, k, v, attn_mask=torch.randn(1, 4, 2, 9))


def test_equals_torch_sdpa_with_top_left_causal():
    q, k, v = make_qkv(1, 2, 2, 3, 10, 8)
    out, _ = ref_backend.sdpa_decode(q, k, v, causal="top_left", candidate=None)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_half_inputs_return_half():
    q, k, v = (t.half() for t in make_qkv(1, 2, 1, 1, 5, 8))
    out, lse = ref_backend.sdpa_decode(q, k, v, candidate=None)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(DEGENERATE_CASES))
def test_degenerate_inputs_match_the_reference(case, dtype):
    q, k, v, kwargs, expect = degenerate_inputs(case, dtype)
    out, _ = check(q, k, v, **kwargs)
    assert out.dtype == dtype
    assert_outcome(out, expect)


# torch's math SDPA reads every key; the kernels and the reference never read keys past a sequence's
# length or, under top-left alignment, past the last query token (neither do torch's fused kernels)
_NEVER_READ = {"nan_past_the_valid_length", "nan_past_the_last_token_top_left"}


@pytest.mark.parametrize("case", [name for name in DEGENERATE_CASES if name not in _NEVER_READ])
def test_reference_is_torch_math_sdpa_on_degenerate_inputs(case):
    """Where NaN/Inf go is torch's math SDPA (the reference implementation of its docs): masks are additive."""
    q, k, v, kwargs, _ = degenerate_inputs(case, torch.float64)
    mask, causal = kwargs.get("attn_mask"), kwargs.get("causal", "none")
    if causal == "bottom_right":  # the full cache is valid: bottom-right is a lower-triangular bool mask
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
    with sdpa_kernel([SDPBackend.MATH]):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal == "top_left",
                                                  enable_gqa=True)
    out, _ = attention_reference(q, k, v, **kwargs)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_a_paged_cache_is_read_through_its_block_table(page_size):
    q, k, v = make_qkv(2, 4, 2, 2, 23, 8)
    pages = -(-23 // page_size)
    padded = [torch.nn.functional.pad(t, (0, 0, 0, pages * page_size - 23)) for t in (k, v)]
    order = torch.randperm(2 * pages + 1)
    table = order[:2 * pages].reshape(2, pages)
    pools = []
    for t in padded:
        pool = torch.randn(2 * pages + 1, 2, page_size, t.shape[-1])
        pool[table.flatten()] = t.reshape(2, 2, pages, page_size, -1).transpose(1, 2).reshape(2 * pages, 2, page_size, -1)
        pools.append(pool)
    lengths = torch.tensor([23, 4])
    out, lse = ref_backend.sdpa_decode(q, *pools, causal="bottom_right", cache_seqlens=lengths, block_table=table)
    ref_out, ref_lse = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
