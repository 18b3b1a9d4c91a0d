"""Candidate types of every family: tags, legacy rows, variants tables and validation rules."""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_triton.planner import (
    FAMILIES,
    ConvCandidate,
    FbankCandidate,
    KernelFamily,
    LstmCandidate,
    MemoryPolicy,
    PrecisionProfile,
    SdpaDecodeCandidate,
    SdpaDecodeVariant,
    SegdenseCandidate,
    ThreadPolicy,
    VarlenAttentionCandidate,
)
from rlx_triton.planner.candidates import base, conv, fbank, lstm, sdpa_decode, segdense, varlen_attention

MODULES = {
    KernelFamily.SDPA_DECODE: sdpa_decode,
    KernelFamily.CONV: conv,
    KernelFamily.FBANK: fbank,
    KernelFamily.LSTM: lstm,
    KernelFamily.SEGDENSE: segdense,
    KernelFamily.VARLEN_ATTENTION: varlen_attention,
}
CANDIDATE_FIELDS = {  # CONTRACT.md, "Candidate types"
    SdpaDecodeCandidate: "split_k tg_size tile_m tile_n tile_k pad_q pad_kv use_f16_kv partial_reduce",
    ConvCandidate: "tile_pos tile_co tile_k tg_size stages precision fuse_epilogue",
    FbankCandidate: "tile_frames tile_freq tg_size stages precision",
    LstmCandidate: "batch_tile hidden_tile tg_size stages mode precision",
    SegdenseCandidate: "row_tile tg_size stages precision fused_activation",
    VarlenAttentionCandidate: "block_m block_n tg_size stages use_f16_dot",
}
families = pytest.mark.parametrize("family", list(KernelFamily), ids=lambda f: f.value)
u32 = st.integers(min_value=0, max_value=2**32 - 1)


def candidates_of(cls):
    """Any well-typed candidate of `cls` (values need not pass the family's rules)."""
    strategies = {}
    for f in cls.TAG.fields:
        if isinstance(f, base.IntField):
            strategies[f.name] = u32
        elif isinstance(f, base.FlagField):
            strategies[f.name] = st.booleans()
        else:
            strategies[f.name] = st.sampled_from(f.choices)
    return st.builds(cls, **strategies)


@pytest.mark.parametrize("cls", list(CANDIDATE_FIELDS), ids=lambda c: c.__name__)
def test_field_names_follow_the_contract(cls):
    assert tuple(f.name for f in dataclasses.fields(cls)) == tuple(CANDIDATE_FIELDS[cls].split())


