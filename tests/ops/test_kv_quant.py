"""Quantised KV caches (fp8 e4m3 / e5m2, int8) in rt.sdpa_decode and rt.flash_attn_with_kvcache: values are
dequantised on load (x = q * scale, per tensor or per token and head) and match a float64 reference that
dequantises the same cache, on the torch path and with the Triton kernel forced (the interpreter); appended
tokens are quantised into the cache alike on both paths; bad scales are refused by name; the route plans the
cache through the precision model and approves it per storage dtype. rt.flash_attn_varlen_func's paged caches
are tests/ops/test_varlen_kv_quant.py's."""
from __future__ import annotations

import pytest
import torch

import rlx_triton as rt
from rlx_triton.kv_quant import dequantize, quantize, token_head_scales
from tests.reference.sdpa_decode import attention_reference

STORAGES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8]
SCALE_KINDS = ["per_tensor", "per_token_head"]
BACKENDS = ["torch", "triton"]
# relative to the output's largest magnitude: a 16-bit query rounds once more than the float64 reference
REL_TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def _quantised(values: torch.Tensor, storage: torch.dtype, kind: str):
    """(cache, scale) holding float32 `values` (..., D): one scale for all, or one per row (token and head)."""
    if kind == "per_tensor":
        scale = token_head_scales(values.reshape(1, -1), storage).reshape(1)
    else:
        scale = token_head_scales(values, storage)
    return quantize(values, scale, storage), scale


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _run(backend: str, fn, *args, **kwargs):
    with rt.use_backend(backend, strict=backend == "triton"):
        return fn(*args, **kwargs)


