"""rt.flash_attn_varlen_func and rt.flash_attn_func: FA2's semantics on the torch path against a naive float64
reading of FA2, its return values, dropout (S_dmask), autograd and float64 on the torch path, routing (the
kernel where covered, MissingKernel naming what is not in strict mode), and FA's argument checks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from tests.reference.varlen_attention import make_varlen_inputs, naive_flash_attn_varlen

TORCH_PATH_CASES = [
    dict(seqlen_q=11, seqlen_k=20, head_dim=59, heads=(6, 2), causal=True),
    dict(seqlen_q=13, seqlen_k=21, head_dim=111, heads=(6, 1), window=(4, 2), softcap=2.0),
    dict(seqlen_q=10, seqlen_k=25, head_dim=40, heads=(6, 2), causal=True, alibi="batch_head", sinks=True),
    dict(seqlen_q=25, seqlen_k=12, head_dim=32, heads=(4, 4), alibi="head", page_size=3),
]


@pytest.mark.parametrize("case", TORCH_PATH_CASES, ids=["gqa-causal", "mqa-local-softcap", "alibi-sinks", "paged3"])
def test_the_torch_path_matches_the_float64_reading_of_fa2(case):
    kw = make_varlen_inputs(**case)
    with rt.use_backend("torch"):
        out, lse, s_dmask = rt.flash_attn_varlen_func(**kw, return_attn_probs=True)
    ref_out, ref_lse = naive_flash_attn_varlen(**kw)
    assert s_dmask is None and lse.shape == (kw["q"].shape[1], kw["q"].shape[0]) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=4e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=4e-5)


def test_float64_runs_the_torch_path_in_float64_and_strict_mode_names_it():
    kw = make_varlen_inputs(9, 14, 24, (4, 2), dtype=torch.float64, causal=True)
    out = rt.flash_attn_varlen_func(**kw)
    torch.testing.assert_close(out, naive_flash_attn_varlen(**kw)[0], rtol=1e-12, atol=1e-12)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="float64"):
        rt.flash_attn_varlen_func(**kw)


def test_flash_attn_func_is_torch_sdpa_with_bottom_right_causal_masking():
    q, k, v = torch.randn(2, 5, 4, 16), torch.randn(2, 7, 2, 16), torch.randn(2, 7, 2, 16)
    out, lse, s_dmask = rt.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    keep = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=7 - 5)
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              attn_mask=keep, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert lse.shape == (2, 4, 5) and s_dmask is None


def test_flash_attn_func_is_the_varlen_call_of_its_equal_length_batch():
    q, k, v = torch.randn(3, 4, 4, 32), torch.randn(3, 6, 1, 32), torch.randn(3, 6, 1, 32)
    out, lse, _ = rt.flash_attn_func(q, k, v, window_size=(2, 1), softcap=4.0, return_attn_probs=True)
    cu_q, cu_k = torch.arange(4, dtype=torch.int32) * 4, torch.arange(4, dtype=torch.int32) * 6
    packed, packed_lse, _ = rt.flash_attn_varlen_func(q.reshape(12, 4, 32), k.reshape(18, 1, 32), v.reshape(18, 1, 32),
                                                      cu_q, cu_k, 4, 6, window_size=(2, 1), softcap=4.0,
                                                      return_attn_probs=True)
    torch.testing.assert_close(out, packed.reshape(3, 4, 4, 32), rtol=0, atol=0)
    torch.testing.assert_close(lse, packed_lse.reshape(4, 3, 4).transpose(0, 1), rtol=0, atol=0)


def test_dropout_drops_probabilities_and_s_dmask_shows_which():
    kw = make_varlen_inputs(0, 0, 16, (2, 2), lengths_q=[3, 4], lengths_k=[5, 6])
    torch.manual_seed(0)
    out, _, s_dmask = rt.flash_attn_varlen_func(**kw, dropout_p=0.3, return_attn_probs=True)
    assert s_dmask.shape == (2, 2, 4, 6)
    assert bool((s_dmask < 0).any())             # FA's sign encoding: dropped probabilities are negative
    for s, (q0, k0, length_q, length_k) in enumerate(((0, 0, 3, 5), (3, 5, 4, 6))):
        kept = s_dmask[s, :, :length_q, :length_k].clamp(min=0) / (1 - 0.3)     # (H, Lq, Lk)
        expected = torch.einsum("hqk,khd->qhd", kept, kw["v"][k0:k0 + length_k])
        torch.testing.assert_close(out[q0:q0 + length_q], expected, rtol=1e-5, atol=1e-5)


def test_dropout_runs_the_torch_path_and_strict_mode_names_it():
    kw = make_varlen_inputs(5, 9, 16, (2, 1))
    with rt.use_backend("triton"):
        assert "dropout" in str(rt.explain(rt.flash_attn_varlen_func, **kw, dropout_p=0.1).skipped_reasons["triton"])
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="dropout"):
        rt.flash_attn_varlen_func(**kw, dropout_p=0.1)


def test_autograd_runs_the_torch_path_with_sdpas_gradients():
    q, k, v = (torch.randn(1, 6, 2, 16, requires_grad=True) for _ in range(3))
    rt.flash_attn_func(q, k, v, causal=True).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                   is_causal=True).sum().backward()
    for got, t in zip(grads, (q, k, v)):
        torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5)


def test_no_query_token_gives_empty_outputs():
    q, k = torch.randn(0, 4, 16), torch.randn(3, 2, 16)
    out, lse, _ = rt.flash_attn_varlen_func(q, k, k, torch.zeros(2, dtype=torch.int32),
                                            torch.tensor([0, 3], dtype=torch.int32), 0, 3, return_attn_probs=True)
    assert out.shape == (0, 4, 16) and lse.shape == (4, 0)


def _valid():
    return make_varlen_inputs(0, 0, 16, (4, 2), lengths_q=[2, 3], lengths_k=[4, 5])


BAD_ARGUMENTS = [
    ({"q": torch.randn(5, 4, 16, dtype=torch.float16)}, TypeError, "dtype of q|k must have"),
    ({"q": torch.randn(5, 4)}, ValueError, "q must be 3-D"),
    ({"k": torch.randn(9, 3, 16), "v": torch.randn(9, 3, 16)}, ValueError, "must divide"),
    ({"k": torch.randn(9, 2, 8)}, ValueError, "k's head dim"),
    ({"cu_seqlens_q": torch.tensor([0.0, 2.0, 5.0])}, TypeError, "cu_seqlens_q must have dtype"),
    ({"cu_seqlens_k": torch.tensor([0, 4], dtype=torch.int32)}, ValueError, "cu_seqlens_k must have shape"),
    ({"cu_seqlens_k": torch.tensor([0, 5, 4], dtype=torch.int32)}, ValueError, "never decrease"),
    ({"cu_seqlens_k": torch.tensor([0, 4, 12], dtype=torch.int32), "max_seqlen_k": 8}, ValueError, "exceeds k's"),
    ({"max_seqlen_q": 2}, ValueError, "longer .* than max_seqlen_q"),
    ({"max_seqlen_q": True}, TypeError, "max_seqlen_q"),
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
    ({"softmax_scale": "0.1"}, TypeError, "softmax_scale"),
    ({"causal": 1}, TypeError, "causal"),
    ({"window_size": (-2, 0)}, ValueError, "window_size"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"alibi_slopes": torch.ones(3)}, ValueError, "alibi_slopes"),
    ({"s_aux": torch.ones(2)}, ValueError, "s_aux"),
    ({"block_table": torch.zeros(2, 1, dtype=torch.int32)}, ValueError, "k must be 4-D"),
]


@pytest.mark.parametrize("change, error, message", BAD_ARGUMENTS, ids=lambda x: x if isinstance(x, str) else "")
def test_bad_arguments_are_refused_naming_them_before_any_launch(change, error, message):
    kw = dict(_valid(), **change)
    with pytest.raises(error, match=message):
        rt.flash_attn_varlen_func(**kw)


def test_a_block_table_entry_outside_the_cache_is_refused():
    kw = make_varlen_inputs(0, 0, 16, (2, 1), lengths_q=[1, 1], lengths_k=[3, 4], page_size=2)
    kw["block_table"] = kw["block_table"].clone()
    kw["block_table"][1, 1] = 99
    with pytest.raises(ValueError, match="block_table entries"):
        rt.flash_attn_varlen_func(**kw)


def test_flash_attn_func_checks_the_batch():
    with pytest.raises(ValueError, match="batch size"):
        rt.flash_attn_func(torch.randn(2, 3, 4, 16), torch.randn(1, 3, 4, 16), torch.randn(1, 3, 4, 16))

