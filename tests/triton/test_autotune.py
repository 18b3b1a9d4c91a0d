"""The autotune bridge, in the interpreter: candidates become configs keyed on buckets; routes are injected."""
import pytest
import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton.autotune import TunedKernel, autotune_key
from rlx_triton.config import override_settings
from rlx_triton.planner import LaunchBuilder, PrecisionProfile, tune_cache_key
from rlx_triton.router import Route, plans


@triton.jit
def mark_kernel(out_ptr, n, n_bucket, MARK: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_bounds = offsets < n
    tl.store(out_ptr + offsets, tl.full((BLOCK,), MARK, tl.float32), mask=in_bounds)


# three real fbank candidates; each one's config writes its position (1, 2, 3) so a test sees which ran
CANDIDATES = list(plans.plan_for("fbank").candidates)[:3]
MARK1, MARK2, MARK3 = (candidate.tag() for candidate in CANDIDATES)


def make_tuned():
    return TunedKernel(mark_kernel, CANDIDATES,
                       lambda c: triton.Config({"MARK": CANDIDATES.index(c) + 1, "BLOCK": 32}, num_warps=1),
                       key=["n_bucket"])


def fbank_route(candidate, evidence="DeviceDefault", profile=None):
    plan = plans.plan_for("fbank", profile)
    launch = LaunchBuilder.from_plan(plan).fields(batch=1, samples=400, frames=1, window=512, bins=23,
                                                  tokens=1).build()
    return Route(family="fbank", op="fbank", backend="triton", candidate=candidate, candidate_tag=candidate.tag(),
                 evidence=evidence, tune_key=tune_cache_key(plan, launch, "test-device", 0))


def launch(tuned, route, n=50):
    out = torch.zeros(n)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731
    ran = tuned.launch(grid, route, out, n, triton.next_power_of_2(n))
    return ran, out


def test_routed_candidate_is_injected_and_runs_without_benchmarking():
    tuned = make_tuned()
    with override_settings(tune=False):
        ran, out = launch(tuned, fbank_route(CANDIDATES[2]))
    assert ran == MARK3
    assert torch.all(out == 3)


def test_key_holds_buckets_not_raw_lengths():
    tuned = make_tuned()
    with override_settings(tune=False):
        launch(tuned, fbank_route(CANDIDATES[1]), n=100)
        launch(tuned, fbank_route(CANDIDATES[1]), n=120)
    assert list(tuned.autotuner.cache) == [(128, "torch.float32")]


def test_key_matches_what_the_autotuner_stores(tmp_path):
    tuned = make_tuned()
    out = torch.zeros(40)
    expected = autotune_key(tuned.arg_names, tuned.key, (out, 40, 64), {})
    with override_settings(tune=True, tune_cache_path=str(tmp_path / "t.tsv"), tune_cache_persist=False):
        tuned.launch(lambda meta: (2,), fbank_route(CANDIDATES[1]), out, 40, 64)
    assert list(tuned.autotuner.cache) == [expected]


def test_cold_bucket_is_tuned_and_the_winner_recorded(tmp_path):
    tuned = make_tuned()
    path = tmp_path / "tune.tsv"
    with override_settings(tune=True, tune_cache_path=str(path), tune_cache_load=True, tune_cache_persist=True):
        route = fbank_route(CANDIDATES[2])
        ran, out = launch(tuned, route)
        # the interpreter's benchmark is deterministic: every candidate runs once, the first declared wins
        assert ran == MARK1 and torch.all(out == 1)
        assert plans.winner_table().lookup(route.tune_key) == MARK1
    assert MARK1 in path.read_text()


def test_winner_from_the_table_is_not_tuned_again(tmp_path):
    tuned = make_tuned()
    with override_settings(tune=True, tune_cache_path=str(tmp_path / "t.tsv"), tune_cache_persist=False):
        ran, out = launch(tuned, fbank_route(CANDIDATES[1], evidence="TuneFile"))
    assert ran == MARK2 and torch.all(out == 2)


def test_deterministic_profile_launches_the_routed_candidate_only(tmp_path):
    tuned = make_tuned()
    with override_settings(tune=True, profile="deterministic", tune_cache_path=str(tmp_path / "t.tsv")):
        route = fbank_route(CANDIDATES[1], profile=PrecisionProfile.DETERMINISTIC)
        ran, out = launch(tuned, route)
        assert plans.winner_table().lookup(route.tune_key) is None
    assert ran == MARK2 and torch.all(out == 2)


def test_tuning_off_in_the_interpreter_by_default():
    tuned = make_tuned()
    with override_settings(tune=None):
        ran, _ = launch(tuned, fbank_route(CANDIDATES[1]))
    assert ran == MARK2


@pytest.mark.gpu
def test_no_tuning_while_a_cuda_graph_is_captured(tmp_path):
    tuned = make_tuned()
    out = torch.zeros(64, device="cuda")
    route = fbank_route(CANDIDATES[2])
    with override_settings(tune=True, tune_cache_path=str(tmp_path / "t.tsv"), tune_cache_persist=False):
        tuned.launch(lambda meta: (2,), route, out, 64, 64)  # warm: compiles outside the capture
        tuned.autotuner.cache.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ran = tuned.launch(lambda meta: (2,), route, out, 64, 64)
    graph.replay()
    torch.cuda.synchronize()
    assert ran == MARK3 and torch.all(out == 3)


def test_concurrent_calls_for_one_bucket_each_run_the_candidate_they_were_routed_to():
    """8 threads routed to three candidates of one bucket: no call runs a config another call injected."""
    import threading

    tuned = make_tuned()
    failures, start = [], threading.Barrier(8)

    def caller(index):
        candidate = CANDIDATES[index % 3]
        start.wait()
        for _ in range(6):
            ran, out = launch(tuned, fbank_route(candidate), n=40)
            if ran != candidate.tag() or not torch.all(out == index % 3 + 1):
                failures.append((index, ran, out.unique().tolist()))

    with override_settings(tune=False):
        threads = [threading.Thread(target=caller, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []


def test_a_config_that_does_not_fit_its_launch_is_refused_before_anything_runs():
    def fits(config, grid, args):
        return "MARK 3 is refused" if config.kwargs["MARK"] == 3 else None

    tuned = TunedKernel(mark_kernel, CANDIDATES,
                        lambda c: triton.Config({"MARK": CANDIDATES.index(c) + 1, "BLOCK": 32}, num_warps=1),
                        key=["n_bucket"], check=fits)
    with override_settings(tune=False):
        with pytest.raises(RuntimeError, match="MARK 3 is refused"):
            launch(tuned, fbank_route(CANDIDATES[2]))
        ran, out = launch(tuned, fbank_route(CANDIDATES[1]))
    assert ran == MARK2 and torch.all(out == 2)


def test_the_decode_bridge_refuses_a_grid_wider_than_its_partial_buffers():
    from rlx_triton.backends.triton.sdpa_decode import _partials_hold_the_grid

    args = [None] * 7 + [torch.empty(1, 2, 1, 4, 16)]
    assert _partials_hold_the_grid(None, (3, 4), tuple(args)) is None
    assert "5 KV splits" in _partials_hold_the_grid(None, (3, 5), tuple(args))
    assert _partials_hold_the_grid(None, (3, 2), tuple([None] * 7 + [torch.empty(1, 2, 1, 16)])) is not None
