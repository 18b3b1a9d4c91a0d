"""The perf command: usage errors, the JSON it writes (exactly the agreed keys), measured/estimated columns."""
import json

import pytest

from rlx_triton import perf
from rlx_triton.devices import profile

TOP_KEYS = ["device", "calibrated", "profile", "assumptions", "cases", "models"]
CASE_KEYS = ["bench", "case", "shape", "backend", "candidate", "routed", "decided_by", "launches", "floor_us",
             "est_us", "est_low_us", "est_high_us", "on_library_us", "bw_fraction", "kernels"]
MODEL_KEYS = ["model", "launches_per_forward", "host_syncs_per_forward"]


@pytest.mark.parametrize("argv, message", [
    (["--device", "h300"], "unknown device"),
    (["--device", "m2-max"], "not a CUDA GPU"),
    (["nope"], "unknown bench"),
])
def test_bad_usage_exits_2_with_the_reason(argv, message, capsys):
    assert perf.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def lstm_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("perf") / "out.json"
    code = perf.main(["--device", "h200", "--json", str(out), "--cache-dir", str(out.parent / "cache"), "lstm"])
    return code, json.loads(out.read_text())


def test_the_json_has_exactly_the_agreed_keys(lstm_report):
    code, report = lstm_report
    assert code == 0
    assert list(report) == TOP_KEYS
    assert report["device"] == "h200" and report["calibrated"] is False and report["assumptions"]
    # every case carries the library path estimate of its op calls (cuDNN's LSTM states its kernels), the rows
    # pinned to a candidate too: they run the same call
    assert report["cases"] and all(list(case) == CASE_KEYS + ["library_estimate"] for case in report["cases"])
    # the routed case first, then the rows pinned to a candidate (forced, not the router's choice)
    assert report["cases"][0]["routed"] is True and report["cases"][0]["decided_by"] in ("estimated", "default")
    assert all(case["routed"] is False and case["decided_by"] == "forced" for case in report["cases"][1:])
    assert len({json.dumps(case["library_estimate"], sort_keys=True) for case in report["cases"]}) == 1
    assert [list(model) for model in report["models"]] == [MODEL_KEYS, MODEL_KEYS]


def test_the_profile_block_states_the_achievable_bandwidth_and_the_latency_constants(lstm_report):
    from rlx_triton.devices import LATENCY_KEYS

    block = lstm_report[1]["profile"]
    assert block["achievable_bw"] == 4.3e12 and block["bandwidth"] == 4.8e12 and block["calibrated"] is False
    assert list(block["latency"]) == list(LATENCY_KEYS)
    assert all(low <= nominal <= high for low, nominal, high in block["latency"].values())
    assert all(block["sources"][f"latency.{key}"] for key in LATENCY_KEYS) and block["sources"]["achievable_bandwidth"]


def test_the_onchip_recurrence_is_latency_bound_with_its_exchange_poll_apart(lstm_report):
    routed = lstm_report[1]["cases"][0]
    recurrence = [k for k in routed["kernels"] if k["name"] == "_lstm_onchip_kernel"]
    assert len(recurrence) == 4
    for kernel in recurrence:
        # the counts are the 589-step loop's (its FFMA), not the poll's, which only waits
        assert kernel["bound"] == "latency" and kernel["trips_rule"] == "table"
        assert len(kernel["spin_loops"]) == 1
        steps = kernel["chain_steps"]
        assert steps["l2_hit"] == 2 * 589 and steps["cta_barrier"] % 589 == 0 and steps["cta_barrier"] > 0
        assert kernel["chain_us"] > kernel["issue_us"] > 0
        assert kernel["est_low_us"] < kernel["est_us"] < kernel["est_high_us"]
    assert routed["est_low_us"] < routed["est_us"] < routed["est_high_us"]


def test_every_case_of_the_bench_is_reported(lstm_report):
    _code, report = lstm_report
    from rlx_triton.backends.triton import lstm

    approved = [tag for tag in lstm.APPROVALS]
    routed, *pinned = report["cases"]
    assert routed["backend"] == "triton" and routed["shape"]["seq"] == 589 and routed["shape"]["batch"] == 32
    assert {case["candidate"] for case in pinned} | {routed["candidate"]} == set(approved)
    assert all(case["shape"] == routed["shape"] for case in pinned)


def test_models_report_launches_and_host_syncs_per_forward(lstm_report):
    _code, report = lstm_report
    models = {model["model"]: model for model in report["models"]}
    assert set(models) == {"PyanNet segmentation", "WeSpeaker ResNet34"}
    for model in models.values():
        assert model["launches_per_forward"] > 0 and model["host_syncs_per_forward"] >= 0


def test_measured_times_of_the_same_gpu_are_read(tmp_path):
    (tmp_path / "2026-12-01-nvidia-h200.json").write_text(json.dumps({
        "device": "NVIDIA H200", "cases": [
            {"bench": "lstm", "shape": "(32, 589, 60) h128 x4 bi cuda", "dtype": "float32", "candidate": "x",
             "rlx_us": 1234.5}]}))
    (tmp_path / "2026-12-02-nvidia-a100.json").write_text(json.dumps({"device": "NVIDIA A100-SXM4-80GB", "cases": []}))
    table = perf._measured(profile("h200"), tmp_path)
    assert table == {("lstm", "(32, 589, 60) h128 x4 bi cuda", "float32", "x"): 1234.5}
    assert perf._measured(profile("l40s"), tmp_path) == {}


def test_json_to_stdout_is_the_json_alone(capsys):
    assert perf.main(["--json", "-", "fbank"]) == 0
    out = capsys.readouterr()
    assert list(json.loads(out.out)) == TOP_KEYS and "UNCALIBRATED" in out.err


def test_an_installed_wheel_analyses_fbank_and_reports_both_models_outside_a_checkout(built_wheel, tmp_path):
    """`rlx-triton perf --device rtx4090 fbank` from the wheel alone: its stock models ship in the package too."""
    import os
    import subprocess
    import sys
    import zipfile

    site = tmp_path / "site"
    zipfile.ZipFile(built_wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-m", "rlx_triton", "perf", "--device", "rtx4090", "--json", "-",
                             "--cache-dir", str(tmp_path / "cache"), "fbank"], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == "rtx-4090" and [case["bench"] for case in report["cases"]] == ["fbank"]
    assert report["cases"][0]["backend"] == "triton" and report["cases"][0]["est_us"] > 0
    assert all(model["launches_per_forward"] for model in report["models"]), report["models"]
