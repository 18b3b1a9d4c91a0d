"""bench records: machine-readable rows appended run after run (Liger-Kernel's all_benchmark_data.csv columns),
with the spread of each timing, the package version and git SHA; dispatch overhead as a metric of its own."""
import csv

import pytest

from tests.cli.test_bench_run import _tiny_bench


def read_rows(path):
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_each_run_appends_its_rows_with_percentiles_version_and_sha(monkeypatch, tmp_path, capsys):
    import rlx_triton

    bench_run = _tiny_bench(monkeypatch, sizes=(1, 7))
    assert bench_run.main(["--quick", "--out", str(tmp_path), "tiny"]) == 0
    first = read_rows(tmp_path / "all_benchmark_data.csv")
    assert bench_run.main(["--quick", "--out", str(tmp_path), "tiny"]) == 0
    rows = read_rows(tmp_path / "all_benchmark_data.csv")
    assert len(first) == 4 and len(rows) == 8 and rows[:4] == first   # appended, the header written once
    assert list(rows[0]) == list(bench_run.RECORD_FIELDS)
    assert {(r["kernel_name"], r["kernel_provider"], r["metric_name"], r["x_value"]) for r in first} == {
        ("tiny", provider, "time", shape) for provider in ("rlx_triton", "torch") for shape in ("n1", "n7")}
    row = first[0]
    assert row["rlx_triton_version"] == rlx_triton.__version__ and row["gpu_name"] == "cpu"
    assert row["git_sha"] and row["timestamp"].endswith("+00:00") and row["kernel_operation_mode"] == "forward"
    assert float(row["y_value_20"]) <= float(row["y_value_50"]) <= float(row["y_value_80"])
    assert (tmp_path / "latest-tiny.png").stat().st_size > 0   # one plot per family


def test_a_timing_carries_its_20th_and_80th_percentiles():
    from bench.common import Timing

    timing = Timing.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert timing == 3.0 and timing.p20 == pytest.approx(1.8) and timing.p80 == pytest.approx(4.2)


def test_case_rows_carry_the_spread_of_both_sides():
    from bench.common import Timing, case

    row = case("fbank", "(2, 1, 16000)", "float32", Timing.of([1.0, 2.0, 3.0]), "torch", Timing.of([4.0, 6.0, 8.0]))
    assert row["rlx_p20_us"] == 1.4 and row["rlx_p80_us"] == 2.6
    assert row["baseline_p20_us"] == 4.8 and row["baseline_p80_us"] == 7.2 and row["speedup"] == 3.0


def test_dispatch_overhead_is_a_metric_of_its_own_and_claims_no_speedup():
    from bench import run as bench_run
    from bench.common import case

    row = case("dispatch_overhead", "sdpa tiny cpu", "float32", 1.0, "torch sdpa", 1.24, metric="dispatch_overhead")
    assert row["speedup"] is None and row["metric"] == "dispatch_overhead"
    report = {"device": "cpu", "timestamp": "2026-12-01T00:00:00+00:00", "rlx_triton": "0", "git_sha": "abc",
              "torch": "2", "triton": "3", "quick": True, "cases": [row]}
    metrics = [(r["kernel_provider"], r["metric_name"], r["y_value_50"]) for r in bench_run.records(report)]
    assert metrics == [("rlx_triton", "time", 1.0), ("torch sdpa", "time", 1.24),
                       ("rlx_triton", "dispatch_overhead", -0.24)]
    table = bench_run.markdown({**report, "date": "2026-12-01", "copy_gbps": 1.0, "summary": {}, "errors": {}})
    assert "| -0.24 us overhead |" in table
    assert "1.24x" not in table


def test_an_unknown_metric_is_refused():
    from bench.common import case

    with pytest.raises(ValueError, match="metric must be one of time, dispatch_overhead"):
        case("fbank", "s", "float32", 1.0, "torch", 1.0, metric="speedup")
