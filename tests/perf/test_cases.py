"""The bench case lists and stock models ship with the package: `rlx-triton perf` builds every bench's cases
without a source checkout's bench/ or tests/."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import rlx_triton
from rlx_triton.perf import BENCHES
from rlx_triton.perf.cases import CASES

PACKAGE_DIR = Path(rlx_triton.__file__).resolve().parent

LIST_FBANK_CASES = """
import importlib.util, sys
from rlx_triton.devices import profile
from rlx_triton.perf.benches import perf_cases
from rlx_triton.router.device import profile_facts

assert importlib.util.find_spec("bench") is None, "bench/ is importable"
for case in perf_cases("fbank", profile_facts(profile("rtx4090"))):
    print(case.bench, case.case, case.dtype)
assert not any(name == "bench" or name.startswith("bench.") for name in sys.modules)
"""


def test_perf_lists_the_fbank_cases_with_no_bench_package_on_the_path(tmp_path):
    """What an installed wheel holds: the package alone, run from a directory with no bench/ in it."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE_DIR, site / "rlx_triton", ignore=shutil.ignore_patterns("__pycache__"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", LIST_FBANK_CASES], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["fbank (32, 1, 160000) cuda float32"]


BUILD_EVERY_BENCH = """
import importlib.util, sys
from rlx_triton.devices import profile
from rlx_triton.perf import BENCHES
from rlx_triton.perf.benches import perf_cases
from rlx_triton.router.device import profile_facts

assert importlib.util.find_spec("bench") is None and importlib.util.find_spec("tests") is None
facts = profile_facts(profile("h200"))
for name in BENCHES:
    print(name, len(perf_cases(name, facts)))
assert not any(name.split(".")[0] in ("bench", "tests") for name in sys.modules)
"""


def test_every_perf_bench_builds_its_cases_from_the_package_alone(tmp_path):
    """The stock pyannote models of the sincnet, pyannote_segmentation and embedding cases ship in the package."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE_DIR, site / "rlx_triton", ignore=shutil.ignore_patterns("__pycache__"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", BUILD_EVERY_BENCH], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    counts = dict(line.split() for line in result.stdout.splitlines())
    assert list(counts) == list(BENCHES)
    assert all(int(count) > 0 for count in counts.values()), counts


def test_every_perf_bench_has_a_shipped_case_list():
    assert tuple(CASES) == BENCHES


def test_the_bench_modules_run_the_shipped_case_lists():
    from bench import attention_serving, embedding, fbank, lstm, pyannote_segmentation, sdpa_decode, sincnet

    modules = dict(sdpa_decode=sdpa_decode, attention_serving=attention_serving, fbank=fbank, sincnet=sincnet,
                   lstm=lstm, pyannote_segmentation=pyannote_segmentation, embedding=embedding)
    assert {name: module.cases for name, module in modules.items()} == CASES
