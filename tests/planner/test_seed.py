"""The planner's end-to-end behaviour in six tests: a default plan, launch field validation, the kernel
name, the winner-table key, eviction settings and the sdpa_decode default candidate."""
from rlx_triton.planner import (
    KernelFamily,
    KernelPlanBuilder,
    LaunchBuilder,
    MissingField,
    TuneCacheEviction,
    TunePolicy,
    tune_cache_key,
)


def test_plan_builder_works_with_defaults():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).autotune(TunePolicy.balanced_defaults()).build_plan()
    assert plan.family is KernelFamily.SDPA_DECODE
    assert plan.candidates


def test_launch_builder_validates_fields():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).build_plan()
    builder = LaunchBuilder.from_plan(plan).m(1).tokens(32).batch(1).num_heads(16).head_dim(128).seq_q(1)
    try:
        builder.build()
    except MissingField as err:
        assert err == MissingField("seq_kv")
        assert err.field == "seq_kv"
    else:
        raise AssertionError("missing seq_kv should fail")


def test_tune_cache_key_has_shape_and_token_bucket():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).build_plan()
    launch = (
        LaunchBuilder.from_plan(plan).m(1).tokens(192).batch(2).num_heads(32).head_dim(128).seq_q(1).seq_kv(192).build()
    )
    key = tune_cache_key(plan, launch, "m4pro-gpu", 0x10)
    assert key.family is KernelFamily.SDPA_DECODE
    assert key.device_fingerprint == "m4pro-gpu"
    assert key.env_mask == 0x10
    assert key.token_bucket == plan.token_buckets.bucket_of(192)
    assert "sdpa_decode_m1_tok192" in launch.kernel_name
    assert "_skp" in launch.kernel_name
    assert "_tm" in launch.kernel_name


def test_custom_tile_sizes_apply_to_candidates():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).tile_sizes(2, 96, 192).build_plan()
    assert all((c.tile_m, c.tile_n, c.tile_k) == (2, 96, 192) for c in plan.candidates)


def test_custom_padding_applies_to_candidates():
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).padding(2, 64).build_plan()
    assert all((c.pad_q, c.pad_kv) == (2, 64) for c in plan.candidates)


def test_tune_cache_config_applies_to_plan():
    plan = (
        KernelPlanBuilder(KernelFamily.SDPA_DECODE)
        .tune_cache(True, False, 32)
        .tune_cache_eviction(TuneCacheEviction.LRU)
        .build_plan()
    )
    assert plan.tune_policy.cache_load
    assert not plan.tune_policy.persist_cache
    assert plan.tune_policy.cache_max_entries == 32
    assert plan.tune_policy.cache_eviction is TuneCacheEviction.LRU
