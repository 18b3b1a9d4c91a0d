"""The hand-off of a wrapper's decision to its custom op (ops/_decisions.py): a key names one Route for good,
threads handing off at once never receive another call's decision, and the maps evict their least recently
used entry, one at a time."""
from __future__ import annotations

import threading

import pytest

from rlx_triton.ops import _decisions
from rlx_triton.router.route import Route

THREADS = 8
ROUTES_PER_THREAD = 200   # 1600 in all: below the maps' limit, so none of them is evicted during the run


def _route(n: int = 0) -> Route:
    return Route(family="sdpa_decode", op="sdpa_decode", backend="torch", evidence_detail=f"route {n}")


@pytest.fixture
def limit_of_three(monkeypatch):
    """Both maps hold 3 entries while the test runs (their entries beyond that are evicted, which only makes
    the custom ops of later calls route again)."""
    for cache in (_decisions._routes_by_key, _decisions._keys_by_route):
        monkeypatch.setattr(cache, "limit", 3)


def test_a_handed_off_decision_is_received_by_its_key():
    decided = _route()
    assert _decisions.received(_decisions.hand_off(decided)) is decided


def test_the_same_route_handed_off_again_keeps_its_key():
    decided = _route()
    assert _decisions.hand_off(decided) == _decisions.hand_off(decided)


def test_equal_routes_are_different_decisions_with_different_keys():
    first, second = _route(), _route()
    assert first == second
    first_key, second_key = _decisions.hand_off(first), _decisions.hand_off(second)
    assert first_key != second_key
    assert _decisions.received(first_key) is first and _decisions.received(second_key) is second


def test_no_key_or_an_unknown_key_receives_nothing():
    assert _decisions.received(None) is None and _decisions.received("") is None
    assert _decisions.received("no-such-decision") is None


def test_threads_handing_off_at_once_never_receive_another_calls_decision():
    shared = _route(-1)   # every thread also hands off this one Route, the way repeated calls do
    barrier = threading.Barrier(THREADS)
    keys = [dict() for _ in range(THREADS)]
    shared_keys = [set() for _ in range(THREADS)]
    wrong = []

    def worker(index: int) -> None:
        mine = [_route(index * ROUTES_PER_THREAD + n) for n in range(ROUTES_PER_THREAD)]
        barrier.wait()
        for decided in mine:
            key = _decisions.hand_off(decided)
            shared_keys[index].add(_decisions.hand_off(shared))
            keys[index][key] = decided
            if _decisions.received(key) is not decided:
                wrong.append((index, key))
        for key, decided in keys[index].items():   # still theirs after every other thread's hand-offs
            if _decisions.received(key) is not decided:
                wrong.append((index, key))

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    all_keys = [key for per_thread in keys for key in per_thread]
    assert len(set(all_keys)) == THREADS * ROUTES_PER_THREAD   # one key per decision, none shared
    assert len(set().union(*shared_keys)) == 1                 # one Route, one key, whichever thread drew it
    assert not set().union(*shared_keys) & set(all_keys)


def test_eviction_drops_the_least_recently_used_decision_only(limit_of_three):
    first, second, third, fourth = (_route(n) for n in range(4))
    first_key, second_key, third_key = (_decisions.hand_off(r) for r in (first, second, third))
    assert _decisions.received(first_key) is first   # used: second is now the least recently used
    fourth_key = _decisions.hand_off(fourth)
    assert _decisions.received(second_key) is None
    assert _decisions.received(first_key) is first
    assert _decisions.received(third_key) is third
    assert _decisions.received(fourth_key) is fourth


def test_a_decision_handed_off_again_after_its_eviction_is_received_again(limit_of_three):
    first, second, third, fourth = (_route(n) for n in range(4))
    first_key = _decisions.hand_off(first)
    for decided in (second, third, fourth):
        _decisions.hand_off(decided)
    assert _decisions.received(first_key) is None
    again = _decisions.hand_off(first)
    assert _decisions.received(again) is first
