"""rt.sdpa_decode, the KV-cache decode op: ragged cache lengths against float64, both paths agreeing,
validation of cache_seqlens, block tables and FlashAttention's options (window, softcap, ALiBi), paged
caches, which checks read index values (RLX_TRITON_CHECK_VALUES), torch.library registration (opcheck,
torch.compile), autograd through the library path, and the GPU checks (every dtype, split-k merges, CUDA
graphs, no host sync in a steady decode step)."""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import rlx_triton as rt
from tests.cuda_sync import assert_steady_state_never_syncs
from tests.ops.attention_cases import TOL, assert_like_torch, math_sdpa64, non_finite_rows, qkv
from tests.reference.sdpa_decode import (DEGENERATE_CASES, assert_outcome, attention_reference, degenerate_inputs,
                                         tree_reference)


# --- values: float64 references, both paths agreeing, autograd -----------------------------------
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


def test_kv_cache_decode_is_differentiable_through_the_library_path():
    query = torch.randn(2, 4, 1, 8, requires_grad=True)
    cache = torch.randn(2, 2, 6, 8)
    out = rt.sdpa_decode(query, cache, cache, torch.tensor([6, 3]))
    out.sum().backward()
    assert query.grad is not None and torch.isfinite(query.grad).all()


# --- validation ----------------------------------------------------------------------------------
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


def test_sdpa_decode_needs_4d_caches():
    q, k, v = qkv(2, 2, 1, 16)
    with pytest.raises(ValueError, match="k_cache must be 4-D"):
        rt.sdpa_decode(q, k[0], v)


# --- RLX_TRITON_CHECK_VALUES: which checks read index values -------------------------------------
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


# --- paged KV caches (block_table) ---------------------------------------------------------------
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


@pytest.mark.parametrize("case", ["nan_query_row", "inf_keys", "neg_inf_keys"])
def test_rows_of_non_finite_scores_are_nan_through_a_paged_cache(case):
    q, k, v = non_finite_rows(case, torch.float32)
    pages = torch.randn(4, 2, 2, 16)   # page size 2: keys 0-1 in page 3, 2-3 in page 0, 4 in page 2
    v_pages = torch.randn(4, 2, 2, 16)
    table = torch.tensor([[3, 0, 2]], dtype=torch.int32)
    for slot, (page, offset) in enumerate([(3, 0), (3, 1), (0, 0), (0, 1), (2, 0)]):
        pages[page, :, offset], v_pages[page, :, offset] = k[0, :, slot], v[0, :, slot]
    with rt.use_backend("triton", strict=True):
        out = rt.sdpa_decode(q, pages, v_pages, torch.tensor([5], dtype=torch.int32), block_table=table)
    torch.testing.assert_close(out.double(), math_sdpa64(q, k, v), rtol=1e-5, atol=1e-5, equal_nan=True)


# --- sdpa_decode with FlashAttention's window, softcap and ALiBi ---------------------------------
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


# --- draft trees: tree_mask ----------------------------------------------------------------------
def draft_trees(tokens: int, batch: int = 0, seed: int = 0) -> torch.Tensor:
    """A random draft tree's mask (tokens, tokens), or one per sequence (batch, tokens, tokens)."""
    from rlx_triton.perf.cases import draft_tree

    gen = torch.Generator().manual_seed(seed)
    if batch == 0:
        return draft_tree(tokens, gen)
    return torch.stack([draft_tree(tokens, gen) for _ in range(batch)])


