"""rt.flash_attn_with_kvcache: FlashAttention 2's kv-cache test matrix (seqlen pairs, head dims 59 and 111,
MHA/MQA/GQA, causal, local windows, softcap, ALiBi, rotary, new k/v, cache_batch_idx, cache_leftpad, paged or
not), sampled so that every option meets every other in some case, against a naive float64 reading of FA2;
the in-place cache append; routing (kernel where covered, the torch path and strict mode's refusal
otherwise); FA's argument checks; torch.library registration and torch.compile."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

import pytest
import torch

import rlx_triton as rt
from tests.reference.flash_attn import naive_flash_attn_with_kvcache

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass(frozen=True)
class Case:
    seqlen_q: int
    seqlen_k: int          # the cache capacity (pages x page size when paged)
    head_dim: int
    heads: Tuple[int, int] = (4, 4)   # (H, Hkv): MHA, GQA or MQA
    head_dim_v: Optional[int] = None
    new_kv: int = 0
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: Optional[str] = None       # "head" or "batch_head"
    rotary: Optional[Tuple[int, bool]] = None   # (rotary_dim, interleaved)
    batch_idx: bool = False
    leftpad: bool = False
    page_size: Optional[int] = None
    lengths: Optional[Tuple[int, ...]] = None   # cache_seqlens before the append; default: random
    batch: int = 2
    extra: dict = field(default_factory=dict, compare=False)


# FA2's seqlen pairs scaled down to interpreter size; each option appears with several others
MATRIX = [
    Case(1, 13, 32),
    Case(3, 40, 59, heads=(6, 2), new_kv=3, causal=True, rotary=(16, True)),
    Case(1, 34, 111, heads=(4, 1), new_kv=1, rotary=(32, False), page_size=16),
    Case(7, 20, 16, heads=(4, 2), window=(4, 2), softcap=3.0, page_size=1),
    Case(5, 9, 24, alibi="head", causal=True, batch_idx=True),
    Case(1, 37, 40, heads=(4, 2), alibi="batch_head", window=(8, 0), leftpad=True, new_kv=1),
    Case(4, 30, 8, causal=True, leftpad=True, rotary=(8, True), new_kv=2, page_size=256),
    Case(16, 16, 32, causal=True, new_kv=16, lengths=(0, 0)),
    Case(2, 25, 32, heads=(4, 2), head_dim_v=16, new_kv=2, window=(3, -1), rotary=(20, False), batch_idx=True),
    Case(6, 12, 16, heads=(2, 1), causal=True, lengths=(3, 0), softcap=1.5, alibi="head", page_size=5),
    Case(3, 799 // 40, 111, heads=(3, 3), window=(2, 2), rotary=(110, True), new_kv=3, leftpad=True),
    Case(5, 9, 59, heads=(4, 1), softcap=2.0, new_kv=5, rotary=(4, False), causal=True, page_size=3),
]


def make_inputs(case: Case, dtype=torch.float32, seed=0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    heads, kv_heads = case.heads
    dim_v = case.head_dim_v or case.head_dim
    batch = case.batch
    kw: dict = {"q": randn(batch, case.seqlen_q, heads, case.head_dim)}
    if case.page_size is None:
        rows = batch + 2 if case.batch_idx else batch
        kw["k_cache"], kw["v_cache"] = randn(rows, case.seqlen_k, kv_heads, case.head_dim), \
            randn(rows, case.seqlen_k, kv_heads, dim_v)
        if case.batch_idx:
            kw["cache_batch_idx"] = torch.randperm(rows, generator=gen)[:batch].to(torch.int32)
        capacity = case.seqlen_k
    else:
        pages_per_sequence = -(-case.seqlen_k // case.page_size)
        num_pages = batch * pages_per_sequence + 1
        kw["k_cache"] = randn(num_pages, case.page_size, kv_heads, case.head_dim)
        kw["v_cache"] = randn(num_pages, case.page_size, kv_heads, dim_v)
        kw["block_table"] = torch.randperm(num_pages, generator=gen)[:batch * pages_per_sequence] \
            .reshape(batch, pages_per_sequence).to(torch.int32)
        capacity = pages_per_sequence * case.page_size
    if case.lengths is not None:
        lengths = torch.tensor(case.lengths, dtype=torch.int32)
    else:
        lengths = torch.randint(0, capacity - case.new_kv + 1, (batch,), generator=gen).to(torch.int32)
    kw["cache_seqlens"] = lengths
    if case.leftpad:
        kw["cache_leftpad"] = (lengths * torch.rand(batch, generator=gen)).to(torch.int32)
    if case.new_kv:
        kw["k"], kw["v"] = randn(batch, case.new_kv, kv_heads, case.head_dim), randn(batch, case.new_kv, kv_heads, dim_v)
    if case.rotary is not None:
        rotary_dim, interleaved = case.rotary
        angle = torch.rand(capacity, rotary_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        kw["rotary_cos"], kw["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
        kw["rotary_interleaved"] = interleaved
    if case.alibi is not None:
        shape = (heads,) if case.alibi == "head" else (batch, heads)
        kw["alibi_slopes"] = torch.rand(*shape, generator=gen) * 0.3
    kw.update(causal=case.causal, window_size=case.window, softcap=case.softcap)
    return kw


def run_and_reference(kw: dict):
    """(out, lse, k_cache, v_cache) of rt's call (on copies of the caches) and of the naive reference."""
    call = dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone())
    out, lse = rt.flash_attn_with_kvcache(**call, return_softmax_lse=True)
    expected = naive_flash_attn_with_kvcache(**kw)
    return (out, lse, call["k_cache"], call["v_cache"]), expected


