"""bench/run.py: one process, side by side, a results file with the agreed keys (CPU: fallback and overhead)."""
import json
import subprocess
import sys
from pathlib import Path

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


def test_unknown_bench_name_is_a_usage_error():
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "nope"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and "unknown bench" in result.stderr
