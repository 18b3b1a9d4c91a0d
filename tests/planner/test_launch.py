"""LaunchBuilder, LaunchConfig, kernel names, shape buckets and tune-cache keys for every family."""
import pickle

import pytest

from rlx_triton.planner import (
    CandidateNotPresent,
    ConvVariant,
    InvalidField,
    KernelFamily,
    KernelPlanBuilder,
    LaunchBuilder,
    LaunchError,
    MissingField,
    PrecisionProfile,
    PrecisionProfileTag,
    SdpaDecodeVariant,
    ShapeBucket,
    TokenBucketStrategy,
    bucket_pow2,
    shape_bucket,
    tune_cache_key,
)

SDPA_FIELDS = dict(m=4, tokens=1, batch=2, num_heads=32, head_dim=128, seq_q=1, seq_kv=300)
FIELDS = {  # CONTRACT.md, "Launch fields", in declared order
    KernelFamily.SDPA_DECODE: SDPA_FIELDS,
    KernelFamily.CONV: dict(batch=2, c_in=1, c_out=80, length=16000, taps=251, stride=10, tokens=1575),
    KernelFamily.FBANK: dict(batch=1, samples=16000, frames=98, window=512, bins=80, tokens=98),
    KernelFamily.LSTM: dict(batch=3, seq=589, input_size=60, hidden=128, layers=4, directions=2, tokens=589),
    KernelFamily.SEGDENSE: dict(rows=1767, in_features=256, hidden=128, classes=7, tokens=1767),
    KernelFamily.VARLEN_ATTENTION: dict(tokens=64, batch=64, num_heads=32, head_dim=128, seq_q=1, seq_kv=4096),
}
families = pytest.mark.parametrize("family", list(KernelFamily), ids=lambda f: f.value)


def plan_of(family, **kw):
    builder = KernelPlanBuilder(family)
    if "profile" in kw:
        builder = builder.precision_profile(kw["profile"])
    return builder.build_plan()


def sdpa(**changes):
    return LaunchBuilder.from_plan(plan_of(KernelFamily.SDPA_DECODE)).fields(**{**SDPA_FIELDS, **changes})


def test_sdpa_named_setters_and_attributes():
    plan = plan_of(KernelFamily.SDPA_DECODE)
    launch = LaunchBuilder.from_plan(plan).m(1).tokens(192).batch(2).num_heads(32).head_dim(128).seq_q(1).seq_kv(192).build()
    assert (launch.m, launch.tokens, launch.batch, launch.num_heads, launch.head_dim, launch.seq_q, launch.seq_kv) == (
        1, 192, 2, 32, 128, 1, 192)
    assert launch.family is KernelFamily.SDPA_DECODE
    assert launch.token_bucket == TokenBucketStrategy().bucket_of(192) == 8
    assert launch.candidate == plan.default_candidate
    assert dict(launch.fields) == dict(m=1, tokens=192, batch=2, num_heads=32, head_dim=128, seq_q=1, seq_kv=192)
    with pytest.raises(AttributeError):
        launch.num_kv_heads


def test_sdpa_kernel_name_format():
    launch = sdpa(tokens=192, seq_kv=192, m=1).build()
    assert launch.kernel_name == (
        "sdpa_decode_m1_tok192_b2_h32_d128_sq1_sk192_skp1_tg128_tm1_tn64_tk64_pq1_pk1_f16kv_full_bal"
    )
    for profile, short in [(PrecisionProfile.ULTRA_LOW_LATENCY, "ull"), (PrecisionProfile.HIGH_FIDELITY, "hf"),
                           (PrecisionProfile.DETERMINISTIC, "det")]:
        plan = plan_of(KernelFamily.SDPA_DECODE, profile=profile)
        name = LaunchBuilder.from_plan(plan).fields(**SDPA_FIELDS).build().kernel_name
        assert name.endswith(f"_{short}")


