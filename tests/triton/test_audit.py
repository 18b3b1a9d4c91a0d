"""The ahead-of-time compile audit: records per variant, shared-memory limits, spill accounting."""
import pytest

from rlx_triton.backends.triton.audit import (AuditRecord, _list_variants, failures, format_table, run_audit,
                                              triton_family_modules)


@pytest.fixture(scope="module")
def audit_run():
    """The fixture module's records, and the totals run_audit reported before compiling."""
    totals = []
    records = run_audit(archs=(80, 90), modules=["tests.triton.audit_fixture"], workers=2, on_total=totals.append)
    return records, totals


@pytest.fixture(scope="module")
def fixture_records(audit_run):
    return audit_run[0]


def test_run_audit_reports_the_number_of_variants_before_compiling_them(audit_run):
    records, totals = audit_run
    assert totals == [len(records)] == [6]


def by(records, kernel, arch):
    return next(r for r in records if r.kernel == kernel and r.arch == arch)


def test_each_variant_gets_one_record_per_arch(fixture_records):
    assert sorted((r.kernel, r.arch) for r in fixture_records) == [
        ("fixture_big_dot", "sm_80"), ("fixture_big_dot", "sm_90"),
        ("fixture_scale", "sm_80"), ("fixture_scale", "sm_90"),
        ("fixture_scale_twin", "sm_80"), ("fixture_scale_twin", "sm_90")]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_variants_that_compile_to_the_same_kernel_are_compiled_once_under_each_name(fixture_records, arch):
    scale, twin = by(fixture_records, "fixture_scale", arch), by(fixture_records, "fixture_scale_twin", arch)
    assert (twin.candidate, twin.default) == ("twin128", True) and scale.candidate == "block128"
    # one compile's facts, its timing included, copied under the second name
    assert (twin.registers, twin.spills, twin.shared_bytes, twin.seconds) == \
        (scale.registers, scale.spills, scale.shared_bytes, scale.seconds)


def test_clean_kernel_reports_registers_no_spills_no_mma(fixture_records):
    record = by(fixture_records, "fixture_scale", "sm_90")
    assert record.ok and record.default
    assert record.registers > 0 and record.spills == 0 and record.uses_mma is False


def test_variant_over_the_shared_memory_limit_is_not_ok(fixture_records):
    # a 256x256 fp16 dot pipelined over 4 stages needs far more than 163 KiB on sm_80
    record = by(fixture_records, "fixture_big_dot", "sm_80")
    assert not record.ok
    assert "shared memory" in record.error and record.shared_bytes > 163 * 1024


def test_failures_list_not_ok_variants_and_spilling_defaults():
    fine = AuditRecord("f", "k", "c", "sm_90", "fp32", default=False, ok=True, spills=64)
    spilling_default = AuditRecord("f", "k", "c", "sm_90", "fp32", default=True, ok=True, spills=64)
    broken = AuditRecord("f", "k", "c", "sm_90", "fp32", default=False, ok=False, error="boom")
    reasons = dict((id(r), why) for r, why in failures([fine, spilling_default, broken]))
    assert id(fine) not in reasons
    assert "spills 64 B" in reasons[id(spilling_default)]
    assert reasons[id(broken)] == "boom"


def test_table_marks_defaults_and_failures(fixture_records):
    table = format_table(fixture_records)
    assert "(default)" in table and "NO" in table


def test_audit_covers_every_triton_family_module():
    modules = triton_family_modules()
    for family in ("sdpa_decode", "conv", "fbank", "lstm", "segdense", "conv2d"):
        assert f"rlx_triton.backends.triton.{family}" in modules


def test_bf16_beside_fp16_is_listed_for_the_default_candidate_unless_every_dtype_is_asked():
    listed = _list_variants(["tests.triton.audit_dtype_fixture"], (80,))
    every = _list_variants(["tests.triton.audit_dtype_fixture"], (80,), every_dtype=True)
    # (spec, candidate index, dtype): candidate 0 is the default
    assert sorted(v[1:4] for v in listed) == [("fixture_two_dtypes", 0, "bf16"), ("fixture_two_dtypes", 0, "fp16"),
                                               ("fixture_two_dtypes", 1, "fp16")]
    assert len(every) == 4
