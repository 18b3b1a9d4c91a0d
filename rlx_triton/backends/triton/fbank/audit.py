"""Fbank audit specs: what `rlx-triton audit` compiles for sm_80 / sm_90."""
from __future__ import annotations

from typing import Dict

from rlx_triton.backends.torch_ref.fbank import FbankOptions
from rlx_triton.backends.triton.audit import AuditSpec
from rlx_triton.backends.triton.fbank.kernels import _fbank_cmn_kernel, _fbank_frames_kernel, _fbank_split_kernel
from rlx_triton.backends.triton.fbank.launch import (CMN_BLOCK_F, CMN_BLOCK_G, CMN_STEP_F, _constexprs, _meta,
                                                     _split_constexprs, _split_meta)
from rlx_triton.planner.candidates.fbank import DEFAULT_VARIANT, FbankCandidate, FbankVariant

_AUDIT_OPTIONS = FbankOptions(num_mel_bins=80, window_type="hamming", input_scale=32768.0, subtract_mean=True)
_OPTION_CONSTEXPRS = ("WIN", "NUM_MEL", "MEL_COL0", "ENERGY_COL", "NUM_COLS", "SNIP_EDGES", "REMOVE_DC",
                      "PREEMPH", "RAW_ENERGY", "USE_ENERGY", "ENERGY_FLOOR", "USE_POWER", "USE_LOG", "SCALE_INPUT",
                      "PARTIALS", "PARTIAL_FRAMES")
_FRAMES_SIGNATURE = {
    "num_samples": "i32", "num_frames": "i32", "stride_wave_b": "i32", "stride_out_b": "i32", "stride_out_f": "i32",
    "stride_partial_b": "i32", "frame_shift": "i32", "reflect_pad": "i32",
    "input_scale": "fp32", "one_minus_preemph": "fp32", "log_energy_floor": "fp32",
}


def _audit_meta(candidate: FbankCandidate, dtype: str) -> Dict[str, object]:
    """The dense kernel at the WeSpeaker front end's options (80 bins, 400-sample hamming window)."""
    return dict(**_constexprs(_AUDIT_OPTIONS), **_meta(candidate, _AUDIT_OPTIONS))


def _audit_split_meta(candidate: FbankCandidate, dtype: str) -> Dict[str, object]:
    """The two-stage kernel at the WeSpeaker front end's options (512 = 16 x 32)."""
    return dict(**_split_constexprs(_AUDIT_OPTIONS), **_split_meta(candidate))


def _audit_kernels() -> list:
    candidates = tuple(variant.candidate() for variant in FbankVariant)
    split_candidates = tuple(c for c in candidates if c.precision == "tf32x3")
    return [AuditSpec(
        name="fbank_frames",
        family="fbank",
        kernel=_fbank_frames_kernel,
        signature={
            "wave_ptr": "*{dt}", "window_ptr": "*fp32", "basis_ptr": "*fp32", "melt_ptr": "*fp32", "out_ptr": "*fp32",
            "partial_ptr": "*fp32", **_FRAMES_SIGNATURE,
            **{name: "constexpr" for name in ("WIN_P", "WIN_CHUNK", "NFREQ_P", "MEL_P", "BLOCK_F", "BLOCK_K",
                                              "PRECISION")
               + _OPTION_CONSTEXPRS},
        },
        meta=_audit_meta,
        candidates=candidates,
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32", "fp16", "bf16"),
        expects_mma=lambda candidate, dtype: candidate.precision == "tf32x3",
    ), AuditSpec(
        name="fbank_split",
        family="fbank",
        kernel=_fbank_split_kernel,
        signature={
            "wave_ptr": "*{dt}", "window_ptr": "*fp32", "stage1_ptr": "*fp32", "twiddle_ptr": "*fp32",
            "stage2_ptr": "*fp32", "mel_ptr": "*fp32", "spectra_ptr": "*fp32", "out_ptr": "*fp32",
            "partial_ptr": "*fp32", **_FRAMES_SIGNATURE, "stride_spectra_b": "i32",
            "frames_bucket": "i32", "batch_bucket": "i32",
            **{name: "constexpr" for name in ("N1", "N2", "N1P", "N2P", "K2P", "MEL_A", "MEL_B", "BLOCK_F", "BLOCK_K",
                                              "STEP_SAMPLES", "PRECISION") + _OPTION_CONSTEXPRS},
        },
        meta=_audit_split_meta,
        candidates=split_candidates,
        default=FbankVariant.TF32X3_F64_Q32.candidate(),  # the sm_80 / sm_90 recipe
        dtypes=("fp32", "fp16", "bf16"),
        expects_mma=lambda candidate, dtype: candidate.precision == "tf32x3",
    ), AuditSpec(
        name="fbank_cmn",
        family="fbank",
        kernel=_fbank_cmn_kernel,
        signature={"out_ptr": "*fp32", "partial_ptr": "*fp32", "num_frames": "i32", "num_groups": "i32",
                   "stride_out_b": "i32", "stride_out_f": "i32", "stride_partial_b": "i32",
                   **{name: "constexpr" for name in ("NUM_COLS", "BLOCK_F", "STEP_F", "BLOCK_C", "BLOCK_G")}},
        meta=lambda candidate, dtype: dict(NUM_COLS=80, BLOCK_F=CMN_BLOCK_F, STEP_F=CMN_STEP_F, BLOCK_C=128,
                                           BLOCK_G=CMN_BLOCK_G,
                                           num_warps=4, num_stages=3),
        candidates=(DEFAULT_VARIANT.candidate(),),
        default=DEFAULT_VARIANT.candidate(),
        dtypes=("fp32",),
        expects_mma=False,
    )]


AUDIT_KERNELS = _audit_kernels()
