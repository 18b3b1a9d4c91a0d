"""The first Ctrl-C stops the long commands that compile in worker processes (audit, perf): queued work is
cancelled, the workers terminated, no traceback, a partial summary, exit code 130. SIGTERM (what `timeout`
sends) stops them the same way, with 143 and no leaked-semaphore warning."""
import re
import signal
import subprocess
import sys

import pytest

from tests.cli.terminal import run_in_terminal

pytest.importorskip("triton", reason="audit and perf compile with the ptxas in the triton wheel")

CLI = [sys.executable, "-m", "rlx_triton"]


def assert_stopped_cleanly(output: str) -> None:
    assert "Traceback" not in output and "leaked semaphore" not in output, output
    assert "KeyboardInterrupt" not in output, output


def test_the_first_ctrl_c_stops_the_audit_with_a_partial_summary():
    run = run_in_terminal(CLI + ["audit", "--workers", "2", "--family", "fbank"], ctrl_c_after="| 1/",
                          timeout=300)
    assert run.exit_code == 130, run.output
    assert run.seconds_after_ctrl_c is not None and run.seconds_after_ctrl_c < 15
    assert re.search(r"rlx-triton audit: interrupted after \d+ of \d+ variants", run.output), run.output
    assert_stopped_cleanly(run.output)


def test_the_first_ctrl_c_stops_the_perf_compiles():
    run = run_in_terminal(CLI + ["perf", "--device", "h200", "--no-cache", "--workers", "2", "fbank"],
                          ctrl_c_after="compiling ", timeout=300)
    assert run.exit_code == 130, run.output
    assert run.seconds_after_ctrl_c is not None and run.seconds_after_ctrl_c < 15
    assert "rlx-triton perf: interrupted" in run.output
    assert_stopped_cleanly(run.output)


def test_sigterm_stops_the_audit_without_leaking_semaphores():
    process = subprocess.Popen(CLI + ["audit", "--workers", "2", "--family", "fbank"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    first_line = process.stderr.readline()  # the first compiled variant: the pool is running
    assert first_line.startswith("audit: 1/"), first_line
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err
    assert "interrupted after " in err
    assert_stopped_cleanly(err)
