"""rt.scaled_dot_product_attention, rt.sdpa_decode and rt.patch_sdpa: routing, torch semantics, validation,
torch.library registration (opcheck, torch.compile), and the GPU checks (CUDA graphs, every dtype)."""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import rlx_triton as rt
from rlx_triton.ops.sdpa_decode import AttentionInputError
from tests.reference.sdpa_decode import DEGENERATE_CASES, assert_outcome, attention_reference, degenerate_inputs

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


# --- routing -------------------------------------------------------------------------------------
def test_decode_shaped_calls_route_to_the_triton_kernel():
    q, k, v = qkv(2, 8, 1, 64, kv_heads=2, dtype=torch.float16)
    with rt.use_backend("triton"):
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).backend == "triton"
        assert rt.explain(rt.sdpa_decode, q, k, v).backend == "triton"


def test_long_queries_and_dropout_route_to_torch():
    q, k, v = qkv(1, 2, 17, 16)
    with rt.use_backend("triton"):
        long_route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        assert long_route.backend == "torch" and "seq_q=17" in str(long_route.skipped_reasons["triton"])
        q, k, v = qkv(1, 2, 1, 16)
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v, dropout_p=0.5).backend == "torch"


def test_uncovered_requests_fall_back_to_torch_with_the_same_values():
    q, k, v = qkv(1, 2, 20, 16)  # 20 query tokens: prefill, not decode
    with rt.use_backend("triton"):
        out = rt.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_strict_mode_raises_missing_kernel_for_uncovered_requests():
    q, k, v = qkv(1, 2, 20, 16)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel):
        rt.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_strict_mode_refuses_dropout_through_the_router(backend):
    q, k, v = qkv(1, 2, 1, 16)
    with rt.use_backend(backend, strict=True):
        with pytest.raises(rt.MissingKernel, match="dropout=True") as from_explain:
            rt.explain(rt.scaled_dot_product_attention, q, k, v, dropout_p=0.5)
        with pytest.raises(rt.MissingKernel, match="dropout=True") as from_call:
            rt.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert from_call.value.reasons == from_explain.value.reasons


def test_dropout_runs_torch_with_its_random_stream():
    q, k, v = qkv(1, 2, 3, 16)
    with rt.use_backend("triton"):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v, dropout_p=0.5)
        torch.manual_seed(7)
        out = rt.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(7)
    expected = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert route.backend == "torch" and "dropout=True" in str(route.skipped_reasons["triton"])
    torch.testing.assert_close(out, expected)


def test_strict_mode_refuses_calls_that_autograd_records():
    q, k, v = qkv(1, 2, 1, 16)
    q.requires_grad_()
    with rt.use_backend("triton", strict=True):
        for op in (rt.scaled_dot_product_attention, rt.sdpa_decode):
            with pytest.raises(rt.MissingKernel, match="requires_grad=True"):
                rt.explain(op, q, k, v)
            with pytest.raises(rt.MissingKernel, match="requires_grad=True"):
                op(q, k, v)


@pytest.mark.parametrize("shape_q, shape_kv", [((1, 2, 1, 16), (1, 2, 0, 16)), ((0, 2, 1, 16), (0, 2, 5, 16))],
                         ids=["no-keys", "empty-batch"])
def test_empty_inputs_are_routed_decisions(shape_q, shape_kv):
    q, k, v = torch.randn(shape_q), torch.randn(shape_kv), torch.randn(shape_kv)
    with rt.use_backend("triton"):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        out = rt.scaled_dot_product_attention(q, k, v)
    assert route.backend == "torch"
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel):
        rt.scaled_dot_product_attention(q, k, v)


def test_float64_runs_torch_and_is_refused_in_strict_mode():
    q, k, v = qkv(1, 2, 1, 16, dtype=torch.float64)
    with rt.use_backend("triton"):
        out = rt.scaled_dot_product_attention(q, k, v)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-12, atol=1e-12)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="dtype float64"):
        rt.scaled_dot_product_attention(q, k, v)


def test_sdpa_decode_float64_runs_torch_in_float64():
    q, k, v = qkv(2, 4, 2, 16, kv_heads=2, seq_kv=19, dtype=torch.float64)
    lengths = torch.tensor([19, 4])
    with rt.use_backend("triton"):
        route = rt.explain(rt.sdpa_decode, q, k, v, lengths)
        out, lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    assert route.backend == "torch" and out.dtype == torch.float64 and lse.dtype == torch.float32
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)


# --- torch semantics through the kernel ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gqa_decode_matches_torch(dtype):
    q, k, v = qkv(2, 8, 1, 80, kv_heads=2, seq_kv=45, dtype=dtype)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert_like_torch(out, q, k, v, enable_gqa=True)


def test_single_kv_head_broadcasts_without_enable_gqa():
    q, k, v = qkv(1, 4, 2, 16, kv_heads=1)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v)
    assert_like_torch(out, q, k, v)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32], ids=["bool", "float"])
def test_masks_match_torch(mask_dtype):
    q, k, v = qkv(2, 4, 3, 16)
    mask = torch.rand(2, 1, 3, 23) > 0.3 if mask_dtype == torch.bool else torch.randn(3, 23)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_like_torch(out, q, k, v, attn_mask=mask)


def test_float32_mask_with_half_inputs_is_accepted_like_torch():
    q, k, v = qkv(1, 2, 1, 16, dtype=torch.float16)
    mask = torch.randn(1, 23)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_like_torch(out, q, k, v, attn_mask=mask)


def test_mask_of_another_float_dtype_is_rejected_like_torch():
    q, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        rt.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(1, 23, dtype=torch.float64))


def test_is_causal_is_top_left_like_torch():
    q, k, v = qkv(1, 2, 4, 16, seq_kv=9)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_like_torch(out, q, k, v, is_causal=True)


