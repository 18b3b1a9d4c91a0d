"""The fused fbank kernels (backends/triton/fbank/) against the float64 reference, in the interpreter.

Both frames kernels are checked: the dense DFT (ieee candidates, and DFT sizes the two-stage DFT does not
factor) and the two-stage DFT on tensor cores (tf32x3 candidates), the latter with the interpreter's dots
rounded as tensor cores round "tf32x3" (tests/reference/tensor_cores.py). Each option of torchaudio's
kaldi.fbank gets one case on a speech-like signal on each kernel; the model option sets (23-bin povey
defaults, 80-bin WeSpeaker, snip_edges=False) get odd lengths and batches; silence, DC, one frame and
NaN / Inf samples on each kernel; one sweep runs every candidate of the plan and re-measures its accuracy
approval; the audit specs compile; GPU-marked tests run both kernels on CUDA.
"""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import fbank as tk
from rlx_triton.backends.triton import launches
from rlx_triton.planner.candidates.fbank import DEFAULT_VARIANT, FbankVariant
from tests.reference.fbank import (DEGENERATE_OPTIONS, DEGENERATE_WAVES, EPS, NO_SNIP, POVEY_23, WESPEAKER_80,
                                   check_degenerate_fbank, fbank64_batch, log_mel_error, rel_error, speech_like)
from tests.reference.tensor_cores import emulated_tensor_cores, tf32, tf32x3_matmul

DEFAULT = DEFAULT_VARIANT.candidate()  # ieee: the dense DFT
TWO_STAGE = FbankVariant.TF32X3_F64_Q32.candidate()  # the sm_80 / sm_90 recipe: the two-stage DFT
KERNELS = {"dense": DEFAULT, "two_stage": TWO_STAGE}
# a 134-point DFT (2 x 67) does not factor for the two-stage kernel: tf32x3 candidates run the dense DFT there
UNFACTORED = dict(sample_frequency=8000.0, frame_length=16.75, round_to_power_of_two=False)
FP32_TOL = 3e-5  # relative (|d| / max(|ref|, 1)); measured <= 1.2e-5 on these signals
WESPEAKER = dict(WESPEAKER_80, input_scale=32768.0, subtract_mean=True)

# one case per option of torchaudio.compliance.kaldi.fbank (dither: tests/ops, it routes to torch),
# at 8 kHz (200-sample frames, 256-point DFT) to keep the interpreter quick; the model option sets
# below run at their real 16 kHz sizes
OPTION_CASES = {
    "povey_defaults": {},
    "hamming": dict(window_type="hamming"),
    "hanning": dict(window_type="hanning"),
    "rectangular": dict(window_type="rectangular"),
    "blackman_coeff": dict(window_type="blackman", blackman_coeff=0.40),
    "snip_edges_false": dict(snip_edges=False),
    "snip_edges_false_shift_over_frame": dict(snip_edges=False, frame_length=10.0, frame_shift=25.0),
    "use_energy_raw": dict(use_energy=True),
    "use_energy_windowed": dict(use_energy=True, raw_energy=False),
    "htk_compat": dict(use_energy=True, htk_compat=True),
    "energy_floor_off": dict(use_energy=True, energy_floor=0.0),
    "energy_floor_2": dict(use_energy=True, energy_floor=2.0),
    "magnitude": dict(use_power=False),
    "linear_fbank": dict(use_log_fbank=False),
    "no_dc_removal": dict(remove_dc_offset=False),
    "no_preemphasis": dict(preemphasis_coefficient=0.0),
    "full_preemphasis": dict(preemphasis_coefficient=1.0),
    "no_power_of_two": dict(round_to_power_of_two=False),
    "frame_length_shift": dict(frame_length=20.0, frame_shift=12.5),
    "sample_frequency_16k": dict(sample_frequency=16000.0),
    "low_high_freq": dict(low_freq=64.0, high_freq=-400.0),
    "high_freq_absolute": dict(high_freq=3500.0),
    "vtln_warp_down": dict(vtln_warp=0.9),
    "vtln_low_high": dict(vtln_warp=1.1, vtln_low=200.0, vtln_high=3000.0),
    "subtract_mean": dict(subtract_mean=True),
    "num_mel_bins_128": dict(num_mel_bins=128),
    "input_scale": dict(input_scale=32768.0),
    "min_duration_met": dict(min_duration=0.1),
}


