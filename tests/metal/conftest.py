"""Fixtures of the Metal tests: `emulated_metal` routes the launchers' kernel dispatch to the NumPy
shader models (tests/metal/shader_models.py) on CPU, after the real argument checks, and checks
the launch geometry (threads = groups x group_size covers the kernel's work items)."""
from __future__ import annotations

import pytest

from rlx_triton.backends.metal import library
from tests.metal import shader_models

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


@pytest.fixture
def emulated_metal(monkeypatch):
    launches = Launches()

    def dispatch(family, base, dtype, signature, *, groups, group_size, **values):
        library.ordered_arguments(signature, dtype, values)  # the real kind/dtype/contiguity checks
        size = library.group_size_for(group_size)
        assert size % library.SIMD_WIDTH == 0 and 0 < size <= 1024
        if base in THREAD_PER_ELEMENT:
            assert groups * size >= THREAD_PER_ELEMENT[base](values) > (groups - 1) * size
        else:
            assert groups == GROUP_PER_ROW[base](values)
        launches.append((library.kernel_name(base, dtype), groups, size))
        shader_models.MODELS[base](groups=groups, group_size=size, **values)

    monkeypatch.setattr(library, "dispatch", dispatch)
    return launches
