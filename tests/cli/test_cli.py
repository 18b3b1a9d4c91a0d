"""The rlx-triton command: each subcommand's output, --json PATH everywhere, one-line usage errors (exit 2)."""
import json
import subprocess
import sys

import pytest

import rlx_triton
from rlx_triton import cli


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_process(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "rlx_triton", *argv], capture_output=True, text=True, timeout=300,
                          **kwargs)


DECODE_H200 = ["explain", "sdpa_decode", "--device", "h200", "--dtype", "float16", "--field", "batch=1",
               "--field", "seq_kv=4096", "--field", "num_heads=32", "--field", "num_kv_heads=8", "--field",
               "head_dim=128"]


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == f"rlx-triton {rlx_triton.__version__}"


def test_info_json_lists_devices_backends_versions_and_tune_cache(capsys):
    code, out, _ = run(capsys, "info", "--json", "-")
    report = json.loads(out)
    assert code == 0
    assert report["torch"] and "triton" in report and report["rlx_triton"] == rlx_triton.__version__
    cpu = next(d for d in report["devices"] if d["device"] == "cpu")
    assert set(cpu["backends"]) >= {"triton", "metal", "torch"}
    assert cpu["backends"]["torch"] == "runs here"
    assert "path" in report["tune_cache"] and "entries" in report["tune_cache"]


def test_info_text_says_why_a_backend_does_not_run(capsys):
    code, out, _ = run(capsys, "info")
    assert code == 0 and "metal" in out and "MPS" in out


def test_json_path_writes_the_file_and_keeps_the_text_on_stdout(capsys, tmp_path):
    path = tmp_path / "sub" / "info.json"
    code, out, _ = run(capsys, "info", "--json", str(path))
    assert code == 0 and "tune cache:" in out
    assert json.loads(path.read_text())["devices"]


def test_every_command_takes_json_as_a_path():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name in ("info", "explain", "tune", "audit", "bench"):
        [action] = [a for a in commands[name]._actions if "--json" in a.option_strings]
        assert action.metavar == "PATH" and action.nargs is None, name


def test_explain_prints_the_route_for_a_shape(capsys):
    code, out, _ = run(capsys, "explain", "fbank", "--field", "batch=1", "--field", "samples=16000",
                       "--field", "bins=80", "--backend", "torch", "--json", "-")
    route = json.loads(out)
    assert code == 0
    assert route["backend"] == "torch" and route["family"] == "fbank"
    assert route["skipped"]["triton"].startswith("not-selected")
    assert route["fields"]["frames"] == 98 and route["fields"]["window"] == 512
    assert set(route["filled"]) == {"window_size", "window_shift", "round_to_power_of_two", "window", "frames", "tokens"}


def test_explain_conv_takes_its_default_op(capsys):
    code, out, _ = run(capsys, "explain", "conv", "--field", "batch=2", "--field", "c_in=60", "--field", "c_out=60",
                       "--field", "length=1000", "--field", "taps=5", "--json", "-")
    assert code == 0 and json.loads(out)["op"] == "conv1d"


def test_explain_as_on_a_named_gpu_routes_for_its_architecture(capsys):
    code, out, _ = run(capsys, *DECODE_H200, "--json", "-")
    route = json.loads(out)
    assert code == 0
    assert route["profile"] == "NVIDIA H200" and route["fields"]["m"] == 4 and route["fields"]["tokens"] == 1
    pytest.importorskip("triton", reason="the triton backend runs on a CUDA profile only where triton is installed")
    assert route["backend"] == "triton" and route["candidate"]
    assert set(route["legend"]) == set(route["candidate"].split("_"))


def test_explain_text_has_the_filled_fields_and_the_tag_legend(capsys):
    code, out, _ = run(capsys, *DECODE_H200)
    assert code == 0 and out.startswith("as on NVIDIA H200 (sm_90")
    [filled_m] = [line for line in out.splitlines() if line.strip().startswith("m=4 ")]
    assert filled_m.endswith("seq_q x num_heads / num_kv_heads: query rows per KV head")
    if "-> triton" in out:
        assert "split_k=" in out and "tg_size=" in out


def test_device_profiles_answer_to_a_unique_prefix():
    assert cli.find_profile("a100").key == "a100-80gb"
    assert cli.find_profile("rtx4090").key == "rtx-4090"
    assert cli.find_profile("H200").key == "h200"
    assert cli.find_profile("m1").key == "m1"
    assert cli.find_profile("m") is None and cli.find_profile("tpu") is None