def test_sdpa_optional_fields_stay_out_of_the_kernel_name():
    launch = sdpa(num_kv_heads=8, head_dim_v=64).build()
    assert launch.num_kv_heads == 8 and launch.head_dim_v == 64
    assert launch.kernel_name == sdpa().build().kernel_name


@pytest.mark.parametrize(
    "family,name",
    [
        (KernelFamily.CONV, "conv_batch2_c_in1_c_out80_length16000_taps251_stride10_tokens1575_"
                            "tp64_tc32_tk32_tg128_ns2_ieee_fused_bal"),
        (KernelFamily.FBANK, "fbank_batch1_samples16000_frames98_window512_bins80_tokens98_fr16_fq32_tg64_ns2_ieee_bal"),
        (KernelFamily.LSTM, "lstm_batch3_seq589_input_size60_hidden128_layers4_directions2_tokens589_"
                            "bt16_ht4_tg256_ns2_onchip_ieee_bal"),
        (KernelFamily.SEGDENSE, "segdense_rows1767_in_features256_hidden128_classes7_tokens1767_"
                                "rt32_tg128_ns2_ieee_fusedact_bal"),
    ],
)
def test_family_kernel_name_format(family, name):
    launch = LaunchBuilder.from_plan(plan_of(family)).fields(**FIELDS[family]).build()
    assert launch.kernel_name == name
    assert launch.tokens == FIELDS[family]["tokens"]
    for field, value in FIELDS[family].items():
        assert getattr(launch, field) == value


@families
def test_missing_field_names_the_first_missing_in_declared_order(family):
    names = list(FIELDS[family])
    for index, name in enumerate(names):
        given = {n: FIELDS[family][n] for n in names[:index]}  # every later field is missing too
        with pytest.raises(MissingField) as info:
            LaunchBuilder.from_plan(plan_of(family)).fields(**given).build()
        assert info.value == MissingField(name)
        assert str(info.value) == f"missing launch field: {name}"


@families
def test_zero_fields_are_invalid(family):
    for name in FIELDS[family]:
        with pytest.raises(InvalidField) as info:
            LaunchBuilder.from_plan(plan_of(family)).fields(**{**FIELDS[family], name: 0}).build()
        expected = "seq_q/seq_kv" if name in ("seq_q", "seq_kv") else name
        assert info.value.field == expected
        assert str(info.value) == f"invalid launch field: {expected}"


@pytest.mark.parametrize("value", [-1, 2**32, 1.5, "4", None, True])
def test_non_u32_values_are_invalid(value):
    with pytest.raises(InvalidField, match="batch"):
        sdpa(batch=value).build()


def test_numpy_like_integers_are_accepted():
    class IndexLike:
        def __index__(self):
            return 7

    assert sdpa(batch=IndexLike()).build().batch == 7


def test_sdpa_field_edges():
    assert sdpa(head_dim=512).build().head_dim == 512
    with pytest.raises(InvalidField, match="head_dim"):
        sdpa(head_dim=513).build()
    with pytest.raises(InvalidField, match="head_dim_v"):
        sdpa(head_dim_v=513).build()
    assert sdpa(m=2**32 - 1).build().m == 2**32 - 1


def test_invalid_checks_run_in_declared_order():
    with pytest.raises(InvalidField) as info:
        sdpa(m=0, seq_kv=0, head_dim=9999).build()
    assert info.value.field == "m"


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(InvalidField, match="num_kv_heads"):
        sdpa(num_heads=32, num_kv_heads=5).build()
    with pytest.raises(InvalidField, match="num_kv_heads"):
        sdpa(num_kv_heads=0).build()
    assert sdpa(num_heads=32, num_kv_heads=32).build().num_kv_heads == 32


def test_fbank_bins_fit_the_window():
    fbank = LaunchBuilder.from_plan(plan_of(KernelFamily.FBANK))
    assert fbank.fields(**{**FIELDS[KernelFamily.FBANK], "window": 512, "bins": 257}).build().bins == 257
    with pytest.raises(InvalidField, match="bins"):
        fbank.fields(**{**FIELDS[KernelFamily.FBANK], "window": 512, "bins": 258}).build()


