"""Runs the real metal/*.metal kernels on the CPU: each shader source is compiled as C++20 with the
MSL shim (metal/shim/metal_shim.h) and the execution runtime (metal/shim/metal_exec.h) into a
shared library with one C entry point per kernel, and launched over its grid through ctypes.

Threads of a threadgroup are OS threads with real barriers and simd_sum exchanges; threadgroups
run one after another, so `threadgroup` arrays are rewritten to function-level statics. This runs
the shaders' own index math, loops, reductions and barriers on Linux; it does not reproduce the
Metal compiler, GPU scheduling or memory-model details (that is what the @mps tests are for).
"""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Sequence

import torch

from tests.metal import msl_source

REPO = Path(__file__).resolve().parents[2]
SHIM_DIR = REPO / "metal" / "shim"
ELEMENT_TYPES = {"float": "float", "half": "half", "bfloat": "bfloat"}
POINTER_TYPES = {"float32": "float", "int64": "long"}
_THREADGROUP_ARRAY = re.compile(r"\bthreadgroup\s+(\w+)\s+(\w+)\s*\[")


def _call_arguments(kernel: msl_source.Kernel) -> str:
    element = ELEMENT_TYPES[kernel.name.rpartition("_")[2]]
    arguments, counts = [], {"buffers": 0, "longs": 0, "floats": 0}
    for argument in kernel.arguments:
        if argument.kind in ("long", "float"):
            pool = f"{argument.kind}s"
            arguments.append(f"{pool}[{counts[pool]}]")
            counts[pool] += 1
            continue
        c_type = element if argument.kind == "T" else POINTER_TYPES[argument.kind]
        qualifier = "" if argument.writable else "const "
        arguments.append(f"({qualifier}{c_type}*)buffers[{counts['buffers']}]")
        counts["buffers"] += 1
    arguments += [f"ids.{builtin}" for builtin in kernel.builtins]
    return ", ".join(arguments)


def harness_source(family: str, build_dir: Path) -> Path:
    """The C++ translation unit: the shader (threadgroup arrays made static) plus one entry point per kernel."""
    source = (REPO / "metal" / f"{family}.metal").read_text()
    static_source = build_dir / f"{family}_cpu.metal"
    static_source.write_text(_THREADGROUP_ARRAY.sub(r"static \1 \2[", source))
    entry_points = [
        f"static void body_{name}(const rlx_exec::ThreadIds& ids, const rlx_exec::KernelArguments& arguments) {{\n"
        f"  void** buffers = arguments.buffers;\n  long* longs = arguments.longs;\n  float* floats = arguments.floats;\n"
        f"  {name}({_call_arguments(k)});\n}}\n"
        f'extern "C" void run_{name}(void** buffers, long* longs, float* floats, long groups, long group_size) {{\n'
        f"  rlx_exec::launch(groups, group_size, body_{name}, rlx_exec::KernelArguments{{buffers, longs, floats}});\n"
        f"}}\n"
        for name, k in msl_source.kernels(source).items()]
    harness = build_dir / f"{family}_harness.cpp"
    harness.write_text(f'#include "{static_source}"\n#include "metal_exec.h"\n\n' + "\n".join(entry_points))
    return harness


def _compile(command: Sequence[str]) -> subprocess.Popen:
    return subprocess.Popen(list(command), stderr=subprocess.PIPE, text=True)


def build(families: Sequence[str], build_dir: Path) -> Dict[str, ctypes.CDLL]:
    """Compile the runtime once and every family's harness (in parallel); load the shared libraries."""
    compiler = shutil.which("g++")
    flags = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-Wno-attributes", "-I", str(SHIM_DIR)]
    runtime = build_dir / "metal_exec.o"
    runtime_job = _compile([compiler, *flags, "-c", str(SHIM_DIR / "metal_exec.cpp"), "-o", str(runtime)])
    objects = {}
    for family in families:
        objects[family] = build_dir / f"{family}.o"
        objects[family + ".job"] = _compile([compiler, *flags, "-c", str(harness_source(family, build_dir)),
                                             "-o", str(objects[family])])
    _, errors = runtime_job.communicate(timeout=300)
    if runtime_job.returncode != 0:
        raise RuntimeError(f"compiling metal_exec.cpp failed:\n{errors}")
    jobs = {}
    for family in families:
        job = objects[family + ".job"]
        _, errors = job.communicate(timeout=300)
        if job.returncode != 0:
            raise RuntimeError(f"compiling {family}.metal for the CPU failed:\n{errors}")
        library = build_dir / f"lib{family}.so"
        jobs[family] = (_compile([compiler, "-shared", "-pthread", str(objects[family]), str(runtime), "-o",
                                  str(library)]), library)
    libraries = {}
    for family, (process, library) in jobs.items():
        _, errors = process.communicate(timeout=300)
        if process.returncode != 0:
            raise RuntimeError(f"compiling {family}.metal for the CPU failed:\n{errors}")
        libraries[family] = ctypes.CDLL(str(library))
    return libraries


def run(library: ctypes.CDLL, kernel: msl_source.Kernel, ordered_values: Sequence[object], *, groups: int,
        group_size: int) -> None:
    """Launch one kernel with its arguments in [[buffer(i)]] order (CPU tensors, Python ints and floats)."""
    buffers, longs, floats = [], [], []
    for argument, value in zip(kernel.arguments, ordered_values):
        if argument.kind == "long":
            longs.append(value)
        elif argument.kind == "float":
            floats.append(value)
        else:
            assert isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.is_contiguous()
            buffers.append(value.data_ptr())
    entry = getattr(library, f"run_{kernel.name}")
    entry.restype = None
    entry((ctypes.c_void_p * max(1, len(buffers)))(*buffers), (ctypes.c_long * max(1, len(longs)))(*longs),
          (ctypes.c_float * max(1, len(floats)))(*floats), ctypes.c_long(groups), ctypes.c_long(group_size))