def assert_matches(got, expected, dtype):
    out, lse, k_cache, v_cache = got
    e_out, e_lse, e_k, e_v = expected
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == e_out.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), e_out, rtol=tol, atol=tol * 4)
    finite = torch.isfinite(e_lse)
    assert torch.equal(torch.isfinite(lse), finite) and bool((lse[~finite] == math.inf).all())
    torch.testing.assert_close(lse.double()[finite], e_lse[finite], rtol=tol, atol=tol * 4)
    # rotated keys are computed in fp32 (the reference rounds its float64 rotation): one rounding apart
    torch.testing.assert_close(k_cache.double(), e_k, rtol=tol, atol=tol)
    torch.testing.assert_close(v_cache.double(), e_v, rtol=0, atol=0)


# --- the matrix on the torch path ---------------------------------------------------------------
@pytest.mark.parametrize("case", MATRIX, ids=lambda c: f"q{c.seqlen_q}k{c.seqlen_k}d{c.head_dim}h{c.heads}")
def test_kvcache_matrix_matches_the_float64_reading_of_fa2(case):
    kw = make_inputs(case)
    with rt.use_backend("torch"):
        got, expected = run_and_reference(kw)
    assert_matches(got, expected, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_precision_and_float64_inputs(dtype):
    kw = make_inputs(MATRIX[1], dtype=dtype)
    got, expected = run_and_reference(kw)
    if dtype == torch.float64:
        torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got[2], expected[2], rtol=0, atol=0)
    else:
        assert_matches(got, expected, dtype)


# --- the matrix on the decode kernel (interpreter) -------------------------------------------------
KERNEL_CASES = [
    Case(1, 13, 32),
    Case(3, 40, 59, heads=(6, 2), new_kv=3, causal=True, rotary=(16, True)),
    Case(1, 21, 111, heads=(4, 1), new_kv=1, rotary=(32, False)),
    Case(6, 12, 16, heads=(2, 1), head_dim_v=8, causal=True, lengths=(3, 0)),
    # paged caches: page sizes 1, 16 and 256 (FA2 takes multiples of 256 only)
    Case(2, 7, 16, heads=(4, 2), new_kv=2, causal=True, page_size=1),
    Case(1, 40, 32, heads=(4, 1), new_kv=1, rotary=(16, True), page_size=16),
    Case(3, 256, 16, heads=(2, 2), new_kv=3, causal=True, page_size=256, batch=1),
    # local windows and the logits softcap, in the kernel
    Case(7, 20, 16, heads=(4, 2), window=(4, 2), softcap=3.0, page_size=1),
    Case(3, 30, 32, heads=(4, 1), new_kv=3, window=(5, 0), rotary=(8, False)),
    Case(4, 9, 16, causal=True, softcap=0.5, lengths=(2, 5)),
    # ALiBi in both of FA2's forms (slope x key index under causal, -slope x |distance| otherwise), cache rows
    # picked by cache_batch_idx, left padding (contiguous and paged)
    Case(5, 9, 24, alibi="head", causal=True, batch_idx=True),
    Case(1, 37, 40, heads=(4, 2), alibi="batch_head", window=(8, 0), leftpad=True, new_kv=1),
    Case(3, 14, 16, heads=(4, 2), alibi="head", softcap=2.0, leftpad=True, batch_idx=True, new_kv=1),
    Case(4, 30, 8, causal=True, leftpad=True, rotary=(8, True), new_kv=2, page_size=16),
]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: f"q{c.seqlen_q}k{c.seqlen_k}d{c.head_dim}h{c.heads}")
def test_covered_calls_run_the_decode_kernel_and_match(case):
    kw = make_inputs(case)
    with rt.use_backend("triton", strict=True):
        assert rt.explain(rt.flash_attn_with_kvcache, **kw).backend == "triton"
        got, expected = run_and_reference(kw)
    assert_matches(got, expected, torch.float32)


