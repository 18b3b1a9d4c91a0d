"""KernelPlanBuilder: every builder method, every plan validation rule, default-candidate rules."""
import dataclasses
import pickle

import pytest

from rlx_triton.planner import (
    FAMILIES,
    ConvCandidate,
    ConvertPolicy,
    ConvVariant,
    EmptyCandidates,
    HybridPrecisionSpec,
    InvalidCandidate,
    InvalidObjectiveWeights,
    InvalidPrecision,
    KernelFamily,
    KernelPlanBuilder,
    LstmVariant,
    MemoryPolicy,
    ObjectiveWeights,
    PlanError,
    PrecisionProfile,
    RolePrecision,
    ScalarType,
    SdpaDecodeVariant,
    ThreadPolicy,
    TokenBucketStrategy,
    TuneCacheEviction,
    TunePolicy,
    UnsupportedFamily,
)

families = pytest.mark.parametrize("family", list(KernelFamily), ids=lambda f: f.value)
F32 = RolePrecision.native(ScalarType.F32, ScalarType.F32)


def spec(**roles):
    base = dict(activations=F32, weights=F32, accum=F32, kv_cache=F32)
    base.update(roles)
    return HybridPrecisionSpec(**base)


@families
def test_default_plan_builds_for_every_family(family):
    plan = KernelPlanBuilder(family).build_plan()
    assert plan.family is family
    assert plan.candidates == FAMILIES[family].default_candidates
    assert plan.default_candidate == FAMILIES[family].default_variant.candidate()
    assert plan.precision_profile is PrecisionProfile.BALANCED
    assert plan.hybrid == PrecisionProfile.BALANCED.default_spec()
    assert plan.tune_policy == TunePolicy.disabled()
    assert plan.schema_version == 1
    assert hash(plan) == hash(KernelPlanBuilder(family).build_plan())


@families
@pytest.mark.parametrize("profile", list(PrecisionProfile), ids=lambda p: p.value)
def test_every_profile_builds_for_every_family(family, profile):
    plan = KernelPlanBuilder(family).precision_profile(profile).build_plan()
    assert plan.default_candidate in plan.candidates


def test_family_given_by_value_string():
    assert KernelPlanBuilder("fbank").build_plan().family is KernelFamily.FBANK


@pytest.mark.parametrize("family", ["attention", None, 3])
def test_unknown_family_is_unsupported(family):
    with pytest.raises(UnsupportedFamily) as info:
        KernelPlanBuilder(family)
    assert str(info.value) == f"unsupported kernel family in plan: {family!r}"
    assert info.value.family == family


def test_unsupported_family_message_names_the_family_in_camel_case():
    assert str(UnsupportedFamily(KernelFamily.SDPA_DECODE)) == "unsupported kernel family in plan: SdpaDecode"


def test_builder_methods_return_new_builders():
    builder = KernelPlanBuilder(KernelFamily.SDPA_DECODE)
    hf = builder.precision_profile(PrecisionProfile.HIGH_FIDELITY)
    assert builder.build_plan().precision_profile is PrecisionProfile.BALANCED
    assert hf.build_plan().precision_profile is PrecisionProfile.HIGH_FIDELITY


def test_every_builder_method_applies():
    weights = ObjectiveWeights(latency=0.5, error=0.5, memory=0.0)
    buckets = TokenBucketStrategy((1, 8, 64))
    hybrid = spec(kv_cache=RolePrecision.native(ScalarType.F16, ScalarType.F16))
    plan = (
        KernelPlanBuilder(KernelFamily.SDPA_DECODE)
        .precision_profile(PrecisionProfile.ULTRA_LOW_LATENCY)
        .hybrid_profile(hybrid)
        .allow_emulation(True)
        .threads(ThreadPolicy(512, False))
        .memory(MemoryPolicy.force_shared())
        .autotune(TunePolicy.balanced_defaults())
        .tune_cache(False, True, 0)
        .tune_cache_eviction(TuneCacheEviction.KEEP_HIGH_BUCKETS)
        .objective_weights(weights)
        .token_buckets(buckets)
        .candidates([SdpaDecodeVariant.BASE_F32.candidate()])
        .tile_sizes(16, 32, 64)
        .padding(8, 16)
        .schema_version(7)
        .build_plan()
    )
    assert plan.hybrid == hybrid
    assert plan.thread_policy == ThreadPolicy(512, False)
    assert plan.memory_policy == MemoryPolicy.force_shared()
    assert plan.tune_policy.enabled and not plan.tune_policy.cache_load and plan.tune_policy.persist_cache
    assert plan.tune_policy.cache_max_entries == 1  # raised to at least 1
    assert plan.tune_policy.cache_eviction is TuneCacheEviction.KEEP_HIGH_BUCKETS
    assert plan.objective_weights == weights and plan.token_buckets == buckets
    assert plan.candidates == (dataclasses.replace(SdpaDecodeVariant.BASE_F32.candidate(), tile_m=16, tile_n=32,
                                                   tile_k=64, pad_q=8, pad_kv=16),)
    assert plan.schema_version == 7


