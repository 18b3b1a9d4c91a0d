"""The planner's policy types: defaults, presets and precision profiles."""
import dataclasses

import pytest

from rlx_triton.planner import (
    ConvertPolicy,
    MemoryKind,
    MemoryPolicy,
    ObjectiveWeights,
    PrecisionProfile,
    RolePrecision,
    ScalarType,
    ThreadPolicy,
    TokenBucketStrategy,
    TuneCacheEviction,
    TunePolicy,
)


def test_role_precision_native():
    role = RolePrecision.native(ScalarType.BF16, ScalarType.F32)
    assert (role.storage, role.compute, role.convert) == (ScalarType.BF16, ScalarType.F32, ConvertPolicy.NATIVE)
    assert hash(role) == hash(RolePrecision(ScalarType.BF16, ScalarType.F32))


@pytest.mark.parametrize(
    "profile,storage,compute,kv",
    [
        (PrecisionProfile.ULTRA_LOW_LATENCY, ScalarType.F16, ScalarType.F16, (ScalarType.F16, ScalarType.F16)),
        (PrecisionProfile.BALANCED, ScalarType.BF16, ScalarType.F16, (ScalarType.BF16, ScalarType.F16)),
        (PrecisionProfile.HIGH_FIDELITY, ScalarType.F32, ScalarType.F32, (ScalarType.F32, ScalarType.F32)),
        (PrecisionProfile.DETERMINISTIC, ScalarType.F32, ScalarType.F32, (ScalarType.F32, ScalarType.F32)),
    ],
)
def test_profile_default_specs(profile, storage, compute, kv):
    spec = profile.default_spec()
    assert spec.activations == spec.weights == RolePrecision.native(storage, compute)
    assert spec.accum == RolePrecision.native(ScalarType.F32, ScalarType.F32)
    assert spec.kv_cache == RolePrecision.native(*kv)


def test_thread_and_memory_defaults():
    assert ThreadPolicy() == ThreadPolicy(max_threads_per_tg=256, prefer_simdgroups=True)
    assert MemoryPolicy() == MemoryPolicy.shared_if_fits() == MemoryPolicy.shared_if_fits(max_tg_bytes=32768)
    assert MemoryPolicy.arena_only().kind is MemoryKind.ARENA_ONLY
    assert MemoryPolicy.force_shared().kind is MemoryKind.FORCE_SHARED
    assert MemoryPolicy.shared_if_fits(1024).max_tg_bytes == 1024


def test_tune_policy_presets():
    assert TunePolicy() == TunePolicy.disabled()
    assert dataclasses.astuple(TunePolicy.disabled()) == (
        False, 0, 0, True, False, 256, TuneCacheEviction.KEEP_LOW_BUCKETS, True)
    assert dataclasses.astuple(TunePolicy.balanced_defaults()) == (
        True, 2, 8, True, True, 256, TuneCacheEviction.KEEP_LOW_BUCKETS, False)


def test_token_bucket_default_edges():
    assert TokenBucketStrategy() == TokenBucketStrategy.decode_default()
    assert TokenBucketStrategy().edges == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def test_objective_weight_defaults():
    assert ObjectiveWeights() == ObjectiveWeights(latency=0.6, error=0.3, memory=0.1)


def test_policies_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ThreadPolicy().max_threads_per_tg = 1


@pytest.mark.parametrize("dtype,short", [("float64", "f64"), ("torch.float32", "f32"), ("bfloat16", "bf16"),
                                         ("float16", "f16"), ("torch.float8_e4m3fn", "f8e4m3"),
                                         ("float8_e5m2", "f8e5m2"), ("int8", "i8")])
def test_scalar_type_names_each_dtype_the_kernels_take_or_a_cache_is_stored_in(dtype, short):
    from rlx_triton.planner import ScalarType

    assert ScalarType.from_dtype(dtype).value == short


def test_scalar_type_of_a_dtype_no_kernel_takes_is_a_value_error_naming_it():
    from rlx_triton.planner import ScalarType

    with pytest.raises(ValueError, match="dtype.*int32"):
        ScalarType.from_dtype("int32")