def _run(wave, candidate=DEFAULT, **kwargs):
    with emulated_tensor_cores():
        return tk.fbank(wave, FbankOptions(**kwargs), candidate=candidate)


def _kernel_that_runs(candidate, **kwargs) -> str:
    plan, _ = tk.fbank_plan(torch.empty(1, 4000, device="meta"), FbankOptions(**kwargs), candidate=candidate)
    return plan[0].name


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_each_option_matches_float64(case, kernel):
    kwargs = dict(dict(sample_frequency=8000.0), **OPTION_CASES[case])
    assert _kernel_that_runs(KERNELS[kernel], **kwargs) == (
        "_fbank_split_kernel" if kernel == "two_stage" else "_fbank_frames_kernel")
    wave = speech_like(1207, batch=1, sample_rate=kwargs["sample_frequency"]).float()
    out = _run(wave, KERNELS[kernel], **kwargs)
    ref = fbank64_batch(wave, **kwargs)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert rel_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("kwargs", [POVEY_23, WESPEAKER, NO_SNIP], ids=["povey23", "wespeaker80", "no_snip"])
@pytest.mark.parametrize("num_samples", [401, 4007])
def test_model_option_sets_on_odd_lengths(kwargs, num_samples, kernel):
    wave = speech_like(num_samples, batch=1).float()
    out = _run(wave, KERNELS[kernel], **kwargs)
    ref = fbank64_batch(wave, **kwargs)
    assert out.shape == ref.shape
    assert rel_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("num_frames", [1, 7, 80, 333])
def test_two_stage_tiles_cover_any_number_of_frames(num_frames):
    """The 64-frame tile runs its DFT in steps of a few frames; a tile with 1, 7, 80 or 333 frames (partial
    steps and tiles) gives the reference's features, CMN over exactly those frames included."""
    kwargs = dict(WESPEAKER, sample_frequency=8000.0)
    options = FbankOptions(**kwargs)
    wave = speech_like(options.window_size + (num_frames - 1) * options.window_shift, batch=1,
                       sample_rate=8000.0).float()
    out = _run(wave, TWO_STAGE, **kwargs)
    assert out.shape == (1, num_frames, 80)
    assert rel_error(out, fbank64_batch(wave, **kwargs)) <= FP32_TOL


@pytest.mark.parametrize("dft_size, factors", [(512, (16, 32)), (256, (16, 16)), (1024, (16, 64)), (400, (16, 25)),
                                               (200, (8, 25)), (320, (16, 20)), (16, (8, 2)), (2, (2, 1)),
                                               (134, None), (2048, None)])
def test_split_factors(dft_size, factors):
    """N = N1 x N2 with N1 <= 16 and N2 <= 64, the least padded work first; None: the dense DFT runs."""
    assert tk.split_factors(dft_size) == factors


def test_ieee_candidates_and_unfactored_sizes_run_the_dense_dft():
    assert _kernel_that_runs(DEFAULT, **WESPEAKER) == "_fbank_frames_kernel"
    assert _kernel_that_runs(TWO_STAGE, **WESPEAKER) == "_fbank_split_kernel"
    assert _kernel_that_runs(TWO_STAGE, **UNFACTORED) == "_fbank_frames_kernel"


