"""rt.flash_attn_varlen_func over a quantised paged KV cache (fp8 e4m3 / e5m2, int8; k_scale / v_scale per tensor
or per key row and head): on the torch path and with the Triton kernel forced (in the interpreter), against a
float64 attention over the dequantised same cache; every storage x scale kind x page size (16 and 5), GQA, ragged
lengths (one key, no key, no query token), causal and not, fp16 / bf16 / fp32 queries; the request's features,
the per-storage approvals and their measured bounds, the e4m3 byte path of GPUs before sm_89, and the argument
checks (every bad scale refused by name, before any launch)."""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch

import rlx_triton as rt
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import varlen_attention as tk
from rlx_triton.kv_quant import dequantize, quantize
from rlx_triton.planner import VarlenAttentionCandidate
from rlx_triton.planner.candidates.varlen_attention import DEFAULT_VARIANT
from rlx_triton.router.route import clear_route_cache
from tests.reference.varlen_attention import assert_out_and_lse_match, make_varlen_inputs, naive_flash_attn_varlen

STORAGES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.int8)
KINDS = ("per_tensor", "per_token_head")
HEADS = (4, 2)          # GQA: two query heads per KV head
HEAD_DIM = 16
# ragged: a sequence of one key, one of no key, one without query tokens, one past two pages of 5
LENGTHS_Q = [3, 1, 2, 0, 4]
LENGTHS_K = [7, 1, 0, 5, 12]
# the bounds' measurement: two sequences (a prefill chunk and a decode-sized one), half the interpreter's programs
BOUND_LENGTHS = ((4, 1), (12, 7))
# the existing varlen tests' tolerances (tests/triton/test_varlen_attention.py): the output's rounding to q's dtype
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
BACKENDS = ("torch", "triton")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _scales(cache: torch.Tensor, kind: str) -> torch.Tensor:
    """Scales that map each row's (or the tensor's) largest magnitude to 100 (inside every storage's range)."""
    amax = cache.float().abs().amax(-1).clamp_min(1e-3)
    return (amax.max() / 100).reshape(1) if kind == "per_tensor" else amax / 100


@functools.lru_cache(maxsize=None)
def _case(storage: torch.dtype, kind: str, page_size: int, causal: bool, q_dtype: torch.dtype, lengths=None):
    """(call keywords, float64 reference out, reference lse): a quantised paged cache and the naive float64
    attention over its dequantised values (what the kernel must compute; quantisation's own error is not its).
    lengths: (query lengths, key lengths), LENGTHS_Q / LENGTHS_K by default."""
    lengths_q, lengths_k = lengths if lengths is not None else (LENGTHS_Q, LENGTHS_K)
    kw = make_varlen_inputs(max(lengths_q), max(lengths_k), HEAD_DIM, HEADS, page_size=page_size, causal=causal,
                            lengths_q=list(lengths_q), lengths_k=list(lengths_k))
    kw["q"] = kw["q"].to(q_dtype)
    k_scale, v_scale = _scales(kw["k"], kind), _scales(kw["v"], kind)
    k, v = quantize(kw["k"], k_scale, storage), quantize(kw["v"], v_scale, storage)
    ref_out, ref_lse = naive_flash_attn_varlen(**dict(kw, k=dequantize(k, k_scale).double(),
                                                      v=dequantize(v, v_scale).double()))
    return dict(kw, k=k, v=v, k_scale=k_scale, v_scale=v_scale), ref_out, ref_lse


def case(storage=torch.int8, kind="per_token_head", page_size=5, causal=True, q_dtype=torch.float16, lengths=None):
    kw, ref_out, ref_lse = _case(storage, kind, page_size, causal, q_dtype, lengths)
    return dict(kw), ref_out, ref_lse


def run(kw: dict, backend: str):
    """(out, lse) of the call on `backend`, which must be the one that runs it."""
    with rt.use_backend(backend, strict=True):
        assert rt.explain(rt.flash_attn_varlen_func, **kw).backend == backend
        out, lse, _ = rt.flash_attn_varlen_func(**kw, return_attn_probs=True)
    return out, lse


def assert_matches(out, lse, ref_out, ref_lse, dtype):
    assert_out_and_lse_match(out, lse, ref_out, ref_lse, dtype, TOL[dtype])


def _relative_error(out, ref) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


