"""`--help` of every command says what each option means, lists the choices it takes and shows an example."""
import importlib
import subprocess
import sys

import pytest

from rlx_triton import cli


def help_of(command):
    """The --help text of a subcommand as `rlx-triton COMMAND --help` prints it, on one line."""
    if command in cli.LAZY_COMMANDS:
        module_name, help_text = cli.LAZY_COMMANDS[command]
        parser = cli._Parser(prog=f"rlx-triton {command}", description=help_text)
        importlib.import_module(module_name).add_arguments(parser)
    else:
        parser = cli.build_parser()._subparsers._group_actions[0].choices[command]
    return " ".join(parser.format_help().split())   # argparse wraps lines at the terminal width


def test_the_help_a_user_types_is_the_parsers_help():
    result = subprocess.run([sys.executable, "-m", "rlx_triton", "tune", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and " ".join(result.stdout.split()) == help_of("tune")


def test_tune_device_says_what_it_takes():
    assert "--device DEVICE the CUDA device to time on: cuda or cuda:N" in help_of("tune")


def test_perf_device_lists_the_gpu_profiles():
    text = help_of("perf")
    assert "h200" in text and "a100-80gb" in text and "devices.py" not in text


def test_bench_has_a_description():
    assert "Times each routed op beside the torch op it replaces" in help_of("bench")


def test_explain_help_says_what_each_field_means_and_shows_examples():
    text = help_of("explain")
    assert "num_kv_heads key/value heads (fewer than num_heads: grouped-query attention)" in text
    assert "seq_kv tokens in the KV cache" in text and "samples samples per waveform" in text
    assert "examples: rlx-triton explain sdpa_decode --device h200" in text


def test_audit_help_names_the_families():
    assert "--family NAME audit this kernel family only: sdpa_decode, conv, fbank, lstm, segdense" in help_of("audit")


@pytest.mark.parametrize("name", ["a", "a1", "h", "rtx"])
def test_a_prefix_short_of_the_model_number_names_no_gpu(name):
    assert cli.find_profile(name) is None


def test_a_feature_with_one_value_says_so_instead_of_a_one_item_list(capsys):
    code = cli.main(["explain", "sdpa_decode", "--field", "batch=1", "--field", "num_heads=2", "--field",
                     "head_dim=4", "--field", "seq_kv=4", "--feature", "causal=none"])
    err = capsys.readouterr().err
    assert code == 2 and "--feature causal has one value for this op (bottom_right), got 'none'" in err
    assert "must be one of" not in err


def test_an_unknown_audit_family_is_a_one_line_usage_error(capsys):
    pytest.importorskip("triton", reason="the audit checks its families once triton is known to be installed")
    code = cli.main(["audit", "--family", "attention"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    from rlx_triton.backends.triton import FAMILIES

    assert f"--family must be one of {', '.join(FAMILIES)}, got 'attention'" in err
    assert "varlen_attention" in err
