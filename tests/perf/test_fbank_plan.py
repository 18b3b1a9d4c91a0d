"""The fbank launcher as launch records (backends/triton/fbank/launch.py `fbank_plan`) and its analysis as on an H200.

In the interpreter the launcher runs exactly its records (both frames kernels, the CMN pass), with the
JIT's own specialisation. At the WeSpeaker bench shape, routed and planned on meta tensors as on an H200,
the records hold the hand-counted grid, bytes and FLOPs; compiled for sm_90 the two-stage kernel issues
tensor-core MMAs without spilling, and the case's estimate is below the library path estimate (the same
roofline on the torch path's kernels, whose bytes and FLOPs are checked by hand here too).
"""
import math

import pytest
import torch

from rlx_triton.backends.torch_ref import fbank as torch_ref
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import fbank as kernels
from rlx_triton.backends.triton import launches
from rlx_triton.devices import profile
from rlx_triton.perf import analyse_plan
from rlx_triton.perf.roofline import case_totals, library_estimate
from rlx_triton.perf.trace import as_compiled
from rlx_triton.planner.candidates.fbank import FbankVariant
from rlx_triton.router.device import profile_facts, routing_as
from tests.perf.jit_reference import jit_specialization
from tests.reference.fbank import WESPEAKER_80, speech_like

H200 = profile("h200")
WESPEAKER = dict(WESPEAKER_80, input_scale=32768.0, subtract_mean=True)
DENSE, TWO_STAGE = FbankVariant.IEEE_F16_Q32.candidate(), FbankVariant.TF32X3_F64_Q32.candidate()


@pytest.mark.parametrize("candidate", [DENSE, TWO_STAGE], ids=["dense", "two_stage"])
@pytest.mark.parametrize("kwargs", [dict(sample_frequency=8000.0, subtract_mean=True, use_energy=True),
                                    dict(sample_frequency=8000.0, snip_edges=False)], ids=["cmn_energy", "no_snip"])
def test_the_launcher_runs_its_records_and_nothing_else(candidate, kwargs):
    options = FbankOptions(**kwargs)
    wave = speech_like(1207, batch=2, sample_rate=8000.0).float()
    with launches.recording() as log:
        out = kernels.fbank(wave, options, candidate=candidate)
    plan, planned_out = kernels.fbank_plan(wave, options, candidate=candidate)
    assert log.outside == [] and [r.describe() for r in log.records] == [r.describe() for r in plan]
    names = ["_fbank_split_kernel" if candidate is TWO_STAGE else "_fbank_frames_kernel"]
    assert [r.name for r in plan] == names + (["_fbank_cmn_kernel"] if options.subtract_mean else [])
    launches.run(plan)
    assert torch.equal(planned_out, out)


@pytest.mark.parametrize("candidate", [DENSE, TWO_STAGE], ids=["dense", "two_stage"])
def test_the_recorded_specialisation_is_the_jits(candidate):
    wave = speech_like(1207, batch=2, sample_rate=8000.0).float()
    plan, _ = kernels.fbank_plan(wave, FbankOptions(sample_frequency=8000.0, subtract_mean=True), candidate=candidate)
    for record in plan:
        mine = record.specialization()
        signature, constexprs, attrs = jit_specialization(record.jit, record.args, record.meta)
        assert (dict(mine.signature), dict(mine.constexprs), dict(mine.attrs)) == (signature, constexprs, attrs)


def test_an_empty_batch_plans_no_launch():
    plan, out = kernels.fbank_plan(torch.empty(0, 800), FbankOptions(), candidate=DENSE)
    assert plan == [] and out.shape == (0, 3, 23)


def _bench_route():
    import rlx_triton as rt

    waves = torch.empty(32, 1, 160000, device="meta")
    with as_compiled(), routing_as(profile_facts(H200)):
        return rt.explain(rt.fbank, waves, **WESPEAKER_80, subtract_mean=True, input_scale=32768.0)


@pytest.fixture(scope="module")
def bench_plan():
    """The WeSpeaker front end at the bench shape (32 chunks of 10 s), routed and planned as on an H200."""
    route = _bench_route()
    options = FbankOptions(**WESPEAKER)
    with as_compiled():
        plan, out = kernels.fbank_plan(torch.empty(32, 160000, device="meta"), options, candidate=route.candidate,
                                       route=route)
    return route, options, plan, out


def test_an_h200_routes_the_front_end_to_the_tensor_core_recipe(bench_plan):
    route, _options, plan, _out = bench_plan
    assert route.backend == "triton" and route.evidence == "Recipe" and route.candidate_tag == TWO_STAGE.tag()
    assert [r.name for r in plan] == ["_fbank_split_kernel", "_fbank_cmn_kernel"]


