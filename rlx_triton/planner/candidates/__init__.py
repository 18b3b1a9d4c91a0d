"""Candidate families: one module per kernel family, registered here by one line each.

`FAMILIES` maps a `KernelFamily` to its `FamilySpec` (candidate type, variants, rules, launch fields).
`register_family` adds a family from outside the package (its `family` is a member of the caller's own
enum with a string value, e.g. a plug-in or a test's toy family); `unregister_family` removes it.
"""
from __future__ import annotations

from typing import Any, Dict

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



def register_family(spec: FamilySpec) -> None:
    """Makes the planner plan for `spec.family` (looked up by the member or its value string)."""
    if not isinstance(spec, FamilySpec):
        raise TypeError(f"spec must be a FamilySpec, got {type(spec).__name__}")
    value = spec.family.value
    if any(family.value == value and FAMILIES[family] is not spec for family in FAMILIES):
        raise ValueError(f"family {value!r} is already registered")
    FAMILIES[spec.family] = spec


def unregister_family(family: Any) -> None:
    """Removes a family added by register_family (the member or its value); the built-in families stay."""
    for key in [key for key in FAMILIES if key is family or key.value == family]:
        if isinstance(key, KernelFamily):
            raise ValueError(f"{key.value} is a built-in family")
        del FAMILIES[key]


__all__ = [
    "FAMILIES",
    "Candidate",
    "CandidateVariant",
    "FamilySpec",
    "LaunchField",
    "register_family",
    "unregister_family",
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
