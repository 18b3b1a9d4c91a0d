"""rlx_triton.fbank, the public op: torchaudio's keywords and shapes, validation, routing, dtypes.

torchaudio's compliance.kaldi.fbank and kaldi-native-fbank are references as well (`make venv` installs
both; where one is missing, its tests skip).
"""
import inspect

import pytest
import torch

import rlx_triton as rt
from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.router import recording_routes
from tests.reference.fbank import (DEFAULTS, NO_SNIP, WESPEAKER_80, check_degenerate_fbank, fbank64, fbank64_batch,
                                   log_mel_error, rel_error, speech_like)
from tests.reference.kaldi_libraries import kaldi, knf_fbank, needs_kaldi_native_fbank, needs_torchaudio


TOL = 3e-5


def _speech(num_samples=1207, batch=1):
    return speech_like(num_samples, batch=batch).float()


# ----------------------------------------------------------------------------- signature

def test_keywords_and_defaults_are_torchaudios():
    params = inspect.signature(rt.fbank).parameters
    torchaudio_names = [name for name in params if name not in ("waveform", "input_scale")]
    assert torchaudio_names == sorted(DEFAULTS)  # torchaudio lists them alphabetically too
    assert {name: params[name].default for name in torchaudio_names} == DEFAULTS
    assert params["input_scale"].kind is inspect.Parameter.KEYWORD_ONLY


def test_options_are_frozen_and_hashable():
    a, b = FbankOptions(num_mel_bins=80), FbankOptions(num_mel_bins=80)
    assert a == b and hash(a) == hash(b)
    with pytest.raises(Exception):
        a.num_mel_bins = 40


# ----------------------------------------------------------------------------- shapes

def test_1d_waveform_gives_frames_by_bins():
    wave = _speech()[0]
    out = rt.fbank(wave)
    assert out.shape == (6, 23)
    assert rel_error(out, fbank64(wave)) <= TOL


def test_single_channel_2d_waveform_gives_what_torchaudio_gives():
    wave = _speech()
    out = rt.fbank(wave)
    assert out.shape == (6, 23)
    assert rel_error(out, fbank64(wave[0])) <= TOL


def test_2d_batch_gives_batch_by_frames_by_bins():
    wave = _speech(batch=3)
    out = rt.fbank(wave, num_mel_bins=40)
    assert out.shape == (3, 6, 40)
    assert rel_error(out, fbank64_batch(wave, num_mel_bins=40)) <= TOL


def test_channel_selects_one_row_like_torchaudio():
    wave = _speech(batch=3)
    out = rt.fbank(wave, channel=2)
    assert out.shape == (6, 23)
    assert rel_error(out, fbank64(wave[2])) <= TOL


def test_3d_input_is_vmap_of_torchaudio_over_the_batch():
    wave = _speech(batch=2)
    stereo = torch.stack([wave, wave.flip(0)], dim=1)  # (B=2, C=2, T)
    assert rel_error(rt.fbank(stereo), fbank64_batch(wave)) <= TOL  # channel -1 reads channel 0
    assert rel_error(rt.fbank(stereo, channel=1), fbank64_batch(wave.flip(0))) <= TOL
    assert rt.fbank(wave[:1].unsqueeze(1)).shape == (1, 6, 23)  # B = 1 keeps its batch dimension


def test_signal_shorter_than_min_duration_gives_an_empty_tensor():
    out = rt.fbank(_speech(), min_duration=1.0)
    assert out.numel() == 0 and out.dtype == torch.float32


def test_positional_options_follow_torchaudios_order():
    wave = _speech()[0]
    assert torch.equal(rt.fbank(wave, 0.42, -1, 0.0, 1.0, 25.0, 10.0, 0.0, False, 20.0, 0.0, 40),
                       rt.fbank(wave, num_mel_bins=40))


# ----------------------------------------------------------------------------- dtypes

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_gives_float32_features(dtype):
    wave = _speech().to(dtype)
    out = rt.fbank(wave, **NO_SNIP)
    assert out.dtype == torch.float32
    assert rel_error(out, fbank64_batch(wave.float(), **NO_SNIP)) <= TOL


def test_float64_input_gives_float64_features_from_the_torch_path():
    wave = _speech().double()
    assert rt.explain(rt.fbank, wave).backend == "torch"
    out = rt.fbank(wave)
    assert out.dtype == torch.float64
    assert rel_error(out, fbank64_batch(wave)) <= 1e-12


