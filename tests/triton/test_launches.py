"""The launch executor (backends/triton/launches.py): every plan runs on its inputs' device, and a cooperative
record is launched with triton's launch_cooperative_grid."""
from __future__ import annotations

import contextlib

import pytest
import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.launches import Launch


@triton.jit
def _fill_kernel(out_ptr, n, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.full([BLOCK], VALUE, tl.float32), mask=offs < n)


class TensorOnSecondGpu:
    """Stands in for a tensor on cuda:1 (what the executor reads of an argument: its device)."""
    device = torch.device("cuda", 1)

    def data_ptr(self) -> int:
        return 0


def test_a_plan_runs_with_its_tensors_cuda_device_current(monkeypatch):
    events = []

    @contextlib.contextmanager
    def device_guard(device):
        events.append(("enter", torch.device(device)))
        yield
        events.append(("exit", torch.device(device)))

    monkeypatch.setattr(torch.cuda, "device", device_guard)
    monkeypatch.setattr(launches, "_launch", lambda record: events.append(("launch", record.name)))
    record = Launch(_fill_kernel, (1,), (TensorOnSecondGpu(), 4), meta=dict(VALUE=1.0, BLOCK=16))
    launches.run([record])
    assert events == [("enter", torch.device("cuda", 1)), ("launch", "_fill_kernel"),
                      ("exit", torch.device("cuda", 1))]


def test_a_plan_of_cpu_tensors_takes_no_device_guard(monkeypatch):
    def refuse(device):
        raise AssertionError("a CPU plan entered a CUDA device guard")

    monkeypatch.setattr(torch.cuda, "device", refuse)
    out = torch.zeros(20)
    launches.run([Launch(_fill_kernel, (2,), (out, 20), meta=dict(VALUE=2.0, BLOCK=16))])
    assert bool((out == 2.0).all())


def test_a_cooperative_record_is_launched_with_launch_cooperative_grid_on_a_gpu(monkeypatch):
    import dataclasses

    from rlx_triton import config

    seen = []
    monkeypatch.setattr(type(_fill_kernel), "run", lambda self, *args, **kwargs: seen.append(
        kwargs.get("launch_cooperative_grid")))
    monkeypatch.setattr(config, "settings", lambda: dataclasses.replace(config.Settings(), interpret=False))
    out = torch.zeros(20)
    plain = Launch(_fill_kernel, (2,), (out, 20), meta=dict(VALUE=1.0, BLOCK=16))
    cooperative = Launch(_fill_kernel, (2,), (out, 20), meta=dict(VALUE=3.0, BLOCK=16), cooperative=True)
    launches.run([plain, cooperative])
    assert seen == [None, True]
    assert plain.config_key() != cooperative.config_key() and "cooperative" in repr(cooperative)


def test_the_interpreter_runs_a_cooperative_record_without_the_option():
    out = torch.zeros(20)
    launches.run([Launch(_fill_kernel, (2,), (out, 20), meta=dict(VALUE=3.0, BLOCK=16), cooperative=True)])
    assert bool((out == 3.0).all())


@pytest.mark.gpu
def test_kernels_on_the_second_gpu_run_there_whichever_device_is_current():
    import rlx_triton as rt

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")

    out = torch.zeros(20, device="cuda:1")
    q, k, v = (torch.randn(2, 8, 1, 64, device="cuda:1") for _ in range(3))
    with torch.cuda.device(0):
        launches.run([Launch(_fill_kernel, (2,), (out, 20), meta=dict(VALUE=5.0, BLOCK=16))])
        with rt.use_backend("triton", strict=True):
            got = rt.sdpa_decode(q, k, v)
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert bool((out.cpu() == 5.0).all())
    want = torch.nn.functional.scaled_dot_product_attention(q.cpu().double(), k.cpu().double(), v.cpu().double())
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)

