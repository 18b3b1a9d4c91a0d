"""The planner's policy types: defaults and presets."""
import dataclasses

import pytest

from rlx_triton.planner import (
    MemoryKind,
    MemoryPolicy,
    PrecisionProfile,
    ThreadPolicy,
    TokenBucketStrategy,
    TuneCacheEviction,
    TunePolicy,
)


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


def test_policies_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ThreadPolicy().max_threads_per_tg = 1


@pytest.mark.parametrize("dtype,short", [("float64", "f64"), ("torch.float32", "f32"), ("bfloat16", "bf16"),
                                         ("float16", "f16")])
def test_scalar_type_names_each_floating_dtype_the_kernels_take(dtype, short):
    from rlx_triton.planner import ScalarType

    assert ScalarType.from_dtype(dtype).value == short


def test_scalar_type_of_a_dtype_no_kernel_takes_is_a_value_error_naming_it():
    from rlx_triton.planner import ScalarType

    with pytest.raises(ValueError, match="dtype.*int8"):
        ScalarType.from_dtype("int8")
