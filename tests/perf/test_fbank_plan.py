"""The fbank launcher as launch records (backends/triton/fbank.py `fbank_plan`).

The dense-DFT launches are checked against the direct kernel calls the launcher made before it ran
records (written out below as `direct_dense_launches`): same kernels, grids, specialisation and
options, same output. At the WeSpeaker bench shape, planned on meta tensors as on an H200, the records
hold the hand-counted grid, bytes and FLOPs, and `launch_count` states what the traced call launched.
"""
import math

import pytest
import torch
import triton

from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import fbank as kernels
from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton.launches import describe_call
from rlx_triton.devices import profile
from rlx_triton.planner.candidates.fbank import FbankVariant
from rlx_triton.router.device import profile_facts
from tests.reference.fbank import WESPEAKER_80, speech_like

H200 = profile("h200")
WESPEAKER = dict(WESPEAKER_80, input_scale=32768.0, subtract_mean=True)


def direct_dense_launches(wave, options, candidate):
    """The dense-DFT launcher as it called the kernels directly (the reference the records must equal)."""
    batch, num_samples = wave.shape
    num_frames = options.num_frames(num_samples)
    out = torch.empty(batch, num_frames, options.num_columns, device=wave.device, dtype=torch.float32)
    device = wave.device
    meta = kernels._meta(candidate, options)
    grid = (triton.cdiv(num_frames, meta["BLOCK_F"]), batch)
    kernels._fbank_frames_kernel[grid](
        wave, kernels._window(options, device),
        kernels._dft_basis(options.window_size, options.padded_window_size, device),
        kernels._mel_transposed(options, device), out,
        num_samples, num_frames,
        wave.stride(0), out.stride(0), out.stride(1),
        options.window_shift, 0 if options.snip_edges else options.reflect_pad,
        float(options.input_scale), 1.0 - float(options.preemphasis_coefficient),
        math.log(options.energy_floor) if options.energy_floor > 0 else 0.0,
        **kernels._constexprs(options), **meta,
    )
    if options.subtract_mean:
        cmn_cols = 16 if options.num_columns <= 16 else 32
        kernels._fbank_cmn_kernel[(batch, triton.cdiv(options.num_columns, cmn_cols))](
            out, num_frames, options.num_columns, out.stride(0), out.stride(1),
            BLOCK_F=32, BLOCK_C=cmn_cols, num_warps=1,
        )
    return out


@pytest.mark.parametrize("variant", list(FbankVariant), ids=lambda v: v.name)
@pytest.mark.parametrize("kwargs", [dict(sample_frequency=8000.0, subtract_mean=True, use_energy=True),
                                    dict(sample_frequency=8000.0, snip_edges=False)], ids=["cmn_energy", "no_snip"])
def test_the_records_are_the_direct_launches(variant, kwargs):
    options = FbankOptions(**kwargs)
    wave = speech_like(1207, batch=2, sample_rate=8000.0).float()
    candidate = variant.candidate()
    with launches.recording() as direct:
        expected = direct_dense_launches(wave, options, candidate)
    plan, out = kernels.fbank_plan(wave, options, candidate=candidate)
    with launches.recording() as planned:
        launches.run(plan)
    assert [describe_call(*call) for call in direct.bypassing_calls] == [record.describe() for record in plan]
    assert planned.outside == [] and planned.records == plan
    assert torch.equal(out, expected)


def test_the_launcher_runs_its_plan_and_nothing_else():
    options = FbankOptions(sample_frequency=8000.0, subtract_mean=True)
    wave = speech_like(807, batch=1, sample_rate=8000.0).float()
    candidate = FbankVariant.DEFAULT.candidate()
    with launches.recording() as log:
        out = kernels.fbank(wave, options, candidate=candidate)
    plan, _ = kernels.fbank_plan(wave, options, candidate=candidate)
    assert log.outside == [] and [r.describe() for r in log.records] == [r.describe() for r in plan]
    assert out.shape == (1, options.num_frames(807), 23)


def test_an_empty_batch_plans_no_launch():
    plan, out = kernels.fbank_plan(torch.empty(0, 800), FbankOptions(), candidate=FbankVariant.DEFAULT.candidate())
    assert plan == [] and out.shape == (0, 3, 23)


@pytest.fixture(scope="module")
def bench_plan():
    """The WeSpeaker front end at the bench shape (32 chunks of 10 s), planned on meta tensors."""
    options = FbankOptions(**WESPEAKER)
    wave = torch.empty(32, 160000, device="meta")
    candidate = FbankVariant.DEFAULT.candidate()
    plan, out = kernels.fbank_plan(wave, options, candidate=candidate)
    return options, candidate, plan, out


def test_bench_shape_records_by_hand(bench_plan):
    options, candidate, plan, out = bench_plan
    assert out.shape == (32, 998, 80) and out.device.type == "meta"
    frames_record, cmn_record = plan
    block_f = candidate.tile_frames
    tiles = math.ceil(998 / block_f)
    assert frames_record.grid == (tiles, 32)
    # waveform once, window (400), the four basis planes (400 x 256), the mel matrix (256 x 128)
    assert frames_record.bytes_read == 32 * 160000 * 4 + 400 * 4 + 4 * 400 * 256 * 4 + 256 * 128 * 4
    assert frames_record.bytes_written == 32 * 998 * 80 * 4
    padded = 32 * tiles * block_f
    assert frames_record.flops == 2 * 4 * padded * 256 * 400 + 2 * padded * 256 * 128 + 3 * padded * 256
    assert frames_record.unit == "fp32_fma"
    assert cmn_record.grid == (32, 3) and cmn_record.bytes == 2 * 32 * 998 * 80 * 4


def test_launch_count_is_what_the_traced_call_launched():
    import rlx_triton as rt
    from rlx_triton.perf import launch_count_mismatches
    from rlx_triton.perf.trace import trace

    facts = profile_facts(H200)
    for kwargs in (dict(WESPEAKER), dict(WESPEAKER, subtract_mean=False)):
        front_end = rt.nn.Fbank(**kwargs).to("meta")
        result = trace(lambda: front_end(torch.empty(4, 1, 16000, device="meta")), facts)
        assert not result.error and result.unplanned_families() == []
        assert launch_count_mismatches(result) == []
        assert result.launches == 1 + int(kwargs["subtract_mean"])