# ------------------------------------------------------------------------------------------------ the numbers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=_name)
def test_a_quantised_paged_cache_gives_attention_over_its_dequantised_values(storage, kind, page_size, causal,
                                                                             backend):
    kw, ref_out, ref_lse = case(storage, kind, page_size, causal)
    out, lse = run(kw, backend)
    assert_matches(out, lse, ref_out, ref_lse, torch.float16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=_name)
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=_name)
def test_the_query_keeps_its_dtype_over_a_quantised_cache(q_dtype, storage, kind, backend):
    kw, ref_out, ref_lse = case(storage, kind, 5, True, q_dtype)
    out, lse = run(kw, backend)
    assert_matches(out, lse, ref_out, ref_lse, q_dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_that_see_no_key_give_zero_and_lse_plus_inf(backend):
    kw, _, _ = case()
    out, lse = run(kw, backend)
    rows = slice(LENGTHS_Q[0] + LENGTHS_Q[1], LENGTHS_Q[0] + LENGTHS_Q[1] + LENGTHS_Q[2])   # the keyless sequence
    assert bool((out[rows] == 0).all()) and bool((lse[:, rows] == math.inf).all())


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_per_token_head_scales_are_the_per_tensor_scale(backend):
    kw, _, _ = case(kind="per_tensor")
    spread = dict(kw, k_scale=kw["k_scale"].expand(kw["k"].shape[:-1]).contiguous(),
                  v_scale=kw["v_scale"].expand(kw["v"].shape[:-1]).contiguous())
    torch.testing.assert_close(run(spread, backend)[0], run(kw, backend)[0], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_one_element_scale_may_be_a_scalar_tensor(backend):
    kw, _, _ = case(kind="per_tensor")
    scalar = dict(kw, k_scale=kw["k_scale"].reshape(()), v_scale=kw["v_scale"].reshape(()))
    assert torch.equal(run(scalar, backend)[0], run(kw, backend)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_an_e4m3_cache_read_as_bytes_gives_the_bits_of_the_fp8_read(monkeypatch, kind):
    """CUDA before sm_89 converts no fp8e4nv: the launcher hands the cache over as bytes and the kernel decodes them.
    Every byte but the two NaNs is stored, so each of the format's values (subnormals, -0, 448) is decoded."""
    kw, _, _ = case(torch.float8_e4m3fn, kind)
    gen = torch.Generator().manual_seed(1)
    for name in ("k", "v"):
        raw = torch.randint(0, 256, kw[name].shape, generator=gen, dtype=torch.int16)
        raw = torch.where((raw & 0x7F) == 0x7F, 0, raw).to(torch.uint8)
        kw[name] = raw.view(torch.float8_e4m3fn)
    args = (kw["q"], kw["k"], kw["v"], kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["max_seqlen_q"], kw["max_seqlen_k"],
            None, True, (-1, -1), 0.0, None, kw["block_table"], None)
    options = dict(k_scale=kw["k_scale"], v_scale=kw["v_scale"], candidate=DEFAULT_VARIANT.candidate())
    as_fp8, _, _ = tk.flash_attn_varlen_func(*args, **options)
    monkeypatch.setattr(tk.launch, "_converts_e4m3", lambda device: False)
    (record,), _ = tk.varlen_attention_plan(*args[:7], scale=0.25, block_table=kw["block_table"], **options)
    assert record.meta["KV_E4M3_BITS"] and record.args[1].dtype == torch.uint8
    as_bytes, _, _ = tk.flash_attn_varlen_func(*args, **options)
    assert torch.equal(as_bytes, as_fp8)
    with rt.use_backend("torch"):
        torch.testing.assert_close(rt.flash_attn_varlen_func(**kw), as_bytes, rtol=2e-3, atol=2e-3)


# ------------------------------------------------------------------------------------------------ routing


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("storage", STORAGES, ids=_name)
def test_the_request_names_the_storage_and_the_scale_layout(storage, kind):
    kw, _, _ = case(storage, kind)
    with rt.use_backend("triton", strict=True):
        decided = rt.explain(rt.flash_attn_varlen_func, **kw)
    features = decided.request.feature_map
    assert features["kv_dtype"] == _name(storage) and features["kv_scale"] == kind
    assert decided.precision is not None
    assert decided.precision.kv_cache.storage.value in ("f8e4m3", "f8e5m2", "i8")
    assert decided.precision.kv_cache.convert.value == "dequant_on_load"


def test_a_float_cache_sends_no_quantisation_features():
    kw = make_varlen_inputs(4, 12, HEAD_DIM, HEADS, page_size=5, dtype=torch.float16)
    features = rt.explain(rt.flash_attn_varlen_func, **kw).request.feature_map
    assert "kv_dtype" not in features and "kv_scale" not in features


@pytest.mark.parametrize("storage", STORAGES, ids=_name)
def test_approved_candidates_hold_their_bound_for_each_storage(storage):
    """Each candidate's approval for a storage is its float-cache bound, measured here against float64 over the
    dequantised cache: an f16-dot candidate's on fp16 queries, the fp32 candidate's on fp32 queries."""
    for tag, approval in tk.APPROVALS.items():
        candidate = VarlenAttentionCandidate.from_tag(tag)
        stored = approval.for_storage(_name(storage))
        assert stored is not None and stored.max_rel_err == approval.max_rel_err, tag
        q_dtype = torch.float16 if candidate.use_f16_dot else torch.float32
        for kind in KINDS:
            kw, ref_out, _ = case(storage, kind, 5, True, q_dtype, BOUND_LENGTHS)
            out, _, _ = tk.flash_attn_varlen_func(
                kw["q"], kw["k"], kw["v"], kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["max_seqlen_q"],
                kw["max_seqlen_k"], None, True, (-1, -1), 0.0, None, kw["block_table"], None,
                k_scale=kw["k_scale"], v_scale=kw["v_scale"], candidate=candidate)
            assert _relative_error(out, ref_out) <= stored.max_rel_err, (tag, kind)


@pytest.fixture
def fresh_routes():
    clear_route_cache()
    yield
    clear_route_cache()


def test_a_storage_without_a_measured_bound_is_not_approved(monkeypatch, fresh_routes):
    """An approval for float caches is no approval for int8: with int8's bounds taken away, strict mode refuses
    the int8 cache by that reason, the free choice falls back to the torch path (the same numbers), and the
    storages still measured keep the kernel."""
    for tag, approval in list(tk.APPROVALS.items()):
        kept = tuple(entry for entry in approval.storage_errors if entry[0] != "int8")
        monkeypatch.setitem(tk.APPROVALS, tag, replace(approval, storage_errors=kept))
    kw, ref_out, ref_lse = case(torch.int8)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="no accuracy approval") as err:
        rt.flash_attn_varlen_func(**kw)
    assert "int8" in str(err.value)
    with rt.use_backend("triton"):
        decided = rt.explain(rt.flash_attn_varlen_func, **kw)
        out, lse, _ = rt.flash_attn_varlen_func(**kw, return_attn_probs=True)
    assert decided.backend == "torch" and "triton" in decided.skipped_reasons
    assert_matches(out, lse, ref_out, ref_lse, torch.float16)
    assert run(case(torch.float8_e5m2)[0], "triton")[0].dtype == torch.float16


# ------------------------------------------------------------------------------------------------ errors


def _without(kw, *names):
    return {key: value for key, value in kw.items() if key not in names}


def _float_cache(kw):
    return dict(kw, k=torch.randn(kw["k"].shape, dtype=torch.float16), v=torch.randn(kw["v"].shape, dtype=torch.float16))


def _contiguous(kw):
    k = kw["k"].reshape(-1, *kw["k"].shape[2:])
    v = kw["v"].reshape(-1, *kw["v"].shape[2:])
    return dict(_without(kw, "block_table", "k_scale", "v_scale"), k=k, v=v,
                cu_seqlens_k=torch.tensor([0, 7, 8, 8, 13, 25], dtype=torch.int32))


BAD_CALLS = {
    "no scales": (lambda kw: _without(kw, "k_scale", "v_scale"), ValueError, "k_scale"),
    "no k_scale": (lambda kw: _without(kw, "k_scale"), ValueError, "k_scale"),
    "no v_scale": (lambda kw: _without(kw, "v_scale"), ValueError, "v_scale"),
    "scales beside a float cache": (_float_cache, ValueError, "k_scale"),
    "k_scale per page": (lambda kw: dict(kw, k_scale=kw["k_scale"][..., 0]), ValueError, "k_scale"),
    # sdpa_decode's paged order (num_pages, Hkv, page_size): not this layout's
    "v_scale transposed": (lambda kw: dict(kw, v_scale=kw["v_scale"].transpose(1, 2)), ValueError, "v_scale"),
    "k_scale float16": (lambda kw: dict(kw, k_scale=kw["k_scale"].half()), TypeError, "k_scale"),
    "v_scale a float": (lambda kw: dict(kw, v_scale=0.5), TypeError, "v_scale"),
    "k_scale on another device": (lambda kw: dict(kw, k_scale=kw["k_scale"].to("meta")), ValueError, "k_scale"),
    "per tensor and per token": (lambda kw: dict(kw, v_scale=kw["v_scale"][:1, :1, 0]), ValueError, "v_scale"),
    "k and v of two storages": (lambda kw: dict(kw, v=kw["v"].view(torch.uint8).view(torch.float8_e5m2)),
                                TypeError, "v must have the dtype"),
    "a quantised contiguous k": (_contiguous, ValueError, "k of dtype torch.int8"),
    "a quantised query": (lambda kw: dict(kw, q=kw["q"].to(torch.float8_e4m3fn)), TypeError, "q must be"),
}


@pytest.mark.parametrize("bad", list(BAD_CALLS))
def test_a_bad_quantised_call_is_refused_by_name_before_any_launch(bad):
    mutate, error, match = BAD_CALLS[bad]
    kw = mutate(case()[0])
    with launches.recording() as log, rt.use_backend("triton", strict=True):
        with pytest.raises(error, match=match):
            rt.flash_attn_varlen_func(**kw)
        with pytest.raises(error, match=match):
            rt.explain(rt.flash_attn_varlen_func, **kw)
    assert log.kernels == []


def test_flash_attn_func_refuses_a_quantised_k_by_name():
    q = torch.randn(2, 3, 4, HEAD_DIM)
    k = torch.zeros(2, 5, 2, HEAD_DIM, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k of dtype torch.float8_e4m3fn"):
        rt.flash_attn_func(q, k, k)