# ----------------------------------------------------------------------------- routing

def test_explain_names_triton_when_asked_for_it():
    wave = _speech()
    with rt.use_backend("triton"):
        assert rt.explain(rt.fbank, wave, num_mel_bins=80, window_type="hamming").backend == "triton"


def test_triton_and_torch_backends_agree_on_the_wespeaker_set():
    wave = _speech()
    kwargs = dict(WESPEAKER_80, subtract_mean=True, input_scale=32768.0)
    with rt.use_backend("triton", strict=True):
        kernel = rt.fbank(wave, **kwargs)
    with rt.use_backend("torch"):
        library = rt.fbank(wave, **kwargs)
    reference = fbank64_batch(wave, **kwargs)
    assert rel_error(kernel, reference) <= TOL and rel_error(library, reference) <= TOL


def test_log_mel_within_1e4_of_float64_under_the_triton_backend():
    wave = _speech(4007)
    with rt.use_backend("triton", strict=True):
        out = rt.fbank(wave)
    assert log_mel_error(out, fbank64_batch(wave)) <= 1e-4


def test_dither_routes_to_torch_and_is_random_like_torchaudio():
    wave = _speech()
    route = rt.explain(rt.fbank, wave, dither=1.0)
    assert route.backend == "torch" and "dither" in str(route.skipped_reasons.get("triton"))
    first, second = rt.fbank(wave, dither=1.0), rt.fbank(wave, dither=1.0)
    assert first.shape == second.shape and not torch.equal(first, second)


def test_autograd_routes_to_torch_and_gives_a_gradient():
    wave = _speech().requires_grad_()
    assert rt.explain(rt.fbank, wave).backend == "torch"
    rt.fbank(wave).sum().backward()
    assert wave.grad is not None and torch.isfinite(wave.grad).all()


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("wave_name", ["silence", "single_frame", "nan_sample", "inf_sample"])
def test_degenerate_waveforms_give_torchaudios_values_on_both_paths(wave_name, backend):
    """A NaN or Inf sample gives NaN in the frames that hold it (all frames after CMN), as torchaudio."""
    def launch(wave, kwargs):
        with rt.use_backend(backend, strict=backend != "torch"):
            return rt.fbank(wave[:, None], **kwargs)  # (B, C, T): the output keeps its batch dimension

    check_degenerate_fbank(launch, "wespeaker_cmn", wave_name, tol=TOL)
    check_degenerate_fbank(launch, "windowed_energy", wave_name, tol=TOL)


def test_nan_sample_with_dither_gives_nan_frames_on_the_torch_path():
    wave = _speech(1207)
    wave[0, 600] = float("nan")
    out = rt.fbank(wave, dither=1.0)
    assert torch.equal(out.isnan().any(-1), fbank64(wave[0].double()).isnan().any(-1))


@pytest.mark.parametrize("make_call", [
    lambda: rt.fbank(_speech(1207), min_duration=1.0),      # shorter than min_duration: empty
    lambda: rt.fbank(torch.zeros(0, 1207)),                  # no rows: empty
], ids=["too-short", "empty-batch"])
def test_empty_results_are_routed_like_every_call(make_call):
    with rt.use_backend("triton", strict=True), recording_routes() as routes:
        out = make_call()
    assert out.numel() == 0 and [route.backend for route in routes] == ["triton"]


def test_strict_mode_refuses_float64_even_when_the_result_is_empty():
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel, match="dtype float64"):
        rt.fbank(_speech(1207).double(), min_duration=1.0)


def test_strict_triton_raises_missing_kernel_for_dither():
    with rt.use_backend("triton", strict=True), pytest.raises(rt.MissingKernel):
        rt.fbank(_speech(), dither=0.5)


# ----------------------------------------------------------------------------- validation