def test_log_mel_agrees_within_1e4_on_speech_with_povey_defaults():
    wave = speech_like(4007, batch=1).float()
    assert log_mel_error(_run(wave), fbank64_batch(wave)) <= 1e-4


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_each_batch_row_is_featurized_independently(kernel):
    wave = speech_like(807, batch=3, sample_rate=8000.0).float()
    kwargs = dict(NO_SNIP, sample_frequency=8000.0)
    batched = _run(wave, KERNELS[kernel], **kwargs)
    for row in range(3):
        alone = _run(wave[row:row + 1], KERNELS[kernel], **kwargs)
        assert torch.allclose(batched[row], alone[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_silence_hits_the_log_floor_and_the_energy_floor(kernel):
    out = _run(torch.zeros(1, 400), KERNELS[kernel], use_energy=True, sample_frequency=8000.0)
    assert torch.all(out[..., 1:] == torch.log(torch.tensor(EPS)))
    assert torch.all(out[..., 0] == 0.0)  # log(max(eps, 0)) floored at log(energy_floor=1)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_degenerate_waveforms_match_float64(options, wave_name, kernel):
    """Silence, DC, one frame, and a NaN / Inf sample: NaN in exactly the frames torchaudio makes NaN
    (the log floors keep NaN; with CMN the whole column, as torchaudio's mean), the reference's values
    everywhere else."""
    check_degenerate_fbank(lambda wave, kwargs: _run(wave, KERNELS[kernel], **kwargs), options, wave_name,
                           tol=FP32_TOL)


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_waveforms_are_read_and_featurized_in_float32(dtype, kernel):
    wave = speech_like(1207, batch=1).to(dtype)
    out = _run(wave, KERNELS[kernel], **WESPEAKER)
    assert out.dtype == torch.float32
    assert rel_error(out, fbank64_batch(wave.float(), **WESPEAKER)) <= FP32_TOL


def test_dither_is_refused_by_the_kernel():
    with pytest.raises(ValueError, match="dither"):
        _run(torch.zeros(1, 800), dither=1.0)


def test_plain_tf32_is_never_a_kernel_precision():
    tf32 = SimpleNamespace(tile_frames=16, tile_freq=32, tg_size=64, stages=2, precision="tf32")
    with pytest.raises(ValueError, match="precision"):
        _run(torch.zeros(1, 800), candidate=tf32)


def test_every_candidate_runs_and_holds_its_approval():
    """The sweep: every candidate of the plan runs on the approval option sets (80-bin WeSpeaker over
    69 frames, so every tile_frames gets two or more tiles; 40-bin snip_edges=False with energy; 23 bins
    at a 134-point DFT, where tf32x3 candidates run the dense DFT), with the dots rounded as tensor cores
    round them, and its measured error stays within its approval's max_rel_err (every candidate is
    approved)."""
    long_wave, short_wave = speech_like(11207, batch=1).float(), speech_like(4007, batch=1).float()
    unfactored_wave = speech_like(2007, batch=2, sample_rate=8000.0).float()
    cases = [(long_wave, WESPEAKER), (short_wave, dict(NO_SNIP, use_energy=True)),
             (unfactored_wave, dict(UNFACTORED, use_energy=True, subtract_mean=True))]
    refs = [fbank64_batch(wave, **kwargs) for wave, kwargs in cases]
    assert set(tk.APPROVALS) == {variant.candidate().tag() for variant in FbankVariant}
    for variant in FbankVariant:
        candidate = variant.candidate()
        worst = max(rel_error(_run(wave, candidate=candidate, **kwargs), ref)
                    for (wave, kwargs), ref in zip(cases, refs))
        assert worst <= tk.APPROVALS[candidate.tag()].max_rel_err, (variant.name, worst)


def test_coverage_sends_dither_and_autograd_to_torch():
    assert tk.COVERAGE.features["dither"] == frozenset({False})
    assert tk.COVERAGE.features["requires_grad"] == frozenset({False})
    assert "float64" not in tk.COVERAGE.dtypes


def test_routed_calls_run_the_two_stage_kernel_through_the_autotune_bridge():
    """With the router's route the two-stage launch is a record of the autotune bridge carrying the route
    (the routed candidate is injected, nothing is tuned in the interpreter); the features are those of the
    direct launch."""
    from types import SimpleNamespace as Route

    wave = speech_like(1607, batch=2).float()
    options = FbankOptions(**WESPEAKER)
    route = Route(candidate=TWO_STAGE, evidence="Recipe", family="fbank", tune_key=None)
    plan, _ = tk.fbank_plan(wave, options, candidate=TWO_STAGE, route=route)
    assert plan[0].route is route and plan[0].kernel is tk.tuned_split_kernel()
    assert plan[0].grid == (1, 2) and plan[0].meta["BLOCK_F"] == 64
    with emulated_tensor_cores(), launches.recording() as log:
        routed = tk.fbank(wave, options, candidate=TWO_STAGE, route=route)
    assert log.outside == [] and [r.name for r in log.records] == ["_fbank_split_kernel", "_fbank_cmn_kernel"]
    torch.testing.assert_close(routed, _run(wave, TWO_STAGE, **WESPEAKER), rtol=0, atol=0)


def test_the_tensor_core_emulation_rounds_as_tf32x3():
    """The interpreter's "tf32x3" dot under emulated_tensor_cores: operands carried to about 2^-22 (three
    TF32 products), far closer than plain TF32 and not as close as float32."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 64, generator=gen), torch.randn(64, 16, generator=gen)
    exact = a.double() @ b.double()
    scale = (a.double().abs() @ b.double().abs()).max().item()
    three = torch.from_numpy(tf32x3_matmul(a.numpy(), b.numpy(), torch.zeros(32, 16).numpy()))
    one = torch.from_numpy(tf32(a.numpy())).double() @ torch.from_numpy(tf32(b.numpy())).double()
    assert 1e-8 < (three.double() - exact).abs().max().item() / scale < 2e-6
    assert (one - exact).abs().max().item() / scale > 1e-4
    assert torch.isinf(torch.from_numpy(tf32(torch.tensor([float("inf")]).numpy()))).all()


def test_audit_spec_compiles_the_default_candidate_for_sm90():
    """The kernel lowers to PTX/cubin for Hopper without a GPU (in a process without the interpreter)."""
    code = (
        "from rlx_triton.backends.triton import fbank as tk\n"
        "from rlx_triton.backends.triton.audit import compile_spec\n"
        "for spec in tk.AUDIT_KERNELS:\n"
        "    compile_spec(spec, spec.default, 'fp32', arch=90)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_kernel_is_at_least_as_close_to_float64_as_torchaudios_float32_algorithm():
    """On the 80-bin WeSpeaker set the narrow low mel bins are where float32 loses digits; the kernel's
    hi/lo basis and cancellation-free pre-emphasis keep it within the torch (torchaudio) path's error."""
    from rlx_triton.backends.torch_ref import fbank as torch_ref

    wave = speech_like(4007, batch=1).float()
    kwargs = dict(WESPEAKER_80, input_scale=32768.0)
    ref = fbank64_batch(wave, **kwargs)
    library = torch_ref.fbank(wave, FbankOptions(**kwargs))
    assert log_mel_error(_run(wave, **kwargs), ref) <= log_mel_error(library, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(FbankVariant), ids=lambda v: v.name)
def test_gpu_wespeaker_front_end_on_ten_second_chunks_matches_float64(variant):
    """Every candidate on CUDA: the tf32x3 ones run the two-stage DFT on tensor cores, the ieee ones the dense DFT."""
    wave = speech_like(160000, batch=4)
    out = tk.fbank(wave.float().cuda(), FbankOptions(**WESPEAKER), candidate=variant.candidate())
    assert out.shape == (4, 998, 80)
    assert rel_error(out.cpu(), fbank64_batch(wave.float(), **WESPEAKER)) <= FP32_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_gpu_two_stage_degenerate_waveforms_match_float64(options, wave_name):
    check_degenerate_fbank(lambda wave, kwargs: tk.fbank(wave.cuda(), FbankOptions(**kwargs),
                                                         candidate=TWO_STAGE).cpu(), options, wave_name, tol=FP32_TOL)


@pytest.mark.gpu
def test_gpu_routed_front_end_runs_the_recipe_on_tensor_cores():
    """On an sm_80 / sm_90 GPU the WeSpeaker front end routes to the tf32x3 recipe (the two-stage kernel)
    and matches float64 over 10 s chunks."""
    import rlx_triton as rt

    wave = speech_like(160000, batch=2).float()
    waves = wave.cuda().unsqueeze(1)
    route = rt.explain(rt.fbank, waves, **WESPEAKER_80, subtract_mean=True, input_scale=32768.0)
    if torch.cuda.get_device_capability()[0] >= 8:
        assert route.backend == "triton" and route.candidate_tag == TWO_STAGE.tag()
    with launches.recording() as log:
        out = rt.nn.Fbank.wespeaker()(waves)
    assert log.records and log.records[0].name == ("_fbank_split_kernel" if route.candidate.precision == "tf32x3"
                                                   else "_fbank_frames_kernel")
    assert rel_error(out.cpu(), fbank64_batch(wave, **WESPEAKER)) <= FP32_TOL
