"""The router's rules, specified on fake backends: precedence, coverage, candidate source, approval, strict mode."""
import threading

import pytest
import torch

import rlx_triton as rt
from rlx_triton.router import Approval, Coverage, MissingKernel, clear_route_cache, route, use_backend
from rlx_triton.router import coverage as refusals
from rlx_triton.router.device import clear_device_cache
from tests.router.conftest import fbank_request

APPROVED = Approval(max_rel_err=1e-6, where="router test")


def approve_all(module, candidates, monkeypatch):
    monkeypatch.setattr(module, "APPROVALS", {c.tag(): APPROVED for c in candidates})


def test_lowest_precedence_backend_that_covers_wins(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    decided = route(fbank_request())
    assert decided.backend == "fast"
    assert decided.module is fake_module


def test_backend_that_does_not_run_here_is_skipped_with_its_reason(fake_backends, fake_module, fbank_candidates,
                                                                  monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    fake_backends["fast"] = "no such accelerator"
    clear_device_cache()
    decided = route(fbank_request())
    assert decided.backend == "slow"
    reason = decided.skipped_reasons["fast"]
    assert reason.kind == refusals.BACKEND_UNAVAILABLE and "no such accelerator" in reason.reason


@pytest.mark.parametrize("request_kwargs, kind, field", [
    ({"dtype": "float16"}, refusals.SHAPE_UNIMPLEMENTED, None),
    ({"bins": 256}, refusals.SHAPE_UNIMPLEMENTED, "bins"),
    ({"snip_edges": False}, refusals.SHAPE_UNIMPLEMENTED, None),
    ({"window_type": "povey"}, refusals.SHAPE_UNIMPLEMENTED, None),  # a feature coverage does not name
    ({"op": "fbank_and_more"}, refusals.SHAPE_UNIMPLEMENTED, None),
])
def test_request_outside_coverage_falls_back_to_torch_with_a_typed_refusal(
        fake_backends, fake_module, fbank_candidates, monkeypatch, request_kwargs, kind, field):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    decided = route(fbank_request(**request_kwargs))
    assert decided.backend == "torch"
    assert decided.evidence == "Library"
    refusal = decided.skipped_reasons["fast"]
    assert refusal.kind == kind
    assert refusal.field == field


def test_weights_outside_the_numeric_contract_are_a_weights_refusal(fake_backends, fake_module, fbank_candidates,
                                                                     monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    monkeypatch.setattr(fake_module, "COVERAGE", Coverage(
        ops=frozenset({"fbank"}), devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}),
        features={"snip_edges": frozenset({True}), "finite_weights": frozenset({True})},
        weight_features=frozenset({"finite_weights"})))
    decided = route(fbank_request(finite_weights=False))
    assert decided.skipped_reasons["fast"].kind == refusals.WEIGHTS_OUT_OF_CONTRACT
    assert decided.backend == "torch"


def test_device_outside_coverage_is_a_device_refusal(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    monkeypatch.setattr(fake_module, "COVERAGE", Coverage(ops=None, devices=frozenset({"cuda"}),
                                                          dtypes=frozenset({"float32"})))
    decided = route(fbank_request())
    assert decided.skipped_reasons["fast"].kind == refusals.DEVICE_UNSUPPORTED


def test_plan_default_is_used_without_winner_or_recipe(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    from rlx_triton.router import plans

    decided = route(fbank_request())
    assert decided.evidence == "DeviceDefault"
    assert decided.candidate == plans.plan_for("fbank").default_candidate


def test_recipe_beats_plan_default(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    recipe = fbank_candidates[-1]
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": recipe.tag()})
    decided = route(fbank_request())
    assert (decided.evidence, decided.candidate) == ("Recipe", recipe)


@pytest.mark.parametrize("key, expected", [("wide", 0), ("other", 1)])
def test_a_recipe_per_request_key_picks_the_keys_tag_else_the_star(fake_backends, fake_module, fbank_candidates,
                                                                  monkeypatch, key, expected):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    chosen = fbank_candidates[-1 - expected]
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": {"wide": fbank_candidates[-1].tag(),
                                                         "*": fbank_candidates[-2].tag()}})
    monkeypatch.setattr(fake_module, "recipe_key", lambda request: key, raising=False)
    decided = route(fbank_request())
    assert (decided.evidence, decided.candidate) == ("Recipe", chosen)
    assert decided.evidence_detail.endswith(", wide") == (key == "wide")


def test_a_recipe_mapping_without_the_key_or_a_star_falls_to_the_plan_default(fake_backends, fake_module,
                                                                            fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": {"wide": fbank_candidates[-1].tag()}})
    monkeypatch.setattr(fake_module, "recipe_key", lambda request: "narrow", raising=False)
    assert route(fbank_request()).evidence == "DeviceDefault"


def test_winner_table_beats_recipe(fake_backends, fake_module, fbank_candidates, monkeypatch, tmp_path):
    from rlx_triton.config import override_settings
    from rlx_triton.router import plans

    approve_all(fake_module, fbank_candidates, monkeypatch)
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": fbank_candidates[-1].tag()})
    with override_settings(tune_cache_path=str(tmp_path / "tune.tsv"), tune_cache_load=True,
                           tune_cache_persist=False):
        first = route(fbank_request())
        winner = fbank_candidates[1]
        plans.winner_table().record(first.tune_key, winner.tag())
        clear_route_cache()
        decided = route(fbank_request())
    assert (decided.evidence, decided.candidate) == ("TuneFile", winner)


def test_unapproved_candidate_is_replaced_by_the_approved_fp32_candidate(fake_backends, fake_module, monkeypatch):
    from rlx_triton.router import plans

    fp32 = plans.fp32_candidate("fbank")
    monkeypatch.setattr(fake_module, "APPROVALS", {fp32.tag(): APPROVED})
    others = [c for c in plans.plan_for("fbank").candidates if c != fp32]
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": others[0].tag()})
    decided = route(fbank_request())
    assert decided.backend == "fast"
    assert decided.candidate == fp32
    assert decided.evidence == "Implemented"
    assert "not approved" in decided.evidence_detail


def test_backend_without_any_approved_candidate_is_skipped(fake_backends, fake_module, monkeypatch):
    monkeypatch.setattr(fake_module, "APPROVALS", {})
    decided = route(fbank_request())
    assert decided.backend == "torch"
    assert decided.skipped_reasons["fast"].kind == refusals.NOT_APPROVED
    assert decided.skipped_reasons["slow"].kind == refusals.NOT_APPROVED


def test_approval_for_another_profile_does_not_count(fake_backends, fake_module, fbank_candidates, monkeypatch):
    only_deterministic = Approval(max_rel_err=1e-6, profiles=frozenset({"deterministic"}))
    monkeypatch.setattr(fake_module, "APPROVALS", {c.tag(): only_deterministic for c in fbank_candidates})
    assert route(fbank_request()).backend == "torch"


def test_speed_evidence_labels_but_never_decides(fake_backends, fake_module, fbank_candidates, monkeypatch):
    from rlx_triton.router import plans

    approve_all(fake_module, fbank_candidates, monkeypatch)
    default = plans.plan_for("fbank").default_candidate
    faster = next(c for c in fbank_candidates if c != default)
    monkeypatch.setattr(fake_module, "SPEED_EVIDENCE", {faster.tag(): "3x torch (measured)",
                                                       default.tag(): "1.1x torch (measured)"})
    decided = route(fbank_request())
    assert decided.candidate == default
    assert decided.speed == "1.1x torch (measured)"


def test_strict_mode_raises_missing_kernel_naming_family_request_and_reasons(fake_backends, fake_module,
                                                                             monkeypatch):
    monkeypatch.setattr(fake_module, "APPROVALS", {})
    with use_backend("auto", strict=True), pytest.raises(MissingKernel) as caught:
        route(fbank_request())
    error = caught.value
    assert error.family == "fbank"
    assert set(error.reasons) >= {"fast", "slow"}
    assert "fbank" in str(error) and "not-approved" in str(error)
    assert isinstance(error, rt.MissingKernel)


def test_forcing_torch_routes_to_the_library(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    with use_backend("torch"):
        decided = route(fbank_request())
    assert decided.backend == "torch"
    assert decided.skipped_reasons["fast"].kind == refusals.NOT_SELECTED


def test_forced_backend_that_cannot_run_falls_back_quietly_unless_strict(fake_backends, fake_module,
                                                                         fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    with use_backend("metal"):
        decided = route(fbank_request())
    assert decided.backend == "torch"
    assert decided.skipped_reasons["metal"].kind == refusals.BACKEND_UNAVAILABLE
    with use_backend("metal", strict=True), pytest.raises(MissingKernel):
        route(fbank_request())


def test_use_backend_nests_and_restores():
    from rlx_triton.router.settings import current_choice

    outer = current_choice()
    with use_backend("torch"):
        with use_backend("triton", strict=True):
            assert (current_choice().name, current_choice().strict) == ("triton", True)
        assert current_choice().name == "torch"
    assert current_choice() == outer


def test_use_backend_rejects_unknown_names_and_non_bool_strict():
    with pytest.raises(ValueError, match="name must be one of"):
        with use_backend("cuda"):
            pass
    with pytest.raises(TypeError, match="strict must be a bool"):
        with use_backend("auto", strict="yes"):
            pass


def test_backend_forcing_is_independent_per_thread(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    barrier = threading.Barrier(4)
    seen = {}

    def worker(name):
        with use_backend(name):
            barrier.wait()
            for _ in range(20):
                seen.setdefault(name, set()).add(route(fbank_request()).backend)

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("auto", "torch", "auto", "torch")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"auto": {"fast"}, "torch": {"torch"}}


def test_cached_route_is_rechecked_against_exact_ranged_fields(fake_backends, fake_module, fbank_candidates,
                                                               monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    monkeypatch.setattr(fake_module, "COVERAGE", Coverage(
        ops=frozenset({"fbank"}), devices=frozenset({"cpu"}), dtypes=frozenset({"float32"}),
        ranges={"bins": (1, 100)}, features={"snip_edges": frozenset({True})}))
    assert route(fbank_request(bins=90)).backend == "fast"
    # 120 shares the power-of-two bucket of 90 but is outside the kernel's range
    assert route(fbank_request(bins=120)).backend == "torch"
    assert route(fbank_request(bins=100)).backend == "fast"


def test_routes_are_cached_per_bucket(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    first = route(fbank_request(bins=80))
    again = route(fbank_request(bins=80))
    assert again is first


def test_registering_or_removing_a_backend_forgets_remembered_routes(fake_backends, fake_module, fbank_candidates,
                                                                    monkeypatch):
    from rlx_triton.router import BackendSpec, register_backend
    from rlx_triton.router.registry import unregister_backend

    approve_all(fake_module, fbank_candidates, monkeypatch)
    assert route(fbank_request()).backend == "fast"
    register_backend(BackendSpec(name="faster", precedence=-30, package="tests.router.fakes", families=("fbank",),
                                 probe=lambda facts: None))
    try:
        assert route(fbank_request()).backend == "faster"   # not the route remembered before it came
    finally:
        unregister_backend("faster")
    assert route(fbank_request()).backend == "fast"


def test_route_prints_backend_candidate_evidence_and_skips(fake_backends, fake_module, fbank_candidates,
                                                           monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    fake_backends["fast"] = "switched off"
    clear_device_cache()
    text = str(route(fbank_request()))
    assert "-> slow" in text and "candidate" in text and "evidence   DeviceDefault" in text
    assert "skipped    fast: backend-unavailable: switched off" in text


def test_explain_needs_an_rlx_op():
    with pytest.raises(TypeError, match="not an rlx_triton op"):
        rt.explain(torch.add, torch.ones(1), torch.ones(1))


def test_explain_returns_the_route_without_running_the_op():
    calls = []

    def build(x):
        return fbank_request()

    from rlx_triton.router import routed_op

    @routed_op(build)
    def op(x):
        calls.append(x)

    with use_backend("torch"):
        decided = rt.explain(op, 1)
    assert decided.backend == "torch" and calls == []


def test_pinned_candidate_replaces_every_source_but_still_needs_approval(fake_backends, fake_module,
                                                                         fbank_candidates, monkeypatch):
    from rlx_triton.router import use_candidate

    pinned = fbank_candidates[-1]
    monkeypatch.setattr(fake_module, "APPROVALS", {pinned.tag(): APPROVED})
    monkeypatch.setattr(fake_module, "RECIPES", {"cpu": fbank_candidates[0].tag()})
    with use_candidate(pinned.tag()):
        decided = route(fbank_request())
    assert (decided.backend, decided.candidate, decided.evidence) == ("fast", pinned, "Pinned")
    monkeypatch.setattr(fake_module, "APPROVALS", {})
    clear_route_cache()
    with use_candidate(pinned.tag()):
        refused = route(fbank_request())
    assert refused.backend == "torch"
    assert "has no accuracy approval" in refused.skipped_reasons["fast"].reason


def test_recording_routes_collects_each_route_in_call_order(fake_backends, fake_module, fbank_candidates,
                                                            monkeypatch):
    from rlx_triton.router import recording_routes

    approve_all(fake_module, fbank_candidates, monkeypatch)
    with recording_routes() as seen:
        first = route(fbank_request(bins=80))
        second = route(fbank_request(bins=256))
    route(fbank_request())
    assert seen == [first, second]


def _public_calls():
    """(name, call) for one small call of every public op; each call is made three times."""
    from rlx_triton.ops import conv, conv2d, lstm, segdense

    q, kv = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)
    stock_lstm = torch.nn.LSTM(3, 4, batch_first=True)
    return [
        ("scaled_dot_product_attention", lambda: rt.scaled_dot_product_attention(q, kv, kv)),
        ("sdpa_decode", lambda: rt.sdpa_decode(q, kv, kv)),
        ("fbank", lambda: rt.fbank(torch.randn(2, 1, 800), num_mel_bins=7)),
        ("lstm", lambda: lstm.lstm(torch.randn(1, 5, 3), None, stock_lstm._flat_weights, batch_first=True)),
        ("segdense", lambda: segdense.segdense(torch.randn(2, 4), [torch.randn(5, 4)], [None], torch.randn(3, 5))),
        ("conv1d", lambda: conv.conv1d(torch.randn(1, 2, 9), torch.randn(3, 2, 3))),
        ("conv2d", lambda: conv2d.conv2d(torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3))),
        ("stats_pool", lambda: conv2d.stats_pool(torch.randn(1, 4, 6))),
    ]


@pytest.mark.parametrize("op, call", _public_calls(), ids=[name for name, _call in _public_calls()])
def test_recording_routes_records_one_route_per_call_of_every_public_op(op, call):
    """Repeated calls take the remembered route of their exact signature; each still records it once."""
    from rlx_triton.router import recording_routes

    with torch.no_grad(), use_backend("torch"), recording_routes() as seen:
        for _ in range(3):
            call()
    assert [route.op for route in seen] == [op] * 3
