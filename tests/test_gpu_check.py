"""bench/gpu_check.sh, the one GPU command: its checks, their budgets, and the tests they name."""
from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"


def test_list_prints_every_check_with_a_budget_summing_to_at_most_480_seconds():
    listed = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True,
                            timeout=30).stdout
    rows = dict(re.findall(r"^(\S+)\s+(\d+) s", listed, flags=re.M))
    total = int(rows.pop("total"))
    assert {"graphs", "no-sync", "two-streams", "sanitizer", "multi-gpu", "rlx-flash", "gpu-tests", "bench",
            "diarization", "wheels"} <= set(rows)
    assert sum(int(budget) for budget in rows.values()) == total <= 480


def test_every_test_a_dedicated_check_names_exists_and_is_gpu_marked():
    named = re.findall(r'"(tests/[\w/]+\.py)::(\w+)"', SCRIPT.read_text())
    assert len(named) >= 8
    for path, name in named:
        source = (REPO / path).read_text()
        assert re.search(rf"@pytest\.mark\.gpu\n(?:@.*\n)*def {name}\(", source), f"{path}::{name}"


def test_an_unknown_check_is_a_usage_error_naming_the_checks():
    listed = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True,
                            timeout=30).stdout
    checks = [name for name in re.findall(r"^(\S+)\s+\d+ s", listed, flags=re.M) if name != "total"]
    done = subprocess.run(["bash", str(SCRIPT), "no-such-check"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "unknown check 'no-such-check'" in done.stderr
    assert f"checks: {' '.join(checks)}" in done.stderr
