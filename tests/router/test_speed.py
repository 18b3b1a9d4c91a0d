"""Speed decides among the eligible kernels and the library op: winner table > estimate > default (router/speed.py).

The device is an H200 profile that CPU requests report (routing_as), the kernels are the fake backends of
tests/router/fakes, and the speed model is a fake whose times each test sets: what is tested is the rule, not
the perf model (tests/perf tests that).
"""
import pytest

from rlx_triton import devices
from rlx_triton.config import override_settings
from rlx_triton.planner.tune_cache import LIBRARY_WINNER
from rlx_triton.router import Coverage, clear_route_cache, route, use_backend, use_candidate
from rlx_triton.router import plans, speed
from rlx_triton.router.device import routing_as
from tests.router.conftest import fbank_request
from tests.router.test_route import APPROVED, approve_all


class FakeSpeed:
    """A speed model with set times: kernel_us per backend name, library_us for the library; counts its calls."""

    def __init__(self, kernel=None, library=None):
        self.kernel, self.library = kernel or {}, library
        self.kernel_calls, self.library_calls = [], []

    def kernel_us(self, request, decided, call, profile):
        self.kernel_calls.append((decided.backend, call))
        return self.kernel.get(decided.backend)

    def library_us(self, request, profile):
        self.library_calls.append(request)
        return self.library


@pytest.fixture
def on_an_h200(fake_backends, fake_module, fbank_candidates, monkeypatch):
    """The fake kernels cover CUDA requests; CPU requests report an H200's facts."""
    approve_all(fake_module, fbank_candidates, monkeypatch)
    covered = Coverage(ops=frozenset({"fbank"}), devices=frozenset({"cpu", "cuda"}), dtypes=frozenset({"float32"}),
                       ranges={"bins": (1, 128)}, features={"snip_edges": frozenset({True})})
    monkeypatch.setattr(fake_module, "COVERAGE", covered)
    with routing_as(devices.profile("h200"), devices=("cpu",)):
        clear_route_cache()
        yield
    clear_route_cache()


def weighed(decided):
    """(backend, time, chosen) of the options weighed, the fake kernels' and the library's (the real triton backend
    covers fbank on an H200 too; the fake model gives it no time)."""
    return [(t.backend, t.time_us, t.chosen) for t in decided.timings if t.backend != "triton"]


def use_speed(monkeypatch, model):
    monkeypatch.setattr(speed, "speed_model", lambda name: model)
    return model


def test_the_library_op_routes_where_the_estimate_says_it_is_faster(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 12.0, "slow": 20.0}, library=5.0))
    decided = route(fbank_request())
    assert (decided.backend, decided.decided_by) == ("torch", "estimated")
    assert decided.skipped_reasons["fast"].kind == "slower"
    assert weighed(decided) == [("fast", 12.0, False), ("slow", 20.0, False), ("torch", 5.0, True)]


def test_the_fastest_eligible_kernel_routes_where_it_beats_the_library(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 12.0, "slow": 8.0}, library=10.0))
    decided = route(fbank_request())
    assert (decided.backend, decided.decided_by) == ("slow", "estimated")
    assert weighed(decided) == [("fast", 12.0, False), ("slow", 8.0, True), ("torch", 10.0, False)]
    assert "decided by estimated" in str(decided) and "8.0 us estimated" in str(decided)


def test_a_kernel_as_fast_as_the_library_keeps_the_call(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 10.0}, library=10.0))
    assert route(fbank_request()).backend == "fast"


def test_without_a_library_estimate_the_first_kernel_is_the_default(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 50.0}, library=None))
    decided = route(fbank_request())
    assert (decided.backend, decided.decided_by, decided.timings) == ("fast", "default", ())


def test_without_a_kernel_estimate_the_first_kernel_is_the_default(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={}, library=1.0))
    assert (route(fbank_request()).backend, route(fbank_request()).decided_by) == ("fast", "default")


@pytest.mark.parametrize("force", ["backend", "strict", "candidate"])
def test_a_forced_backend_strict_mode_or_a_pinned_candidate_takes_the_kernel(on_an_h200, monkeypatch,
                                                                             fbank_candidates, force):
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 50.0}, library=1.0))
    if force == "backend":
        context = use_backend("triton")
    elif force == "strict":
        context = use_backend("auto", strict=True)
    else:
        context = use_candidate(fbank_candidates[0].tag())
    with context:
        decided = route(fbank_request())
    assert decided.backend == ("triton" if force == "backend" else "fast") and decided.decided_by == "forced"
    assert model.kernel_calls == [] and model.library_calls == []