def test_tile_sizes_and_padding_follow_each_family_tile_fields():
    plan = KernelPlanBuilder(KernelFamily.CONV).tile_sizes(16, 16, 16).build_plan()
    assert {(c.tile_pos, c.tile_co, c.tile_k) for c in plan.candidates} == {(16, 16, 16)}
    plan = KernelPlanBuilder(KernelFamily.LSTM).tile_sizes(hidden_tile=32).build_plan()
    assert {c.hidden_tile for c in plan.candidates} == {32}
    plan = KernelPlanBuilder(KernelFamily.SEGDENSE).tile_sizes(64).build_plan()
    assert {c.row_tile for c in plan.candidates} == {64}
    with pytest.raises(TypeError, match="takes the fields tile_frames, tile_freq"):
        KernelPlanBuilder(KernelFamily.FBANK).tile_sizes(16, 16, 16)
    with pytest.raises(TypeError, match=r"\(none\)"):
        KernelPlanBuilder(KernelFamily.CONV).padding(2)
    with pytest.raises(TypeError):
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).tile_sizes(tile_q=2)


def test_tile_sizes_apply_to_current_candidates_only():
    # a later candidates() call replaces the overridden list
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).tile_sizes(2, 2, 2).candidates([SdpaDecodeVariant.BASE_F32.candidate()])
    assert plan.build_plan().candidates[0].tile_m == 1


@pytest.mark.parametrize(
    "weights",
    [
        ObjectiveWeights(0.6, 0.3, 0.2),
        ObjectiveWeights(-0.1, 0.6, 0.5),
        ObjectiveWeights(float("nan"), 0.5, 0.5),
        ObjectiveWeights(float("inf"), 0.0, 0.0),
        ObjectiveWeights(1e39, 0.0, 0.0),
        ObjectiveWeights("0.6", 0.3, 0.1),
        ObjectiveWeights(0.0, 0.0, 0.0),
        ObjectiveWeights(1.0011, 0.0, 0.0),
    ],
)
def test_invalid_objective_weights(weights):
    with pytest.raises(InvalidObjectiveWeights) as info:
        KernelPlanBuilder(KernelFamily.CONV).objective_weights(weights).build_plan()
    assert str(info.value) == "objective weights must be finite, non-negative, and sum to 1.0 (+/- 1e-3)"


@pytest.mark.parametrize("weights", [ObjectiveWeights(), ObjectiveWeights(1.0, 0.0, 0.0), ObjectiveWeights(0.9995, 0, 0)])
def test_valid_objective_weights(weights):
    KernelPlanBuilder(KernelFamily.CONV).objective_weights(weights).build_plan()


def test_tune_policy_max_entries_zero_is_invalid_candidate():
    policy = dataclasses.replace(TunePolicy.balanced_defaults(), cache_max_entries=0)
    with pytest.raises(InvalidCandidate) as info:
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).autotune(policy).build_plan()
    assert str(info.value) == "invalid candidate: cache_max_entries must be at least 1"
    with pytest.raises(InvalidCandidate, match="cache_eviction"):
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).autotune(dataclasses.replace(policy, cache_max_entries=1,
                                                                                  cache_eviction="lru")).build_plan()


