"""A long-running process that keeps meeting new shapes keeps bounded memory: 10 000 calls, each with a shape
not seen before, leave every cache at or under its stated limit and resident memory within a fixed bound."""
from __future__ import annotations

import gc

import pytest
import torch

import rlx_triton as rt
from rlx_triton import caches

CALLS = 10_000
# resident growth allowed over the last 5 000 calls, once the signature cache is full (measured: 0.3 MiB; the
# same loop with that cache unbounded grows by 3.7 MiB): allocator noise only
WARM_CALLS = 5_000
GROWTH_BOUND_BYTES = 2 * 1024 * 1024


def _resident_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


@pytest.fixture
def one_intra_op_thread():
    """Tiny CPU ops on one thread: OpenMP's barriers on a loaded machine cost ~10 ms per call."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_ten_thousand_calls_with_ever_new_shapes_keep_caches_and_resident_memory_bounded(one_intra_op_thread):
    from rlx_triton.router import clear_route_cache

    clear_route_cache()   # the count below is this test's
    generator = torch.Generator().manual_seed(0)
    # 100 KV lengths x 100 head dims: every call a new exact signature, each tensor at most 1600 values
    query = torch.randn(1, 2, 1, 100, generator=generator)
    keys = torch.randn(1, 2, 100, 100, generator=generator)
    start = None
    with rt.use_backend("torch"):
        for index in range(CALLS):
            seq_kv, head_dim = index % 100 + 1, index // 100 + 1
            key = keys[:, :, :seq_kv, :head_dim]
            out = rt.scaled_dot_product_attention(query[..., :head_dim], key, key)
            assert out.shape == (1, 2, 1, head_dim)
            if index == WARM_CALLS - 1:
                gc.collect()
                start = _resident_bytes()
    gc.collect()
    growth = _resident_bytes() - start
    sizes = caches.sizes()
    # every KV length of a head dim after its bucket's first is a decode step that reuses the bucket's route
    # without remembering its own signature: 2 signatures per (head dim, bucket) of 8 buckets
    assert sizes["route_signatures"][0] == min(100 * 8 * 2, caches.LIMITS["route_signatures"])
    assert all(unpinned <= limit for unpinned, _, limit in sizes.values()), sizes
    assert growth <= GROWTH_BOUND_BYTES, f"resident memory grew by {growth / 2**20:.1f} MiB"
