"""Tracing calls as on a profile: host syncs, launches counted on meta tensors equal what runs, every bench case."""
import copy
from types import SimpleNamespace

import pytest
import torch

from rlx_triton.devices import profile
from rlx_triton.perf import BENCHES, launch_count_mismatches
from rlx_triton.perf.benches import perf_cases
from rlx_triton.perf.trace import HostSyncs, trace
from rlx_triton.router.device import device_facts, profile_facts

H200 = profile_facts(profile("h200"))


def test_host_syncs_counts_what_waits_for_the_device():
    device_tensor = torch.empty(3, device="meta")
    with HostSyncs() as syncs:
        torch.tensor([1, 2], device=device_tensor.device)      # host data copied to the device
        device_tensor.new_tensor([1.0])                          # the same, through new_tensor
        torch.zeros(2).to("meta")                                # host-to-device copy
        torch.tensor(0.0)                                        # stays on the host: no sync
        torch.ones(2).sum().item()                               # a host value read on the host: no sync
        with pytest.raises(RuntimeError):
            device_tensor.sum().item()                           # a device value read on the host
    assert syncs.events == ["host-to-device copy (tensor from host data)",
                            "host-to-device copy (tensor from host data)", "host-to-device copy",
                            "host read (.item())"]


def test_a_host_read_ends_the_trace_with_the_reason():
    result = trace(lambda: bool(torch.empty(1, device="meta").sum() > 0), H200, host_syncs=True)
    assert "meta" in result.error and result.host_syncs == ["host read (bool())"]


def _tiny_models():
    from rlx_triton.integrations import pyannote
    from tests.reference.pyannote_models import make_pyannet
    from tests.reference.wespeaker_models import tiny_wespeaker

    return {"pyannet": (pyannote.optimize(make_pyannet(hidden=8, lstm_layers=2, linear_hidden=8)), 1600),
            "wespeaker": (pyannote.optimize(tiny_wespeaker()), 1600)}


@pytest.mark.parametrize("name", ["pyannet", "wespeaker"])
def test_launches_counted_on_meta_tensors_are_the_launches_that_run(name):
    model, samples = _tiny_models()[name]
    wav = 0.1 * torch.randn(1, 1, samples)
    cpu = device_facts("cpu")
    # executed in the interpreter on CPU tensors, then planned on meta tensors routed as on the same CPU
    executed = trace(lambda: model(wav), cpu, devices=("cpu",), execute=True)
    planned = trace(lambda: copy.deepcopy(model).to("meta")(wav.to("meta")), cpu)
    assert not executed.error and not planned.error
    assert all(r.backend == "triton" for r in executed.routes), [str(r) for r in executed.routes]
    assert executed.launches > 0 and planned.log.kernels == executed.log.kernels
    assert [(r.family, r.op, r.candidate_tag) for r in planned.routes] == \
        [(r.family, r.op, r.candidate_tag) for r in executed.routes]


def test_a_stated_launch_count_is_checked_against_the_launches():
    route = SimpleNamespace(request="lstm request", backend="triton", family="lstm", op="lstm", candidate=None,
                            module=SimpleNamespace(launch_count=lambda request, candidate: 3))
    log = SimpleNamespace(launches_per_route=lambda: [2, 0])
    mismatch = SimpleNamespace(routes=[route, route], log=log)   # the op routed twice for one call
    assert launch_count_mismatches(mismatch) == ["lstm.lstm: launch_count states 3, the launcher made 2"]
    log.launches_per_route = lambda: [3, 0]
    assert launch_count_mismatches(mismatch) == []


@pytest.mark.parametrize("bench", BENCHES)
def test_every_bench_case_traces_on_meta_tensors_as_on_an_h200(bench):
    cases = perf_cases(bench, H200)
    assert cases
    for case in cases:
        result = trace(case.call, H200)
        assert not result.error, f"{case.case}: {result.error}"
        routed = [r for r in result.routes if r.backend == "triton"]
        if routed or case.pinned:
            assert result.launches > 0, case.case


def test_a_speed_model_plans_a_sinc_filter_bank_on_the_kernel_the_call_takes():
    """The router prices a call on meta copies of its arguments: a sinc_filters bank's copy is still one, so the
    plan holds the symmetric sinc kernel the call itself launches, not the direct convolution."""
    from rlx_triton.backends.triton import conv as tconv
    from rlx_triton.ops.conv import is_sinc_filter_bank
    from rlx_triton.perf.trace import meta_copy
    from tests.reference.conv import random_sincnet
    from tests.triton.test_conv import GPU_RECIPE, _sincnet_args

    args = _sincnet_args(random_sincnet(), torch.randn(2, 1, 4000))
    copied = meta_copy(args)
    assert is_sinc_filter_bank(args[1]) and is_sinc_filter_bank(copied[1])
    assert not is_sinc_filter_bank(meta_copy(args[1].clone()))
    plan, _ = tconv.sincnet_plan(*copied, candidate=GPU_RECIPE)
    assert [record.name for record in plan].count("_sinc_conv_kernel") == 1