def assert_tree_result(out, lse, q, k, v, tree, lengths, **options):
    """out (and lse, where given) against float64, the tolerance of q's dtype with atol scaled by the KV length."""
    window = options.pop("window_size", (-1, -1))
    expected, expected_lse = tree_reference(q, k, v, tree, cache_seqlens=lengths, window_left=window[0], **options)
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol * math.log2(k.shape[2]))
    if lse is not None:
        torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("return_lse", [True, False], ids=["lse", "out"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_sdpa_decode_tree_mask_matches_float64_on_both_paths(dtype, backend, return_lse):
    # per-sequence trees over ragged lengths; the second sequence is all draft (L_b == Q)
    q, k, v = qkv(2, 4, 5, 16, kv_heads=2, seq_kv=30, dtype=dtype)
    lengths = torch.tensor([30, 5], dtype=torch.int32)
    tree = draft_trees(5, batch=2)
    with rt.use_backend(backend, strict=backend != "torch"), torch.inference_mode():
        assert rt.explain(rt.sdpa_decode, q, k, v, lengths, tree_mask=tree).backend == backend
        result = rt.sdpa_decode(q, k, v, lengths, tree_mask=tree, return_lse=return_lse)
    out, lse = result if return_lse else (result, None)
    assert_tree_result(out, lse, q, k, v, tree, lengths)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("page_size", [16, 5])
def test_sdpa_decode_tree_mask_on_a_paged_cache(page_size, backend):
    k, v, k_pages, v_pages, table = paged_cache(page_size=page_size, seq_kv=20)
    q = torch.randn(2, 4, 6, 16)
    lengths = torch.tensor([20, 9], dtype=torch.int32)
    tree = draft_trees(6, seed=1)                       # one tree shared by the batch
    with rt.use_backend(backend, strict=backend != "torch"):
        out, lse = rt.sdpa_decode(q, k_pages, v_pages, lengths, block_table=table, tree_mask=tree, return_lse=True)
    assert_tree_result(out, lse, q, k, v, tree, lengths)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("options", [
    dict(window_size=(3, 0)),                                          # by absolute position: cuts far ancestors
    dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),        # -slope x |position - key|
    dict(softcap=1.5, window_size=(6, 0), alibi_slopes=torch.rand(2, 4) * 0.3),
], ids=["window", "alibi", "softcap-window-alibi"])
def test_sdpa_decode_tree_mask_with_flash_attentions_options(options, backend):
    q, k, v = qkv(2, 4, 6, 16, kv_heads=2, seq_kv=25)
    lengths = torch.tensor([25, 8], dtype=torch.int32)
    tree = draft_trees(6, batch=2, seed=2)
    with rt.use_backend(backend, strict=backend != "torch"):
        out, lse = rt.sdpa_decode(q, k, v, lengths, tree_mask=tree, return_lse=True, **options)
    assert_tree_result(out, lse, q, k, v, tree, lengths, **options)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_lower_triangular_tree_mask_gives_the_causal_result(backend):
    q, k, v = qkv(3, 4, 7, 16, kv_heads=1, seq_kv=21)
    lengths = torch.tensor([21, 10, 4], dtype=torch.int32)      # 4 < 7 tokens: the first three see nothing
    chain = torch.ones(7, 7, dtype=torch.bool).tril()
    with rt.use_backend(backend, strict=backend != "torch"):
        tree_out, tree_lse = rt.sdpa_decode(q, k, v, lengths, tree_mask=chain, return_lse=True)
        causal_out, causal_lse = rt.sdpa_decode(q, k, v, lengths, return_lse=True)
    torch.testing.assert_close(tree_out, causal_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tree_lse, causal_lse, rtol=1e-6, atol=1e-6)
    assert bool((tree_out[2, :, :3] == 0).all()) and bool((tree_lse[2, :, :3] == -math.inf).all())


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_token_the_tree_hides_everything_from_gives_zero_and_minus_inf(backend):
    q, k, v = qkv(1, 2, 4, 16, seq_kv=4)                          # L_b == Q: no prefix
    tree = draft_trees(4)
    tree[1] = False
    with rt.use_backend(backend, strict=backend != "torch"):
        out, lse = rt.sdpa_decode(q, k, v, tree_mask=tree, return_lse=True)
        alone = rt.sdpa_decode(q, k, v, tree_mask=tree)
    assert bool((out[:, :, 1] == 0).all()) and bool((lse[:, :, 1] == -math.inf).all())
    assert bool((alone[:, :, 1] == 0).all())
    assert_tree_result(out, lse, q, k, v, tree, torch.tensor([4]))


@pytest.mark.parametrize("bad, error", [
    (lambda tree: tree.to(torch.int8), ValueError),
    (lambda tree: tree.float(), ValueError),
    (lambda tree: tree[:4, :4], ValueError),
    (lambda tree: tree.expand(3, 5, 5), ValueError),            # a batch of 3 trees for 2 sequences
    (lambda tree: tree[None, None], ValueError),
    (lambda tree: tree.tolist(), TypeError),
], ids=["int8", "float", "tokens", "batch", "4-d", "list"])
def test_bad_tree_masks_are_named_before_any_launch(bad, error):
    from rlx_triton.backends.triton import launches

    q, k, v = qkv(2, 4, 5, 16, kv_heads=2, seq_kv=12)
    mask = bad(draft_trees(5))
    with rt.use_backend("triton", strict=True), launches.recording() as log:
        with pytest.raises(error, match="tree_mask"):
            rt.sdpa_decode(q, k, v, tree_mask=mask)
        with pytest.raises(error, match="tree_mask"):
            rt.explain(rt.sdpa_decode, q, k, v, tree_mask=mask)
    assert log.kernels == []


def test_explain_reports_the_tree_mask_request_and_metal_refuses_it():
    from rlx_triton.backends.metal import sdpa_decode as metal

    q, k, v = qkv(2, 4, 5, 16, kv_heads=2, seq_kv=12)
    with rt.use_backend("triton"):
        route = rt.explain(rt.sdpa_decode, q, k, v, tree_mask=draft_trees(5))
    request = route.request
    assert route.family == "sdpa_decode" and route.backend == "triton" and request.feature_map["mask"] == "tree"
    refusal = metal.COVERAGE.check(request.op, "mps", request.dtype, request.field_map, request.feature_map)
    assert refusal is not None and "mask='tree'" in refusal.reason


@pytest.mark.parametrize("tokens, backend", [(40, "triton"), (64, "triton"), (65, "torch")])
def test_up_to_64_query_tokens_stay_on_the_kernel_without_a_tree(tokens, backend):
    q, k, v = qkv(1, 2, tokens, 16, kv_heads=1, seq_kv=70)
    lengths = torch.tensor([69], dtype=torch.int32)
    with rt.use_backend("triton"):
        assert rt.explain(rt.sdpa_decode, q, k, v, lengths).backend == backend
        out = rt.sdpa_decode(q, k, v, lengths)
    expected, _ = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=4e-5)


