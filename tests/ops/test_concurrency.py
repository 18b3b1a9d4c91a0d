"""Eight threads calling the ops at once get the answers one thread gets alone: routes, decisions, packed
weights and constants are shared process-wide, and `use_backend` is per thread.

Shapes that share buckets (KV lengths 20, 27 and 30 in bucket 32; fbank lengths 1600 and 1700) and shapes that
do not (KV 70, fbank 4000) are mixed, so threads hit, fill and miss the same route entries at once. The torch
path carries the volume; a small subset runs the Triton kernels in the interpreter."""
from __future__ import annotations

import random
import threading

import pytest
import torch

import rlx_triton as rt
from rlx_triton.ops.conv import conv1d
from rlx_triton.ops.lstm import lstm as rt_lstm

THREADS = 8


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """Each caller thread runs its tiny ops on one intra-op thread: OpenMP's barriers, with 8 callers on a
    loaded machine, cost ~10 ms per op."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _attention_jobs(generator):
    jobs = {}
    for seq_kv in (20, 27, 30, 70):
        q = torch.randn(2, 4, 1, 16, generator=generator)
        k, v = (torch.randn(2, 2, seq_kv, 16, generator=generator) for _ in range(2))
        lengths = torch.tensor([seq_kv, seq_kv // 2], dtype=torch.int32)
        jobs[f"sdpa-{seq_kv}"] = lambda q=q, k=k, v=v: rt.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        jobs[f"decode-{seq_kv}"] = lambda q=q, k=k, v=v, n=lengths: rt.sdpa_decode(q, k, v, n, return_lse=True)
        pages = -(-seq_kv // 8)
        k_pages, v_pages = (t.reshape(2, 2, pages, 8, 16).transpose(1, 2).reshape(2 * pages, 2, 8, 16)
                            for t in (torch.nn.functional.pad(x, (0, 0, 0, pages * 8 - seq_kv)) for x in (k, v)))
        table = torch.arange(2 * pages, dtype=torch.int32).reshape(2, pages)
        jobs[f"paged-{seq_kv}"] = lambda q=q, kp=k_pages, vp=v_pages, n=lengths, t=table: rt.sdpa_decode(
            q, kp, vp, n, block_table=t)
        cache_k, cache_v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        jobs[f"flash-{seq_kv}"] = lambda q=q, ck=cache_k, cv=cache_v, n=lengths: rt.flash_attn_with_kvcache(
            q.transpose(1, 2), ck, cv, cache_seqlens=n, causal=True)
    return jobs


def _diarization_jobs(generator):
    jobs = {}
    for samples in (1600, 1700, 4000):
        wave = torch.randn(samples, generator=generator)
        jobs[f"fbank-{samples}"] = lambda w=wave: rt.fbank(w, num_mel_bins=23)
    # weights that need no gradient: the kernels take them (with packed weights shared by every thread)
    module = torch.nn.LSTM(12, 8, bidirectional=True, batch_first=True).requires_grad_(False)
    for steps in (3, 9):
        x = torch.randn(2, steps, 12, generator=generator)
        jobs[f"lstm-{steps}"] = lambda x=x: rt_lstm(x, None, module._flat_weights, bidirectional=True,
                                                    batch_first=True)[0]
    weight, bias = torch.randn(6, 4, 5, generator=generator), torch.randn(6, generator=generator)
    for length in (40, 47, 300):
        x = torch.randn(2, 4, length, generator=generator)
        jobs[f"conv-{length}"] = lambda x=x: conv1d(x, weight, bias, padding=2)
    return jobs


def _flat(result):
    return [t.detach().clone() for t in (result if isinstance(result, (tuple, list)) else (result,))]


def _run_in_threads(jobs, backend, rounds):
    """Every thread runs every job `rounds` times in its own shuffled order; returns the mismatches."""
    with rt.use_backend(backend):
        serial = {name: _flat(job()) for name, job in jobs.items()}
    mismatches, start = [], threading.Barrier(THREADS)

    def worker(seed):
        order = [name for name in jobs for _ in range(rounds)]
        random.Random(seed).shuffle(order)
        start.wait()
        with rt.use_backend(backend):
            for name in order:
                try:
                    got = _flat(jobs[name]())
                except Exception as error:  # a thread's failure must fail the test, not only warn
                    mismatches.append(f"{name}: {error!r}")
                    continue
                for actual, expected in zip(got, serial[name]):
                    if not torch.allclose(actual, expected, rtol=1e-6, atol=1e-6, equal_nan=True):
                        mismatches.append(name)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return mismatches


def test_eight_threads_of_mixed_ops_on_the_torch_path_match_the_serial_answers():
    generator = torch.Generator().manual_seed(0)
    jobs = {**_attention_jobs(generator), **_diarization_jobs(generator)}
    assert _run_in_threads(jobs, "torch", rounds=2) == []


def test_eight_threads_of_triton_kernels_in_the_interpreter_match_the_serial_answers():
    generator = torch.Generator().manual_seed(1)
    attention = _attention_jobs(generator)
    diarization = _diarization_jobs(generator)
    # two decode calls of one bucket, a paged one, and the families with packed weights (conv, LSTM)
    jobs = {**{name: attention[name] for name in ("decode-20", "decode-27", "paged-30")},
            **{name: diarization[name] for name in ("conv-40", "lstm-3")}}
    with rt.use_backend("triton"):
        assert {rt.explain(rt.sdpa_decode, torch.randn(2, 4, 1, 16), torch.randn(2, 2, 20, 16),
                           torch.randn(2, 2, 20, 16)).backend} == {"triton"}
    assert _run_in_threads(jobs, "triton", rounds=1) == []


def test_use_backend_holds_per_thread_while_other_threads_hold_other_choices():
    q, k, v = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    seen, inside = {}, threading.Barrier(THREADS)

    def worker(index):
        backend = ("torch", "triton", "auto")[index % 3]
        with rt.use_backend(backend):
            inside.wait()   # every thread is inside its own block now
            routes = [rt.explain(rt.scaled_dot_product_attention, q, k, v).backend for _ in range(20)]
            inside.wait()
        seen[index] = (backend, set(routes), rt.explain(rt.scaled_dot_product_attention, q, k, v).backend)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    auto = rt.explain(rt.scaled_dot_product_attention, q, k, v).backend
    assert len(seen) == THREADS
    for backend, routes, after in seen.values():
        assert routes == {auto if backend == "auto" else backend} and after == auto
