"""torch.compile(fullgraph=True) of every public op of rt: one graph, no break, and the eager call's outputs, on
the torch path and with the Triton kernels forced (the interpreter), for the eager and aot_eager backends, and
inductor for a representative subset (its C++ build costs the CI machine too much for every op).
rt.flash_attn_with_kvcache's append into the caches is a mutation the graph carries: the caller's caches hold the
new keys after the compiled call as after the eager one. The checks are tests/compile_checks.py's."""
from __future__ import annotations

import pytest
import torch

import rlx_triton as rt
from rlx_triton.ops.varlen_attn import AuxRequest   # torch's, where torch has varlen_attn
from tests.compile_checks import assert_compiled_equals_eager, assert_one_graph


def _inputs(*shapes):
    generator = torch.Generator().manual_seed(1)
    return tuple(torch.randn(shape, generator=generator) for shape in shapes)


def _sdpa():
    q, k, v = _inputs((2, 4, 1, 16), (2, 2, 12, 16), (2, 2, 12, 16))   # a decode step with grouped heads
    return (lambda q, k, v: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)), (q, k, v)


def _sdpa_decode():
    q, k, v = _inputs((2, 4, 2, 16), (2, 2, 12, 16), (2, 2, 12, 16))
    return (lambda q, k, v, lengths: rt.sdpa_decode(q, k, v, lengths)), \
        (q, k, v, torch.tensor([5, 12], dtype=torch.int32))


def _sdpa_decode_paged():
    q, k, v = _inputs((2, 4, 1, 16), (6, 2, 4, 16), (6, 2, 4, 16))   # 6 pages of 4 slots
    table = torch.tensor([[0, 2, 4], [5, 3, 1]], dtype=torch.int32)
    return (lambda q, k, v, lengths, table: rt.sdpa_decode(q, k, v, lengths, block_table=table)), \
        (q, k, v, torch.tensor([5, 12], dtype=torch.int32), table)


def _flash_attn_with_kvcache():
    q, k_cache, v_cache, k, v = _inputs((2, 1, 4, 16), (2, 12, 2, 16), (2, 12, 2, 16), (2, 1, 2, 16), (2, 1, 2, 16))

    def step(q, k_cache, v_cache, k, v, lengths):
        return rt.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lengths, causal=True)

    return step, (q, k_cache, v_cache, k, v, torch.tensor([3, 7], dtype=torch.int32))


def _flash_attn_varlen_func():
    q, k, v = _inputs((5, 4, 16), (12, 2, 16), (12, 2, 16))
    cu_q, cu_k = torch.tensor([0, 4, 5], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    return (lambda q, k, v, cu_q, cu_k: rt.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 7, causal=True)), \
        (q, k, v, cu_q, cu_k)


def _flash_attn_func():
    q, k, v = _inputs((2, 3, 4, 16), (2, 6, 2, 16), (2, 6, 2, 16))
    return (lambda q, k, v: rt.flash_attn_func(q, k, v, causal=True, window_size=(3, 0))), (q, k, v)


def _varlen_attn():
    """Paged (pages of 4), seqused_k, no cu_seq_k, causal, grouped heads, with the LSE."""
    q, k, v = _inputs((4, 4, 16), (5, 4, 2, 16), (5, 4, 2, 16))
    table = torch.tensor([[3, 0], [4, 1]], dtype=torch.int32)
    aux = AuxRequest(lse=True)

    def call(q, k, v, cu_q, used, table):
        return rt.varlen_attn(q, k, v, cu_q, None, 3, 8, return_aux=aux, window_size=(-1, 0), enable_gqa=True,
                              seqused_k=used, block_table=table)

    return call, (q, k, v, torch.tensor([0, 1, 4], dtype=torch.int32), torch.tensor([6, 8], dtype=torch.int32),
                  table)


def _fbank():
    return (lambda waveform: rt.fbank(waveform, num_mel_bins=8, window_type="hamming")), _inputs((1, 800))


CASES = {
    "scaled_dot_product_attention": _sdpa,
    "sdpa_decode": _sdpa_decode,
    "sdpa_decode_paged": _sdpa_decode_paged,
    "flash_attn_with_kvcache": _flash_attn_with_kvcache,
    "flash_attn_varlen_func": _flash_attn_varlen_func,
    "flash_attn_func": _flash_attn_func,
    "varlen_attn": _varlen_attn,
    "fbank": _fbank,
}
# inductor compiles the graph around the op too (C++ on the CPU, tens of seconds a graph on the CI machine): two
# ops whose graph is the op alone, a cache append (a mutation inductor must carry) and a paged ragged call, cover
# what inductor does with a custom op (tests/nn/test_compile.py adds the LSTM module)
INDUCTOR = ("flash_attn_with_kvcache", "varlen_attn")


def test_every_public_op_has_a_case():
    ops = {name for name in rt.__all__ if callable(getattr(rt, name)) and hasattr(getattr(rt, name), "__rlx_request__")}
    assert ops <= {name.replace("_paged", "") for name in CASES}


@pytest.mark.parametrize("name", CASES)
def test_one_graph_without_a_break(name):
    assert_one_graph(CASES[name])


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name", CASES)
def test_compiled_op_gives_the_eager_outputs(name, backend):
    assert_compiled_equals_eager(name, CASES[name], backend)


@pytest.mark.parametrize("name", INDUCTOR)
def test_compiled_op_on_inductor_gives_the_eager_outputs(name):
    assert_compiled_equals_eager(name, CASES[name], "inductor")


def test_the_cache_append_is_a_mutation_of_the_callers_caches():
    step, args = _flash_attn_with_kvcache()
    k_cache, before = args[1], args[1].clone()
    torch._dynamo.reset()
    with torch.no_grad(), rt.use_backend("torch"):
        torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
    changed = (k_cache != before).any(dim=(2, 3))
    assert changed.tolist() == [[t == 3 for t in range(12)], [t == 7 for t in range(12)]]