def test_the_torch_backend_requested_is_forced_too(on_an_h200, monkeypatch):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 1.0}, library=50.0))
    with use_backend("torch"):
        decided = route(fbank_request())
    assert (decided.backend, decided.decided_by) == ("torch", "forced")


def test_on_a_cpu_nothing_is_estimated(fake_backends, fake_module, fbank_candidates, monkeypatch):
    approve_all(fake_module, fbank_candidates, monkeypatch)
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 50.0}, library=1.0))
    decided = route(fbank_request())
    assert (decided.backend, decided.decided_by) == ("fast", "default")
    assert model.kernel_calls == [] and model.library_calls == []


def test_an_estimate_is_made_once_per_bucket(on_an_h200, monkeypatch):
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 12.0, "slow": 20.0}, library=5.0))
    route(fbank_request())
    route(fbank_request())
    assert len(model.library_calls) == 1
    assert [backend for backend, _ in model.kernel_calls if backend != "triton"] == ["fast", "slow"]


def test_the_call_reaches_the_speed_model(on_an_h200, monkeypatch):
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 1.0}, library=5.0))
    call = lambda: (print, (), {})   # noqa: E731 - what an op passes: the public call, built on demand
    route(fbank_request(), call=call)
    assert model.kernel_calls[0] == ("fast", call)


def test_a_winner_table_naming_the_library_routes_there_with_its_time(on_an_h200, monkeypatch, tmp_path):
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 1.0}, library=50.0))
    with override_settings(tune_cache_path=str(tmp_path / "tune.tsv"), tune_cache_load=True,
                           tune_cache_persist=False):
        with use_backend("auto", strict=True):   # the kernel's route, whose bucket the winner table keys
            kernel_route = route(fbank_request())
        clear_route_cache()
        plans.winner_table().record(kernel_route.tune_key, LIBRARY_WINNER, time_us=3.5)
        clear_route_cache()
        decided = route(fbank_request())
    assert (decided.backend, decided.decided_by) == ("torch", "measured")
    assert [(t.backend, t.time_us, t.source, t.chosen) for t in decided.timings] == [("torch", 3.5, "measured", True)]
    assert decided.skipped_reasons["fast"].kind == "slower"
    assert model.library_calls == []   # a measured winner asks no model


def test_a_winner_table_naming_a_candidate_is_a_measured_kernel_route(on_an_h200, monkeypatch, tmp_path,
                                                                     fbank_candidates):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 50.0}, library=1.0))
    winner = fbank_candidates[1].tag()
    with override_settings(tune_cache_path=str(tmp_path / "tune.tsv"), tune_cache_load=True,
                           tune_cache_persist=False):
        with use_backend("auto", strict=True):
            first = route(fbank_request())
        plans.winner_table().record(first.tune_key, winner, time_us=2.0)
        clear_route_cache()
        decided = route(fbank_request())
    assert (decided.backend, decided.candidate_tag, decided.decided_by) == ("fast", winner, "measured")
    assert decided.timings[0].time_us == 2.0


def test_an_unapproved_winner_is_no_measurement_of_the_route(on_an_h200, monkeypatch, tmp_path, fake_module):
    use_speed(monkeypatch, FakeSpeed(kernel={"fast": 50.0}, library=1.0))
    fp32 = plans.fp32_candidate("fbank")
    other = next(c for c in plans.plan_for("fbank").candidates if c != fp32)
    monkeypatch.setattr(fake_module, "APPROVALS", {fp32.tag(): APPROVED})
    with override_settings(tune_cache_path=str(tmp_path / "tune.tsv"), tune_cache_load=True,
                           tune_cache_persist=False):
        with use_backend("auto", strict=True):
            first = route(fbank_request())
        plans.winner_table().record(first.tune_key, other.tag())
        clear_route_cache()
        decided = route(fbank_request())
    # the winner is replaced by the approved fp32 candidate: the estimates decide, and the library is faster
    assert (decided.backend, decided.decided_by) == ("torch", "estimated")


