"""rt.scaled_dot_product_attention, the drop-in for torch's, and rt.patch_sdpa: routing and fallback to
torch, torch's semantics through the kernel (GQA, masks, is_causal, scale, degenerate and non-finite inputs),
validation, every input class torch's SDPA accepts (CausalBias, tensor scales, nested tensors), one route per
call and the decision hand-off into the op, torch.library registration (opcheck, torch.compile) and the
GPU compile check."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import rlx_triton as rt
from rlx_triton.ops.sdpa_decode import AttentionInputError
from tests.ops.attention_cases import TOL, assert_like_torch, math_sdpa64, non_finite_rows, qkv, torch_sdpa64
from tests.reference.sdpa_decode import DEGENERATE_CASES, assert_outcome, attention_reference, degenerate_inputs


# --- routing -------------------------------------------------------------------------------------
def test_decode_shaped_calls_route_to_the_triton_kernel():
    q, k, v = qkv(2, 8, 1, 64, kv_heads=2, dtype=torch.float16)
    with rt.use_backend("triton"):
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).backend == "triton"
        assert rt.explain(rt.sdpa_decode, q, k, v).backend == "triton"


def test_long_queries_and_dropout_route_to_torch():
    q, k, v = qkv(1, 2, 65, 16)
    with rt.use_backend("triton"):
        long_route = rt.explain(rt.scaled_dot_product_attention, q, k, v)
        assert long_route.backend == "torch" and "seq_q=65" in str(long_route.skipped_reasons["triton"])
        q, k, v = qkv(1, 2, 1, 16)
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v, dropout_p=0.5).backend == "torch"


def test_uncovered_requests_fall_back_to_torch_with_the_same_values():
    q, k, v = qkv(1, 2, 70, 16)  # 70 query tokens: prefill, not decode
    with rt.use_backend("triton"):
        out = rt.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_strict_mode_raises_missing_kernel_for_uncovered_requests():
    q, k, v = qkv(1, 2, 70, 16)
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


# --- whole rows of non-finite scores (no mask made them -inf) ------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masking", ["none", "causal", "bool_mask", "float_mask"])
@pytest.mark.parametrize("case", ["nan_query_row", "inf_keys", "neg_inf_keys"])
def test_rows_of_non_finite_scores_are_nan_on_the_kernel_path_as_in_torch_math_sdpa(case, masking, dtype):
    """Only a mask's -inf drops a key: a NaN query row or +-inf keys give NaN, never the 0 of a masked row."""
    q, k, v = non_finite_rows(case, dtype)
    kwargs = {"causal": {"is_causal": True},
              "bool_mask": {"attn_mask": torch.tensor([True, False, True, True, True])},
              "float_mask": {"attn_mask": torch.tensor([0.0, -1.5, 0.25, 0.0, 2.0]).to(dtype)}}.get(masking, {})
    with rt.use_backend("triton", strict=True):
        out = rt.scaled_dot_product_attention(q, k, v, **kwargs)
    expected = math_sdpa64(q, k, v, **kwargs)
    assert expected.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=TOL[dtype], atol=TOL[dtype] * 4, equal_nan=True)


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


# --- patch_sdpa ----------------------------------------------------------------------------------
def test_patch_sdpa_replaces_and_restores_torch_function():
    original = F.scaled_dot_product_attention
    with rt.patch_sdpa():
        assert F.scaled_dot_product_attention is rt.scaled_dot_product_attention
        q, k, v = qkv(1, 2, 1, 16)
        assert_like_torch(F.scaled_dot_product_attention(q, k, v), q, k, v)
    assert F.scaled_dot_product_attention is original


# --- torch's whole contract: every input class torch's SDPA accepts ------------------------------
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


# --- dispatch: one route per call, a new KV length reuses its bucket's decision ------------------
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


def test_decode_steps_in_a_known_bucket_are_not_remembered_one_by_one():
    from rlx_triton import caches
    from rlx_triton.router import clear_route_cache

    clear_route_cache()
    q, cache = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 64, 16)
    for length in range(33, 65):   # one bucket: its first call is remembered, with the bucket, and no step after it
        rt.scaled_dot_product_attention(q, cache[:, :, :length], cache[:, :, :length])
    assert caches.sizes()["route_signatures"][0] == 2


