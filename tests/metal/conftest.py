"""Fixtures of the Metal tests. Both route the launchers' kernel dispatch to the CPU, after the
real argument checks and a check of the launch geometry (threads = groups x group_size covers the
kernel's work items):
  emulated_metal  to the NumPy shader models (tests/metal/shader_models.py);
  executed_metal  to the shader sources themselves, compiled for the CPU (tests/metal/shader_exec.py).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlx_triton.backends import metal as metal_backend
from rlx_triton.backends.metal import library
from tests.metal import msl_source, shader_exec, shader_models

# work items each kernel's grid must cover: one thread per element, or one threadgroup per row
THREAD_PER_ELEMENT = {
    "conv1d_pool": lambda v: v["out"].numel(),
    "lstm_input_projection": lambda v: v["gates_x"].numel(),
    "lstm_recurrence_step": lambda v: v["h_out"].numel(),
}
GROUP_PER_ROW = {
    "sdpa_decode_one_pass": lambda v: v["lse"].numel(),
    "sdpa_decode_split": lambda v: v["partial_max_sum"].numel() // 2,
    "sdpa_decode_combine": lambda v: v["lse"].numel(),
    "fbank_frames": lambda v: v["log_energy"].numel(),
    "instance_norm_act": lambda v: v["x"].numel() // v["length"],
    "lstm_recurrence_persistent": lambda v: v["h0"].numel() // v["hidden"],
    "segdense_head": lambda v: v["out"].numel() // v["layer_dims"][-1].item(),
}


class Launches(list):
    """The kernels a test's launcher calls dispatched, in order: (kernel name, groups, group size)."""

    def names(self):
        return [name for name, _, _ in self]


def _checked_launch(launches, base, dtype, signature, groups, group_size, values):
    """The real argument checks and the geometry checks; returns (ordered arguments, group size)."""
    ordered = library.ordered_arguments(signature, dtype, values)
    size = library.group_size_for(group_size)
    assert size % library.SIMD_WIDTH == 0 and 0 < size <= 1024
    if base in THREAD_PER_ELEMENT:
        assert groups * size >= THREAD_PER_ELEMENT[base](values) > (groups - 1) * size
    else:
        assert groups == GROUP_PER_ROW[base](values)
    launches.append((library.kernel_name(base, dtype), groups, size))
    return ordered, size


@pytest.fixture
def emulated_metal(monkeypatch):
    launches = Launches()

    def dispatch(family, base, dtype, signature, *, groups, group_size, **values):
        _, size = _checked_launch(launches, base, dtype, signature, groups, group_size, values)
        shader_models.MODELS[base](groups=groups, group_size=size, **values)

    monkeypatch.setattr(library, "dispatch", dispatch)
    return launches


@pytest.fixture(scope="session")
def cpu_shader_libraries(tmp_path_factory):
    """Every family's shader compiled for the CPU once per test session."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    build_dir = Path(tmp_path_factory.mktemp("metal_cpu"))
    return {family: (lib, msl_source.kernels((shader_exec.REPO / "metal" / f"{family}.metal").read_text()))
            for family, lib in shader_exec.build(metal_backend.SHADER_FAMILIES, build_dir).items()}


@pytest.fixture
def executed_metal(monkeypatch, cpu_shader_libraries):
    launches = Launches()

    def dispatch(family, base, dtype, signature, *, groups, group_size, **values):
        ordered, size = _checked_launch(launches, base, dtype, signature, groups, group_size, values)
        cpu_library, kernels = cpu_shader_libraries[family]
        shader_exec.run(cpu_library, kernels[library.kernel_name(base, dtype)], ordered, groups=groups,
                        group_size=size)

    monkeypatch.setattr(library, "dispatch", dispatch)
    return launches