def test_fully_masked_rows_give_zero_like_torch():
    q, k, v = qkv(1, 2, 2, 16)
    mask = torch.ones(2, 23, dtype=torch.bool)
    mask[1] = False
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (out[:, :, 1] == 0).all()
    assert_like_torch(out, q, k, v, attn_mask=mask)


def test_custom_scale_and_value_head_dim():
    q, k, v = qkv(1, 2, 1, 24, head_dim_v=40)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, scale=0.2)
    assert_like_torch(out, q, k, v, scale=0.2)


@pytest.mark.parametrize("shape", [(6, 1, 16), (2, 3, 2, 1, 16)], ids=["3d", "5d"])
def test_any_leading_batch_dims(shape):
    q, k, v = qkv(*shape)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v)
    assert_like_torch(out, q, k, v)


def test_strided_query_from_a_transposed_layout():
    q = torch.randn(2, 1, 4, 16).transpose(1, 2)  # (B, H, 1, D) view of (B, 1, H, D)
    _, k, v = qkv(2, 4, 1, 16)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v)
    assert_like_torch(out, q, k, v)


# the SDPA-shaped degenerate cases (no cache lengths); bottom-right alignment over a full cache is a bool mask
_SDPA_CASES = [name for name in DEGENERATE_CASES if name != "nan_past_the_valid_length"]


def _as_sdpa_call(case, dtype):
    """(q, k, v, SDPA keywords, reference keywords, expect) of a degenerate case."""
    q, k, v, reference_kwargs, expect = degenerate_inputs(case, dtype)
    kwargs = dict(reference_kwargs)
    causal = kwargs.pop("causal", "none")
    if causal == "bottom_right":
        kwargs["attn_mask"] = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(k.shape[-2] - q.shape[-2])
    return q, k, v, dict(kwargs, is_causal=causal == "top_left"), reference_kwargs, expect


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", _SDPA_CASES)
def test_degenerate_inputs_give_torch_math_sdpa_values_through_the_kernel(case, dtype):
    """NaN and Inf land where torch's math SDPA puts them (masks are additive), on the kernel path."""
    q, k, v, kwargs, reference_kwargs, expect = _as_sdpa_call(case, dtype)
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    expected, _ = attention_reference(q, k, v, **reference_kwargs)
    with sdpa_kernel([SDPBackend.MATH]):
        math_sdpa = torch_sdpa64(q, k, v, enable_gqa=True, **kwargs)
    if case != "nan_past_the_last_token_top_left":  # torch's math backend reads keys past the last token
        torch.testing.assert_close(expected, math_sdpa, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(out.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * 4, equal_nan=True)
    assert_outcome(out, expect)


# sdpa_decode takes no mask and aligns bottom-right: the cases without a mask or top-left alignment
_DECODE_CASES = [name for name in DEGENERATE_CASES if "mask" not in name and "top_left" not in name]


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", _DECODE_CASES)
def test_sdpa_decode_degenerate_inputs_match_the_reference_on_both_paths(case, backend):
    q, k, v, kwargs, expect = degenerate_inputs(case)
    lengths = kwargs.get("cache_seqlens")
    with rt.use_backend(backend, strict=backend != "torch"):
        out, lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5, equal_nan=True)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert_outcome(out, expect)


# --- validation ----------------------------------------------------------------------------------
def test_non_tensor_query_is_a_type_error():
    _, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(TypeError, match="query"):
        rt.scaled_dot_product_attention([1.0], k, v)


def test_mixed_dtypes_raise_like_torch():
    q, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(RuntimeError, match="same dtype"):
        rt.scaled_dot_product_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="key"):
        rt.scaled_dot_product_attention(q, k.half(), v)


def test_mismatched_head_dim_names_key():
    q, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(AttentionInputError, match="key"):
        rt.scaled_dot_product_attention(q, k[..., :8], v)


def test_gqa_heads_must_divide():
    q, k, v = qkv(1, 4, 1, 16, kv_heads=3)
    with pytest.raises(AttentionInputError, match="divide"):
        rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_mask_must_broadcast():
    q, k, v = qkv(1, 2, 3, 16)
    with pytest.raises(AttentionInputError, match="attn_mask"):
        rt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 23, dtype=torch.bool))


def test_dropout_must_be_a_probability():
    q, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(ValueError, match="dropout_p"):
        rt.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


# --- sdpa_decode ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_sdpa_decode_with_ragged_cache_lengths(dtype):
    q, k, v = qkv(3, 4, 3, 16, kv_heads=2, seq_kv=40, dtype=dtype)
    lengths = torch.tensor([40, 7, 2], dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        out, lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.double(), ref_out, rtol=TOL[dtype], atol=TOL[dtype] * 4)
    assert lse.shape == (3, 4, 3) and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))  # length 2 < 3 tokens: the first sees nothing


def test_sdpa_decode_fallback_equals_kernel():
    q, k, v = qkv(2, 2, 2, 16, seq_kv=30)
    lengths = torch.tensor([30, 9])
    with rt.use_backend("triton", strict=True):
        kernel = rt.sdpa_decode(q, k, v, lengths, scale=0.3)
    with rt.use_backend("torch"):
        library = rt.sdpa_decode(q, k, v, lengths, scale=0.3)
    torch.testing.assert_close(kernel, library, rtol=1e-5, atol=1e-5)


def test_sdpa_decode_single_token_without_lengths_is_plain_attention():
    q, k, v = qkv(2, 4, 1, 16, kv_heads=1)
    out = rt.sdpa_decode(q, k, v)
    assert_like_torch(out, q, k, v)


