"""`rlx-triton perf --calibrate`: a least-squares fit of the device constants to measured times.

On a synthetic run (times the model itself gives at known constants) the fit recovers those constants
from the profile's nominal ones; the fitted profile says `calibrated`, round-trips through its file and
keeps its ranges' spread; a results file is matched to the cases on (bench, shape, dtype, candidate).
"""
import json
from types import SimpleNamespace

import pytest

from rlx_triton import devices
from rlx_triton.perf import main
from rlx_triton.perf.calibrate import MeasuredCase, case_estimate, fit, matched_cases, measured_table
from rlx_triton.perf.roofline import KernelTerms

H200 = devices.profile("h200")
TRUTH = {"achievable_bw": 3.9e12, "launch_us": 6.0, "l2_hit": 320.0, "hbm": 700.0, "atomic": 410.0,
         "cta_barrier": 45.0, "issue_interval": 2.5}


def _terms(bytes_=0, flops=0.0, ctas=132, warps=4, instructions=0.0, chain=None):
    return KernelTerms(bytes=bytes_, flops=flops, peak=H200.peak["fp32_fma"], sms=132, ctas=ctas,
                       waves=[(1, ctas)], warps=warps, warp_instructions=instructions, chain=dict(chain or {}))


# each constant dominates at least one case: a copy, an empty launch, chains of each latency kind, one warp
# per scheduler issuing
SYNTHETIC = [
    [_terms(bytes_=4 * 10**9)],
    [_terms(bytes_=10**8)],
    [_terms()],
    [_terms(chain={"l2_hit": 2000})],
    [_terms(chain={"atomic": 1500, "l2_hit": 100})],
    [_terms(chain={"hbm": 3000})],
    [_terms(chain={"cta_barrier": 20000})],
    [_terms(instructions=2e5, warps=4)],
    [_terms(bytes_=10**7, instructions=5e4, chain={"l2_hit": 300, "atomic": 200}), _terms(bytes_=10**6)],
]


def _synthetic_cases():
    return [MeasuredCase(f"case {i}", terms, case_estimate(MeasuredCase("", terms, 1.0), TRUTH, H200))
            for i, terms in enumerate(SYNTHETIC)]


def test_the_fit_recovers_known_constants_from_a_synthetic_run():
    cases = _synthetic_cases()
    fitted = fit(cases, H200)
    for key, value in TRUTH.items():
        assert fitted[key] == pytest.approx(value, rel=0.02), key
    for case in cases:
        assert case_estimate(case, fitted, H200) == pytest.approx(case.measured_us, rel=0.01)


def test_a_constant_no_case_depends_on_stays_nominal():
    cases = [case for case in _synthetic_cases() if "hbm" not in case.terms[0].chain]
    assert fit(cases, H200)["hbm"] == pytest.approx(H200.latency_ns("hbm"), rel=1e-3)


def test_the_calibrated_profile_says_so_and_round_trips_through_its_file(tmp_path):
    fitted = devices.calibrated(H200, TRUTH, "bench/results/run.json")
    assert fitted.calibrated and not H200.calibrated
    assert fitted.achievable_bw == 3.9e12 and fitted.launch_us == 6.0
    low, nominal, high = fitted.latency["l2_hit"]
    base = H200.latency["l2_hit"]
    assert nominal == 320.0 and low / nominal == pytest.approx(base[0] / base[1]) and high > nominal
    assert "calibrated" in fitted.sources["latency.atomic"]
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(devices.profile_file(fitted, "bench/results/run.json")))
    loaded = devices.load_profile(json.loads(path.read_text()))
    assert loaded.calibrated and loaded.latency == fitted.latency and loaded.achievable_bw == fitted.achievable_bw
    assert devices.profile_block(loaded)["calibrated"] is True


def test_results_rows_match_cases_on_bench_shape_dtype_and_candidate():
    data = {"device": "NVIDIA H200", "cases": [
        {"bench": "lstm", "shape": "(32, 589, 60)", "dtype": "float32", "candidate": "a", "rlx_us": 900.0},
        {"bench": "lstm", "shape": "(32, 589, 60)", "dtype": "float32", "candidate": "b", "rlx_us": 700.0},
        {"bench": "lstm", "shape": "(32, 589, 60)", "dtype": "float32", "candidate": "c", "rlx_us": None}]}
    table = measured_table(data)
    assert table == {("lstm", "(32, 589, 60)", "float32", "a"): 900.0, ("lstm", "(32, 589, 60)", "float32", "b"): 700.0}
    kernel = SimpleNamespace(terms=_terms(bytes_=100))
    reports = [SimpleNamespace(bench="lstm", case="(32, 589, 60)", dtype="float32", candidate=tag, est_us=1.0,
                               kernels=[kernel]) for tag in ("b", "c")]
    matched = matched_cases(reports, table)
    assert [(case.measured_us, len(case.terms)) for case in matched] == [(700.0, 1)]


def test_a_results_file_without_device_or_cases_is_bad_usage(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"cases": []}))
    assert main(["--calibrate", str(path)]) == 2
    assert "needs \"device\"" in capsys.readouterr().err


def test_a_results_file_of_a_gpu_without_a_profile_is_bad_usage(tmp_path, capsys):
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"device": "cpu", "cases": []}))
    assert main(["--calibrate", str(path)]) == 2
    assert "not a CUDA GPU with a profile" in capsys.readouterr().err
