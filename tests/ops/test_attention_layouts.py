"""rt.sdpa_decode takes (B, H, S, D) tensors, rt.flash_attn_with_kvcache (B, S, H, D): passing one layout to the
other op is an error that names the layout the op takes and the likely mix-up, before any launch."""
import pytest
import torch

import rlx_triton as rt

# (batch, query heads, KV heads, cache length, head dim): odd sizes, grouped-query heads
SIZES = [(2, 8, 2, 37, 16), (1, 3, 1, 5, 8)]


def heads_first(batch, heads, kv_heads, length, dim, dtype):
    q = torch.randn(batch, heads, 1, dim, dtype=dtype)
    k = torch.randn(batch, kv_heads, length, dim, dtype=dtype)
    return q, k, torch.randn_like(k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sizes", SIZES)
def test_sdpa_decode_given_flash_attention_layout_says_which_layout_it_takes(sizes, dtype):
    q, k, v = (t.transpose(1, 2) for t in heads_first(*sizes, dtype))
    with pytest.raises(ValueError, match=r"sdpa_decode takes \(B, H, S, D\) tensors; these look like "
                                         r"rt\.flash_attn_with_kvcache's \(B, S, H, D\)"):
        rt.sdpa_decode(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sizes", SIZES)
def test_flash_attn_with_kvcache_given_sdpa_layout_says_which_layout_it_takes(sizes, dtype):
    q, k, v = heads_first(*sizes, dtype)
    with pytest.raises(ValueError, match=r"flash_attn_with_kvcache takes \(B, S, H, D\) tensors; these look like "
                                         r"rt\.sdpa_decode's \(B, H, S, D\)"):
        rt.flash_attn_with_kvcache(q, k, v)


def test_heads_that_fit_neither_layout_get_the_layout_without_a_guess():
    q, k, v = heads_first(2, 3, 2, 7, 8, torch.float32)
    with pytest.raises(ValueError, match=r"must divide the query heads \(3\) \(sdpa_decode takes \(B, H, S, D\) "
                                         r"tensors\)$"):
        rt.sdpa_decode(q, k, v)


@pytest.mark.parametrize("sizes", SIZES)
def test_the_transposed_tensors_run_in_the_other_op_as_the_hint_says(sizes):
    q, k, v = heads_first(*sizes, torch.float64)
    decoded = rt.sdpa_decode(q, k, v)
    flashed = rt.flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    torch.testing.assert_close(flashed.transpose(1, 2), decoded, rtol=1e-9, atol=1e-9)
