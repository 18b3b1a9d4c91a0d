"""rlx_triton.caches: the bounded, thread-safe LRU every process-wide cache uses, and the one table of sizes."""
from __future__ import annotations

import threading

import pytest

from rlx_triton import caches


@pytest.fixture
def small_cache(monkeypatch):
    """A BoundedCache of 3 entries, outside the package's registry."""
    monkeypatch.setitem(caches.LIMITS, "under_test", 3)
    monkeypatch.setattr(caches, "_registry", {})
    return caches.BoundedCache("under_test")


def test_a_cache_without_a_stated_limit_is_refused():
    with pytest.raises(ValueError, match="no limit is stated for 'nowhere'"):
        caches.BoundedCache("nowhere")


def test_past_the_limit_the_least_recently_used_entry_goes_and_only_that_one(small_cache):
    for key in "abc":
        small_cache.put(key, key.upper())
    assert small_cache.get("a") == "A"         # a is now the most recent: b is the oldest
    small_cache.put("d", "D")
    assert [small_cache.get(key) for key in "abcd"] == ["A", None, "C", "D"]
    assert len(small_cache) == 3


def test_the_first_stored_value_is_the_one_every_writer_gets(small_cache):
    assert small_cache.put("k", 1) == 1
    assert small_cache.put("k", 2) == 1
    assert small_cache.get_or_build("k", lambda: 3) == 1


def test_a_stale_value_is_replaced_and_a_pinned_stale_one_kept_alive(small_cache):
    small_cache.put("k", "old")
    assert small_cache.put("k", "new", replace_stale=lambda held: held == "old") == "new"
    small_cache.put("p", "graph's", pin=True)
    assert small_cache.put("p", "fresh", replace_stale=lambda held: True) == "fresh"
    assert small_cache.counts() == (2, 1) and small_cache._retired == ["graph's"]


def test_pinned_entries_survive_eviction_and_clear(small_cache):
    small_cache.put("graph", "pack")
    small_cache.pin("graph")
    for index in range(10):
        small_cache.put(index, index)
    small_cache.clear()
    assert small_cache.get("graph") == "pack" and small_cache.counts() == (0, 1)


def test_eight_threads_never_see_another_keys_value_nor_grow_it_past_its_limit(small_cache):
    errors, start = [], threading.Barrier(8)

    def worker(seed):
        start.wait()
        for step in range(2000):
            key = (seed * 7 + step) % 11
            value = small_cache.get_or_build(key, lambda: ("value", key))
            if value != ("value", key) or len(small_cache) > 3:
                errors.append((key, value))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and small_cache.counts()[0] <= 3


def test_every_cache_the_package_creates_has_its_limit_stated_in_limits():
    import rlx_triton.backends.triton.device_cache  # noqa: F401
    import rlx_triton.ops.conv  # noqa: F401
    import rlx_triton.ops.sdpa_decode  # noqa: F401
    import rlx_triton.router.route  # noqa: F401

    sizes = caches.sizes()
    assert {"route_signatures", "route_buckets", "op_decisions", "op_decision_ids", "weight_packs",
            "fbank_constants", "sinc_filters", "sinc_banks"} <= set(sizes)
    assert all(limit == caches.LIMITS[name] for name, (_, _, limit) in sizes.items())
