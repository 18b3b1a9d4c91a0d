"""The package as a user gets it: a wheel with both licenses, py.typed and the stubs; one version; a
public surface that type checkers see while `import rlx_triton` stays lazy; a CLI that works from the
installed wheel alone."""
import ast
import importlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import rlx_triton

ROOT = Path(__file__).resolve().parents[2]
STUBBED = ("rlx_triton", "rlx_triton.nn", "rlx_triton.integrations")


def test_wheel_ships_both_license_texts_py_typed_and_the_stubs(built_wheel):
    names = zipfile.ZipFile(built_wheel).namelist()
    licenses = [n for n in names if n.endswith(("LICENSE-MIT", "LICENSE-APACHE"))]
    assert sorted(Path(n).name for n in licenses) == ["LICENSE-APACHE", "LICENSE-MIT"]
    assert {"rlx_triton/py.typed", "rlx_triton/__init__.pyi", "rlx_triton/nn/__init__.pyi",
            "rlx_triton/integrations/__init__.pyi"} <= set(names)
    metadata = zipfile.ZipFile(built_wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT OR Apache-2.0" in metadata
    assert f"\nVersion: {rlx_triton.__version__}\n" in metadata
    assert "Provides-Extra: transformers" in metadata and "Provides-Extra: pyannote" in metadata


def test_the_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]


def test_triton_pin_is_the_documented_range():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("triton>=3.6,<3.10") for d in dependencies)
    assert "triton 3.6 to 3.9" in " ".join((ROOT / "README.md").read_text().split())


def test_installed_wheel_runs_the_cli_on_its_own(built_wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(built_wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "rlx_triton", *argv], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=300)

    where = subprocess.run([sys.executable, "-c", "import rlx_triton; print(rlx_triton.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert where.stdout.startswith(str(site))
    assert cli("--version").stdout.strip() == f"rlx-triton {rlx_triton.__version__}"
    assert cli("info").returncode == 0
    assert "families and their ops" in cli("explain", "--help").stdout
    route = cli("explain", "sdpa_decode", "--device", "h200", "--field", "batch=1", "--field", "seq_kv=4096",
                "--field", "num_heads=32", "--field", "num_kv_heads=8", "--field", "head_dim=128", "--json", "-")
    assert route.returncode == 0, route.stderr
    assert json.loads(route.stdout)["profile"] == "NVIDIA H200"
    unknown = cli("explain", "sdpa_decode", "--field", "colour=1")
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1
    assert "its fields are batch, num_heads, head_dim, seq_kv" in unknown.stderr
    bench = cli("bench", "--quick")
    assert bench.returncode == 2 and "source checkout" in bench.stderr


@pytest.mark.parametrize("module_name", STUBBED)
def test_each_stub_lists_exactly_the_names_the_module_exports(module_name):
    module = importlib.import_module(module_name)
    stub = Path(module.__file__).with_suffix(".pyi")
    names = set()
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    assert names == set(module.__all__)


def test_import_stays_lazy_and_quick():
    code = ("import sys, time; start = time.perf_counter(); import rlx_triton; spent = time.perf_counter() - start; "
            "heavy = [m for m in ('torch', 'triton', 'numpy', 'tqdm') if m in sys.modules]; "
            "print(heavy, spent)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    heavy, spent = result.stdout.rsplit(" ", 1)
    assert heavy == "[]" and float(spent) < 0.1, result.stdout


def test_type_checkers_see_the_public_surface(tmp_path):
    """mypy resolves rt.*, rt.nn.* and rt.integrations.* to their definitions, and flags a name that is not there.

    torch and the other large dependencies are not followed (their types read as Any), which keeps the run short.
    """
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra installs it)")
    (tmp_path / "mypy.ini").write_text("[mypy]\nfollow_imports = silent\nignore_missing_imports = True\n"
                                       "[mypy-torch.*,triton.*,numpy.*,transformers.*]\nfollow_imports = skip\n")
    (tmp_path / "use.py").write_text(
        "import rlx_triton as rt\n"
        "reveal_type(rt.fbank)\n"
        "reveal_type(rt.scaled_dot_product_attention)\n"
        "reveal_type(rt.nn.LSTM.from_torch)\n"
        "reveal_type(rt.integrations.pyannote.optimize)\n"
        "reveal_type(rt.integrations.transformers.register)\n"
        "reveal_type(rt.explain)\n"
        "reveal_type(rt.__version__)\n"
        "rt.not_a_public_name\n")
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
                             "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "use.py")],
                            capture_output=True, text=True, cwd=ROOT, timeout=600)
    # mypy releases differ in spelling builtins ("builtins.str" or "str")
    revealed = [line.split('Revealed type is "', 1)[1].replace("builtins.", "")
                for line in result.stdout.splitlines() if "Revealed" in line]
    assert len(revealed) == 7, result.stdout
    assert revealed[0].startswith("def (waveform: Any, blackman_coeff: float")
    assert revealed[1].startswith("def (query: Any, key: Any, value: Any")
    assert revealed[2].endswith("-> rlx_triton.nn.lstm.LSTM\"")
    assert revealed[3].startswith("def (model: Any, *, cuda_graphs: bool =)") and revealed[4].startswith("def (name: str")
    # explain's overloads: a Route for an op or an rt.nn module, {module path: Route} for another nn.Module
    assert revealed[5].startswith("Overload(") and "-> rlx_triton.router.route.Route" in revealed[5]
    assert "-> dict[str, Any]" in revealed[5].replace("Dict[", "dict[")   # the spelling of mypy releases
    assert revealed[6] == 'str"'
    assert 'Module has no attribute "not_a_public_name"' in result.stdout


@pytest.mark.slow  # the whole demo under the interpreter: about a minute on a loaded 2-core machine
def test_the_demo_runs_from_the_installed_wheel_outside_a_checkout(built_wheel, tmp_path):
    """What the README's first screen tells a wheel user: `python -m rlx_triton.demo`, no clone, no test extra."""
    site = tmp_path / "site"
    zipfile.ZipFile(built_wheel).extractall(site)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-m", "rlx_triton.demo"], capture_output=True, text=True, cwd=tmp_path,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout


def test_the_readme_first_screen_gives_the_two_commands_and_the_cpu_torch_install():
    first_screen = (ROOT / "README.md").read_text().split("## Install")[0]
    assert "make demo" in first_screen and "make test" in first_screen
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in first_screen
    assert "python -m rlx_triton.demo" in first_screen


def test_make_demo_installs_the_package_without_the_test_extra():
    makefile = (ROOT / "Makefile").read_text()
    demo_recipe = makefile.split("$(DEMO_STAMP): pyproject.toml Makefile\n", 1)[1].split("\n\n", 1)[0]
    assert "pip install -q -e .\n" in demo_recipe + "\n" and "[test]" not in demo_recipe
    assert "demo: $(DEMO_STAMP)\n" in makefile and "$(STAMP): $(DEMO_STAMP)\n" in makefile