@pytest.mark.parametrize("lengths,error,match", [
    (torch.tensor([5.0, 6.0]), TypeError, "cache_seqlens must be int32 or int64"),
    (torch.tensor([5, 6, 7]), ValueError, r"cache_seqlens must have shape \(B,\)"),
    (torch.tensor([0, 6]), ValueError, r"cache_seqlens entry must be in \[1, S_max=23\]"),
    (torch.tensor([5, 24]), ValueError, r"cache_seqlens entry must be in \[1, S_max=23\]"),
], ids=["dtype", "shape", "zero", "past-end"])
def test_sdpa_decode_rejects_bad_cache_seqlens(lengths, error, match):
    q, k, v = qkv(2, 2, 1, 16)
    with pytest.raises(error, match=match):
        rt.sdpa_decode(q, k, v, lengths)


# --- RLX_TRITON_CHECK_VALUES: which checks read index values ---------------------------------------
@contextlib.contextmanager
def refusing_value_reads(monkeypatch):
    """A block in which every way of reading a tensor's values on the host (a sync on a GPU) raises."""
    def refuse(*args, **kwargs):
        raise AssertionError("a check read a tensor's values")

    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "__int__", "__bool__", "__index__", "__float__"):
            patched.setattr(torch.Tensor, name, refuse)
        yield


def test_check_values_0_reads_no_index_value_and_the_kernel_clamps_them(monkeypatch):
    from rlx_triton.config import override_settings

    q, k, v = qkv(2, 2, 1, 16)
    lengths = torch.tensor([0, 30])         # outside [1, S_max=23]: checked (and refused) under auto on the CPU
    pages = torch.randn(4, 2, 8, 16)
    table = torch.tensor([[0, 9, 1], [2, 3, -1]])   # pages 9 and -1 are outside the cache
    with override_settings(check_values="0"), rt.use_backend("triton", strict=True):
        with refusing_value_reads(monkeypatch):
            out, lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
            paged = rt.sdpa_decode(q, pages, pages, torch.tensor([24, 17]), block_table=table)
    assert bool((out[0] == 0).all()) and bool((lse[0] == -math.inf).all())   # length 0: no key
    assert_like_torch(out[1:], q[1:], k[1:], v[1:])                          # length 30: all 23 keys
    kept = torch.cat([pages[0], pages[1]], dim=1)[None], torch.cat([pages[2], pages[3]], dim=1)[None]
    assert_like_torch(paged[:1], q[:1], kept[0], kept[0])       # page 9 dropped: pages 0 and 1 (24 keys wanted)
    assert_like_torch(paged[1:], q[1:], kept[1], kept[1])       # page -1 dropped: pages 2 and 3 (17 keys wanted)


def test_check_values_auto_and_1_still_refuse_bad_lengths_on_the_cpu():
    from rlx_triton.config import override_settings

    q, k, v = qkv(2, 2, 1, 16)
    for policy in ("auto", "1"):
        with override_settings(check_values=policy), pytest.raises(ValueError, match="cache_seqlens entry"):
            rt.sdpa_decode(q, k, v, torch.tensor([0, 5]))


def test_check_values_auto_reads_only_tensors_on_the_cpu():
    from rlx_triton.config import override_settings
    from rlx_triton.ops._attention_options import values_readable

    on_gpu = SimpleNamespace(device=torch.device("cuda", 0), is_cuda=True)
    with override_settings(check_values="auto"):
        assert values_readable(torch.zeros(2)) and not values_readable(on_gpu)
    with override_settings(check_values="0"):
        assert not values_readable(torch.zeros(2))


def test_flash_attn_with_kvcache_under_check_values_0_reads_no_index_value(monkeypatch):
    from rlx_triton.config import override_settings

    q = torch.randn(3, 1, 2, 16)
    k_cache, v_cache = torch.randn(3, 20, 2, 16), torch.randn(3, 20, 2, 16)
    lengths = torch.tensor([0, 12, 20], dtype=torch.int32)
    leftpad = torch.tensor([0, 15, 0], dtype=torch.int32)     # past its length: the sequence has no key
    with override_settings(check_values="0"), rt.use_backend("triton", strict=True):
        with refusing_value_reads(monkeypatch):
            out, lse = rt.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths, cache_leftpad=leftpad,
                                                  return_softmax_lse=True)
    assert bool((out[:2] == 0).all()) and bool((lse[:2] == math.inf).all())   # FA2's output for empty rows
    assert_like_torch(out[2:].transpose(1, 2), q[2:].transpose(1, 2), k_cache[2:].transpose(1, 2),
                      v_cache[2:].transpose(1, 2))


def test_sdpa_decode_needs_4d_caches():
    q, k, v = qkv(2, 2, 1, 16)
    with pytest.raises(ValueError, match="k_cache must be 4-D"):
        rt.sdpa_decode(q, k[0], v)


# --- patch_sdpa ----------------------------------------------------------------------------------
def test_patch_sdpa_replaces_and_restores_torch_function():
    original = F.scaled_dot_product_attention
    with rt.patch_sdpa():
        assert F.scaled_dot_product_attention is rt.scaled_dot_product_attention
        q, k, v = qkv(1, 2, 1, 16)
        assert_like_torch(F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert F.scaled_dot_product_attention is original


# --- torch.library -------------------------------------------------------------------------------
def test_opcheck_sdpa():
    q, k, v = qkv(1, 4, 2, 16, kv_heads=2, seq_kv=9)
    torch.library.opcheck(torch.ops.rlx_triton.sdpa.default, (q, k, v, None, True, None, True))


def test_opcheck_sdpa_decode():
    q, k, v = qkv(2, 2, 2, 16, seq_kv=9)
    torch.library.opcheck(torch.ops.rlx_triton.sdpa_decode.default, (q, k, v, torch.tensor([9, 4]), 0.25))


def test_torch_compile_fullgraph_on_cpu():
    q, k, v = qkv(2, 4, 1, 16, kv_heads=2, seq_kv=12)
    lengths = torch.tensor([12, 5])

    def step(q, k, v, lengths):
        attn = rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        decoded = rt.sdpa_decode(q, k, v, lengths)
        return attn + decoded

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, lengths), step(q, k, v, lengths))


