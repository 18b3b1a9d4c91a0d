"""The rlx-triton command: each subcommand's output, --json forms and exit codes."""
import json
import subprocess
import sys

import pytest

from rlx_triton import cli


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_info_json_lists_devices_backends_versions_and_tune_cache(capsys):
    code, out, _ = run(capsys, "info", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["torch"] and "triton" in report
    cpu = next(d for d in report["devices"] if d["device"] == "cpu")
    assert set(cpu["backends"]) >= {"triton", "metal", "torch"}
    assert cpu["backends"]["torch"] == "runs here"
    assert "path" in report["tune_cache"] and "entries" in report["tune_cache"]


def test_info_text_says_why_a_backend_does_not_run(capsys):
    code, out, _ = run(capsys, "info")
    assert code == 0 and "metal" in out and "MPS" in out


def test_explain_prints_the_route_for_a_shape(capsys):
    code, out, _ = run(capsys, "explain", "fbank", "--field", "batch=1", "--field", "samples=16000",
                       "--field", "frames=98", "--field", "window=512", "--field", "bins=80",
                       "--field", "tokens=98", "--backend", "torch", "--json")
    route = json.loads(out)
    assert code == 0
    assert route["backend"] == "torch" and route["family"] == "fbank"
    assert route["skipped"]["triton"].startswith("not-selected")


def test_explain_rejects_a_malformed_field(capsys):
    code, _, err = run(capsys, "explain", "fbank", "--field", "bins")
    assert code == 2 and "name=value" in err


def test_explain_rejects_an_unknown_dtype(capsys):
    code, _, err = run(capsys, "explain", "fbank", "--field", "bins=80", "--dtype", "float7")
    assert code == 2 and "--dtype" in err


def test_audit_rejects_an_unknown_arch(capsys):
    code, _, err = run(capsys, "audit", "--arch", "sm_75")
    assert code == 2 and "sm_80" in err


def test_tune_rejects_an_unknown_model(capsys):
    code, _, err = run(capsys, "tune", "gpt-17")
    assert code == 2 and "model must be one of" in err


def test_bench_rejects_an_unknown_bench(capsys):
    code, _, err = run(capsys, "bench", "--quick", "nonsense")
    assert code == 2


def test_python_dash_m_runs_the_same_cli():
    result = subprocess.run([sys.executable, "-m", "rlx_triton", "info", "--json"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "devices" in json.loads(result.stdout)


def test_missing_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as caught:
        cli.main([])
    assert caught.value.code == 2