def test_explain_cuda_without_a_gpu_says_so_and_names_the_profiles(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(capsys, "explain", "sdpa_decode", "--device", "cuda", "--field", "batch=1",
                       "--field", "num_heads=8", "--field", "head_dim=64", "--field", "seq_kv=128")
    assert code == 2 and "no CUDA device is visible" in err and "h200" in err


@pytest.mark.parametrize("argv, message", [
    (["explain", "foo"], "unknown family 'foo'; choose from sdpa_decode, conv, fbank, lstm, segdense"),
    (["explain", "conv", "conv3d"], "choose from conv1d, conv2d, sincnet, stats_pool"),
    (["explain", "fbank", "--field", "bins"], "--field expects name=value"),
    (["explain", "fbank", "--field", "batch=1", "--field", "samples=16000", "--field", "colour=3"],
     "fbank has no field colour; its fields are batch, samples, bins, window_size, window_shift, "
     "round_to_power_of_two (derived: window, frames, tokens)"),
    (["explain", "fbank", "--field", "batch=1", "--field", "samples=16000", "--dtype", "int8"],
     "--dtype must be one of float16, bfloat16, float32, float64"),
    (["explain", "fbank", "--field", "batch=1"], "fbank needs --field samples=N"),
    (["explain", "fbank", "--field", "batch=1", "--field", "samples=16000", "--device", "tpu"],
     "is neither cpu, cuda[:N], mps nor a GPU profile"),
    (["audit", "--arch", "sm_75"], "--arch must be one of sm_80"),
    (["tune", "gpt-17"], "model must be one of"),
    (["bench", "--quick", "nonsense"], "unknown bench nonsense"),
])
def test_usage_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1, err


def test_a_usage_error_from_the_command_line_is_one_line_without_traceback():
    result = run_process("explain", "foo")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "Traceback" not in result.stderr


def test_argparse_errors_are_one_line_too():
    result = run_process("explain", "fbank", "--backend", "cuda")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "invalid choice" in result.stderr and "--help" in result.stderr


def test_explain_help_lists_every_familys_ops_fields_and_features():
    result = run_process("explain", "--help")
    assert result.returncode == 0
    for family in ("sdpa_decode", "conv", "fbank", "lstm", "segdense"):
        assert f"\n  {family}\n" in result.stdout
    for text in ("conv1d: --field batch, c_in, c_out, length, taps", "filled in when not given: seq_q, num_kv_heads",
                 "window_type=povey", "h200", "legend"):
        assert text in result.stdout


def test_bench_outside_a_source_checkout_says_so(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_bench_root", lambda: None)
    code, _, err = run(capsys, "bench", "--quick")
    assert code == 2 and "source checkout" in err


def test_python_dash_m_runs_the_same_cli():
    result = run_process("info", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert "devices" in json.loads(result.stdout)


def test_missing_subcommand_is_a_usage_error():
    with pytest.raises(SystemExit) as caught:
        cli.main([])
    assert caught.value.code == 2


def test_a_lazy_subcommand_is_imported_only_when_it_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "fake_perf_command.py").write_text(
        "def add_arguments(parser):\n"
        "    parser.add_argument('--device', required=True)\n"
        "def run(args):\n"
        "    print('perf for', args.device)\n"
        "    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.LAZY_COMMANDS, "perf", ("fake_perf_command", "performance analysis"))
    cli.build_parser()
    assert "fake_perf_command" not in sys.modules
    code, out, _ = run(capsys, "perf", "--device", "h200")
    assert code == 0 and out == "perf for h200\n"
    with pytest.raises(SystemExit) as caught:
        cli.main(["perf"])
    assert caught.value.code == 2 and "--device" in capsys.readouterr().err
    sys.modules.pop("fake_perf_command", None)


def test_perf_is_a_subcommand_that_loads_only_when_it_runs(capsys):
    code = subprocess.run([sys.executable, "-c", "import sys; from rlx_triton import cli; cli.build_parser(); "
                           "print([m for m in ('rlx_triton.perf', 'torch') if m in sys.modules])"],
                          capture_output=True, text=True, timeout=120)
    assert code.stdout.strip() == "[]", code.stdout + code.stderr
    code, _, err = run(capsys, "perf", "--device", "m2-max")
    assert code == 2 and "not a CUDA GPU" in err


DECODE_H200_JSON = ("explain", "sdpa_decode", "--device", "h200", "--field", "batch=4", "--field", "num_heads=32",
               "--field", "num_kv_heads=8", "--field", "head_dim=128", "--field", "seq_kv=4096", "--json", "-")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_explain_says_the_f16kv_flag_uses_16_bit_operands_only_on_16_bit_requests(capsys, dtype):
    from rlx_triton.planner import SdpaDecodeCandidate

    pytest.importorskip("triton", reason="the triton backend runs on a CUDA profile only where triton is installed")
    code, out, _ = run(capsys, *DECODE_H200_JSON, "--dtype", dtype)
    route = json.loads(out)
    assert code == 0 and route["backend"] == "triton"
    assert SdpaDecodeCandidate.from_tag(route["candidate"]).use_f16_kv
    meaning = route["legend"]["f16kv"]
    if dtype == "float32":
        assert "fp16/bf16 operands (tensor cores)" not in meaning and "keeps fp32" in meaning
    else:
        assert "fp16/bf16 operands (tensor cores)" in meaning