@pytest.mark.parametrize("cls", list(CANDIDATE_FIELDS), ids=lambda c: c.__name__)
def test_candidates_are_frozen_and_hashable(cls):
    candidate = FAMILIES[next(f for f, s in FAMILIES.items() if s.candidate_type is cls)].default_candidates[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(candidate, dataclasses.fields(cls)[0].name, 1)
    assert hash(candidate) == hash(dataclasses.replace(candidate))


@pytest.mark.parametrize("cls", list(CANDIDATE_FIELDS), ids=lambda c: c.__name__)
@given(data=st.data())
def test_tag_round_trips(cls, data):
    candidate = data.draw(candidates_of(cls))
    assert cls.from_tag(candidate.tag()) == candidate


@pytest.mark.parametrize("cls", list(CANDIDATE_FIELDS), ids=lambda c: c.__name__)
@given(text=st.text(alphabet="abfgknpqrstxy0123456789_+-", max_size=40))
def test_from_tag_never_raises(cls, text):
    parsed = cls.from_tag(text)
    assert parsed is None or isinstance(parsed, cls)


def test_sdpa_tag_format():
    c = SdpaDecodeVariant.PARTIAL_F16_KV.candidate()
    assert c.tag() == "skp4_tg256_tm1_tn128_tk128_pq1_pk1_f16kv_partial"
    assert SdpaDecodeVariant.BASE_F32.tag() == "skp1_tg128_tm1_tn64_tk64_pq1_pk1_f32kv_full"


def test_sdpa_legacy_rows_without_tile_and_pad_fields_parse_with_ones():
    assert SdpaDecodeCandidate.from_tag("skp4_tg256_f16kv_partial") == SdpaDecodeCandidate(4, 256, 1, 1, 1, 1, 1, True, True)
    # an unparseable legacy field falls back to its default too, as `unwrap_or(1)` does
    assert SdpaDecodeCandidate.from_tag("skp4_tg256_tmx_f16kv_partial").tile_m == 1


@pytest.mark.parametrize(
    "tag",
    [
        "",
        "garbage",
        "tg128_tm1_tn64_tk64_pq1_pk1_f16kv_full",  # no split_k
        "skp1_tm1_tn64_tk64_pq1_pk1_f16kv_full",  # no tg_size
        "skp1_tg128_full",  # no kv precision
        "skp1_tg128_f16kv",  # no reduce mode
        "skp-1_tg128_f16kv_full",  # a number part takes no sign '-'
        "skp1_tg128_tgx_f16kv_full",  # a later unparseable value clears the field
        "skp4294967296_tg128_f16kv_full",  # beyond u32
        "skp 1_tg128_f16kv_full",
    ],
)
def test_sdpa_unparseable_tags_give_none(tag):
    assert SdpaDecodeCandidate.from_tag(tag) is None


def test_sdpa_tag_parsing_rules():
    # a number may start with '+'; unknown parts are ignored; later parts overwrite
    assert SdpaDecodeCandidate.from_tag("skp+2_tg64_f32kv_full_extra").split_k == 2
    assert SdpaDecodeCandidate.from_tag("skp1_skp8_tg64_f32kv_full").split_k == 8
    assert SdpaDecodeCandidate.from_tag(12) is None


@pytest.mark.parametrize(
    "cls,tag",
    [
        (ConvCandidate, "tp64_tc32_tk32_tg128_ns2_ieee"),  # no epilogue flag
        (ConvCandidate, "tp64_tc32_tk32_tg128_ns2_fp8_fused"),  # unknown precision
        (FbankCandidate, "fr32_fq64_tg128_ns2_tf32"),  # tf32 is not an fbank precision
        (LstmCandidate, "bt16_ht64_tg128_ns2_ieee"),  # no mode
        (SegdenseCandidate, "rt32_tg128_ieee_fusedact"),  # no stages: only sdpa has legacy fields
    ],
)
def test_family_unparseable_tags_give_none(cls, tag):
    assert cls.from_tag(tag) is None


def test_tag_spec_refuses_words_that_read_as_integers():
    with pytest.raises(ValueError, match="starts with the integer prefix"):
        base.TagSpec((base.IntField("stages", "st"), base.ChoiceField("mode", ("stepwise",))))
    with pytest.raises(ValueError, match="unique"):
        base.TagSpec((base.FlagField("a", "x", "y"), base.FlagField("b", "y", "z")))


@families
def test_variants_table(family):
    spec, module = FAMILIES[family], MODULES[family]
    variants = spec.variants
    assert 3 <= len(variants.ALL) <= 8   # a short table: each variant is a routed recipe or a measured alternative
    assert variants.ALL == tuple(variants)  # aliases FP32 / DEFAULT are not listed twice
    assert len(set(variants.ALL)) == len({v.candidate() for v in variants.ALL})
    assert module.FP32_VARIANT is variants.FP32 and module.DEFAULT_VARIANT is variants.DEFAULT
    assert all(isinstance(v.candidate(), spec.candidate_type) for v in variants.ALL)
    assert all(v.tag() == v.candidate().tag() for v in variants.ALL)


@families
def test_default_variant_is_what_the_default_rule_picks(family):
    spec = FAMILIES[family]
    chosen = spec.choose_default(PrecisionProfile.BALANCED, ThreadPolicy(), spec.default_candidates)
    assert chosen == spec.default_variant.candidate()


@families
def test_fp32_variant_is_the_deterministic_choice_and_true_fp32(family):
    spec = FAMILIES[family]
    fp32 = spec.fp32_variant.candidate()
    assert spec.choose_default(PrecisionProfile.DETERMINISTIC, ThreadPolicy(), spec.default_candidates) == fp32
    assert getattr(fp32, "precision", "ieee") == "ieee" and getattr(fp32, "use_f16_kv", False) is False


def test_sdpa_first_four_variants_are_unchanged():
    seed = [
        ("BASE_F32", (1, 128, 1, 64, 64, 1, 1, False, False)),
        ("BASE_F16_KV", (1, 128, 1, 64, 64, 1, 1, True, False)),
        ("SPLIT_K4_F16_KV", (4, 256, 1, 128, 128, 1, 1, True, False)),
        ("PARTIAL_F16_KV", (4, 256, 1, 128, 128, 1, 1, True, True)),
    ]
    assert [(v.name, dataclasses.astuple(v.candidate())) for v in SdpaDecodeVariant.ALL[:4]] == seed


@families
def test_every_default_candidate_is_valid_under_default_policies(family):
    spec = FAMILIES[family]
    for c in spec.default_candidates:
        assert spec.candidate_error(c, ThreadPolicy(), MemoryPolicy()) is None, c.tag()


def errors_of(family, candidate, threads=ThreadPolicy(), memory=MemoryPolicy()):
    return FAMILIES[family].candidate_error(candidate, threads, memory)


SDPA = SdpaDecodeVariant.BASE_F32.candidate()
SDPA_PARTIAL = SdpaDecodeVariant.PARTIAL_F16_KV.candidate()


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"split_k": 0}, "split_k must be a power-of-two in [1, 32]"),
        ({"split_k": 3}, "split_k must be a power-of-two in [1, 32]"),
        ({"split_k": 64}, "split_k must be a power-of-two in [1, 32]"),
        ({"tg_size": 96}, "tg_size must be one of 64, 128, 256, 512"),
        ({"tile_m": 0}, "tile sizes must be non-zero"),
        ({"tile_k": 0}, "tile sizes must be non-zero"),
        ({"pad_q": 0}, "padding factors must be non-zero"),
        ({"tile_m": 1025}, "tile sizes exceed supported planner bounds"),
        ({"tile_n": 1025}, "tile sizes exceed supported planner bounds"),
        ({"tile_k": 4097}, "tile sizes exceed supported planner bounds"),
        ({"pad_kv": 4097}, "padding factors exceed supported planner bounds"),
        ({"tg_size": 512}, "tg_size exceeds thread policy max_threads_per_tg"),
        ({"split_k": "4"}, "split_k must be an integer in [0, 2^32)"),
        ({"use_f16_kv": 1}, "use_f16_kv must be True or False"),
    ],
)
def test_sdpa_candidate_rules(changes, message):
    assert errors_of(KernelFamily.SDPA_DECODE, dataclasses.replace(SDPA, **changes)) == message