# --- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_every_dtype_against_float64(dtype):
    q, k, v = qkv(4, 32, 1, 128, kv_heads=8, seq_kv=1000, dtype=dtype, device="cuda")
    lengths = torch.tensor([1000, 1, 513, 64], device="cuda", dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, k, v, lengths)
    ref, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=TOL[dtype], atol=TOL[dtype] * 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_cuda_mqa_at_batch_one_and_two_splits_past_split_k_and_merges_in_two_levels(dtype):
    # one KV head: the split rule lifts split_k's bound to fill the SMs (about 119 splits on an H200 at
    # batch 1), so live splits past 16 merge in two levels, concurrently on the device
    for batch, lengths in ((1, [32768]), (2, [32768, 4000])):
        q, k, v = qkv(batch, 32, 1, 128, kv_heads=1, seq_kv=32768, dtype=dtype, device="cuda")
        seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
        with rt.use_backend("triton", strict=True):
            rt.sdpa_decode(q, k, v, seqlens)  # warm-up: compile, and tune a cold bucket where tuning is allowed
            first = rt.sdpa_decode(q, k, v, seqlens)
            again = rt.sdpa_decode(q, k, v, seqlens)
        torch.testing.assert_close(again, first, rtol=0, atol=0)  # merge order fixed: the same bits every launch
        ref, _ = attention_reference(q.cpu(), k.cpu(), v.cpu(), causal="bottom_right", cache_seqlens=seqlens.cpu())
        torch.testing.assert_close(first.cpu().double(), ref, rtol=TOL[dtype], atol=TOL[dtype] * 4)


@pytest.mark.gpu
def test_cuda_graph_capture_after_warm_up():
    q, k, v = qkv(2, 8, 1, 128, kv_heads=2, seq_kv=2048, dtype=torch.float16, device="cuda")
    lengths = torch.tensor([2048, 700], device="cuda", dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        rt.sdpa_decode(q, k, v, lengths)  # warm-up: compile + route outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = rt.sdpa_decode(q, k, v, lengths)
        lengths.copy_(torch.tensor([5, 2048], device="cuda", dtype=torch.int32))  # new lengths, same graph
        graph.replay()
    torch.cuda.synchronize()
    ref, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)


@pytest.mark.gpu
def test_cuda_graph_capture_grow_allocate_replay_keeps_its_own_counters():
    """A graph captured before a larger call and new allocations replays on buffers no later call freed,
    replaced or shares: outputs against float64 after every replay, its counters back at 0."""
    from rlx_triton.backends.triton import launches
    from rlx_triton.backends.triton.sdpa_decode import _sdpa_decode_kernel

    q, k, v = qkv(2, 8, 1, 128, kv_heads=2, seq_kv=4096, dtype=torch.float16, device="cuda")
    lengths = torch.tensor([4096, 700], device="cuda", dtype=torch.int32)
    with rt.use_backend("triton", strict=True):
        rt.sdpa_decode(q, k, v, lengths)                                    # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with launches.recording() as log, torch.cuda.graph(graph):
            out = rt.sdpa_decode(q, k, v, lengths)
        tickets = log.records[0].args[_sdpa_decode_kernel.arg_names.index("tickets_ptr")]
        assert log.records[0].grid[1] > 1                                   # it splits: tickets and a merge
        big = qkv(16, 32, 1, 128, kv_heads=8, seq_kv=8192, dtype=torch.float16, device="cuda")
        for _ in range(2):
            rt.sdpa_decode(*big)                                            # grow: a larger call, twice
        junk = [torch.full((1 << 22,), 7, dtype=torch.int32, device="cuda") for _ in range(8)]   # allocate
        for new_lengths in ([5, 4096], [4096, 1], [3000, 2222]):
            lengths.copy_(torch.tensor(new_lengths, dtype=torch.int32))
            graph.replay()                                                  # replay
            torch.cuda.synchronize()
            ref, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
            torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)
            assert int(tickets.abs().sum()) == 0
    assert all(int(j[0]) == 7 for j in junk)


@pytest.mark.gpu
def test_cuda_graphs_replayed_concurrently_on_two_streams_never_share_counters():
    """torch.cuda.graph() captures on one shared stream: two graphs replayed at once on two streams must not
    count each other's tickets (a miscount would leave a row block's counter wrong for good)."""
    with rt.use_backend("triton", strict=True):
        cases, graphs = [], []
        for seed_lengths in ([4096, 700], [1000, 3000]):
            q, k, v = qkv(2, 8, 1, 128, kv_heads=2, seq_kv=4096, dtype=torch.float16, device="cuda")
            lengths = torch.tensor(seed_lengths, device="cuda", dtype=torch.int32)
            rt.sdpa_decode(q, k, v, lengths)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = rt.sdpa_decode(q, k, v, lengths)
            cases.append((q, k, v, lengths, out))
            graphs.append(graph)
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        torch.cuda.synchronize()
        for _ in range(50):
            for graph, stream in zip(graphs, streams):
                with torch.cuda.stream(stream):
                    graph.replay()
        torch.cuda.synchronize()
    for q, k, v, lengths, out in cases:
        ref, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
        torch.testing.assert_close(out.cpu().double(), ref, rtol=2e-3, atol=8e-3)


