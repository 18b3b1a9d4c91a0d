"""rt.varlen_attn: torch.nn.attention.varlen.varlen_attn's signature (inspect.signature compares equal) and the
semantics of torch's code (window bottom-right within each sequence, seqused_k, pages, GQA only with enable_gqa,
the LSE (H_q, T_q) float32) against the float64 reading of FlashAttention in tests/reference/varlen_attention.py,
on the torch path and with the Triton kernel forced (the interpreter); torch's argument errors, batch invariance,
threads and inference mode; on a GPU, torch's own varlen_attn."""
from __future__ import annotations

import inspect
import threading

import pytest
import torch

import rlx_triton as rt
from tests.reference.varlen_attention import naive_flash_attn_varlen, offsets

varlen = pytest.importorskip("torch.nn.attention.varlen", reason="torch < 2.9 has no varlen_attn")
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}   # relative; atol = 4 x that


def test_the_signature_is_torchs():
    assert inspect.signature(rt.varlen_attn) == inspect.signature(varlen.varlen_attn)
    assert [p.name for p in inspect.signature(rt.varlen_attn).parameters.values()] == [
        "query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "return_aux", "scale", "window_size",
        "enable_gqa", "seqused_k", "block_table", "num_splits"]


def make_call(lengths_q, lengths_k, heads=(4, 2), head_dim=16, *, page_size=None, used=None, window=(-1, -1),
              dtype=torch.float32, keep_cu_seq_k=True, seed=0):
    """A varlen_attn call's (args, kwargs): `used` (seqused_k) shorter than lengths_k where given; paged key/value
    behind a shuffled block table (cu_seq_k None when keep_cu_seq_k is False)."""
    gen = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    query = torch.randn(sum(lengths_q), num_heads, head_dim, generator=gen).to(dtype)
    kwargs = dict(window_size=window, enable_gqa=num_heads != num_kv_heads)
    cu_seq_k = offsets(lengths_k)
    if page_size is None:
        key, value = (torch.randn(sum(lengths_k), num_kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    else:
        per_sequence = -(-max(lengths_k) // page_size)
        pages = len(lengths_k) * per_sequence + 2
        key, value = (torch.randn(pages, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
                      for _ in range(2))
        kwargs["block_table"] = torch.randperm(pages, generator=gen)[:len(lengths_k) * per_sequence] \
            .reshape(len(lengths_k), per_sequence).to(torch.int32)
        if not keep_cu_seq_k:
            cu_seq_k = None
    if used is not None:
        kwargs["seqused_k"] = torch.tensor(used, dtype=torch.int32)
    args = (query, key, value, offsets(lengths_q), cu_seq_k, max(lengths_q), max(lengths_k))
    return args, kwargs


def reference(args, kwargs):
    """(out, lse) in float64: torch's varlen_attn passes window_size to FlashAttention, causal when it is (-1, 0)."""
    query, key, value, cu_q, cu_k, max_q, max_k = args
    window = tuple(kwargs.get("window_size", (-1, -1)))
    return naive_flash_attn_varlen(query, key, value, cu_q, cu_k, max_q, max_k, causal=window == (-1, 0),
                                   window_size=window, block_table=kwargs.get("block_table"),
                                   seqused_k=kwargs.get("seqused_k"))


CASES = {
    "ragged-causal": dict(lengths_q=[3, 1, 5], lengths_k=[7, 4, 5], window=(-1, 0)),
    "gqa-no-mask": dict(lengths_q=[2, 4], lengths_k=[9, 4], heads=(6, 2)),
    "sliding-window": dict(lengths_q=[4, 6], lengths_k=[10, 6], window=(3, 0)),
    "two-sided-window": dict(lengths_q=[5, 2], lengths_k=[8, 9], heads=(4, 4), window=(2, 1)),
    "contiguous-seqused": dict(lengths_q=[1, 1, 2], lengths_k=[8, 6, 9], used=[5, 0, 9], window=(-1, 0)),
    "paged-16": dict(lengths_q=[1, 3], lengths_k=[37, 20], page_size=16, used=[30, 20], window=(-1, 0)),
    "paged-5": dict(lengths_q=[2, 1, 4], lengths_k=[13, 7, 11], page_size=5, used=[13, 3, 11],
                    keep_cu_seq_k=False, heads=(6, 3)),
    "paged-5-offsets": dict(lengths_q=[2, 2], lengths_k=[9, 12], page_size=5, window=(4, 0)),
}


@pytest.mark.parametrize("mode", ["torch", "kernel"])
@pytest.mark.parametrize("name", CASES)
def test_out_and_lse_equal_the_float64_reference(name, mode):
    args, kwargs = make_call(**CASES[name])
    choice = rt.use_backend("triton", strict=True) if mode == "kernel" else rt.use_backend("torch")
    with choice:
        assert rt.explain(rt.varlen_attn, *args, **kwargs).backend == ("triton" if mode == "kernel" else "torch")
        out, lse = rt.varlen_attn(*args, return_aux=varlen.AuxRequest(lse=True), **kwargs)
    want_out, want_lse = reference(args, kwargs)
    assert out.shape == args[0].shape and out.dtype == args[0].dtype
    assert lse.shape == (args[0].shape[1], args[0].shape[0]) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_out, rtol=1e-5, atol=4e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=4e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_16_bit_inputs_on_the_kernel(dtype):
    args, kwargs = make_call([3, 2], [9, 5], heads=(4, 2), page_size=5, used=[9, 4], window=(-1, 0), dtype=dtype)
    with rt.use_backend("triton", strict=True):
        out = rt.varlen_attn(*args, **kwargs)
    want, _ = reference(args, kwargs)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), want, rtol=TOL[dtype], atol=4 * TOL[dtype])


def test_aux_request_without_lse_and_none_return_the_output_alone():
    args, kwargs = make_call([2, 3], [4, 6])
    with rt.use_backend("torch"):
        alone = rt.varlen_attn(*args, **kwargs)
        assert torch.equal(rt.varlen_attn(*args, return_aux=varlen.AuxRequest(), **kwargs), alone)
        assert torch.equal(rt.varlen_attn(*args, return_aux=None, **kwargs), alone)


def test_causal_is_bottom_right_within_each_sequence_and_the_default_window_is_not_causal():
    args, kwargs = make_call([2], [5], heads=(2, 2))
    query, key, value = args[:3]
    scores = torch.einsum("qhd,khd->hqk", query.double(), key.double()) * 16 ** -0.5
    keep = torch.ones(2, 5, dtype=torch.bool).tril(diagonal=3)   # query i sees keys up to i + 5 - 2
    expected = torch.einsum("hqk,khd->qhd", scores.masked_fill(~keep, -torch.inf).softmax(-1), value.double())
    with rt.use_backend("torch"):
        causal = rt.varlen_attn(*args, window_size=(-1, 0), enable_gqa=False)
        full = rt.varlen_attn(*args, enable_gqa=False)
    torch.testing.assert_close(causal.double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full, causal)


def test_num_splits_never_changes_a_sequences_result_on_the_kernel():
    args, kwargs = make_call([3, 1, 4], [9, 5, 7], window=(-1, 0))
    query, key, value = args[:3]
    with rt.use_backend("triton", strict=True):
        batched = rt.varlen_attn(*args, num_splits=1, **kwargs)
        alone = rt.varlen_attn(query[:3], key[:9], value[:9], offsets([3]), offsets([9]), 3, 9, num_splits=1,
                               **kwargs)
        split = rt.varlen_attn(*args, num_splits=4, **kwargs)
    assert torch.equal(batched[:3], alone) and torch.equal(batched, split)


def test_threads_and_inference_mode_get_the_serial_answers():
    calls = [make_call([2, 1], [6, 3], used=[used, 3], seed=used) for used in range(1, 7)]
    with rt.use_backend("triton", strict=True):
        serial = [rt.varlen_attn(*args, **kwargs) for args, kwargs in calls]
    results = [None] * len(calls)

    def run(i):
        with torch.inference_mode(), rt.use_backend("triton", strict=True):
            results[i] = rt.varlen_attn(*calls[i][0], **calls[i][1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(got, want) for got, want in zip(results, serial))


def test_float64_runs_the_torch_path_and_strict_mode_names_the_dtype():
    args, kwargs = make_call([2, 3], [4, 6], dtype=torch.float64, window=(-1, 0))
    torch.testing.assert_close(rt.varlen_attn(*args, **kwargs), reference(args, kwargs)[0], rtol=1e-12, atol=1e-12)
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="float64"):
        rt.varlen_attn(*args, **kwargs)


@pytest.mark.parametrize("change, error, match", [
    (dict(enable_gqa=False), ValueError, "same number of heads.*enable_gqa=True"),
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(cu_seq_k=None), ValueError, "cu_seq_k may be None only"),
    (dict(return_aux=True), TypeError, "return_aux must be an AuxRequest"),
    (dict(seqused_k=torch.tensor([1], dtype=torch.int32)), ValueError, "seqused_k must have shape"),
    (dict(seqused_k=torch.tensor([1.0, 2.0])), TypeError, "seqused_k must have dtype"),
    (dict(seqused_k=torch.tensor([7, 1], dtype=torch.int32)), ValueError, r"seqused_k entry must be in \[0, max_k=6\]"),
    (dict(max_q=1), ValueError, "longer .* than max_q"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(num_splits=1.0), TypeError, "num_splits"),
    (dict(scale="0.5"), TypeError, "scale"),
])
def test_bad_arguments_raise_naming_the_argument(change, error, match):
    (query, key, value, cu_q, cu_k, max_q, max_k), kwargs = make_call([2, 3], [4, 6], heads=(4, 2))
    call = dict(query=query, key=key, value=value, cu_seq_q=cu_q, cu_seq_k=cu_k, max_q=max_q, max_k=max_k, **kwargs)
    call.update(change)
    with pytest.raises(error, match=match):
        rt.varlen_attn(**call)


@pytest.mark.gpu
@pytest.mark.parametrize("route", ["triton", "torch"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged-256"])
def test_on_cuda_both_routes_give_torchs_varlen_attn(route, paged):
    """fp16 on a GPU: the kernel, and the library route (torch's own op), against torch's varlen_attn."""
    args, kwargs = make_call([5, 1, 64], [300, 40, 290], heads=(8, 2), head_dim=64, dtype=torch.float16,
                             page_size=256 if paged else None, used=[300, 33, 290] if paged else None,
                             window=(-1, 0))
    args = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in args)
    kwargs = {name: t.cuda() if isinstance(t, torch.Tensor) else t for name, t in kwargs.items()}
    aux = varlen.AuxRequest(lse=True)
    want, want_lse = varlen.varlen_attn(*args, return_aux=aux, **kwargs)
    with rt.use_backend(route, strict=route == "triton"):
        out, lse = rt.varlen_attn(*args, return_aux=aux, **kwargs)
    torch.testing.assert_close(out, want, rtol=1e-3, atol=4e-3)
    torch.testing.assert_close(lse, want_lse, rtol=1e-3, atol=4e-3)