def test_sdpa_candidate_rule_edges_pass():
    for changes in ({"split_k": 32}, {"tile_m": 1024, "tile_n": 1024, "tile_k": 4096}, {"pad_q": 4096, "pad_kv": 4096}):
        assert errors_of(KernelFamily.SDPA_DECODE, dataclasses.replace(SDPA, **changes)) is None
    assert errors_of(KernelFamily.SDPA_DECODE, dataclasses.replace(SDPA, tg_size=512), ThreadPolicy(512)) is None


def test_sdpa_memory_rules():
    family = KernelFamily.SDPA_DECODE
    assert errors_of(family, SDPA_PARTIAL, memory=MemoryPolicy.arena_only()) == "partial_reduce requires shared memory staging"
    assert errors_of(family, SDPA, memory=MemoryPolicy.arena_only()) is None
    too_small = MemoryPolicy.shared_if_fits(16 * 1024 - 1)
    assert errors_of(family, SDPA_PARTIAL, memory=too_small) == "candidate staging bytes exceed memory policy limit"
    assert errors_of(family, SDPA_PARTIAL, memory=MemoryPolicy.shared_if_fits(16 * 1024)) is None
    assert errors_of(family, SDPA, memory=MemoryPolicy.shared_if_fits(4 * 1024 - 1)) is not None
    assert errors_of(family, SDPA_PARTIAL, memory=MemoryPolicy.force_shared()) is None


def test_candidate_of_another_family_is_refused():
    assert errors_of(KernelFamily.CONV, SDPA) == "conv plans take ConvCandidate candidates"


CONV = conv.FP32_VARIANT.candidate()
FBANK = fbank.FP32_VARIANT.candidate()
LSTM = lstm.FP32_VARIANT.candidate()
SEGDENSE = segdense.FP32_VARIANT.candidate()