BAD_OPTIONS = [
    ("window_type", dict(window_type="kaiser")),
    ("sample_frequency", dict(sample_frequency=0.0)),
    ("frame_shift", dict(frame_shift=0.01)),
    ("frame_length", dict(frame_length=0.05)),
    ("frame_length", dict(frame_length=25.0625, round_to_power_of_two=False)),  # 401: odd FFT size
    ("preemphasis_coefficient", dict(preemphasis_coefficient=1.5)),
    ("num_mel_bins", dict(num_mel_bins=3)),
    ("num_mel_bins", dict(num_mel_bins=23.0)),
    ("channel", dict(channel=-2)),
    ("dither", dict(dither=-1.0)),
    ("energy_floor", dict(energy_floor=-1.0)),
    ("min_duration", dict(min_duration=-1.0)),
    ("low_freq", dict(low_freq=8000.0)),
    ("high_freq", dict(high_freq=9000.0)),
    ("high_freq", dict(low_freq=4000.0, high_freq=3000.0)),
    ("vtln_warp", dict(vtln_warp=0.0)),
    ("vtln_low", dict(vtln_warp=1.1, vtln_low=10.0)),
    ("vtln_high", dict(vtln_warp=1.1, vtln_high=8500.0)),
    ("snip_edges", dict(snip_edges="yes")),
    ("use_energy", dict(use_energy=1)),
    ("blackman_coeff", dict(blackman_coeff=float("nan"))),
    ("input_scale", dict(input_scale=float("inf"))),
]


@pytest.mark.parametrize("option,kwargs", BAD_OPTIONS, ids=[f"{o}:{k}" for o, k in BAD_OPTIONS])
def test_bad_option_raises_value_error_naming_it(option, kwargs):
    with pytest.raises(ValueError, match=option):
        rt.fbank(_speech(), **kwargs)


def test_waveform_shorter_than_one_frame_raises_value_error():
    with pytest.raises(ValueError, match="waveform"):
        rt.fbank(torch.zeros(399))


def test_channel_out_of_range_raises_value_error():
    with pytest.raises(ValueError, match="channel"):
        rt.fbank(_speech(batch=2), channel=2)


def test_waveform_must_be_a_float_tensor_of_one_to_three_dims():
    with pytest.raises(TypeError, match="waveform"):
        rt.fbank([0.0] * 800)
    with pytest.raises(TypeError, match="waveform"):
        rt.fbank(torch.zeros(800, dtype=torch.int16))
    with pytest.raises(ValueError, match="waveform"):
        rt.fbank(torch.zeros(1, 1, 1, 800))


def test_unknown_keyword_raises_type_error():
    with pytest.raises(TypeError):
        rt.fbank(_speech(), num_mel_bin=80)


def test_validation_happens_before_routing_in_explain():
    with pytest.raises(ValueError, match="num_mel_bins"):
        rt.explain(rt.fbank, _speech(), num_mel_bins=2)


# ----------------------------------------------------------------------------- torchaudio and kaldi-native-fbank

LIBRARY_OPTION_SETS = pytest.mark.parametrize(
    "kwargs", [{}, dict(WESPEAKER_80), NO_SNIP, dict(use_energy=True, htk_compat=True)],
    ids=["povey23", "wespeaker80", "no_snip", "energy_htk"])


@needs_torchaudio
@LIBRARY_OPTION_SETS
def test_matches_torchaudio_kaldi_fbank(kwargs):
    wave = _speech(4007, batch=1)
    expected = kaldi.fbank(wave, **kwargs)
    with rt.use_backend("triton", strict=True):
        out = rt.fbank(wave, **kwargs)
    # both are float32 computations; their gap is bounded by torchaudio's own float32 error (see the report)
    assert (out - expected).abs().max().item() <= 2e-4


@needs_torchaudio
def test_matches_torchaudio_vmapped_over_a_batch_as_pyannote_calls_it():
    waves = _speech(4007, batch=3).unsqueeze(1) * 32768
    expected = torch.vmap(lambda w: kaldi.fbank(w, **WESPEAKER_80))(waves)
    with rt.use_backend("triton", strict=True):
        out = rt.fbank(waves, **WESPEAKER_80)
    assert (out - expected).abs().max().item() <= 2e-4


@needs_kaldi_native_fbank
@LIBRARY_OPTION_SETS
def test_matches_kaldi_native_fbank(kwargs):
    wave = _speech(4007, batch=1)
    expected = knf_fbank(wave[0], **kwargs)
    with rt.use_backend("triton", strict=True):
        out = rt.fbank(wave, **kwargs)
    # both are float32 computations (kaldi-native-fbank with its own FFT), as against torchaudio above
    assert (out - expected).abs().max().item() <= 2e-4
