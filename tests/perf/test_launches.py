"""Launch records and their executor: the JIT's specialisation, exact execution, recording and planning."""
from types import SimpleNamespace

import pytest
import torch

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.launches import Launch, describe_call, specialize
from tests.perf.jit_reference import jit_specialization
from tests.perf.kernels import scaled_add_kernel, unspecialised_copy_kernel


def _buffers(device):
    x = torch.zeros(64, device=device)
    return x, torch.zeros(64, device=device, dtype=torch.float16), torch.zeros(64, device=device, dtype=torch.bool)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("case", [
    "aligned pointers, int 1, int 16",
    "misaligned view, int 17, int 2**31",
    "None pointer, negative int, u64",
    "float 1.0 and bool",
])
def test_specialization_equals_the_jit(device, case):
    x, h, b = _buffers(device)
    args = {
        "aligned pointers, int 1, int 16": (x, x[4:], x, 1, 16, 2.0, True),
        "misaligned view, int 17, int 2**31": (x, x[1:], h[3:], 17, 2**31, 0.5, False),
        "None pointer, negative int, u64": (h, None, b, -48, 2**63, 3.0, 1),
        "float 1.0 and bool": (x, x, x, 2**40, 32, 1.0, True),
    }[case]
    mine = specialize(scaled_add_kernel, args, {"BLOCK": 64})
    signature, constexprs, attrs = jit_specialization(scaled_add_kernel, args, {"BLOCK": 64})
    assert dict(mine.signature) == signature
    assert dict(mine.constexprs) == constexprs
    assert dict(mine.attrs) == attrs


@pytest.mark.parametrize("n, stride", [(1, 32), (32, 1), (17, 2**40), (48, 16)])
def test_specialization_honours_do_not_specialize(n, stride):
    x, _, _ = _buffers("cpu")
    args = (x, x[1:], n, stride)
    mine = specialize(unspecialised_copy_kernel, args, {"BLOCK": 16})
    signature, constexprs, attrs = jit_specialization(unspecialised_copy_kernel, args, {"BLOCK": 16})
    assert (dict(mine.signature), dict(mine.constexprs), dict(mine.attrs)) == (signature, constexprs, attrs)


def test_pointer_alignment_and_integer_specialisation_as_documented():
    x, _, _ = _buffers("meta")
    spec = specialize(scaled_add_kernel, (x, x[1:], x[4:], 1, 48, 1.5, True), {"BLOCK": 32})
    assert spec.signature["x_ptr"] == "*fp32" and spec.attrs[(0,)] == [["tt.divisibility", 16]]
    assert spec.attrs[(1,)] == []                                 # 4-byte offset: not 16-byte aligned
    assert spec.attrs[(2,)] == [["tt.divisibility", 16]]          # 16-byte offset
    assert spec.signature["n"] == "constexpr" and spec.constexprs[(3,)] == 1
    assert spec.signature["stride"] == "i32" and spec.attrs[(4,)] == [["tt.divisibility", 16]]
    assert spec.signature["alpha"] == "fp32" and (5,) not in spec.attrs
    assert spec.signature["use_alpha"] == "u1"
    assert spec.constexprs[(7,)] == 32


