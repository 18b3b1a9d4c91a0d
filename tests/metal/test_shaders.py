"""The Metal shader sources, checked on Linux: every metal/*.metal compiles as C++17 against the
MSL shim (g++ -fsyntax-only), and every kernel a launcher calls exists in the source with its
[[buffer(i)]] arguments in the launcher's order and of the launcher's kinds."""
from __future__ import annotations

import ast
import importlib
import inspect
import shutil
import subprocess
from pathlib import Path

import pytest

from rlx_triton.backends import metal as metal_backend
from rlx_triton.backends.metal import library
from tests.metal import msl_source

REPO = Path(__file__).resolve().parents[2]
SHADER_DIR = REPO / "metal"
SHIM_DIR = SHADER_DIR / "shim"
FAMILIES = metal_backend.SHADER_FAMILIES
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ not found")


def _syntax_check(path: Path, metal_version: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GXX, "-std=c++17", "-fsyntax-only", "-Wno-attributes", f"-D__METAL_VERSION__={metal_version}",
         "-I", str(SHIM_DIR), "-x", "c++", str(path)],
        capture_output=True, text=True, timeout=60)


def _launcher(family: str):
    return importlib.import_module(f"rlx_triton.backends.metal.{family}")


def test_every_family_has_one_shader_file():
    assert sorted(p.stem for p in SHADER_DIR.glob("*.metal")) == sorted(FAMILIES)


@needs_gxx
@pytest.mark.parametrize("metal_version", [300, 310], ids=["msl3.0", "msl3.1-bfloat"])
@pytest.mark.parametrize("family", FAMILIES)
def test_shader_compiles_as_cpp_against_the_msl_shim(family, metal_version):
    result = _syntax_check(SHADER_DIR / f"{family}.metal", metal_version)
    assert result.returncode == 0, result.stderr


@needs_gxx
def test_shim_rejects_implicit_float_to_half_conversion(tmp_path):
    """MSL refuses `half h = 1.0f * x;` without a cast; the shim's explicit constructors do too."""
    source = tmp_path / "implicit.metal"
    source.write_text("#include <metal_stdlib>\nusing namespace metal;\n"
                      "kernel void bad(device half* out [[buffer(0)]]) { float x = 1.0f; half h = x; out[0] = h; }\n")
    result = _syntax_check(source, 310)
    assert result.returncode != 0 and "half" in result.stderr


@needs_gxx
def test_shim_reports_undefined_names(tmp_path):
    source = tmp_path / "undefined.metal"
    source.write_text("#include <metal_stdlib>\nusing namespace metal;\n"
                      "kernel void bad(device float* out [[buffer(0)]]) { out[0] = not_declared(1.0f); }\n")
    result = _syntax_check(source, 310)
    assert result.returncode != 0 and "not_declared" in result.stderr


@pytest.mark.parametrize("family", FAMILIES)
def test_launcher_arguments_match_the_shader_buffers_in_order(family):
    kernels = msl_source.kernels((SHADER_DIR / f"{family}.metal").read_text())
    for base, signature in _launcher(family).KERNEL_ARGUMENTS.items():
        declared = library.parse_signature(signature)
        for dtype, suffix in library.DTYPE_SUFFIX.items():
            kernel = kernels.get(f"{base}_{suffix}")
            assert kernel is not None, f"{family}.metal has no kernel {base}_{suffix}"
            assert [a.index for a in kernel.arguments] == list(range(len(kernel.arguments))), kernel.name
            assert [(a.name, a.kind) for a in kernel.arguments] == list(declared), kernel.name


@pytest.mark.parametrize("family", FAMILIES)
def test_every_shader_kernel_has_a_launcher_and_bfloat_needs_msl_3_1(family):
    kernels = msl_source.kernels((SHADER_DIR / f"{family}.metal").read_text())
    bases = set(_launcher(family).KERNEL_ARGUMENTS)
    for name, kernel in kernels.items():
        base, _, suffix = name.rpartition("_")
        assert base in bases, f"{name} is not launched by backends/metal/{family}.py"
        assert kernel.min_metal_version == (310 if suffix == "bfloat" else 0), name


@pytest.mark.parametrize("family", FAMILIES)
def test_launchers_only_dispatch_declared_kernels_with_their_own_signature(family):
    """Each library.dispatch(FAMILY, "<base>", dtype, KERNEL_ARGUMENTS["<base>"], ...) call names a
    declared kernel and passes that kernel's own signature."""
    module = _launcher(family)
    calls = [node for node in ast.walk(ast.parse(inspect.getsource(module)))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "dispatch"]
    assert calls, f"backends/metal/{family}.py dispatches no kernel"
    for call in calls:
        base = call.args[1]
        signature = call.args[3]
        assert isinstance(base, ast.Constant) and base.value in module.KERNEL_ARGUMENTS
        assert isinstance(signature, ast.Subscript) and ast.literal_eval(signature.slice) == base.value


def test_scalars_are_declared_with_the_widths_compile_shader_binds():
    """A Python int is bound as int64 and a float as float32: the parser refuses any other scalar."""
    with pytest.raises(ValueError):
        msl_source.kernels("#define K(T, S) kernel void k_##S(constant int& n [[buffer(0)]]) {}\nK(float, float)\n")