def test_lstm_directions_are_one_or_two():
    lstm = LaunchBuilder.from_plan(plan_of(KernelFamily.LSTM))
    with pytest.raises(InvalidField, match="directions"):
        lstm.fields(**{**FIELDS[KernelFamily.LSTM], "directions": 3}).build()


def test_unknown_field_is_refused_at_once():
    with pytest.raises(InvalidField) as info:
        LaunchBuilder.from_plan(plan_of(KernelFamily.CONV)).field("groups", 2)
    assert info.value.field == "groups"
    with pytest.raises(InvalidField, match="m"):
        LaunchBuilder.from_plan(plan_of(KernelFamily.CONV)).m(1)


def test_builders_are_immutable():
    base = LaunchBuilder.from_plan(plan_of(KernelFamily.SDPA_DECODE)).fields(**SDPA_FIELDS)
    base.seq_kv(5000)
    assert base.build().seq_kv == 300


# the launch's candidate choice: tokens <= 8 or seq_kv > 1024 -> first partial-reduce candidate
@pytest.mark.parametrize(
    "tokens,seq_kv,partial",
    [(1, 100, True), (8, 100, True), (9, 100, False), (9, 1024, False), (9, 1025, True), (64, 4096, True)],
)
def test_sdpa_launch_candidate_rule(tokens, seq_kv, partial):
    plan = plan_of(KernelFamily.SDPA_DECODE)
    launch = sdpa(tokens=tokens, seq_kv=seq_kv).build()
    expected = SdpaDecodeVariant.PARTIAL_F16_KV.candidate() if partial else plan.default_candidate
    assert launch.candidate == expected


def test_sdpa_launch_rule_without_partial_candidates_keeps_the_default():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).candidates(
        [SdpaDecodeVariant.BASE_F32.candidate(), SdpaDecodeVariant.BASE_F16_KV.candidate()]).build_plan()
    launch = LaunchBuilder.from_plan(plan).fields(**SDPA_FIELDS).build()
    assert launch.candidate == plan.default_candidate == SdpaDecodeVariant.BASE_F16_KV.candidate()


@pytest.mark.parametrize("family", [f for f in KernelFamily if f is not KernelFamily.SDPA_DECODE], ids=lambda f: f.value)
def test_other_families_launch_the_plan_default(family):
    for profile in PrecisionProfile:
        plan = plan_of(family, profile=profile)
        assert LaunchBuilder.from_plan(plan).fields(**FIELDS[family]).build().candidate == plan.default_candidate


def test_candidate_override_and_candidate_not_present():
    plan = plan_of(KernelFamily.CONV)
    chosen = ConvVariant.TF32_P128_CO64.candidate()
    builder = LaunchBuilder.from_plan(plan).fields(**FIELDS[KernelFamily.CONV])
    launch = builder.candidate(chosen).build()
    assert launch.candidate == chosen and launch.kernel_name.endswith("_tp128_tc64_tk32_tg256_ns3_tf32_fused_bal")
    for foreign in (SdpaDecodeVariant.BASE_F32.candidate(), ConvVariant.IEEE_P64_CO32.candidate().__class__(
            16, 16, 16, 64, 1, "ieee", True)):
        with pytest.raises(CandidateNotPresent) as info:
            builder.candidate(foreign).build()
        assert str(info.value) == "selected candidate is not in the plan"


def test_launch_config_is_hashable_and_picklable():
    launch = sdpa().build()
    assert hash(launch) == hash(sdpa().build())
    assert pickle.loads(pickle.dumps(launch)) == launch


@pytest.mark.parametrize(
    "value,bucket", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (1024, 10), (1025, 11), (2**32 - 1, 32)]
)
def test_bucket_pow2_edges(value, bucket):
    assert bucket_pow2(value) == bucket


