"""The torch fallback of fbank (backends/torch_ref/fbank.py): torchaudio's algorithm, batched, in float32.

Also the per-option-set constants every backend shares: the mel matrix and window, built exactly as
torchaudio builds them and cached.
"""
import math

import pytest
import torch

from rlx_triton.backends.torch_ref import fbank as ref
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from tests.reference.fbank import (DEGENERATE_OPTIONS, DEGENERATE_WAVES, NO_SNIP, WESPEAKER_80, assert_features_match,
                                   check_degenerate_fbank, degenerate_wave, fbank64, fbank64_batch, mel_weights,
                                   rel_error, speech_like)
from tests.reference.kaldi_libraries import kaldi, knf_fbank, needs_kaldi_native_fbank, needs_torchaudio


TOL = 3e-5

OPTION_SETS = {
    "povey23": {},
    "wespeaker80": dict(WESPEAKER_80, input_scale=32768.0, subtract_mean=True),
    "no_snip": NO_SNIP,
    "no_snip_shift_over_frame": dict(snip_edges=False, frame_length=10.0, frame_shift=25.0),
    "energy_htk_windowed": dict(use_energy=True, htk_compat=True, raw_energy=False, energy_floor=0.0),
    "magnitude_linear": dict(use_power=False, use_log_fbank=False),
    "blackman_no_pow2": dict(window_type="blackman", round_to_power_of_two=False, preemphasis_coefficient=0.0),
    "vtln": dict(vtln_warp=1.1, vtln_low=200.0, vtln_high=6000.0, remove_dc_offset=False),
}


@pytest.mark.parametrize("name", sorted(OPTION_SETS))
@pytest.mark.parametrize("num_samples", [401, 4007])
def test_matches_float64_reference(name, num_samples):
    kwargs = OPTION_SETS[name]
    wave = speech_like(num_samples, batch=2).float()
    out = ref.fbank(wave, FbankOptions(**kwargs))
    assert out.dtype == torch.float32
    assert rel_error(out, fbank64_batch(wave, **kwargs)) <= TOL


def test_float64_waveform_computes_in_float64():
    wave = speech_like(4007, batch=2)
    out = ref.fbank(wave, FbankOptions(num_mel_bins=80))
    assert out.dtype == torch.float64
    assert rel_error(out, fbank64_batch(wave, num_mel_bins=80)) <= 1e-12


def test_silence_gives_the_log_floor():
    out = ref.fbank(torch.zeros(1, 800), FbankOptions())
    assert torch.all(out == math.log(torch.finfo(torch.float32).eps))


def test_mel_matrix_is_torchaudios_float32_definition():
    options = FbankOptions(num_mel_bins=80)
    weights = ref.mel_banks(options)
    assert weights.dtype == torch.float32 and weights.shape == (80, 256)
    assert torch.equal(weights.double(), mel_weights(dict(options.__dict__), 512)[:, :256])


def test_window_and_mel_matrix_are_cached_per_option_set():
    options = FbankOptions(num_mel_bins=40, window_type="hamming")
    assert ref.mel_banks(options) is ref.mel_banks(FbankOptions(num_mel_bins=40, window_type="hamming"))
    assert ref.window_function(options) is ref.window_function(FbankOptions(num_mel_bins=40, window_type="hamming"))


def test_snip_edges_false_reflects_kaldi_style():
    options = FbankOptions(snip_edges=False, frame_length=1.0, frame_shift=0.5, sample_frequency=4000.0)
    wave = torch.arange(10, dtype=torch.float32).unsqueeze(0)  # window 4, shift 2, reflect pad 1
    frames = ref.frame_waveform(wave, options)
    assert frames.shape == (1, 5, 4)
    assert frames[0, 0].tolist() == [0.0, 0.0, 1.0, 2.0]
    assert frames[0, -1].tolist() == [7.0, 8.0, 9.0, 9.0]


def test_dither_adds_noise_per_frame_sample():
    wave = speech_like(4007, batch=1).float()
    options = FbankOptions(dither=1.0)
    assert not torch.equal(ref.fbank(wave, options), ref.fbank(wave, options))


@needs_torchaudio
@pytest.mark.parametrize("name", sorted(OPTION_SETS))
def test_matches_torchaudio(name):
    kwargs = dict(OPTION_SETS[name])
    scale = kwargs.pop("input_scale", 1.0)
    wave = speech_like(4007, batch=1).float()
    expected = kaldi.fbank(wave * scale, **kwargs)
    out = ref.fbank(wave, FbankOptions(input_scale=scale, **kwargs))[0]
    assert (out - expected).abs().max().item() <= 1e-5 * max(1.0, expected.abs().max().item())


# kaldi-native-fbank has no VTLN warp option
KNF_OPTION_SETS = sorted(set(OPTION_SETS) - {"vtln"})


@needs_kaldi_native_fbank
@pytest.mark.parametrize("name", KNF_OPTION_SETS)
def test_matches_kaldi_native_fbank(name):
    kwargs = dict(OPTION_SETS[name])
    scale = kwargs.pop("input_scale", 1.0)
    subtract_mean = kwargs.pop("subtract_mean", False)
    wave = speech_like(4007, batch=1).float()
    expected = knf_fbank(wave[0] * scale, **kwargs)
    if subtract_mean:  # a torchaudio option that kaldi-native-fbank leaves to its caller
        expected = expected - expected.mean(dim=0, keepdim=True)
    out = ref.fbank(wave, FbankOptions(input_scale=scale, subtract_mean=subtract_mean, **kwargs))[0]
    # kaldi-native-fbank computes in float32 with its own FFT: up to ~5e-5 from the float64 reference
    assert (out - expected).abs().max().item() <= 2e-5 * max(1.0, expected.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_degenerate_waveforms_match_float64(options, wave_name, dtype):
    out = check_degenerate_fbank(lambda wave, kwargs: ref.fbank(wave, FbankOptions(**kwargs)), options, wave_name,
                                 tol=TOL if dtype == torch.float32 else 1e-10, dtype=dtype)
    assert out.dtype == dtype


@needs_torchaudio
@pytest.mark.parametrize("wave_name", DEGENERATE_WAVES)
@pytest.mark.parametrize("options", sorted(DEGENERATE_OPTIONS))
def test_reference_puts_nan_and_inf_where_torchaudio_does(options, wave_name):
    kwargs = dict(DEGENERATE_OPTIONS[options])
    scale = kwargs.pop("input_scale", 1.0)
    wave = degenerate_wave(wave_name)
    expected = kaldi.fbank((wave * scale).float(), **kwargs)  # float32: values within its rounding
    assert_features_match(expected, fbank64(wave[0], scale, **kwargs), 2e-4)