def test_a_remembered_kernel_route_still_checks_key_and_value_dtype():
    q, k, v = qkv(1, 2, 1, 16, seq_kv=9)
    with rt.use_backend("triton", strict=True):
        rt.scaled_dot_product_attention(q, k, v)
        with pytest.raises(ValueError, match="same dtype"):
            rt.scaled_dot_product_attention(q, k.double(), v)
        with pytest.raises(ValueError, match="same dtype"):
            rt.scaled_dot_product_attention(q, k, v.half())


def test_a_call_autograd_records_after_a_kernel_call_of_its_shape_goes_to_torch_and_back():
    q, k, v = qkv(1, 2, 1, 16, seq_kv=9)
    with rt.use_backend("triton"):
        assert rt.explain(rt.scaled_dot_product_attention, q, k, v).backend == "triton"
        rt.scaled_dot_product_attention(q, k, v)
        leaf = q.clone().requires_grad_()
        routes, out = _routes_of(lambda: rt.scaled_dot_product_attention(leaf, k, v))
        out.sum().backward()
        again, _ = _routes_of(lambda: rt.scaled_dot_product_attention(q, k, v))
    assert routes[0].backend == "torch" and leaf.grad is not None
    assert again[0].backend == "triton"


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


# --- torch.library -------------------------------------------------------------------------------
def test_opcheck_sdpa():
    q, k, v = qkv(1, 4, 2, 16, kv_heads=2, seq_kv=9)
    torch.library.opcheck(torch.ops.rlx_triton.sdpa.default, (q, k, v, None, True, None, True))


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
def test_torch_compile_on_gpu():
    q, k, v = qkv(2, 8, 1, 64, kv_heads=2, seq_kv=300, dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(lambda q, k, v: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                             fullgraph=True)
    with rt.use_backend("triton", strict=True):
        out = compiled(q, k, v)
    assert_like_torch(out.cpu(), q.cpu(), k.cpu(), v.cpu(), enable_gqa=True)



# --- a repeated call: remembered under its arguments as given --------------------------------------
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
def test_a_repeated_causal_bias_call_gives_torchs_values(variant, backend):
    bias = _causal_biases()[variant](1, 80)
    q, k, v = qkv(1, 4, 1, 16, kv_heads=2, seq_kv=80)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    with rt.use_backend(backend, strict=backend == "triton"):
        first = rt.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
        routes, again = _routes_of(lambda: rt.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True))
    assert routes[0].backend == backend
    torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_lower_right_causal_bias_decode_steps_give_torchs_values_and_check_the_bias_sizes(backend):
    causal_lower_right = _causal_biases()["lower_right"]
    q, cache = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 64, 16)
    with rt.use_backend(backend, strict=backend == "triton"):
        for length in (33, 34, 47, 64):   # one KV bucket: the steps after the first reuse its route
            k = v = cache[:, :, :length]
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(1, length))
            out = rt.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(1, length))
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="CausalBias"):
            rt.scaled_dot_product_attention(q, cache[:, :, :40], cache[:, :, :40], attn_mask=causal_lower_right(1, 41))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_repeated_call_with_a_tensor_scale_reads_each_calls_scale(backend):
    q, k, v = qkv(1, 2, 1, 16, seq_kv=7)
    with rt.use_backend(backend, strict=backend == "triton"):
        for scale in (torch.tensor(0.3), torch.tensor(1.5), torch.tensor(0.3)):
            expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
            torch.testing.assert_close(rt.scaled_dot_product_attention(q, k, v, scale=scale), expected,
                                       rtol=1e-5, atol=1e-5)


def test_a_call_first_seen_under_autograd_still_takes_the_kernel_without_it():
    from rlx_triton.router import clear_route_cache

    clear_route_cache()
    q, k, v = qkv(1, 2, 1, 16, seq_kv=9)
    leaf = q.clone().requires_grad_()
    with rt.use_backend("triton"):
        recorded, out = _routes_of(lambda: rt.scaled_dot_product_attention(leaf, k, v))
        plain, _ = _routes_of(lambda: rt.scaled_dot_product_attention(q, k, v))
        with torch.no_grad():
            under_no_grad, _ = _routes_of(lambda: rt.scaled_dot_product_attention(leaf, k, v))
    assert out.requires_grad and recorded[0].backend == "torch"
    assert plain[0].backend == "triton" and under_no_grad[0].backend == "triton"