@pytest.mark.gpu
def test_a_steady_state_decode_step_never_syncs_with_the_host():
    """RLX_TRITON_CHECK_VALUES=auto (the default) reads no CUDA index tensor: after a warm-up call, sdpa_decode
    (contiguous and paged), flash_attn_with_kvcache (appending one token) and scaled_dot_product_attention
    run with torch's sync debug mode raising on any host sync."""
    q, k, v = qkv(4, 32, 1, 128, kv_heads=8, seq_kv=2048, dtype=torch.float16, device="cuda")
    lengths = torch.tensor([2048, 1, 700, 1500], device="cuda", dtype=torch.int32)
    pages = torch.randn(64, 8, 128, 128, device="cuda", dtype=torch.float16)
    table = torch.randperm(64, device="cuda").to(torch.int32).view(4, 16)
    fa_q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.float16)
    k_cache, v_cache = (torch.randn(4, 2048, 8, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    new_k, new_v = (torch.randn(4, 1, 8, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    fa_lengths = torch.tensor([10, 300, 2000, 0], device="cuda", dtype=torch.int32)

    def step():
        rt.sdpa_decode(q, k, v, lengths)
        rt.sdpa_decode(q, pages, pages, lengths, block_table=table)
        rt.flash_attn_with_kvcache(fa_q, k_cache, v_cache, new_k, new_v, cache_seqlens=fa_lengths, causal=True)
        rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    with rt.use_backend("triton", strict=True):
        step()                                                              # warm-up: compile, route
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_torch_compile_on_gpu():
    q, k, v = qkv(2, 8, 1, 64, kv_heads=2, seq_kv=300, dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(lambda q, k, v: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                             fullgraph=True)
    with rt.use_backend("triton", strict=True):
        out = compiled(q, k, v)
    assert_like_torch(out.cpu(), q.cpu(), k.cpu(), v.cpu(), enable_gqa=True)


def test_calls_that_autograd_records_run_torch_and_give_torchs_gradients():
    query = torch.randn(1, 4, 1, 16, dtype=torch.float64, requires_grad=True)
    key = torch.randn(1, 2, 9, 16, dtype=torch.float64, requires_grad=True)
    value = torch.randn(1, 2, 9, 16, dtype=torch.float64)
    query32, key32 = query.detach().float().requires_grad_(), key.detach().float().requires_grad_()
    with rt.use_backend("triton"):
        route = rt.explain(rt.scaled_dot_product_attention, query32, key32, value.float(), enable_gqa=True)
        out = rt.scaled_dot_product_attention(query32, key32, value.float(), enable_gqa=True)
    assert route.backend == "torch" and route.skipped_reasons["triton"].reason.startswith("requires_grad=True")
    out.sum().backward()
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, enable_gqa=True)
    expected.sum().backward()
    torch.testing.assert_close(query32.grad, query.grad.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(key32.grad, key.grad.float(), rtol=1e-5, atol=1e-5)


def test_kv_cache_decode_is_differentiable_through_the_library_path():
    query = torch.randn(2, 4, 1, 8, requires_grad=True)
    cache = torch.randn(2, 2, 6, 8)
    out = rt.sdpa_decode(query, cache, cache, torch.tensor([6, 3]))
    out.sum().backward()
    assert query.grad is not None and torch.isfinite(query.grad).all()


# --- torch's whole contract: every input class torch's SDPA accepts ---------------------------------
def _causal_biases():
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    return {"upper_left": causal_upper_left, "lower_right": causal_lower_right}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("seq_q, seq_kv", [(3, 7), (1, 333), (4, 4)])
def test_causal_bias_gives_torchs_values(variant, seq_q, seq_kv, backend):
    bias = _causal_biases()[variant](seq_q, seq_kv)
    q, k, v = qkv(2, 4, seq_q, 16, kv_heads=2, seq_kv=seq_kv)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    with rt.use_backend(backend, strict=backend == "triton"):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v, attn_mask=bias, enable_gqa=True)
        out = rt.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    assert type(out) is torch.Tensor and route.backend == backend
    aligned = "bottom_right" if variant == "lower_right" and seq_q != seq_kv else "top_left"
    assert route.request.feature_map["causal"] == aligned and route.request.feature_map["mask"] == "none"
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_lower_right_causal_bias_with_more_queries_than_keys_gives_torchs_zero_rows():
    bias = _causal_biases()["lower_right"](9, 7)
    q, k, v = qkv(1, 2, 9, 16, seq_kv=7)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out = rt.scaled_dot_product_attention(q, k, v, attn_mask=bias)   # 9 tokens: not decode-shaped, torch's op
    assert (out[:, :, :2] == 0).all()
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
def test_causal_bias_under_torch_compile_gives_torchs_values(variant):
    bias = _causal_biases()[variant](2, 11)
    q, k, v = qkv(2, 4, 2, 16, kv_heads=1, seq_kv=11)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, bias: rt.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                             fullgraph=True, backend="aot_eager")
    with rt.use_backend("triton", strict=True):
        out = compiled(q, k, v, bias)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_causal_bias_through_patched_sdpa_gives_torchs_values():
    bias = _causal_biases()["lower_right"](2, 9)
    q, k, v = qkv(1, 2, 2, 16, seq_kv=9)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    with rt.patch_sdpa():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_causal_bias_with_is_causal_raises_torchs_value_error():
    q, k, v = qkv(1, 2, 2, 16, seq_kv=9)
    with pytest.raises(ValueError, match="CausalBias should not be used with causal=True"):
        rt.scaled_dot_product_attention(q, k, v, attn_mask=_causal_biases()["upper_left"](2, 9), is_causal=True)


def test_lower_right_causal_bias_of_other_lengths_names_attn_mask():
    q, k, v = qkv(1, 2, 2, 16, seq_kv=9)
    with pytest.raises(ValueError, match="CausalBias of .* needs query length"):
        rt.scaled_dot_product_attention(q, k, v, attn_mask=_causal_biases()["lower_right"](3, 9))


@pytest.mark.parametrize("kv_heads, v_heads", [(2, 4), (4, 2), (8, 2)])
def test_enable_gqa_with_unequal_key_and_value_heads_gives_torchs_values(kv_heads, v_heads):
    q = torch.randn(2, 8, 1, 16)
    k, v = torch.randn(2, kv_heads, 13, 16), torch.randn(2, v_heads, 13, 16)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with rt.use_backend("triton"):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True)
        out = rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert route.backend == "torch" and "unequal_kv_heads" in str(route.skipped_reasons["triton"])
    torch.testing.assert_close(out, expected)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="unequal_kv_heads"):
        rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_enable_gqa_with_heads_that_do_not_divide_raises_like_torch():
    q, k, v = torch.randn(1, 8, 1, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 3, 5, 16)
    with pytest.raises(RuntimeError, match="must divide the number of heads in query"):
        rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("scale", [torch.tensor(0.3), torch.tensor(0.3, dtype=torch.float64), torch.tensor(2)],
                         ids=["float32", "float64", "int64"])
def test_a_zero_dim_tensor_scale_gives_torchs_values(scale, backend):
    q, k, v = qkv(2, 4, 1, 16, kv_heads=2)
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    with rt.use_backend(backend, strict=backend == "triton"):
        out = rt.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
        decoded = rt.sdpa_decode(q, k, v, scale=scale)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(decoded, expected, rtol=1e-5, atol=1e-5)


def test_a_tensor_scale_with_elements_is_a_type_error_like_torch():
    q, k, v = qkv(1, 2, 1, 16)
    with pytest.raises(TypeError, match="scale"):
        rt.scaled_dot_product_attention(q, k, v, scale=torch.tensor([0.3]))


def test_a_tensor_scale_under_torch_compile_gives_torchs_values():
    q, k, v = qkv(2, 4, 1, 16)
    scale = torch.tensor(0.3)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v, s: rt.scaled_dot_product_attention(q, k, v, scale=s), backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, scale), F.scaled_dot_product_attention(q, k, v, scale=scale),
                               rtol=1e-5, atol=1e-5)


