"""The fused fbank kernel (backends/triton/fbank.py) against the float64 reference, in the interpreter.

Each option of torchaudio's kaldi.fbank gets one case on a speech-like signal; the model option sets
(23-bin povey defaults, 80-bin WeSpeaker, snip_edges=False) get odd lengths and batches; one sweep
runs every candidate of the plan and re-measures its accuracy approval; the audit spec compiles.
"""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton import fbank as tk
from rlx_triton.planner.candidates.fbank import DEFAULT_VARIANT, FbankVariant
from tests.reference.fbank import (DEGENERATE_OPTIONS, DEGENERATE_WAVES, EPS, NO_SNIP, POVEY_23, WESPEAKER_80,
                                   check_degenerate_fbank, fbank64_batch, log_mel_error, rel_error, speech_like)

DEFAULT = DEFAULT_VARIANT.candidate()
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
    return tk.fbank(wave, FbankOptions(**kwargs), candidate=candidate)


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_each_option_matches_float64(case):
    kwargs = dict(dict(sample_frequency=8000.0), **OPTION_CASES[case])
    wave = speech_like(1207, batch=1, sample_rate=kwargs["sample_frequency"]).float()
    out = _run(wave, **kwargs)
    ref = fbank64_batch(wave, **kwargs)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert rel_error(out, ref) <= FP32_TOL


@pytest.mark.parametrize("kwargs", [POVEY_23, WESPEAKER, NO_SNIP], ids=["povey23", "wespeaker80", "no_snip"])
@pytest.mark.parametrize("num_samples", [401, 4007])
def test_model_option_sets_on_odd_lengths(kwargs, num_samples):
    wave = speech_like(num_samples, batch=1).float()
    out = _run(wave, **kwargs)
    ref = fbank64_batch(wave, **kwargs)
    assert out.shape == ref.shape
    assert rel_error(out, ref) <= FP32_TOL


def test_log_mel_agrees_within_1e4_on_speech_with_povey_defaults():
    wave = speech_like(4007, batch=1).float()
    assert log_mel_error(_run(wave), fbank64_batch(wave)) <= 1e-4


def test_each_batch_row_is_featurized_independently():
    wave = speech_like(807, batch=3, sample_rate=8000.0).float()
    kwargs = dict(NO_SNIP, sample_frequency=8000.0)
    batched = _run(wave, **kwargs)
    for row in range(3):
        alone = _run(wave[row:row + 1], **kwargs)
        assert torch.allclose(batched[row], alone[0], rtol=0, atol=1e-6)


def test_silence_hits_the_log_floor_and_the_energy_floor():
    out = _run(torch.zeros(1, 400), use_energy=True, sample_frequency=8000.0)
    assert torch.all(out[..., 1:] == torch.log(torch.tensor(EPS)))
    assert torch.all(out[..., 0] == 0.0)  # log(max(eps, 0)) floored at log(energy_floor=1)


@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_degenerate_waveforms_match_float64(options, wave_name):
    """Silence, DC, one frame, and a NaN / Inf sample: NaN in exactly the frames torchaudio makes NaN
    (the log floors keep NaN), the reference's values everywhere else."""
    check_degenerate_fbank(lambda wave, kwargs: _run(wave, **kwargs), options, wave_name, tol=FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_waveforms_are_read_and_featurized_in_float32(dtype):
    wave = speech_like(1207, batch=1).to(dtype)
    out = _run(wave, **WESPEAKER)
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
    69 frames, so every tile_frames gets two or more tiles; 40-bin snip_edges=False with energy), and
    its measured error stays within its approval's max_rel_err (every candidate is approved)."""
    long_wave, short_wave = speech_like(11207, batch=1).float(), speech_like(4007, batch=1).float()
    cases = [(long_wave, WESPEAKER), (short_wave, dict(NO_SNIP, use_energy=True))]
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
def test_gpu_wespeaker_front_end_on_ten_second_chunks_matches_float64():
    wave = speech_like(160000, batch=4)
    out = _run(wave.float().cuda(), **WESPEAKER)
    assert out.shape == (4, 998, 80)
    assert rel_error(out.cpu(), fbank64_batch(wave.float(), **WESPEAKER)) <= FP32_TOL
