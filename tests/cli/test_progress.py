"""One progress mechanism for tune, audit, bench and perf: a tqdm bar on a terminal, plain lines in logs."""
import io

from rlx_triton.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_plain_lines_with_the_count_the_total_an_eta_and_the_unit_of_work():
    log = io.StringIO()
    with Progress(3, "audit", unit="variant", stream=log, interval=0) as progress:
        for name in ("conv", "fbank", "lstm"):
            progress.set_label(name)
            progress.update()
    lines = log.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in log.getvalue()
    assert lines[0].startswith("audit: 1/3 variant [00:00<") and lines[0].endswith(", conv]")
    assert lines[-1].startswith("audit: 3/3 variant") and lines[-1].endswith(", lstm]")


def test_a_log_gets_the_first_and_the_last_line_and_at_most_one_per_interval_between():
    log = io.StringIO()
    with Progress(100, "tune", unit="case", stream=log, interval=3600) as progress:
        for _ in range(100):
            progress.update()
    lines = log.getvalue().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["tune: 1/100 case", "tune: 100/100 case"]


def test_a_terminal_gets_a_tqdm_bar():
    terminal = Terminal()
    with Progress(2, "bench", unit="bench", stream=terminal) as progress:
        progress.update()
        progress.update()
    assert "\r" in terminal.getvalue() and "2/2" in terminal.getvalue() and "100%" in terminal.getvalue()


def test_a_total_known_only_later_is_shown_from_then_on():
    log = io.StringIO()
    with Progress(0, "audit", unit="variant", stream=log, interval=0) as progress:
        progress.set_total(2)
        progress.update()
        progress.update()
    assert [line.split(" [")[0] for line in log.getvalue().splitlines()] == ["audit: 1/2 variant", "audit: 2/2 variant"]


def test_disabled_progress_writes_nothing():
    log = io.StringIO()
    with Progress(2, "tune", stream=log, enabled=False) as progress:
        progress.update()
    assert log.getvalue() == ""


def test_a_jump_of_several_units_is_one_line_with_the_new_count():
    log = io.StringIO()
    with Progress(5, "bench", unit="case", stream=log, interval=3600) as progress:
        progress.update()
        progress.update(4)  # the cases a failed bench did not reach, counted at once
    assert [line.split(" [")[0] for line in log.getvalue().splitlines()] == ["bench: 1/5 case", "bench: 5/5 case"]


def bar_widths(output: str):
    """(line length, bar width) of each redraw of a tqdm bar in a terminal's output."""
    redraws = [part for line in output.split("\r\n") for part in line.split("\r") if "%|" in part]
    return [(len(part), len(part.split("|")[1])) for part in redraws]


def test_on_an_80_column_terminal_the_label_is_clipped_and_the_bar_keeps_its_width():
    import sys

    from tests.cli.terminal import run_in_terminal

    run = run_in_terminal([sys.executable, "-m", "rlx_triton", "bench", "--quick", "fbank"], columns=80)
    assert run.exit_code == 0, run.output
    widths = bar_widths(run.output)
    assert widths and all(length <= 80 for length, _ in widths), widths
    assert all(bar >= 15 for _, bar in widths), widths
    assert ", fbank b" in run.output and "…" in run.output


def test_a_wide_terminal_shows_the_whole_label(monkeypatch):
    import os

    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((160, 24)))
    terminal = Terminal()
    terminal.fileno = lambda: 2
    label = "sdpa_decode label=gqa batch=16 heads=32 kv_heads=8 dtype=float16 seq=4096"
    with Progress(2, "bench", unit="case", stream=terminal) as progress:
        progress.set_label(label)
        progress.update()
    assert label in terminal.getvalue()
    assert all(length <= 160 and bar >= 20 for length, bar in bar_widths(terminal.getvalue()))