def _nested(layout):
    """Nested (B=2, H=4, L_b, 16) query, key and value with ragged lengths: decode queries, 3 and 5 keys."""
    torch.manual_seed(0)
    if layout == "jagged":
        make = lambda *lengths: torch.nested.nested_tensor(  # noqa: E731
            [torch.randn(n, 4, 16) for n in lengths], layout=torch.jagged).transpose(1, 2)
    else:
        make = lambda *lengths: torch.nested.nested_tensor([torch.randn(4, n, 16) for n in lengths])  # noqa: E731
    return make(1, 1), make(3, 5), make(3, 5)


def _assert_same_nested(out, expected):
    assert type(out) is type(expected) and out.is_nested
    for got, want in zip(out.unbind(), expected.unbind()):
        torch.testing.assert_close(got, want)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("layout", ["strided", "jagged"])
def test_nested_tensors_give_torchs_values_and_type(layout):
    q, k, v = _nested(layout)
    expected = F.scaled_dot_product_attention(q, k, v)
    with rt.use_backend("triton"):
        route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        out = rt.scaled_dot_product_attention(q, k, v)
    assert route.backend == "torch" and "layout='nested'" in str(route.skipped_reasons["triton"])
    _assert_same_nested(out, expected)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="nested"):
        rt.scaled_dot_product_attention(q, k, v)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("layout", ["strided", "jagged"])
def test_nested_tensors_under_torch_compile_give_torchs_values(layout):
    q, k, v = _nested(layout)
    expected = F.scaled_dot_product_attention(q, k, v)
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: rt.scaled_dot_product_attention(q, k, v), backend="aot_eager")
    _assert_same_nested(compiled(q, k, v), expected)


# --- dispatch: one route per call, a new KV length reuses its bucket's decision -------------------
def _routes_of(call):
    from rlx_triton.router import recording_routes

    with recording_routes() as routes:
        out = call()
    return routes, out