@families
@pytest.mark.parametrize("low", [ScalarType.F16, ScalarType.F8E4M3, ScalarType.F8E5M2])
def test_low_accumulator_is_refused(family, low):
    with pytest.raises(InvalidPrecision) as info:
        KernelPlanBuilder(family).hybrid_profile(spec(accum=RolePrecision.native(ScalarType.F32, low))).build_plan()
    assert str(info.value) == "invalid precision configuration: accumulator compute precision too low for stable reductions"


@families
@pytest.mark.parametrize(
    "convert", [ConvertPolicy.STOCHASTIC_ROUND, ConvertPolicy.DOUBLE_SINGLE_EMU, ConvertPolicy.DEQUANT_ON_LOAD]
)
def test_emulation_needs_allow_emulation(family, convert):
    hybrid = spec(weights=RolePrecision(ScalarType.F32, ScalarType.F32, convert))
    with pytest.raises(InvalidPrecision, match="emulation policies are disabled in this plan"):
        KernelPlanBuilder(family).hybrid_profile(hybrid).build_plan()
    KernelPlanBuilder(family).hybrid_profile(hybrid).allow_emulation(True).build_plan()


def test_cast_is_not_emulation():
    hybrid = spec(weights=RolePrecision(ScalarType.BF16, ScalarType.F32, ConvertPolicy.CAST))
    KernelPlanBuilder(KernelFamily.CONV).hybrid_profile(hybrid).build_plan()


@pytest.mark.parametrize("kv", [ScalarType.F8E4M3, ScalarType.I8, ScalarType.Q4, ScalarType.F64])
def test_sdpa_kv_cache_storage_rule(kv):
    with pytest.raises(InvalidPrecision) as info:
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).hybrid_profile(spec(kv_cache=RolePrecision.native(kv, ScalarType.F32))).build_plan()
    assert str(info.value) == "invalid precision configuration: sdpa decode requires kv-cache storage in F16/BF16/F32"


@pytest.mark.parametrize("kv", [ScalarType.F8E4M3, ScalarType.F8E5M2, ScalarType.I8])
def test_a_quantised_kv_cache_plans_when_it_dequantises_on_load(kv):
    role = RolePrecision(kv, ScalarType.F32, ConvertPolicy.DEQUANT_ON_LOAD)
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).hybrid_profile(spec(kv_cache=role)).allow_emulation(True)
    assert plan.build_plan().hybrid.kv_cache == role
    with pytest.raises(InvalidPrecision, match="emulation policies are disabled"):
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).hybrid_profile(spec(kv_cache=role)).build_plan()
    to_fp8 = RolePrecision(kv, ScalarType.F8E4M3, ConvertPolicy.DEQUANT_ON_LOAD)
    with pytest.raises(InvalidPrecision, match="dequantises on load to F32/F16/BF16"):
        KernelPlanBuilder(KernelFamily.SDPA_DECODE).hybrid_profile(spec(kv_cache=to_fp8)).allow_emulation(True).build_plan()


DIARIZATION = [KernelFamily.CONV, KernelFamily.FBANK, KernelFamily.LSTM, KernelFamily.SEGDENSE]


@pytest.mark.parametrize("family", DIARIZATION, ids=lambda f: f.value)
def test_diarization_accumulator_must_be_f32_or_f64(family):
    for compute in (ScalarType.BF16, ScalarType.I8):
        with pytest.raises(InvalidPrecision, match=f"{family.value} requires accumulator compute in F32/F64"):
            KernelPlanBuilder(family).hybrid_profile(spec(accum=RolePrecision.native(ScalarType.F32, compute))).build_plan()
    KernelPlanBuilder(family).hybrid_profile(spec(accum=RolePrecision.native(ScalarType.F64, ScalarType.F64))).build_plan()
    # the kv-cache role does not concern these families
    KernelPlanBuilder(family).hybrid_profile(spec(kv_cache=RolePrecision.native(ScalarType.Q4, ScalarType.F32))).build_plan()


@pytest.mark.parametrize("family", DIARIZATION, ids=lambda f: f.value)
@pytest.mark.parametrize("role", ["activations", "weights"])
def test_diarization_storage_must_be_float(family, role):
    hybrid = spec(**{role: RolePrecision.native(ScalarType.Q8, ScalarType.F32)})
    with pytest.raises(InvalidPrecision, match="requires activation and weight storage in F32/F16/BF16"):
        KernelPlanBuilder(family).hybrid_profile(hybrid).build_plan()