@pytest.mark.parametrize("case", [KERNEL_CASES[1], KERNEL_CASES[-2]], ids=["rotary", "alibi-leftpad-batch-idx"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_covered_low_precision_calls_on_the_kernel(dtype, case):
    kw = make_inputs(case, dtype=dtype)
    with rt.use_backend("triton", strict=True):
        got, expected = run_and_reference(kw)
    assert_matches(got, expected, dtype)


def test_sequences_left_padded_to_their_length_see_no_key_on_the_kernel():
    kw = make_inputs(Case(2, 12, 16, heads=(4, 2), alibi="head", lengths=(6, 9)))
    kw["cache_leftpad"] = torch.tensor([6, 2], dtype=torch.int32)      # sequence 0 keeps no key
    with rt.use_backend("triton", strict=True):
        got, expected = run_and_reference(kw)
    assert bool((got[0][0] == 0).all()) and bool((got[1][0] == math.inf).all())
    assert_matches(got, expected, torch.float32)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_nan_key_right_of_the_diagonal_reaches_only_the_rows_that_see_it(backend):
    # FlashAttention drops the keys right of a causal row's diagonal: token 0 of two does not see key 8
    q, k_cache, v_cache = torch.randn(1, 2, 2, 16), torch.randn(1, 9, 2, 16), torch.randn(1, 9, 2, 16)
    k_cache[0, 8, :, 0] = float("nan")
    with rt.use_backend(backend, strict=backend != "torch"):
        out = rt.flash_attn_with_kvcache(q, k_cache, v_cache, causal=True)
    assert out[:, 0].isfinite().all() and out[:, 1].isnan().all()


def test_strict_mode_names_what_no_kernel_covers():
    kw = make_inputs(Case(1, 13, 32, alibi="head", leftpad=True), dtype=torch.float64)
    kw["alibi_slopes"] = kw["alibi_slopes"].float()
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="float64"):
        rt.flash_attn_with_kvcache(**kw)
    with rt.use_backend("triton"):
        assert "float64" in str(rt.explain(rt.flash_attn_with_kvcache, **kw).skipped_reasons["triton"])


# --- semantics spelled out ---------------------------------------------------------------------
def test_new_keys_are_appended_in_place_at_cache_seqlens_through_the_block_table():
    kw = make_inputs(Case(1, 12, 8, new_kv=2, page_size=4, lengths=(3, 10)))
    k_cache, block_table = kw["k_cache"], kw["block_table"]
    rt.flash_attn_with_kvcache(**kw)
    for b, length in enumerate((3, 10)):
        for t in range(2):
            position = length + t
            page = block_table[b, position // 4]
            assert torch.equal(k_cache[page, position % 4], kw["k"][b, t])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rotary_positions_with_left_padding_are_absolute_cache_slots(backend):
    # FA2 rotates new key t at cos/sin row cache_seqlens + t and causal query row i at cache_seqlens + i,
    # counting the left padding (its test reference: apply_rotary_emb(..., seqlen_offsets=cache_seqlens))
    kw = make_inputs(Case(2, 12, 8, heads=(2, 2), new_kv=2, causal=True, rotary=(8, False), lengths=(5, 7)))
    kw["cache_leftpad"] = torch.tensor([3, 4], dtype=torch.int32)
    k_cache, cos, sin = kw["k_cache"], kw["rotary_cos"].double(), kw["rotary_sin"].double()
    with rt.use_backend(backend, strict=backend != "torch"):
        rt.flash_attn_with_kvcache(**kw)
    for b, length in enumerate((5, 7)):
        for t in range(2):
            key, row = kw["k"][b, t].double(), length + t
            first, second = key[:, :4], key[:, 4:]
            rotated = torch.cat((first * cos[row] - second * sin[row], first * sin[row] + second * cos[row]), -1)
            torch.testing.assert_close(k_cache[b, row].double(), rotated, rtol=1e-6, atol=1e-6)


def test_an_int_cache_seqlens_is_every_sequence_at_that_length():
    kw = make_inputs(Case(2, 10, 16, new_kv=1, causal=True))
    as_tensor = rt.flash_attn_with_kvcache(**dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone(),
                                                  cache_seqlens=torch.tensor([4, 4], dtype=torch.int32)))
    as_int = rt.flash_attn_with_kvcache(**dict(kw, cache_seqlens=4))
    torch.testing.assert_close(as_int, as_tensor, rtol=0, atol=0)


def test_rows_that_see_no_key_give_zero_and_lse_plus_inf():
    kw = make_inputs(Case(4, 8, 16, causal=True, lengths=(2, 0)))
    out, lse = rt.flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert bool((out[0, :2] == 0).all()) and bool((lse[0, :, :2] == math.inf).all())   # 2 keys, 4 tokens
    assert bool((out[1] == 0).all()) and bool((lse[1] == math.inf).all())              # an empty sequence
    assert bool(torch.isfinite(lse[0, :, 2:]).all())


def test_paged_cache_gives_the_contiguous_cache_values():
    kw = make_inputs(Case(2, 12, 16, heads=(4, 2), new_kv=1, causal=True, page_size=3, lengths=(5, 11)))
    pages = kw["k_cache"][kw["block_table"].long()].reshape(2, 12, 2, 16)
    values = kw["v_cache"][kw["block_table"].long()].reshape(2, 12, 2, 16)
    paged = rt.flash_attn_with_kvcache(**kw)
    contiguous = rt.flash_attn_with_kvcache(**dict(kw, k_cache=pages, v_cache=values, block_table=None))
    torch.testing.assert_close(paged, contiguous, rtol=1e-6, atol=1e-6)


def test_inference_mode_and_silence():
    kw = make_inputs(Case(1, 9, 16, new_kv=1))
    kw["q"] = torch.zeros_like(kw["q"])
    with torch.inference_mode():
        kw = {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in kw.items()}
        got, expected = run_and_reference(kw)
    assert_matches(got, expected, torch.float32)


# --- argument checks ---------------------------------------------------------------------------
def _bad(**change):
    return dict(make_inputs(Case(2, 10, 16, heads=(4, 2), new_kv=1)), **change)


@pytest.mark.parametrize("change, error, name", [
    ({"q": torch.randn(2, 1, 16)}, ValueError, "q"),
    ({"q": torch.randn(2, 2, 3, 16)}, ValueError, "heads in key/value"),
    ({"k_cache": torch.randn(2, 10, 2, 16).half()}, TypeError, "k_cache"),
    ({"v_cache": torch.randn(2, 9, 2, 16)}, ValueError, "v_cache"),
    ({"k": None}, ValueError, "value must also be passed"),
    ({"cache_seqlens": None}, ValueError, "cache_seqlens"),
    ({"cache_seqlens": torch.tensor([1.0, 2.0])}, TypeError, "cache_seqlens"),
    ({"cache_seqlens": torch.tensor([1, 2, 3], dtype=torch.int32)}, ValueError, "cache_seqlens"),
    ({"cache_seqlens": torch.tensor([1, 10], dtype=torch.int32)}, ValueError, "cache_seqlens"),
    ({"cache_leftpad": torch.tensor([9, 0], dtype=torch.int32)}, ValueError, "cache_leftpad"),
    ({"cache_batch_idx": torch.tensor([0, 5], dtype=torch.int32)}, ValueError, "cache_batch_idx"),
    ({"block_table": torch.zeros(2, 2, dtype=torch.int32), "cache_batch_idx": torch.zeros(2, dtype=torch.int32)},
     ValueError, "cache_batch_idx"),
    ({"block_table": torch.tensor([[0, 1], [2, 7]], dtype=torch.int32)}, ValueError, "block_table"),
    ({"rotary_cos": torch.ones(10, 4)}, ValueError, "rotary_cos and rotary_sin"),
    ({"rotary_cos": torch.ones(10, 9), "rotary_sin": torch.ones(10, 9)}, ValueError, "rotary_dim"),
    ({"rotary_cos": torch.ones(5, 4), "rotary_sin": torch.ones(5, 4)}, ValueError, "seqlen"),
    ({"q": torch.randn(2, 4, 4, 16), "causal": True, "rotary_cos": torch.ones(10, 4), "rotary_sin": torch.ones(10, 4),
      "cache_seqlens": torch.tensor([7, 0], dtype=torch.int32)}, ValueError, "rotary_cos"),
    ({"alibi_slopes": torch.ones(4, dtype=torch.float64)}, TypeError, "alibi_slopes"),
    ({"alibi_slopes": torch.ones(3)}, ValueError, "alibi_slopes"),
    ({"window_size": (-2, 0)}, ValueError, "window_size"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"softmax_scale": "0.5"}, TypeError, "softmax_scale"),
    ({"causal": 1}, TypeError, "causal"),
    ({"num_splits": -1}, ValueError, "num_splits"),
])
def test_bad_arguments_are_named_before_the_cache_is_touched(change, error, name):
    kw = _bad(**change)
    before = kw["k_cache"].clone()
    with pytest.raises(error, match=name):
        rt.flash_attn_with_kvcache(**kw)
    torch.testing.assert_close(kw["k_cache"], before, rtol=0, atol=0)