def test_an_eager_kernel_call_is_routed_once():
    from rlx_triton.router import clear_route_cache

    clear_route_cache()
    q, k, v = qkv(1, 4, 1, 16, kv_heads=2, seq_kv=21, dtype=torch.float16)
    with rt.use_backend("triton", strict=True):
        routes, out = _routes_of(lambda: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        decode_routes, _ = _routes_of(lambda: rt.sdpa_decode(q, k, v))
    assert [r.backend for r in routes] == ["triton"] and [r.op for r in decode_routes] == ["sdpa_decode"]
    assert_like_torch(out, q, k, v, enable_gqa=True)


def test_a_new_kv_length_in_the_same_bucket_reuses_the_decision(monkeypatch):
    from rlx_triton.ops import sdpa as ops_module
    from rlx_triton.router import clear_route_cache

    def must_not_run(*args, **kwargs):
        raise AssertionError("a known bucket was validated or routed again")

    clear_route_cache()
    q = torch.randn(1, 4, 1, 16)
    cache = torch.randn(1, 2, 64, 16)
    with rt.use_backend("triton", strict=True):
        first, _ = _routes_of(lambda: rt.scaled_dot_product_attention(q, cache[:, :, :33], cache[:, :, :33],
                                                                      enable_gqa=True))
        with monkeypatch.context() as patched:
            patched.setattr(ops_module, "_validate_sdpa", must_not_run)
            patched.setattr(ops_module, "route", must_not_run)
            for length in (40, 64):   # the bucket of 33..64: the first call's decision, nothing re-checked
                k = v = cache[:, :, :length]
                again, out = _routes_of(lambda: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                assert len(again) == 1 and again[0] is first[0]
                assert_like_torch(out, q, k, v, enable_gqa=True)
        other, _ = _routes_of(lambda: rt.scaled_dot_product_attention(q, cache[:, :, :20], cache[:, :, :20],
                                                                      enable_gqa=True))
    assert len(first) == 1 and len(other) == 1 and other[0] is not first[0]


def test_the_kv_length_is_still_checked_when_its_bucket_is_known():
    q, cache = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 64, 16)
    rt.scaled_dot_product_attention(q, cache[:, :, :40], cache[:, :, :40])
    with pytest.raises(ValueError, match="value's sequence length"):
        rt.scaled_dot_product_attention(q, cache[:, :, :41], cache[:, :, :42])
    with pytest.raises(ValueError, match="attn_mask"):
        rt.scaled_dot_product_attention(q, cache[:, :, :41], cache[:, :, :41], attn_mask=torch.ones(1, 40, dtype=torch.bool))


def test_a_forgotten_decision_is_routed_again_inside_the_op():
    q, k, v = qkv(1, 2, 1, 16, seq_kv=9)
    with rt.use_backend("triton", strict=True):
        out = torch.ops.rlx_triton.sdpa.default(q, k, v, None, False, None, False, False, "no-such-decision")
    assert_like_torch(out, q, k, v)


# --- paged KV caches (block_table) -----------------------------------------------------------------
def paged_cache(batch=2, kv_heads=2, seq_kv=20, head_dim=16, page_size=4, dtype=torch.float32):
    """(k, v) contiguous (B, Hkv, S, D), their pages (num_pages, Hkv, page_size, D) and the block table."""
    k = torch.randn(batch, kv_heads, seq_kv, head_dim).to(dtype)
    v = torch.randn(batch, kv_heads, seq_kv, head_dim).to(dtype)
    pages = -(-seq_kv // page_size)
    table = torch.randperm(batch * pages + 1)[:batch * pages].reshape(batch, pages).to(torch.int32)
    pools = []
    for t in (k, v):
        padded = F.pad(t, (0, 0, 0, pages * page_size - seq_kv))
        pool = torch.randn(batch * pages + 1, kv_heads, page_size, head_dim).to(dtype)
        pool[table.long().flatten()] = padded.reshape(batch, kv_heads, pages, page_size, head_dim).transpose(1, 2) \
            .reshape(batch * pages, kv_heads, page_size, head_dim)
        pools.append(pool)
    return k, v, pools[0], pools[1], table


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sdpa_decode_reads_a_paged_cache_through_its_block_table(backend):
    k, v, k_pages, v_pages, table = paged_cache(page_size=3, seq_kv=20)
    q = torch.randn(2, 4, 2, 16)
    lengths = torch.tensor([20, 6], dtype=torch.int32)
    with rt.use_backend(backend, strict=backend != "torch"):
        assert rt.explain(rt.sdpa_decode, q, k_pages, v_pages, lengths, block_table=table).backend == backend
        out, lse = rt.sdpa_decode(q, k_pages, v_pages, lengths, block_table=table, return_lse=True)
    expected, expected_lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-5, atol=1e-5)


def test_paged_requests_carry_the_paged_feature_the_metal_coverage_does_not_name():
    from rlx_triton.backends.metal import sdpa_decode as metal

    _, _, k_pages, v_pages, table = paged_cache()
    request = rt.explain(rt.sdpa_decode, torch.randn(2, 4, 1, 16), k_pages, v_pages, block_table=table).request
    assert request.feature_map["paged"] is True and request.field_map["seq_kv"] == table.shape[1] * 4
    refusal = metal.COVERAGE.check(request.op, "mps", request.dtype, request.field_map, request.feature_map)
    assert refusal is not None and refusal.kind == "shape-unimplemented" and "paged" in refusal.reason


@pytest.mark.parametrize("change, error, name", [
    (lambda t: t.float(), TypeError, "block_table"),
    (lambda t: t[:1], ValueError, "block_table"),
    (lambda t: t + 100, ValueError, "block_table"),
])
def test_bad_block_tables_are_named(change, error, name):
    _, _, k_pages, v_pages, table = paged_cache()
    with pytest.raises(error, match=name):
        rt.sdpa_decode(torch.randn(2, 4, 1, 16), k_pages, v_pages, block_table=change(table))


def test_paged_sdpa_decode_under_torch_compile():
    k, v, k_pages, v_pages, table = paged_cache(page_size=5)
    q = torch.randn(2, 4, 1, 16)
    lengths = torch.tensor([17, 3], dtype=torch.int32)
    compiled = torch.compile(lambda *a: rt.sdpa_decode(*a[:4], block_table=a[4]), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k_pages, v_pages, lengths, table), rt.sdpa_decode(q, k, v, lengths),
                               rtol=1e-5, atol=1e-5)


# --- sdpa_decode with FlashAttention's window, softcap and ALiBi ----------------------------------
def fa_options_reference(q, k, v, lengths, **options):
    """float64 (out, lse) of rt.sdpa_decode with FA options: FA2's kv-cache call with causal=True on the
    (B, S, H, D) views, its +inf LSE of rows that see no key read as sdpa_decode's -inf."""
    from tests.reference.flash_attn import naive_flash_attn_with_kvcache

    out, lse, _, _ = naive_flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   cache_seqlens=lengths, causal=True, **options)
    return out.transpose(1, 2), torch.where(lse == float("inf"), float("-inf"), lse)


FA_OPTIONS = {
    "window": dict(window_size=(3, 0)),
    "softcap": dict(softcap=2.0),
    "alibi-per-head": dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),   # no window: slope x key index
    "alibi-per-batch-head-window-softcap": dict(alibi_slopes=torch.rand(2, 4) * 0.3, window_size=(5, 7), softcap=1.5),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("name", list(FA_OPTIONS))