@families
def test_empty_candidates(family):
    with pytest.raises(EmptyCandidates) as info:
        KernelPlanBuilder(family).candidates([]).build_plan()
    assert str(info.value) == "kernel plan needs at least one candidate"


def test_validation_reports_the_first_failing_rule_in_a_fixed_order():
    # weights before tune policy before precision before candidates
    builder = (
        KernelPlanBuilder(KernelFamily.SDPA_DECODE)
        .candidates([])
        .hybrid_profile(spec(accum=RolePrecision.native(ScalarType.F16, ScalarType.F16)))
        .autotune(dataclasses.replace(TunePolicy(), cache_max_entries=0))
        .objective_weights(ObjectiveWeights(1, 1, 1))
    )
    with pytest.raises(InvalidObjectiveWeights):
        builder.build_plan()
    with pytest.raises(InvalidCandidate):
        builder.objective_weights(ObjectiveWeights()).build_plan()
    with pytest.raises(InvalidPrecision):
        builder.objective_weights(ObjectiveWeights()).autotune(TunePolicy()).build_plan()
    with pytest.raises(EmptyCandidates):
        builder.objective_weights(ObjectiveWeights()).autotune(TunePolicy()).hybrid_profile(spec()).build_plan()


def test_invalid_candidate_in_plan():
    bad = dataclasses.replace(ConvVariant.IEEE_P64_CO32.candidate(), tile_co=3)
    with pytest.raises(InvalidCandidate) as info:
        KernelPlanBuilder(KernelFamily.CONV).candidates([bad]).build_plan()
    assert str(info.value) == "invalid candidate: tile_co must be a power-of-two in [16, 128]"
    assert info.value.reason == "tile_co must be a power-of-two in [16, 128]"
    with pytest.raises(InvalidCandidate, match="tg_size exceeds thread policy"):
        KernelPlanBuilder(KernelFamily.CONV).threads(ThreadPolicy(128)).build_plan()


SEED_DEFAULTS = {
    PrecisionProfile.ULTRA_LOW_LATENCY: SdpaDecodeVariant.PARTIAL_F16_KV,
    PrecisionProfile.BALANCED: SdpaDecodeVariant.BASE_F16_KV,
    PrecisionProfile.HIGH_FIDELITY: SdpaDecodeVariant.BASE_F32,
    PrecisionProfile.DETERMINISTIC: SdpaDecodeVariant.BASE_F32,
}


@pytest.mark.parametrize("profile", list(PrecisionProfile), ids=lambda p: p.value)
def test_sdpa_default_candidate_rule(profile):
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).precision_profile(profile).build_plan()
    assert plan.default_candidate == SEED_DEFAULTS[profile].candidate()


def test_sdpa_default_rule_fallbacks():
    f16_full_256 = SdpaDecodeVariant.SPLIT_K4_F16_KV.candidate()
    partial = SdpaDecodeVariant.PARTIAL_F16_KV.candidate()
    base32 = SdpaDecodeVariant.BASE_F32.candidate()
    choose = FAMILIES[KernelFamily.SDPA_DECODE].choose_default
    # the only f16/full candidate exceeds the thread policy: first f16 candidate, thread policy ignored
    assert choose(PrecisionProfile.BALANCED, ThreadPolicy(128), [partial, f16_full_256]) == partial
    # no f16 candidate at all: the first candidate
    assert choose(PrecisionProfile.BALANCED, ThreadPolicy(), [base32]) == base32
    assert choose(PrecisionProfile.HIGH_FIDELITY, ThreadPolicy(), [partial, f16_full_256]) == partial