# --- torch integration -------------------------------------------------------------------------
def test_the_custom_op_declares_the_cache_mutation():
    schema = torch.ops.rlx_triton.flash_attn_with_kvcache.default._schema
    mutated = {arg.name for arg in schema.arguments if arg.alias_info is not None and arg.alias_info.is_write}
    # a quantised cache's per-token-head scales are written for appended tokens too
    assert mutated == {"k_cache", "v_cache", "k_scale", "v_scale"}


def test_opcheck():
    kw = make_inputs(Case(2, 10, 16, heads=(4, 2), new_kv=1, causal=True, rotary=(8, True)))
    args = (kw["q"], kw["k_cache"], kw["v_cache"], kw["k"], kw["v"], kw["rotary_cos"], kw["rotary_sin"],
            kw["cache_seqlens"], None, None, None, None, True, -1, -1, 0.0, True, None, None)
    torch.library.opcheck(torch.ops.rlx_triton.flash_attn_with_kvcache.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_fullgraph_appends_and_matches_eager():
    kw = make_inputs(Case(1, 12, 16, heads=(4, 2), new_kv=1, rotary=(8, False), page_size=4))
    eager_kw = dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone())
    expected = rt.flash_attn_with_kvcache(**eager_kw)
    names = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "block_table")
    fixed = {name: value for name, value in kw.items() if name not in names}

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(*tensors):
        return rt.flash_attn_with_kvcache(**dict(zip(names, tensors)), **fixed)

    out = step(*(kw[name] for name in names))
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(kw["k_cache"], eager_kw["k_cache"], rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_capture_of_a_covered_decode_step():
    kw = {name: value.cuda() if isinstance(value, torch.Tensor) else value
          for name, value in make_inputs(Case(1, 64, 64, heads=(8, 2), new_kv=1), dtype=torch.float16).items()}
    kw["cache_seqlens"] = torch.tensor([10, 40], dtype=torch.int32, device="cuda")
    expected = naive_flash_attn_with_kvcache(**{n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in kw.items()})
    rt.flash_attn_with_kvcache(**dict(kw, k_cache=kw["k_cache"].clone(), v_cache=kw["v_cache"].clone()))  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rt.flash_attn_with_kvcache(**kw)
    graph.replay()
    torch.testing.assert_close(out.double().cpu(), expected[0], rtol=2e-3, atol=8e-3)
