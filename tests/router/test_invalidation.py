"""Stale decisions are forgotten on the change that makes them stale, and on no other."""
from rlx_triton.router import invalidation
from rlx_triton.router.invalidation import Change, changed, forget_on


def test_a_cache_forgets_on_the_changes_it_names_only(monkeypatch):
    monkeypatch.setattr(invalidation, "_forgetters", {change: [] for change in Change})
    forgotten = []

    def forget():
        forgotten.append("cleared")

    forget_on(Change.DEVICE_VIEW, forget)
    forget_on(Change.DEVICE_VIEW, forget)   # stated twice, cleared once per change
    changed(Change.BACKENDS)
    assert forgotten == []
    changed(Change.DEVICE_VIEW)
    assert forgotten == ["cleared"]


def test_routing_as_forgets_the_routes_on_entry_and_exit():
    from rlx_triton import devices
    from rlx_triton.router.device import routing_as
    from rlx_triton.router.route import _exact as routes_by_signature

    routes_by_signature.put(("a call", "outside"), "a route")
    with routing_as(devices.profile("h200")):
        assert routes_by_signature.get(("a call", "outside")) is None
        routes_by_signature.put(("a call", "as on an h200"), "a route")
    assert routes_by_signature.get(("a call", "as on an h200")) is None