@pytest.mark.parametrize(
    "family,candidate,changes,message",
    [
        (KernelFamily.CONV, CONV, {"tile_pos": 8}, "tile_pos must be a power-of-two in [16, 256]"),
        (KernelFamily.CONV, CONV, {"tile_pos": 48}, "tile_pos must be a power-of-two in [16, 256]"),
        (KernelFamily.CONV, CONV, {"tile_co": 256}, "tile_co must be a power-of-two in [16, 128]"),
        (KernelFamily.CONV, CONV, {"tile_k": 0}, "tile_k must be a power-of-two in [16, 128]"),
        (KernelFamily.CONV, CONV, {"tg_size": 32}, "tg_size must be one of 64, 128, 256, 512"),
        (KernelFamily.CONV, CONV, {"tg_size": 512}, "tg_size exceeds thread policy max_threads_per_tg"),
        (KernelFamily.CONV, CONV, {"stages": 0}, "stages must be in [1, 4]"),
        (KernelFamily.CONV, CONV, {"stages": 5}, "stages must be in [1, 4]"),
        (KernelFamily.CONV, CONV, {"precision": "bf16"}, "precision must be one of ieee, tf32x3, tf32"),
        (KernelFamily.CONV, CONV, {"fuse_epilogue": None}, "fuse_epilogue must be True or False"),
        (KernelFamily.CONV, CONV, {"tile_pos": 256, "tile_co": 128, "tile_k": 128},
         "candidate staging bytes exceed memory policy limit"),
        (KernelFamily.FBANK, FBANK, {"tile_frames": 256}, "tile_frames must be a power-of-two in [16, 128]"),
        (KernelFamily.FBANK, FBANK, {"tile_freq": 24}, "tile_freq must be a power-of-two in [16, 128]"),
        (KernelFamily.FBANK, FBANK, {"precision": "tf32"}, "precision must be one of ieee, tf32x3"),
        (KernelFamily.FBANK, FBANK, {"tile_freq": 128}, "candidate staging bytes exceed memory policy limit"),
        (KernelFamily.LSTM, LSTM, {"batch_tile": 8}, "batch_tile must be a power-of-two in [16, 64]"),
        (KernelFamily.LSTM, LSTM, {"hidden_tile": 512}, "hidden_tile must be a power-of-two in [4, 256]"),
        (KernelFamily.LSTM, LSTM, {"mode": "fused"}, "mode must be one of persistent, stepwise, onchip"),
        (KernelFamily.LSTM, LSTM, {"mode": "persistent", "batch_tile": 64, "hidden_tile": 128},
         "candidate staging bytes exceed memory policy limit"),
        (KernelFamily.SEGDENSE, SEGDENSE, {"row_tile": 256}, "row_tile must be a power-of-two in [16, 128]"),
        (KernelFamily.SEGDENSE, SEGDENSE, {"stages": 9}, "stages must be in [1, 4]"),
        (KernelFamily.SEGDENSE, SEGDENSE, {"fused_activation": "yes"}, "fused_activation must be True or False"),
    ],
)
def test_family_candidate_rules(family, candidate, changes, message):
    assert errors_of(family, dataclasses.replace(candidate, **changes)) == message


def test_staging_estimates_fit_exactly_at_the_limit():
    assert conv.staging_bytes(CONV) == (64 + 32) * 32 * 4
    limit = MemoryPolicy.shared_if_fits(conv.staging_bytes(CONV))
    assert errors_of(KernelFamily.CONV, CONV, memory=limit) is None
    assert errors_of(KernelFamily.CONV, CONV, memory=MemoryPolicy.shared_if_fits(limit.max_tg_bytes - 1)) is not None
    assert errors_of(KernelFamily.CONV, dataclasses.replace(CONV, tile_pos=256, tile_co=128, tile_k=128),
                     memory=MemoryPolicy.force_shared()) is None


@pytest.mark.parametrize(
    "family,candidate,message",
    [
        (KernelFamily.CONV, CONV, "software pipelining (stages > 1) requires shared memory staging"),
        (KernelFamily.FBANK, FBANK, "software pipelining (stages > 1) requires shared memory staging"),
        (KernelFamily.SEGDENSE, SEGDENSE, "software pipelining (stages > 1) requires shared memory staging"),
        (KernelFamily.LSTM, lstm.LstmVariant.STEPWISE_IEEE.candidate(),
         "persistent mode and stages > 1 require shared memory staging"),
    ],
)
def test_arena_only_refuses_shared_staging(family, candidate, message):
    arena = MemoryPolicy.arena_only()
    assert errors_of(family, candidate, memory=arena) == message
    assert errors_of(family, dataclasses.replace(candidate, stages=1), memory=arena) is None


def test_lstm_persistent_mode_needs_shared_memory():
    persistent = dataclasses.replace(LSTM, mode="persistent", stages=1)
    assert errors_of(KernelFamily.LSTM, persistent, memory=MemoryPolicy.arena_only()) is not None
    assert lstm.staging_bytes(persistent) == 2 * lstm.staging_bytes(dataclasses.replace(persistent, mode="stepwise"))


@families
def test_docstring_states_the_triton_and_metal_mapping(family):
    doc = MODULES[family].__doc__
    assert "num_warps = tg_size // 32" in doc
    # a family without a shader says so where the Metal mapping would be
    assert "threads per threadgroup = `tg_size`" in doc or "Metal: no shader" in doc
    for name in FAMILIES[family].candidate_type.TAG.names:
        assert f"`{name}`" in doc, name
