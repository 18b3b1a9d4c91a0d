"""rlx_triton.nn.Fbank: the module form of rlx_triton.fbank, and pyannote's WeSpeaker front end."""
import contextlib

import pytest
import torch

import rlx_triton as rt
from tests.reference.fbank import WESPEAKER_80, fbank64_batch, rel_error, speech_like

TOL = 3e-5


def _pyannote_compute_fbank64(waveforms: torch.Tensor) -> torch.Tensor:
    """BaseWeSpeakerResNet.compute_fbank in float64: x (1 << 15), vmap(kaldi.fbank), minus the mean over frames."""
    features = fbank64_batch(waveforms[:, 0] * (1 << 15), **WESPEAKER_80)
    return features - features.mean(dim=1, keepdim=True)


def test_wespeaker_front_end_matches_pyannotes_compute_fbank():
    waves = speech_like(4007, batch=2).float().unsqueeze(1)  # (B, 1, T) as pyannote passes them
    with rt.use_backend("triton", strict=True):
        out = rt.nn.Fbank.wespeaker()(waves)
    assert out.shape == (2, 23, 80)
    assert rel_error(out, _pyannote_compute_fbank64(waves)) <= TOL


def test_batch_of_one_keeps_its_batch_dimension():
    waves = speech_like(1207, batch=1).float()
    assert rt.nn.Fbank()(waves).shape == (1, 6, 23)
    assert rt.nn.Fbank()(waves.unsqueeze(1)).shape == (1, 6, 23)


def test_1d_waveform_gives_frames_by_bins():
    assert rt.nn.Fbank(num_mel_bins=40)(speech_like(1207).float()[0]).shape == (6, 40)


def test_constructor_keywords_mirror_the_options():
    module = rt.nn.Fbank(num_mel_bins=64, window_type="hanning", use_energy=True, htk_compat=True)
    assert module.options.num_mel_bins == 64 and module.options.window_type == "hanning"
    assert module.num_features == 65
    assert "num_mel_bins=64" in repr(module) and "window_type='hanning'" in repr(module)


def test_bad_option_fails_at_construction_naming_it():
    with pytest.raises(ValueError, match="num_mel_bins"):
        rt.nn.Fbank(num_mel_bins=2)


def test_module_has_no_parameters():
    assert list(rt.nn.Fbank.wespeaker().parameters()) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("run_mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize("built", ["outside", "inside"], ids=["built_outside", "built_in_inference_mode"])
def test_wespeaker_front_end_in_inference_and_no_grad_mode(built, run_mode, dtype):
    """float32 runs the kernel, float64 runs torch and returns float64, whichever mode built the module."""
    with torch.inference_mode() if built == "inside" else contextlib.nullcontext():
        front_end = rt.nn.Fbank.wespeaker()
    waves = speech_like(560, batch=1).to(dtype).unsqueeze(1)
    with run_mode(), rt.use_backend("triton", strict=dtype == torch.float32):
        out = front_end(waves)
    assert out.dtype == dtype
    assert rel_error(out, _pyannote_compute_fbank64(waves.double())) <= (TOL if dtype == torch.float32 else 1e-9)