EXPECTED_DEFAULTS = {  # family -> profile -> variant name
    KernelFamily.CONV: {"ultra_low_latency": "TF32_P128_CO64", "balanced": "IEEE_P64_CO32",
                        "high_fidelity": "IEEE_P64_CO32", "deterministic": "IEEE_P64_CO32"},
    KernelFamily.FBANK: {"ultra_low_latency": "TF32X3_F64_Q64", "balanced": "IEEE_F16_Q32",
                         "high_fidelity": "IEEE_F16_Q32", "deterministic": "IEEE_F16_Q32"},
    KernelFamily.LSTM: {"ultra_low_latency": "STEPWISE_TF32", "balanced": "ONCHIP_IEEE",
                        "high_fidelity": "ONCHIP_IEEE", "deterministic": "ONCHIP_IEEE"},
    KernelFamily.SEGDENSE: {"ultra_low_latency": "R64_TF32X3", "balanced": "R32_IEEE",
                            "high_fidelity": "R32_IEEE", "deterministic": "R32_IEEE"},
}


@pytest.mark.parametrize("family", DIARIZATION, ids=lambda f: f.value)
@pytest.mark.parametrize("profile", list(PrecisionProfile), ids=lambda p: p.value)
def test_diarization_default_candidate_rule(family, profile):
    plan = KernelPlanBuilder(family).precision_profile(profile).build_plan()
    assert plan.default_candidate == FAMILIES[family].variants[EXPECTED_DEFAULTS[family][profile.value]].candidate()


def test_precision_default_rule_fallbacks():
    choose = FAMILIES[KernelFamily.CONV].choose_default
    tf32 = ConvVariant.TF32_P128_CO64.candidate()
    wide_ieee = ConvVariant.IEEE_P128_CO64.candidate()
    # only an ieee candidate beyond the thread policy: taken anyway (the fallback ignores the thread policy)
    assert choose(PrecisionProfile.DETERMINISTIC, ThreadPolicy(128), [tf32, wide_ieee]) == wide_ieee
    # no accepted precision at all: the first candidate
    assert choose(PrecisionProfile.DETERMINISTIC, ThreadPolicy(), [tf32]) == tf32
    # a thread-policy-fitting candidate is preferred over an earlier one that does not fit
    small_tf32 = ConvCandidate(64, 32, 32, 128, 2, "tf32", True)
    assert choose(PrecisionProfile.ULTRA_LOW_LATENCY, ThreadPolicy(128), [tf32, small_tf32]) == small_tf32


def test_lstm_persistent_plans_under_arena_only_need_stepwise_single_stage():
    with pytest.raises(InvalidCandidate):
        KernelPlanBuilder(KernelFamily.LSTM).memory(MemoryPolicy.arena_only()).build_plan()
    stepwise = dataclasses.replace(LstmVariant.STEPWISE_IEEE.candidate(), stages=1)
    plan = KernelPlanBuilder(KernelFamily.LSTM).memory(MemoryPolicy.arena_only()).candidates([stepwise]).build_plan()
    assert plan.default_candidate == stepwise


@pytest.mark.parametrize(
    "error",
    [EmptyCandidates(), UnsupportedFamily(KernelFamily.CONV), InvalidCandidate("x"), InvalidPrecision("y"),
     InvalidObjectiveWeights()],
)
def test_plan_errors_are_value_errors_that_pickle_and_compare(error):
    assert isinstance(error, PlanError) and isinstance(error, ValueError)
    clone = pickle.loads(pickle.dumps(error))
    assert clone == error and str(clone) == str(error) and hash(clone) == hash(error)
    assert error != InvalidCandidate("other")


def test_a_registered_family_is_planned_by_its_value_and_removed_again():
    import enum

    from rlx_triton.planner.candidates import register_family, unregister_family

    class OtherFamily(enum.Enum):
        SEGDENSE_COPY = "segdense_copy"

    segdense = FAMILIES[KernelFamily.SEGDENSE]
    spec = dataclasses.replace(segdense, family=OtherFamily.SEGDENSE_COPY)
    register_family(spec)
    try:
        assert KernelPlanBuilder("segdense_copy").build_plan().family is OtherFamily.SEGDENSE_COPY
        with pytest.raises(ValueError, match="already registered"):
            register_family(dataclasses.replace(segdense))
        with pytest.raises(ValueError, match="built-in"):
            unregister_family(KernelFamily.SEGDENSE)
    finally:
        unregister_family("segdense_copy")
    with pytest.raises(UnsupportedFamily):
        KernelPlanBuilder("segdense_copy")