def test_bench_shape_records_by_hand(bench_plan):
    _route, _options, plan, out = bench_plan
    assert out.shape == (32, 998, 80) and out.device.type == "meta"
    frames, cmn = plan
    tiles = math.ceil(998 / 64)
    assert frames.grid == (tiles, 32) and frames.num_warps == 8 and frames.unit == "tf32x3"
    # 512 = 16 x 32: stage 1 (2 x 16 x 16 x 32 per frame, cos and sin), twiddle (6 x 16 x 32), stage 2
    # (4 x 2 x 16 x 32 x 16), power (3 x 256), mel (2 x 256 x (64 + 16)), over 64-frame tiles
    per_frame = 2 * 2 * 16 * 16 * 32 + 6 * 16 * 32 + 4 * 2 * 16 * 32 * 16 + 3 * 256 + 2 * 256 * 80
    padded_frames = 32 * tiles * 64
    assert frames.flops == padded_frames * per_frame
    scratch = padded_frames * 256 * 4   # the spectra, written and read back
    constants = 400 * 4 + (2 * 16 * 16 + 2 * 16 * 32 + 3 * 16 * 32 + 80 * 256) * 4
    groups = math.ceil(998 / 16) * 80 * 4 * 32
    assert frames.bytes_read == 32 * 160000 * 4 + constants + scratch
    assert frames.bytes_written == 32 * 998 * 80 * 4 + groups + scratch
    assert cmn.grid == (math.ceil(998 / 128), 32)
    assert cmn.bytes_read == 32 * 998 * 80 * 4 + groups and cmn.bytes_written == 32 * 998 * 80 * 4


def test_library_kernels_by_hand(bench_plan):
    """The torch fallback's eager ops at the bench shape, each with its bytes: what `fbank` launches."""
    route, _options, _plan, _out = bench_plan
    stated = torch_ref.library_kernels(route.request, H200)
    rows = 32 * 998
    assert [k.name for k in stated] == [
        "frame mean (DC offset)", "- mean", "pre-emphasis cat (replicate pad)", "pre-emphasis * coefficient",
        "pre-emphasis subtraction", "window multiply", "zero pad to the FFT size", "rfft (cuFFT R2C)",
        "abs (complex magnitude)", "pow(2)", stated[10].name, "torch.tensor(epsilon) to the device",
        "max(mel, eps)", "log", "mean over frames", "mean subtraction"]
    mean, subtract, cat, scale, emphasis, window, pad, rfft, magnitude, power, mel, eps, floor, log, cmn, cmn_sub = (
        stated)
    wave, frames = 32 * 160000 * 4, rows * 400 * 4
    # the first ops over the strided frames read each waveform sample once; the frames are 400 samples
    assert (mean.bytes_read, subtract.bytes_written) == (wave, frames)
    assert (cat.bytes_written, scale.bytes, emphasis.bytes_read, window.bytes_written) == (
        frames, 2 * frames, 2 * frames, frames)
    assert (pad.bytes_read, pad.bytes_written) == (frames, rows * 512 * 4)
    assert (rfft.bytes_read, rfft.bytes_written) == (rows * 512 * 4, rows * 257 * 8)
    assert (magnitude.bytes_read, magnitude.bytes_written, power.bytes) == (rows * 257 * 8, rows * 257 * 4,
                                                                             2 * rows * 257 * 4)
    assert mel.name.startswith("mel matmul (cuBLAS SGEMM, TF32 off)") and mel.unit == "fp32_fma"
    assert mel.flops >= 2 * rows * 257 * 80 and mel.bytes == (rows + 80) * 257 * 4 + rows * 80 * 4
    assert eps.bytes_read == 4 and floor.bytes == log.bytes == 2 * rows * 80 * 4
    assert cmn.bytes_read == rows * 80 * 4 and cmn_sub.bytes_written == rows * 80 * 4
    estimate = library_estimate(stated, H200)
    assert estimate["launches"] == 16
    # every elementwise kernel is bandwidth-bound, one launch each
    by_hand = sum(k.bytes for k in stated if k.flops < 1e8) / 4.3e12 * 1e6 + 16 * H200.launch_us
    memory_rows = [row for row, k in zip(estimate["kernels"], stated) if k.flops < 1e8]
    assert all(row["bound"] == "memory" for row in memory_rows)
    assert estimate["est_us"] > by_hand


@pytest.fixture(scope="module")
def bench_analysis(bench_plan, tmp_path_factory):
    _route, _options, plan, _out = bench_plan
    return analyse_plan(plan, H200, cache_dir=str(tmp_path_factory.mktemp("perf-cache")))


def test_the_two_stage_kernel_runs_on_tensor_cores_without_spilling(bench_analysis):
    frames, cmn = bench_analysis
    assert frames.mma > 0 and frames.spills == 0 and frames.ctas_per_sm >= 1
    assert cmn.spills == 0


def test_the_estimate_is_below_the_library_path_estimate(bench_plan, bench_analysis):
    route, _options, _plan, _out = bench_plan
    _floor_us, est_us, _bw = case_totals(bench_analysis, H200)
    library = library_estimate(torch_ref.library_kernels(route.request, H200), H200)
    # the two-stage kernel is issue-bound (one CTA of 8 warps per SM) but still under the library's 16 launches
    assert bench_analysis[0].bound == "issue"
    assert est_us < library["est_us"]


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