def test_sdpa_decode_fa_options_match_float64_on_both_paths(name, backend):
    options = FA_OPTIONS[name]
    q, k, v = qkv(2, 4, 3, 16, kv_heads=2, seq_kv=19)
    lengths = torch.tensor([19, 6], dtype=torch.int32)
    with rt.use_backend(backend, strict=backend != "torch"):
        assert rt.explain(rt.sdpa_decode, q, k, v, lengths, **options).backend == backend
        out, lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True, **options)
    expected, expected_lse = fa_options_reference(q, k, v, lengths, **options)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=4e-5)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-5, atol=4e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_with_fa_options_a_nan_key_right_of_the_diagonal_reaches_only_the_rows_that_see_it(backend):
    # FlashAttention's masking, as the options come with it: token 0 of two does not see key 8 and drops it
    q, k, v = qkv(1, 2, 2, 16, seq_kv=9)
    k[0, :, 8, 0] = float("nan")
    with rt.use_backend(backend, strict=backend != "torch"):
        out = rt.sdpa_decode(q, k, v, softcap=2.0)
    assert out[:, :, 0].isfinite().all() and out[:, :, 1].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_sdpa_decode_fa_options_on_a_paged_cache_in_low_precision(dtype):
    k, v, k_pages, v_pages, table = paged_cache(page_size=3, seq_kv=20, dtype=dtype)
    q = torch.randn(2, 4, 2, 16).to(dtype)
    lengths = torch.tensor([20, 7], dtype=torch.int32)
    options = FA_OPTIONS["alibi-per-batch-head-window-softcap"]
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, k_pages, v_pages, lengths, block_table=table, **options)
    expected, _ = fa_options_reference(q, k, v, lengths, **options)
    torch.testing.assert_close(out.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * 4)


def test_sdpa_decode_fa_options_are_part_of_the_remembered_signature():
    q, k, v = qkv(2, 4, 1, 16, kv_heads=2, seq_kv=12)
    plain = rt.sdpa_decode(q, k, v)
    capped = rt.sdpa_decode(q, k, v, softcap=0.5)
    torch.testing.assert_close(capped.double(), fa_options_reference(q, k, v, None, softcap=0.5)[0], rtol=1e-5,
                               atol=4e-5)
    assert not torch.allclose(plain, capped)


@pytest.mark.parametrize("options, error, name", [
    ({"window_size": (-2, 0)}, ValueError, "window_size"),
    ({"window_size": (1, 2, 3)}, ValueError, "window_size"),
    ({"window_size": (1.5, 0)}, TypeError, "window_size"),
    ({"window_size": 4}, TypeError, "window_size"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"softcap": float("nan")}, ValueError, "softcap"),
    ({"softcap": "1"}, TypeError, "softcap"),
    ({"alibi_slopes": torch.ones(4, dtype=torch.float64)}, TypeError, "alibi_slopes"),
    ({"alibi_slopes": torch.ones(3)}, ValueError, "alibi_slopes"),
    ({"alibi_slopes": [1.0] * 4}, TypeError, "alibi_slopes"),
])
def test_sdpa_decode_rejects_bad_fa_options_by_name(options, error, name):
    q, k, v = qkv(2, 4, 1, 16, kv_heads=2, seq_kv=12)
    with pytest.raises(error, match=name):
        rt.sdpa_decode(q, k, v, **options)
    with pytest.raises(error, match=name):
        rt.explain(rt.sdpa_decode, q, k, v, **options)


def test_sdpa_decode_fa_options_under_torch_compile():
    q, k, v = qkv(2, 4, 2, 16, kv_heads=2, seq_kv=12)
    lengths = torch.tensor([12, 5], dtype=torch.int32)
    slopes = torch.rand(4)
    compiled = torch.compile(lambda *a: rt.sdpa_decode(*a[:4], window_size=(4, 0), softcap=3.0, alibi_slopes=a[4]),
                             fullgraph=True, backend="aot_eager")
    expected, _ = fa_options_reference(q, k, v, lengths, window_size=(4, 0), softcap=3.0, alibi_slopes=slopes)
    torch.testing.assert_close(compiled(q, k, v, lengths, slopes).double(), expected, rtol=1e-5, atol=4e-5)


# --- whole rows of non-finite scores (no mask made them -inf) ----------------------------------------
def _non_finite_rows(case, dtype):
    """The reported shapes: query (1, 2, 1, 16) x keys (1, 2, 5, 16), one query row all NaN or every key +-inf."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=generator) for n in (1, 5, 5))
    if case == "nan_query_row":
        q[0, 0] = float("nan")
    else:
        k.fill_(float("inf") if case == "inf_keys" else float("-inf"))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _math_sdpa64(q, k, v, **kw):
    with sdpa_kernel([SDPBackend.MATH]):
        return torch_sdpa64(q, k, v, **kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masking", ["none", "causal", "bool_mask", "float_mask"])
@pytest.mark.parametrize("case", ["nan_query_row", "inf_keys", "neg_inf_keys"])
def test_rows_of_non_finite_scores_are_nan_on_the_kernel_path_as_in_torch_math_sdpa(case, masking, dtype):
    """Only a mask's -inf drops a key: a NaN query row or +-inf keys give NaN, never the 0 of a masked row."""
    q, k, v = _non_finite_rows(case, dtype)
    kwargs = {"causal": {"is_causal": True},
              "bool_mask": {"attn_mask": torch.tensor([True, False, True, True, True])},
              "float_mask": {"attn_mask": torch.tensor([0.0, -1.5, 0.25, 0.0, 2.0]).to(dtype)}}.get(masking, {})
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, **kwargs)
    expected = _math_sdpa64(q, k, v, **kwargs)
    assert expected.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * 4, equal_nan=True)


@pytest.mark.parametrize("case", ["nan_query_row", "inf_keys", "neg_inf_keys"])
def test_rows_of_non_finite_scores_are_nan_through_a_paged_cache(case):
    q, k, v = _non_finite_rows(case, torch.float32)
    pages = torch.randn(4, 2, 2, 16)   # page size 2: keys 0-1 in page 3, 2-3 in page 0, 4 in page 2
    v_pages = torch.randn(4, 2, 2, 16)
    table = torch.tensor([[3, 0, 2]], dtype=torch.int32)
    for slot, (page, offset) in enumerate([(3, 0), (3, 1), (0, 0), (0, 1), (2, 0)]):
        pages[page, :, offset], v_pages[page, :, offset] = k[0, :, slot], v[0, :, slot]
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, pages, v_pages, torch.tensor([5], dtype=torch.int32), block_table=table)
    torch.testing.assert_close(out.double(), _math_sdpa64(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)