def test_sdpa_decode_tree_mask_under_torch_compile():
    q, k, v = qkv(2, 4, 5, 16, kv_heads=2, seq_kv=12)
    lengths = torch.tensor([12, 7], dtype=torch.int32)
    tree = draft_trees(5, batch=2)
    compiled = torch.compile(lambda *a: rt.sdpa_decode(*a[:4], tree_mask=a[4], return_lse=True), fullgraph=True,
                             backend="aot_eager")
    out, lse = compiled(q, k, v, lengths, tree)
    assert_tree_result(out, lse, q, k, v, tree, lengths)


# --- torch.library -------------------------------------------------------------------------------
def test_opcheck_sdpa_decode():
    q, k, v = qkv(2, 2, 2, 16, seq_kv=9)
    torch.library.opcheck(torch.ops.rlx_triton.sdpa_decode.default, (q, k, v, torch.tensor([9, 4]), 0.25))
    tree = torch.tensor([[True, False], [True, True]])
    torch.library.opcheck(torch.ops.rlx_triton.sdpa_decode.default, (q, k, v, torch.tensor([9, 4]), 0.25),
                          {"tree_mask": tree})


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
        assert_steady_state_never_syncs(step, repeats=3)



# --- the deterministic profile: a sequence's output bits do not depend on its batch or the GPU --------------
def _decode_alone_and_in_a_batch(backend: str, gpus=("h200", "a100")):
    """The inputs (q, k, v, lengths) of 7 sequences, the first decoded alone as on the first GPU and inside the
    batch of 7 as on the second ((out, lse) each), and the KV splits of the launches."""
    from rlx_triton import devices
    from rlx_triton.backends.triton import launches
    from rlx_triton.router.device import routing_as

    generator = torch.Generator().manual_seed(3)
    k = torch.randn(7, 1, 2200, 16, generator=generator)
    v = torch.randn(7, 1, 2200, 16, generator=generator)
    q = torch.randn(7, 2, 1, 16, generator=generator)
    lengths = torch.tensor([2100, 3, 700, 2200, 1025, 64, 1500], dtype=torch.int32)
    results, splits = [], []
    for gpu, rows in zip(gpus, (slice(0, 1), slice(0, 7))):
        as_gpu = routing_as(devices.profile(gpu), devices=("cpu",)) if backend == "triton" else contextlib.nullcontext()
        with as_gpu, rt.use_backend(backend, strict=backend != "torch"), launches.recording() as log:
            results.append(rt.sdpa_decode(q[rows], k[rows], v[rows], lengths[rows], return_lse=True))
        splits += [record.grid[1] for record in log.records]
    return (q, k, v, lengths), results, splits


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_under_the_deterministic_profile_a_sequence_decodes_to_the_same_bits_alone_and_in_a_batch(backend):
    from rlx_triton.config import override_settings

    with override_settings(profile="deterministic"):
        (q, k, v, lengths), ((alone, alone_lse), (batched, batched_lse)), splits = _decode_alone_and_in_a_batch(backend)
    assert torch.equal(alone[0], batched[0]) and torch.equal(alone_lse[0], batched_lse[0])
    ref_out, ref_lse = attention_reference(q[:1], k[:1], v[:1], causal="bottom_right", cache_seqlens=lengths[:1])
    torch.testing.assert_close(alone.double(), ref_out, rtol=TOL[torch.float32], atol=1e-5)
    torch.testing.assert_close(alone_lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    if backend == "triton":   # 2100 keys in fixed splits of 16 tiles: partials merged, under either GPU's SM count
        assert splits and all(count > 1 for count in splits), splits
