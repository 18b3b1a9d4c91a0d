"""The return types of the ops' flags, as a type checker reads them: rt.sdpa_decode's return_lse,
rt.flash_attn_with_kvcache's return_softmax_lse, the varlen ops' return_attn_probs and what rt.explain answers
for an op, an rt.nn module and a model.

mypy checks user_code.py (right annotations: no error) and wrong_annotations.txt (as a .py file: an error on
each line marked "# error", none elsewhere) in one run, with torch followed so that torch.Tensor is a real type.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

import rlx_triton as rt

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ERROR_LINE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): error: (?P<message>.*)$")


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> Dict[str, List[str]]:
    """{file name: ["<line>: <message>", ...]} of one mypy run over both files (cache in a temporary dir)."""
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (the test extra installs it)")
    tmp = tmp_path_factory.mktemp("mypy")
    wrong = tmp / "wrong_annotations.py"
    wrong.write_text((HERE / "wrong_annotations.txt").read_text())
    config = tmp / "mypy.ini"
    # rlx_triton from this checkout; errors inside rlx_triton and torch are not the user's, so not reported
    config.write_text(f"[mypy]\nmypy_path = {ROOT}\nfollow_imports = silent\ncache_dir = {tmp / 'cache'}\n")
    stdout, stderr, status = api.run(["--config-file", str(config), str(HERE / "user_code.py"), str(wrong)])
    assert status in (0, 1) and not stderr, stdout + stderr   # 2: mypy itself failed
    errors: Dict[str, List[str]] = {}
    for line in stdout.splitlines():
        found = ERROR_LINE.match(line)
        if found:
            errors.setdefault(Path(found["path"]).name, []).append(f"{found['line']}: {found['message']}")
    return errors


def _marked_lines() -> Set[int]:
    lines = (HERE / "wrong_annotations.txt").read_text().splitlines()
    return {number for number, line in enumerate(lines, 1) if line.endswith("# error")}


def test_user_code_with_the_right_annotations_type_checks(mypy_errors):
    assert mypy_errors.get("user_code.py", []) == []


def test_each_wrong_annotation_is_a_type_error(mypy_errors):
    reported = mypy_errors.get("wrong_annotations.py", [])
    assert {int(error.split(":", 1)[0]) for error in reported} == _marked_lines(), reported
    assert all("Incompatible types in assignment" in error for error in reported), reported


def test_the_wrong_annotations_file_marks_one_line_per_flag_and_target():
    assert len(_marked_lines()) == 10


def test_user_code_runs_and_returns_what_its_annotations_say():
    from tests.typing import user_code

    with rt.use_backend("torch"):
        user_code.check()