def _decode_case(storage, kind, query_dtype=torch.float16, seed=0):
    """GQA (4 query heads on 2 KV heads), 2 query tokens, ragged lengths 37, 1 and 20 of a 37-slot cache."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 4, 2, 16, generator=generator).to(query_dtype)
    k_cache, k_scale = _quantised(torch.randn(3, 2, 37, 16, generator=generator) * 3, storage, kind)
    v_cache, v_scale = _quantised(torch.randn(3, 2, 37, 16, generator=generator), storage, kind)
    return q, k_cache, v_cache, k_scale, v_scale, torch.tensor([37, 1, 20], dtype=torch.int32)


def _paged(cache: torch.Tensor, scale: torch.Tensor, page_size: int, generator: torch.Generator):
    """A contiguous (B, Hkv, S, D) cache and its scales as shuffled pages (num_pages, Hkv, page_size, D), the
    per-token-head scales as (num_pages, Hkv, page_size), and the block table."""
    batch, heads, slots, dim = cache.shape
    pages_per_sequence = -(-slots // page_size)
    padded = pages_per_sequence * page_size
    order = torch.randperm(batch * pages_per_sequence, generator=generator)
    table = order.reshape(batch, pages_per_sequence).to(torch.int32)

    def pages_of(tensor):
        grown = tensor.new_zeros((batch, heads, padded) + tuple(tensor.shape[3:]))
        grown[:, :, :slots] = tensor
        split = grown.reshape((batch, heads, pages_per_sequence, page_size) + tuple(tensor.shape[3:]))
        by_page = split.transpose(1, 2).reshape((batch * pages_per_sequence, heads, page_size)
                                                + tuple(tensor.shape[3:]))
        out = torch.empty_like(by_page)
        out[order] = by_page
        return out

    return pages_of(cache.view(torch.uint8)).view(cache.dtype), (scale if scale.numel() == 1 else pages_of(scale)), \
        table


# --- sdpa_decode: contiguous and paged caches --------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", SCALE_KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_sdpa_decode_dequantises_the_cache_on_load(storage, kind, backend):
    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(storage, kind)
    out = _run(backend, rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    ref, _ = attention_reference(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale),
                                 causal="bottom_right", cache_seqlens=lengths)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert _relative_error(out, ref) <= REL_TOL[q.dtype]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sdpa_decode_output_follows_the_query_dtype(query_dtype, backend):
    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(torch.float8_e4m3fn, "per_token_head",
                                                                  query_dtype)
    out, lse = _run(backend, rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale,
                    return_lse=True)
    ref, ref_lse = attention_reference(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale),
                                       causal="bottom_right", cache_seqlens=lengths)
    assert out.dtype == query_dtype and lse.dtype == torch.float32
    assert _relative_error(out, ref) <= REL_TOL[query_dtype]
    torch.testing.assert_close(lse.double(), ref_lse, rtol=REL_TOL[query_dtype], atol=REL_TOL[query_dtype])


@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("kind", SCALE_KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_paged_sdpa_decode_reads_quantised_pages_on_both_paths(storage, kind, page_size):
    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(storage, kind, seed=page_size)
    generator = torch.Generator().manual_seed(page_size)
    k_pages, k_page_scale, table = _paged(k_cache, k_scale, page_size, generator)
    v_pages, v_page_scale, _ = _paged(v_cache, v_scale, page_size, torch.Generator().manual_seed(page_size))
    ref, _ = attention_reference(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale),
                                 causal="bottom_right", cache_seqlens=lengths)
    for backend in BACKENDS:
        out = _run(backend, rt.sdpa_decode, q, k_pages, v_pages, lengths, block_table=table, k_scale=k_page_scale,
                   v_scale=v_page_scale)
        assert _relative_error(out, ref) <= REL_TOL[q.dtype], backend


def test_an_e4m3_cache_read_as_bytes_gives_the_converted_result(monkeypatch):
    """Before sm_89 the kernel takes an e4m3 cache's bytes and decodes them itself: the same numbers."""
    from rlx_triton.backends.triton.sdpa_decode import launch

    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(torch.float8_e4m3fn, "per_token_head")
    converted = _run("triton", rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    monkeypatch.setattr(launch, "_converts_e4m3", lambda device: False)
    decoded = _run("triton", rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(decoded, converted, rtol=0, atol=0)


# --- flash_attn_with_kvcache: FlashAttention's layouts, appends quantised ---------------------------------------
def _fa_case(storage, kind, page_size, seed=0):
    """q (2, 1, 4, 16) on 2 KV heads; 30 and 11 cached tokens of 40 slots; one new token each, appended."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 1, 4, 16, generator=generator).to(torch.float16)
    k_cache, k_scale = _quantised(torch.randn(2, 2, 40, 16, generator=generator), storage, kind)
    v_cache, v_scale = _quantised(torch.randn(2, 2, 40, 16, generator=generator), storage, kind)
    table = None
    if page_size is not None:
        k_cache, k_scale, table = _paged(k_cache, k_scale, page_size, torch.Generator().manual_seed(seed))
        v_cache, v_scale, _ = _paged(v_cache, v_scale, page_size, torch.Generator().manual_seed(seed))
    # FlashAttention's order: (rows or pages, slots, Hkv, D) and scales (rows or pages, slots, Hkv)
    to_fa = (lambda t: t.transpose(1, 2).contiguous() if t.dim() >= 3 else t)
    k_cache, v_cache = (to_fa(c.view(torch.uint8)).view(storage) for c in (k_cache, v_cache))
    k_scale, v_scale = to_fa(k_scale), to_fa(v_scale)
    new_k = torch.randn(2, 1, 2, 16, generator=generator).to(torch.float16)
    new_v = torch.randn(2, 1, 2, 16, generator=generator).to(torch.float16)
    return q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, table, torch.tensor([30, 11], dtype=torch.int32)


@pytest.mark.parametrize("page_size", [None, 16, 5], ids=["contiguous", "pages16", "pages5"])
@pytest.mark.parametrize("kind", SCALE_KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_flash_attn_with_kvcache_appends_quantised_and_attends_on_both_paths(storage, kind, page_size):
    q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, table, lengths = _fa_case(storage, kind, page_size)
    results = {}
    for backend in BACKENDS:
        state = [t.clone() for t in (k_cache, v_cache, k_scale, v_scale)]
        out = _run(backend, rt.flash_attn_with_kvcache, q, state[0], state[1], new_k, new_v, cache_seqlens=lengths,
                   block_table=table, k_scale=state[2], v_scale=state[3])
        results[backend] = out, state
    _, (k_after, v_after, k_scale_after, v_scale_after) = results["torch"]
    for got, want in zip(results["triton"][1], results["torch"][1]):   # the same bytes appended on both paths
        assert torch.equal(got.view(torch.uint8) if got.dtype == storage else got,
                           want.view(torch.uint8) if want.dtype == storage else want)
    reference = rt.flash_attn_with_kvcache(q.double(), dequantize(k_after, k_scale_after).double(),
                                           dequantize(v_after, v_scale_after).double(), cache_seqlens=lengths + 1,
                                           block_table=table)
    for backend, (out, _) in results.items():
        assert out.dtype == q.dtype
        assert _relative_error(out, reference) <= REL_TOL[q.dtype], backend


@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_appended_tokens_are_rounded_to_nearest_and_saturated(storage):
    q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, _, lengths = _fa_case(storage, "per_tensor", None)
    new_k[0, 0, 0, :2] = torch.tensor([1e4, -1e4])    # past the largest stored magnitude at this scale
    rt.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=lengths, k_scale=k_scale,
                               v_scale=v_scale)
    stored = k_cache[0, 30, 0].to(torch.float32)
    largest = 127.0 if storage == torch.int8 else torch.finfo(storage).max
    assert stored[:2].tolist() == [largest, -largest]
    want = (new_k[0, 0, 0, 2:].float() / k_scale).to(storage) if storage != torch.int8 \
        else (new_k[0, 0, 0, 2:].float() / k_scale).round().to(torch.int8)
    assert torch.equal(stored[2:], want.to(torch.float32))


def test_per_token_head_scales_of_appended_tokens_are_written():
    q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, _, lengths = _fa_case(torch.int8, "per_token_head", None)
    rt.flash_attn_with_kvcache(q, k_cache, v_cache, new_k, new_v, cache_seqlens=lengths, k_scale=k_scale,
                               v_scale=v_scale)
    for b, slot in enumerate(lengths.tolist()):
        torch.testing.assert_close(k_scale[b, slot], new_k[b, 0].float().abs().amax(-1) / 127)
        assert k_cache[b, slot].abs().amax(-1).tolist() == [127, 127]   # each row's largest value uses the range


# --- the conditions users create: inference mode, silence, NaN ------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_quantised_caches_under_inference_mode_give_the_reference(backend):
    """pyannote-style inference tensors: the caches, scales and query made and appended inside inference_mode."""
    with torch.inference_mode():
        q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, table, lengths = _fa_case(torch.int8, "per_token_head", 5)
        out = _run(backend, rt.flash_attn_with_kvcache, q, k_cache, v_cache, new_k, new_v, cache_seqlens=lengths,
                   block_table=table, k_scale=k_scale, v_scale=v_scale)
        reference = rt.flash_attn_with_kvcache(q.double(), dequantize(k_cache, k_scale).double(),
                                               dequantize(v_cache, v_scale).double(), cache_seqlens=lengths + 1,
                                               block_table=table)
    assert _relative_error(out, reference) <= REL_TOL[q.dtype]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_silent_tokens_append_as_zeros_with_unit_scales_and_constant_values_stay_constant(storage, backend):
    q, k_cache, v_cache, k_scale, v_scale, new_k, new_v, _, lengths = _fa_case(storage, "per_token_head", None)
    v_cache.zero_()
    v_scale.fill_(1.0)
    out = _run(backend, rt.flash_attn_with_kvcache, q, k_cache, v_cache, torch.zeros_like(new_k),
               torch.zeros_like(new_v), cache_seqlens=lengths, k_scale=k_scale, v_scale=v_scale)
    for b, slot in enumerate(lengths.tolist()):
        assert k_scale[b, slot].tolist() == [1.0, 1.0] and not k_cache[b, slot].to(torch.float32).any()
    assert bool((out == 0).all())   # every value row is zero: the output is exactly zero, not NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_stored_in_an_fp8_cache_reaches_the_rows_that_read_it_as_in_float64(backend, monkeypatch):
    """On the kernel, the e4m3 cache is read through the byte decoder: Triton's interpreter converts fp8e4nv's NaN
    (0x7f) to 480, where a GPU's conversion and the decoder give NaN (bench/gpu_check.sh's gpu-tests run the
    native conversion on CUDA)."""
    from rlx_triton.backends.triton.sdpa_decode import launch

    monkeypatch.setattr(launch, "_converts_e4m3", lambda device: False)
    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(torch.float8_e4m3fn, "per_tensor")
    v_cache[1, 0, 0, 3] = float("nan")      # sequence 1 (length 1) reads it through KV head 0; no other does
    out = _run(backend, rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    ref, _ = attention_reference(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale),
                                 causal="bottom_right", cache_seqlens=lengths)
    assert torch.equal(out.isnan(), ref.isnan()) and bool(out[1, :2, 1, 3].isnan().all())
    finite = ~ref.isnan()
    assert ((out.double() - ref)[finite].abs().max() / ref[finite].abs().max()).item() <= REL_TOL[q.dtype]


# --- refusals --------------------------------------------------------------------------------------------------
def _bad_scale_calls(k_scale, v_scale, k_cache=None):
    q, cache, v_cache, good_k, good_v, lengths = _decode_case(torch.int8, "per_tensor")
    k_cache = cache if k_cache is None else k_cache
    fa_q = q[:, :, :1].transpose(1, 2)
    yield lambda: rt.sdpa_decode(q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    in_fa_order = (lambda s: s.transpose(1, 2) if isinstance(s, torch.Tensor) and s.dim() == 3 else s)
    yield lambda: rt.flash_attn_with_kvcache(fa_q, k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                                             cache_seqlens=lengths, k_scale=in_fa_order(k_scale),
                                             v_scale=in_fa_order(v_scale))


@pytest.mark.parametrize("case, error, name", [
    ("no scales", ValueError, "k_scale"),
    ("a v scale of another shape", ValueError, "v_scale"),
    ("a float64 k scale", TypeError, "k_scale"),
    ("one per tensor, one per token", ValueError, "k_scale and v_scale"),
])
def test_bad_scales_are_refused_by_name_in_every_entry_point(case, error, name):
    good = torch.tensor([0.1])
    k_scale, v_scale = {"no scales": (None, None), "a v scale of another shape": (good, torch.ones(3, 2)),
                        "a float64 k scale": (good.double(), good),
                        "one per tensor, one per token": (good, torch.ones(3, 2, 37))}[case]
    for call in _bad_scale_calls(k_scale, v_scale):
        with pytest.raises(error, match=name):
            call()


def test_scales_with_a_float_cache_are_refused_by_name():
    q, k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    with pytest.raises(ValueError, match="k_scale is for an fp8 or int8 k_cache"):
        rt.sdpa_decode(q, k, v, k_scale=torch.tensor([1.0]), v_scale=torch.tensor([1.0]))


# --- routing: the precision model plans it, approvals are per storage -------------------------------------------
def test_explain_shows_the_kv_cache_role_dequantised_on_load():
    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(torch.float8_e5m2, "per_token_head")
    with rt.use_backend("triton"):
        decided = rt.explain(rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
    assert decided.backend == "triton"
    assert "precision  kv_cache f8e5m2 -> f32, dequant on load" in str(decided)


def test_a_storage_without_a_measured_bound_is_not_approved(monkeypatch):
    from dataclasses import replace

    from rlx_triton.backends.triton import sdpa_decode as kernels
    from rlx_triton.router import clear_route_cache

    q, k_cache, v_cache, k_scale, v_scale, lengths = _decode_case(torch.int8, "per_tensor")
    monkeypatch.setattr(kernels, "APPROVALS", {tag: replace(approval, storage_errors=tuple(
        (storage, bound) for storage, bound in approval.storage_errors if storage != "int8"))
        for tag, approval in kernels.APPROVALS.items()})
    clear_route_cache()
    try:
        with rt.use_backend("triton"):
            decided = rt.explain(rt.sdpa_decode, q, k_cache, v_cache, lengths, k_scale=k_scale, v_scale=v_scale)
            float8 = rt.explain(rt.sdpa_decode, q, k_cache.to(torch.float32).to(torch.float8_e4m3fn),
                                v_cache.to(torch.float32).to(torch.float8_e4m3fn), lengths, k_scale=k_scale,
                                v_scale=v_scale)
    finally:
        monkeypatch.undo()
        clear_route_cache()
    assert decided.backend == "torch" and "approv" in str(decided)
    assert float8.backend == "triton"   # the storages that were measured stay approved


@pytest.mark.gpu
@pytest.mark.parametrize("kind", SCALE_KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=str)
def test_on_cuda_the_kernel_reads_quantised_caches_as_the_reference(storage, kind):
    """bench/gpu_check.sh (gpu-tests): the compiled kernel on the GPU, contiguous and paged (page size 5), at a
    long cache that splits; e4m3 is read natively from sm_89 on and as bytes before."""
    q = _decode_case(storage, kind)[0].cuda()
    k_long, k_long_scale = _quantised(torch.randn(3, 2, 3000, 16, device="cuda") * 3, storage, kind)
    v_long, v_long_scale = _quantised(torch.randn(3, 2, 3000, 16, device="cuda"), storage, kind)
    lengths = torch.tensor([3000, 1, 2000], dtype=torch.int32, device="cuda")
    ref, _ = attention_reference(q, dequantize(k_long, k_long_scale), dequantize(v_long, v_long_scale),
                                 causal="bottom_right", cache_seqlens=lengths)
    out = _run("triton", rt.sdpa_decode, q, k_long, v_long, lengths, k_scale=k_long_scale, v_scale=v_long_scale)
    assert _relative_error(out.cpu(), ref) <= REL_TOL[q.dtype]
    k_pages, k_page_scale, table = _paged(k_long, k_long_scale, 5, torch.Generator().manual_seed(0))
    v_pages, v_page_scale, _ = _paged(v_long, v_long_scale, 5, torch.Generator().manual_seed(0))
    paged = _run("triton", rt.sdpa_decode, q, k_pages, v_pages, lengths, block_table=table.cuda(),
                 k_scale=k_page_scale, v_scale=v_page_scale)
    assert _relative_error(paged.cpu(), ref) <= REL_TOL[q.dtype]
    if storage != torch.int8:   # fp8 holds NaN: the GPU's own conversion keeps it (the interpreter's does not)
        v_long[1, 0, 0, 3] = float("nan")
        with_nan = _run("triton", rt.sdpa_decode, q, k_long, v_long, lengths, k_scale=k_long_scale,
                        v_scale=v_long_scale)
        assert bool(with_nan[1, :2, :, 3].isnan().all()) and not bool(with_nan[0].isnan().any())
