"""The hand-off of a wrapper's routing decision to its torch.library custom op.

Each routed op is a Python wrapper around a custom op (`rlx_triton::sdpa`, `rlx_triton::sdpa_decode`,
`rlx_triton::flash_attn_with_kvcache`, `rlx_triton::flash_attn_varlen`). A call is routed once: in eager mode
the wrapper routes (it validates the call and knows its signature) and hands the Route to the custom op; under
torch.compile the wrapper traces without real shapes, so the op routes when it runs. A custom op takes only
tensors, numbers and strings, so the wrapper hands over a key (`hand_off`) and the op looks the Route up
(`received`); an op that gets no key, or a key whose Route is no longer held, routes the call itself (the
same Route: routing is a pure function of the request).

Both maps are `caches.BoundedCache`s (least-recently-used eviction, one entry at a time, a lock around every
read and write), so the hand-off is bounded and safe for threads calling ops at once. A key is handed out
once and names one Route for good, so a lookup never returns another call's decision.
"""
from __future__ import annotations

import itertools
from typing import Optional, Tuple

from rlx_triton.caches import BoundedCache
from rlx_triton.router.route import Route

# key -> Route, what the custom op reads; and id(Route) -> (key, Route), so a Route handed off again (every
# call with a remembered signature hands off the same Route) reuses its key. The entry holds the Route, so
# its id names no other object while the entry lives.
_routes_by_key: BoundedCache[str, Route] = BoundedCache("op_decisions")
_keys_by_route: BoundedCache[int, Tuple[str, Route]] = BoundedCache("op_decision_ids")
_new_keys = itertools.count()


def hand_off(decided: Route) -> str:
    """The key the custom op receives for a decision the wrapper made."""
    remembered = _keys_by_route.get(id(decided))
    if remembered is None:
        # next() of itertools.count is one atomic step, so two threads never draw one key; two threads handing
        # off the same new Route both store the key the first one stored
        remembered = _keys_by_route.put(id(decided), (str(next(_new_keys)), decided))
    key = remembered[0]
    # first writer wins: a held key keeps its Route; a key evicted since it was made is stored again
    _routes_by_key.put(key, decided)
    return key


def received(key: Optional[str]) -> Optional[Route]:
    """The wrapper's decision for a custom op, or None (no key under torch.compile, or evicted: route again)."""
    return _routes_by_key.get(key) if key else None
