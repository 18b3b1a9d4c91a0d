"""bench/run.py: one process, side by side, a results file with the agreed keys (CPU: fallback and overhead)."""
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_quick_dispatch_overhead_run_writes_json_markdown_and_summary(tmp_path):
    env_cmd = [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(tmp_path), "dispatch_overhead"]
    result = subprocess.run(env_cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    [report_file] = list(tmp_path.glob("*.json"))
    report = json.loads(report_file.read_text())
    assert {"device", "torch", "triton", "cases", "summary"} <= set(report)
    assert len(report["cases"]) == 2
    for case in report["cases"]:
        assert {"bench", "shape", "dtype", "rlx_us", "baseline", "baseline_us", "speedup", "gbps"} <= set(case)
        assert case["bench"] == "dispatch_overhead" and case["backend"] == "torch"
    assert set(report["summary"]) == {"sdpa_decode_geomean_speedup", "decode_bw_fraction", "fbank_speedup",
                                      "sincnet_speedup", "lstm_speedup", "pyannote_segmentation_speedup",
                                      "embedding_speedup"}
    assert report_file.with_suffix(".md").read_text().startswith("# rlx_triton benchmarks")
    assert "bench: 2/2 case" in result.stderr  # one unit of progress per case


def test_unknown_bench_name_is_a_usage_error():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "nope"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and "unknown bench" in result.stderr


def _tiny_bench(monkeypatch, sizes=(1,), name="tiny", fail_at=None):
    """A bench module with one case per size (bench.common.each_case); the case at index fail_at raises."""
    import types

    from bench import run as bench_run
    from bench.common import each_case

    def run(quick, progress=None):
        rows = []
        for spec in each_case(name, cases(quick), progress):
            if spec["size"] == fail_at:
                raise RuntimeError("this case is broken")
            rows.append({"bench": name, "shape": f"n{spec['size']}", "dtype": "float32", "rlx_us": 2.0,
                         "baseline": "torch", "baseline_us": 3.0, "speedup": 1.5, "gbps": None})
        return rows

    def cases(quick, gpu=None):
        return [dict(size=size) for size in sizes]

    module = types.ModuleType(f"{name}_bench_for_tests")
    module.run, module.cases = run, cases
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(bench_run.BENCHES, name, module.__name__)
    return bench_run


def test_progress_counts_every_case_of_every_bench_against_their_total(monkeypatch, capsys):
    _tiny_bench(monkeypatch, sizes=(1, 7), name="tiny")
    bench_run = _tiny_bench(monkeypatch, sizes=(80,), name="small")
    assert bench_run.main(["--quick", "tiny", "small"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" [")[0] for line in lines] == ["bench: 1/3 case", "bench: 3/3 case"]
    assert lines[0].endswith(", tiny size=1]") and lines[-1].endswith(", small size=80]")


def test_a_failing_bench_still_counts_its_cases_and_the_others_run(monkeypatch, capsys):
    _tiny_bench(monkeypatch, sizes=(1, 7, 80), name="broken", fail_at=7)
    bench_run = _tiny_bench(monkeypatch, sizes=(333,), name="tiny")
    assert bench_run.main(["--quick", "--json", "-", "broken", "tiny"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert [case["shape"] for case in report["cases"]] == ["n333"]
    assert report["errors"] == {"broken": "RuntimeError: this case is broken"}
    assert "bench: 4/4 case" in captured.err


def test_every_bench_module_lists_its_cases_and_reports_each_one_to_a_progress():
    import importlib
    import inspect

    from bench.run import BENCHES

    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        assert "progress" in inspect.signature(module.run).parameters, name
        specs = module.cases(True)
        assert specs and all(isinstance(spec, dict) for spec in specs), name


def test_each_case_labels_a_case_before_its_body_and_counts_it_after():
    from bench.common import each_case

    events = []

    class Recorder:
        def set_label(self, label):
            events.append(("label", label))

        def update(self):
            events.append(("done",))

    for spec in each_case("sdpa_decode", [dict(label="gqa", dtype=torch.float16), dict(label="mha")], Recorder()):
        events.append(("body", spec["label"]))
    assert events == [("label", "sdpa_decode label=gqa dtype=float16"), ("body", "gqa"), ("done",),
                      ("label", "sdpa_decode label=mha"), ("body", "mha"), ("done",)]
    assert list(each_case("fbank", [dict(batch=2)])) == [dict(batch=2)]  # without a progress: just the cases


def test_results_are_written_only_when_asked(monkeypatch, tmp_path, capsys):
    bench_run = _tiny_bench(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert bench_run.main(["--quick", "tiny"]) == 0
    assert list(tmp_path.iterdir()) == []
    assert "| tiny | n1 | float32 |" in capsys.readouterr().out


def test_json_dash_puts_only_the_report_on_stdout(monkeypatch, capsys):
    bench_run = _tiny_bench(monkeypatch)
    assert bench_run.main(["--quick", "--json", "-", "tiny"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cases"][0]["speedup"] == 1.5


def test_plot_keeps_every_label_inside_the_picture(tmp_path):
    import warnings

    import matplotlib.image
    from bench.run import plot

    cases = [{"bench": "sdpa_decode", "shape": f"B{b} Hq32 Hkv8 D128 S{s}", "dtype": "bfloat16",
              "baseline": "torch SDPA (best backend)", "speedup": 0.5 + 0.1 * b} for b in range(12) for s in (512, 65536)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. matplotlib's "Tight layout not applied"
        assert plot({"cases": cases, "device": "NVIDIA H200", "date": "2026-12-01", "quick": True}, tmp_path / "p.png")
    height, width, _ = matplotlib.image.imread(tmp_path / "p.png").shape
    assert height > 24 * 0.28 * 120 and width > 10 * 120 * 0.9  # one row per case at 120 dpi, labels included
