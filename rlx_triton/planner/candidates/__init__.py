"""Candidate families: one module per kernel family, registered here by one line each.

`FAMILIES` maps a `KernelFamily` to its `FamilySpec` (candidate type, variants, rules, launch fields).
"""
from __future__ import annotations

from typing import Dict

from ..policy import KernelFamily
from . import conv, fbank, lstm, sdpa_decode, segdense, varlen_attention
from .base import Candidate, CandidateVariant, FamilySpec, LaunchField
from .conv import ConvCandidate, ConvVariant
from .fbank import FbankCandidate, FbankVariant
from .lstm import LstmCandidate, LstmVariant
from .sdpa_decode import SdpaDecodeCandidate, SdpaDecodeVariant
from .segdense import SegdenseCandidate, SegdenseVariant
from .varlen_attention import VarlenAttentionCandidate, VarlenAttentionVariant

FAMILIES: Dict[KernelFamily, FamilySpec] = {
    module.SPEC.family: module.SPEC for module in (sdpa_decode, conv, fbank, lstm, segdense, varlen_attention)
}

__all__ = [
    "FAMILIES",
    "Candidate",
    "CandidateVariant",
    "FamilySpec",
    "LaunchField",
    "SdpaDecodeCandidate",
    "SdpaDecodeVariant",
    "ConvCandidate",
    "ConvVariant",
    "FbankCandidate",
    "FbankVariant",
    "LstmCandidate",
    "LstmVariant",
    "SegdenseCandidate",
    "SegdenseVariant",
    "VarlenAttentionCandidate",
    "VarlenAttentionVariant",
]