def test_the_deterministic_profile_takes_the_first_kernel_whatever_the_estimates(on_an_h200, monkeypatch):
    # a speed decision may differ with the batch or the GPU, and the library op computes other bits
    model = use_speed(monkeypatch, FakeSpeed(kernel={"fast": 12.0}, library=5.0))
    with override_settings(profile="deterministic"):
        decided = route(fbank_request())
    assert decided.backend != "torch" and decided.decided_by == "default" and not model.library_calls


# --- ranking: the approved candidates nothing has timed, weighed by the plan's ObjectiveWeights --------------
class CostedSpeed(FakeSpeed):
    """A fake speed model that also prices each candidate: (us, bytes) per candidate tag."""

    def __init__(self, costs, **times):
        super().__init__(**times)
        self.costs = costs

    def kernel_cost(self, request, decided, call, profile):
        return self.costs.get(decided.candidate_tag)

    def kernel_us(self, request, decided, call, profile):
        super().kernel_us(request, decided, call, profile)
        cost = self.costs.get(decided.candidate_tag)
        return None if cost is None else cost[0]


CALL = lambda: (print, (), {})   # noqa: E731 - what an op passes: the public call, built on demand


def test_untimed_candidates_are_ranked_by_latency_error_and_memory(on_an_h200, monkeypatch, fbank_candidates):
    first, second = fbank_candidates[0].tag(), fbank_candidates[1].tag()
    # the second is 1.5x faster and moves twice the bytes: 0.6 x 1 + 0.1 x 2 = 0.8 beats 0.6 x 1.5 + 0.1 x 1 = 1.0
    use_speed(monkeypatch, CostedSpeed({first: (15.0, 1000), second: (10.0, 2000)}, library=100.0))
    decided = route(fbank_request(), call=CALL)
    assert (decided.backend, decided.candidate_tag, decided.evidence) == ("fast", second, "Ranked")
    chosen = [r for r in decided.ranking if r.chosen]
    assert [r.candidate_tag for r in chosen] == [second] and chosen[0].terms == (1.0, 1.0, 2.0)
    assert "ranked     " in str(decided) and "objective weights latency 0.6, error 0.3, memory 0.1" in str(decided)


def test_a_recipe_or_a_pinned_candidate_is_not_ranked(on_an_h200, monkeypatch, fake_module, fbank_candidates):
    recipe = fbank_candidates[0].tag()
    use_speed(monkeypatch, CostedSpeed({c.tag(): (10.0 + i, 1000) for i, c in enumerate(fbank_candidates)},
                                       library=100.0))
    monkeypatch.setattr(fake_module, "RECIPES", {"sm90": recipe})
    decided = route(fbank_request(), call=CALL)
    assert (decided.candidate_tag, decided.evidence, decided.ranking) == (recipe, "Recipe", ())
    with use_candidate(fbank_candidates[2].tag()):
        assert route(fbank_request(), call=CALL).ranking == ()


def test_without_a_call_to_price_the_plan_default_stays(on_an_h200, monkeypatch, fbank_candidates):
    use_speed(monkeypatch, CostedSpeed({c.tag(): (10.0, 1000) for c in fbank_candidates}, library=100.0))
    decided = route(fbank_request())
    assert decided.evidence == "DeviceDefault" and decided.ranking == ()


def test_a_candidate_a_hundred_times_less_accurate_weighs_three_on_the_error_term():
    from rlx_triton.planner import ObjectiveWeights

    ranked = speed.rank([("accurate", 12.0, 1e-5, 100), ("fast", 10.0, 1e-3, 100)], ObjectiveWeights())
    assert [r.terms for r in ranked] == [(1.2, 1.0, 1.0), (1.0, 3.0, 1.0)]
    # 0.6 x 1.2 + 0.3 + 0.1 = 1.12 against 0.6 + 0.9 + 0.1 = 1.6: 20% slower and 100x more accurate wins
    assert [r.chosen for r in ranked] == [True, False]
    slower = speed.rank([("accurate", 30.0, 1e-5, 100), ("fast", 10.0, 1e-3, 100)], ObjectiveWeights())
    assert [r.chosen for r in slower] == [False, True]   # 3x slower: 2.2 against 1.6