def _plan(x, y, out, block=16):
    n = x.numel()
    return [Launch(scaled_add_kernel, (-(-n // block),), (x, y, out, n, 1, 2.0, True), meta={"BLOCK": block},
                   num_warps=1, num_stages=1, bytes_read=8 * n, bytes_written=4 * n, flops=2 * n)]


def test_run_launches_exactly_the_records():
    x, y = torch.randn(37), torch.randn(37)
    out = torch.empty(37)
    plan = _plan(x, y, out)
    with launches.recording() as log:
        launches.run(plan)
    torch.testing.assert_close(out, 2.0 * x + y, rtol=1e-6, atol=0)
    assert log.records == plan and log.kernels == ["scaled_add_kernel"] and log.outside == []


def test_a_launch_outside_the_executor_is_seen():
    x, y, out = torch.randn(16), torch.randn(16), torch.empty(16)
    with launches.recording() as log:
        scaled_add_kernel[(1,)](x, y, out, 16, 1, 1.0, False, BLOCK=16)
    torch.testing.assert_close(out, x + y)
    assert log.outside == ["scaled_add_kernel"] and log.bypassed == [True]
    kernel, grid, args, kwargs = log.bypassing_calls[0]
    record = Launch(scaled_add_kernel, (1,), (x, y, out, 16, 1, 1.0, False), meta={"BLOCK": 16})
    assert describe_call(kernel, grid, args, kwargs) == record.describe()


def test_planning_collects_records_and_runs_nothing():
    x, y = torch.randn(20), torch.randn(20)
    out = torch.zeros(20)
    with launches.planning() as log:
        launches.run(_plan(x, y, out))
        scaled_add_kernel[(2,)](x, y, out, 20, 1, 1.0, False, BLOCK=16)   # bypassing: skipped, listed
    assert torch.count_nonzero(out) == 0
    assert len(log.records) == 1 and log.kernels == ["scaled_add_kernel", "scaled_add_kernel"]
    assert log.bypassed == [False, True]


def test_plans_build_from_meta_tensors():
    x = torch.empty(1 << 30, device="meta")   # 4 GiB that are never allocated
    record = _plan(x, x, x, block=1024)[0]
    assert record.grid == (1 << 20,) and record.ctas == 1 << 20 and record.bytes == 12 * (1 << 30)
    with launches.planning() as log:
        launches.run([record])
    assert log.records == [record]


def test_launches_are_attributed_to_the_route_before_them():
    x, y, out = torch.randn(8), torch.randn(8), torch.empty(8)
    routes = []
    with launches.recording(execute=False, routes=routes) as log:
        routes.append("first op")
        launches.run(_plan(x, y, out) * 2)
        routes.append("second op")
        launches.run(_plan(x, y, out))
    assert log.launches_per_route() == [2, 1]


@pytest.mark.parametrize("bad, message", [
    (dict(unit="fp64"), "unit"),
    (dict(grid=(0, -1)), "grid"),
    (dict(meta={"BLOCK": 16, "NOPE": 1}), "unknown"),
    (dict(meta={}), "leaves out"),
    (dict(bytes_read=-1), "bytes_read"),
])
def test_a_malformed_record_is_refused(bad, message):
    x = torch.empty(16)
    fields = dict(kernel=scaled_add_kernel, grid=(1,), args=(x, x, x, 16, 1, 1.0, False), meta={"BLOCK": 16})
    fields.update(bad)
    with pytest.raises((ValueError, TypeError), match=message):
        Launch(**fields)


class _Candidate(SimpleNamespace):
    def tag(self):
        return f"block{self.block}"


def _tuned():
    import triton

    from rlx_triton.backends.triton.autotune import TunedKernel

    candidates = [_Candidate(block=16), _Candidate(block=32)]
    return TunedKernel(scaled_add_kernel, candidates,
                       lambda c: triton.Config({"BLOCK": c.block}, num_warps=1, num_stages=1), key=["n"]), candidates


def test_a_tuned_record_states_its_candidates_config_and_runs_through_the_bridge():
    tuned, candidates = _tuned()
    route = SimpleNamespace(candidate=candidates[1], evidence="Recipe", family="conv", tune_key=None)
    x, y, out = torch.randn(70), torch.randn(70), torch.empty(70)
    record = Launch.tuned(tuned, candidates[1], lambda meta: (-(-70 // meta["BLOCK"]),),
                          (x, y, out, 70, 1, 1.0, False), {}, route=route, bytes_read=560, bytes_written=280)
    assert record.meta["BLOCK"] == 32 and record.grid == (3,) and record.num_warps == 1
    assert record.specialization().constexprs[(7,)] == 32
    with launches.recording() as log:
        launches.run([record])
    torch.testing.assert_close(out, x + y)
    assert log.outside == [] and tuned.winner((70, "torch.float32", "torch.float32", "torch.float32")) == "block32"


def test_a_tuned_record_must_state_the_routes_candidate():
    tuned, candidates = _tuned()
    route = SimpleNamespace(candidate=candidates[0])
    x = torch.empty(8)
    with pytest.raises(ValueError, match="not the route's"):
        Launch.tuned(tuned, candidates[1], lambda meta: (1,), (x, x, x, 8, 1, 1.0, False), {}, route=route)
