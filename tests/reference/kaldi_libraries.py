"""The two Kaldi fbank implementations rt.fbank is checked against: torchaudio.compliance.kaldi and kaldi-native-fbank.

`make venv` installs both (torchaudio's files outside sys.path, without the torch release it pins: only
its pure-Python compliance module is used, see rlx_triton/_torchaudio.py). Where either is missing,
the tests that need it skip and say so.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from rlx_triton._torchaudio import kaldi_compliance
from tests.reference.fbank import DEFAULTS

kaldi = kaldi_compliance()
needs_torchaudio = pytest.mark.skipif(kaldi is None, reason="torchaudio is not installed (make venv installs it)")

HAS_KALDI_NATIVE_FBANK = importlib.util.find_spec("kaldi_native_fbank") is not None
needs_kaldi_native_fbank = pytest.mark.skipif(not HAS_KALDI_NATIVE_FBANK,
                                              reason="kaldi-native-fbank is not installed (make venv installs it)")

# torchaudio keyword -> (kaldi-native-fbank options group or None for the top level, attribute)
_KNF_OPTIONS = {
    "sample_frequency": ("frame_opts", "samp_freq"), "frame_shift": ("frame_opts", "frame_shift_ms"),
    "frame_length": ("frame_opts", "frame_length_ms"), "dither": ("frame_opts", "dither"),
    "preemphasis_coefficient": ("frame_opts", "preemph_coeff"),
    "remove_dc_offset": ("frame_opts", "remove_dc_offset"), "window_type": ("frame_opts", "window_type"),
    "round_to_power_of_two": ("frame_opts", "round_to_power_of_two"),
    "blackman_coeff": ("frame_opts", "blackman_coeff"), "snip_edges": ("frame_opts", "snip_edges"),
    "num_mel_bins": ("mel_opts", "num_bins"), "low_freq": ("mel_opts", "low_freq"),
    "high_freq": ("mel_opts", "high_freq"), "vtln_low": ("mel_opts", "vtln_low"),
    "vtln_high": ("mel_opts", "vtln_high"), "use_energy": (None, "use_energy"),
    "energy_floor": (None, "energy_floor"), "raw_energy": (None, "raw_energy"), "htk_compat": (None, "htk_compat"),
    "use_log_fbank": (None, "use_log_fbank"), "use_power": (None, "use_power"),
}
# torchaudio keywords kaldi-native-fbank has no option for, at the value that means "not used"
_KNF_ABSENT = {"channel": -1, "min_duration": 0.0, "subtract_mean": False, "vtln_warp": 1.0}


def knf_fbank(waveform: torch.Tensor, **kwargs) -> torch.Tensor:
    """kaldi-native-fbank's OnlineFbank over one (T,) waveform with torchaudio's keywords and defaults: (frames, bins)."""
    import kaldi_native_fbank as knf

    options = {**DEFAULTS, **kwargs}
    for name, unused in _KNF_ABSENT.items():
        value = options.pop(name)
        if value != unused:
            raise ValueError(f"kaldi-native-fbank has no option for {name}={value!r}")
    knf_options = knf.FbankOptions()
    for name, value in options.items():
        group, attribute = _KNF_OPTIONS[name]
        setattr(knf_options if group is None else getattr(knf_options, group), attribute, value)
    computer = knf.OnlineFbank(knf_options)
    computer.accept_waveform(float(options["sample_frequency"]), waveform.double().tolist())
    computer.input_finished()
    frames = [computer.get_frame(i) for i in range(computer.num_frames_ready)]
    return torch.from_numpy(np.stack(frames)).float()
