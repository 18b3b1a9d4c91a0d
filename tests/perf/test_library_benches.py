"""Every case of the diarization benches gets a library path estimate: each op it routes states the kernels its
torch path runs (backends/torch_ref/<family>.py `library_kernels(request, profile)`), all of them modelled."""
import pytest

from rlx_triton.devices import profile
from rlx_triton.perf import library_path
from rlx_triton.perf.benches import perf_cases
from rlx_triton.perf.stock_models import StockModelUnavailable
from rlx_triton.perf.trace import trace
from rlx_triton.router.device import profile_facts

H200 = profile("h200")
FACTS = profile_facts(H200)


@pytest.mark.parametrize("bench", ["fbank", "sincnet", "lstm", "pyannote_segmentation", "embedding"])
def test_every_routed_case_has_a_library_estimate(bench):
    try:
        cases = [case for case in perf_cases(bench, FACTS) if case.pinned is None]
    except StockModelUnavailable as why:
        pytest.skip(str(why))
    assert cases
    for case in cases:
        result = trace(case.call, FACTS)
        assert not result.error, f"{case.case}: {result.error}"
        estimate = library_path(result.routes, H200)
        assert estimate is not None, case.case
        assert estimate["est_us"] > 0 and all(row["note"] for row in estimate["kernels"]), case.case


def test_the_segmentation_model_is_sincnet_lstm_and_the_dense_head_on_the_library_path():
    try:
        (case,) = perf_cases("pyannote_segmentation", FACTS)
    except StockModelUnavailable as why:
        pytest.skip(str(why))
    result = trace(case.call, FACTS)
    routed = {(route.family, route.op) for route in result.routes if route.request is not None}
    assert routed == {("conv", "sincnet"), ("lstm", "lstm"), ("segdense", "segdense")}
    names = [row["name"] for row in library_path(result.routes, H200)["kernels"]]
    assert any("sinc conv1d" in name for name in names) and any("persistent recurrence" in name for name in names)
    assert names[-1] == "log_softmax"