@pytest.mark.parametrize(
    "tokens,bucket", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (512, 9), (513, 10), (2**32 - 1, 10)]
)
def test_token_bucket_edges(tokens, bucket):
    assert TokenBucketStrategy.decode_default().bucket_of(tokens) == bucket


def test_custom_token_buckets():
    assert [TokenBucketStrategy((4, 16)).bucket_of(t) for t in (1, 4, 5, 16, 17)] == [0, 0, 1, 1, 2]


def test_sdpa_shape_bucket_attributes():
    bucket = shape_bucket(sdpa().build())
    assert (bucket.m_bucket, bucket.batch_bucket, bucket.heads_bucket, bucket.head_dim_bucket, bucket.seq_q_bucket,
            bucket.seq_kv_bucket) == (2, 1, 5, 7, 0, 9)
    assert bucket == ShapeBucket.of(m_bucket=2, batch_bucket=1, heads_bucket=5, head_dim_bucket=7, seq_q_bucket=0,
                                    seq_kv_bucket=9)
    assert list(bucket.buckets) == ["m_bucket", "batch_bucket", "heads_bucket", "head_dim_bucket", "seq_q_bucket",
                                    "seq_kv_bucket"]
    # the same buckets for nearby shapes, another for the next power of two
    assert shape_bucket(sdpa(seq_kv=511).build()) == bucket
    assert shape_bucket(sdpa(seq_kv=513).build()) != bucket
    assert len({bucket, shape_bucket(sdpa(seq_kv=400).build())}) == 1


@pytest.mark.parametrize("family", [f for f in KernelFamily if f is not KernelFamily.SDPA_DECODE], ids=lambda f: f.value)
def test_family_shape_buckets(family):
    launch = LaunchBuilder.from_plan(plan_of(family)).fields(**FIELDS[family]).build()
    bucket = shape_bucket(launch)
    expected = {f"{n}_bucket": bucket_pow2(v) for n, v in FIELDS[family].items() if n != "tokens"}
    assert dict(bucket.buckets) == expected
    for name, value in expected.items():
        assert getattr(bucket, name) == value
    with pytest.raises(AttributeError):
        bucket.tokens_bucket


def test_tune_cache_key_fields():
    plan = KernelPlanBuilder(KernelFamily.FBANK).precision_profile(PrecisionProfile.HIGH_FIDELITY).schema_version(3).build_plan()
    launch = LaunchBuilder.from_plan(plan).fields(**FIELDS[KernelFamily.FBANK]).build()
    key = tune_cache_key(plan, launch, "sm90", 0b101)
    assert key.schema_version == 3 and key.family is KernelFamily.FBANK
    assert key.precision_profile is PrecisionProfileTag.HIGH_FIDELITY
    assert key.token_bucket == launch.token_bucket == TokenBucketStrategy().bucket_of(98)
    assert key.shape_bucket == shape_bucket(launch)
    assert (key.device_fingerprint, key.env_mask) == ("sm90", 5)
    assert key == tune_cache_key(plan, launch, "sm90", 5) and hash(key) == hash(tune_cache_key(plan, launch, "sm90", 5))
    assert key != tune_cache_key(plan, launch, "sm80", 5)


def test_profile_tags_cover_profiles_and_custom():
    assert [PrecisionProfileTag.from_profile(p).value for p in PrecisionProfile] == [p.value for p in PrecisionProfile]
    assert PrecisionProfileTag.CUSTOM.value == "custom"


@pytest.mark.parametrize("error", [MissingField("seq_kv"), InvalidField("m"), CandidateNotPresent()])
def test_launch_errors_are_value_errors_that_pickle_and_compare(error):
    assert isinstance(error, LaunchError) and isinstance(error, ValueError)
    assert pickle.loads(pickle.dumps(error)) == error
    assert MissingField("seq_kv") != InvalidField("seq_kv")
