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



@triton.jit(do_not_specialize=["n_unspecialised"], do_not_specialize_on_alignment=["n_unaligned", "p_unaligned"])
def _specialisation_sample_kernel(p_f32, p_f16, p_bf16, p_i64, p_u8, p_bool, p_f8, p_unaligned,
                                  n_one, n_div16, n_odd, n_negative, n_i64, n_u64, n_unspecialised, n_unaligned,
                                  typed_int: tl.int32, typed_float: tl.float32, scale, flag, nothing,
                                  BLOCK: tl.constexpr, DEFAULTED: tl.constexpr = 7):
    tl.store(p_f32 + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32))


def _specialisation_samples(device):
    """Argument tuples covering every rule the JIT specialises on: pointer dtypes and alignments, ints equal
    to 1, divisible by 16 or not, beyond 32 and 63 bits, negative, floats, bools, None, typed parameters,
    do_not_specialize and do_not_specialize_on_alignment, constexprs passed and defaulted."""
    base = torch.zeros(64, device=device)
    half, bf16 = torch.zeros(64, device=device, dtype=torch.float16), torch.zeros(64, device=device, dtype=torch.bfloat16)
    i64, u8 = torch.zeros(8, device=device, dtype=torch.int64), torch.zeros(64, device=device, dtype=torch.uint8)
    flags, f8 = torch.zeros(64, device=device, dtype=torch.bool), torch.zeros(64, device=device, dtype=torch.float8_e4m3fn)
    aligned = (base, half, bf16, i64, u8, flags, f8, base)
    misaligned = (base[1:], half[3:], bf16[8:], i64[1:], u8[5:], flags[16:], f8[1:], base[1:])
    ints = (1, 32, 17, -48, 2**40, 2**63 + 16, 16, 32)
    odd_ints = (1, 48, 2**31 - 1, -1, -2**40, 2**64 - 1, 1, 1)
    return {
        "aligned, specialised ints": aligned + ints + (16, 1.0, 2.0, True, None),
        "misaligned, odd ints": misaligned + odd_ints + (1, 0.5, 1.5, False, None),
    }


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("case", ["aligned, specialised ints", "misaligned, odd ints"])
def test_every_argument_is_specialised_as_the_installed_tritons_binder_does(device, case):
    # a triton whose specialisation rules differ from launches.py fails here, naming the argument
    from tests.perf.jit_reference import jit_specialization

    args = _specialisation_samples(device)[case]
    meta = {"BLOCK": 16}
    mine = launches.specialize(_specialisation_sample_kernel, args, meta)
    signature, constexprs, attrs = jit_specialization(_specialisation_sample_kernel, args, meta)
    names = list(_specialisation_sample_kernel.arg_names)
    assert list(mine.signature) == list(signature) == names
    for index, name in enumerate(names):
        key = (index,)
        assert mine.signature[name] == signature[name], (
            f"argument {name!r}: launches.py says type {mine.signature[name]!r}, triton {signature[name]!r}")
        assert mine.constexprs.get(key, "-") == constexprs.get(key, "-"), (
            f"argument {name!r}: launches.py says constexpr {mine.constexprs.get(key, '-')!r}, "
            f"triton {constexprs.get(key, '-')!r}")
        assert mine.attrs.get(key, "-") == attrs.get(key, "-"), (
            f"argument {name!r}: launches.py says attrs {mine.attrs.get(key, '-')!r}, triton {attrs.get(key, '-')!r}")
    assert len(mine.constexprs) == len(constexprs) and len(mine.attrs) == len(attrs)


def test_the_sample_arguments_cover_every_specialisation_rule():
    spec = launches.specialize(_specialisation_sample_kernel, _specialisation_samples("cpu")["aligned, specialised ints"],
                               {"BLOCK": 16})
    kinds = set(spec.signature.values())
    assert {"*fp32", "*fp16", "*bf16", "*i64", "*u8", "*u1", "*fp8e4nv", "i32", "i64", "u64", "fp32", "u1",
            "constexpr"} <= kinds
    divisible = [["tt.divisibility", 16]]
    assert spec.attrs[(1,)] == divisible and spec.attrs[(9,)] == divisible and spec.attrs[(10,)] == []
    assert spec.constexprs[(8,)] == 1 and spec.constexprs[(22,)] == 7
