"""Metal shader libraries: find metal/<family>.metal inside the installed package, compile it
lazily with torch.mps.compile_shader (once per family, cached), run the routing smoke test, and
dispatch kernels with their arguments checked against each launcher's declared signature.

Argument kinds (what a launcher declares in its KERNEL_ARGUMENTS, and what the shader declares):
  "T"       tensor of the kernel's dtype      device [const] T*       [[buffer(i)]]
  "float32" float32 tensor                    device [const] float*
  "int64"   int64 tensor                      device [const] long*
  "long"    Python int  (bound as int64)      constant long&
  "float"   Python float (bound as float32)   constant float&
compile_shader binds argument i to [[buffer(i)]] by position, a Python int as int64 and a float
as float32, and ignores strides: tensors must be contiguous and of the declared dtype.
"""
from __future__ import annotations

import functools
import importlib.resources
import threading
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

SHADER_PACKAGE = "rlx_triton"
SHADER_FOLDER = "metal"

# kernel name suffix per torch dtype: <base>_<suffix> (bfloat kernels exist from MSL 3.1 / macOS 14)
DTYPE_SUFFIX: Dict[torch.dtype, str] = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}
ARGUMENT_KINDS = ("T", "float32", "int64", "long", "float")
SIMD_WIDTH = 32

_libraries: Dict[str, object] = {}
_lock = threading.Lock()


def shader_path(family: str):
    """The Traversable of metal/<family>.metal inside the installed rlx_triton package."""
    return importlib.resources.files(SHADER_PACKAGE).joinpath(SHADER_FOLDER).joinpath(f"{family}.metal")


def shader_source(family: str) -> str:
    return shader_path(family).read_text(encoding="utf-8")


def _compile(source: str):
    compile_shader = getattr(getattr(torch, "mps", None), "compile_shader", None)
    if compile_shader is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.mps.compile_shader (needs torch >= 2.7)")
    return compile_shader(source)


def library(family: str):
    """The compiled shader library of one family (compiled on first use, then cached)."""
    compiled = _libraries.get(family)
    if compiled is None:
        with _lock:
            compiled = _libraries.get(family)
            if compiled is None:
                compiled = _compile(shader_source(family))
                _libraries[family] = compiled
    return compiled


def kernel_name(base: str, dtype: torch.dtype) -> str:
    try:
        return f"{base}_{DTYPE_SUFFIX[dtype]}"
    except KeyError:
        raise TypeError(f"Metal kernels take float32, float16 or bfloat16 tensors, not {dtype}") from None


def parse_signature(arguments: Sequence[str]) -> Tuple[Tuple[str, str], ...]:
    """("query:T", "scale:float", ...) -> (("query", "T"), ("scale", "float"), ...)."""
    parsed = []
    for entry in arguments:
        name, _, kind = entry.partition(":")
        if kind not in ARGUMENT_KINDS:
            raise ValueError(f"argument {entry!r}: kind must be one of {ARGUMENT_KINDS}")
        parsed.append((name, kind))
    return tuple(parsed)


def ordered_arguments(signature: Sequence[str], dtype: torch.dtype, values: Mapping[str, object]) -> list:
    """The values in [[buffer(i)]] order, each checked against its declared kind."""
    parsed = parse_signature(signature)
    names = [name for name, _ in parsed]
    if set(values) != set(names):
        missing = sorted(set(names) - set(values))
        unknown = sorted(set(values) - set(names))
        raise TypeError(f"kernel arguments do not match the signature: missing {missing}, unknown {unknown}")
    tensor_dtypes = {"T": dtype, "float32": torch.float32, "int64": torch.int64}
    ordered = []
    for name, kind in parsed:
        value = values[name]
        if kind in tensor_dtypes:
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"argument {name} must be a tensor, got {type(value).__name__}")
            if value.dtype != tensor_dtypes[kind]:
                raise TypeError(f"argument {name} must be {tensor_dtypes[kind]}, got {value.dtype}")
            if not value.is_contiguous():
                raise ValueError(f"argument {name} must be contiguous (compile_shader ignores strides)")
        elif kind == "long":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"argument {name} is a long scalar: pass a Python int, got {type(value).__name__}")
        elif not isinstance(value, float):
            raise TypeError(f"argument {name} is a float scalar: pass a Python float, got {type(value).__name__}")
        ordered.append(value)
    return ordered


def group_size_for(requested: int, kernel=None, *, multiple: int = SIMD_WIDTH, largest: int = 1024) -> int:
    """A threadgroup size near `requested`: a multiple of the SIMD width, within the kernel's limit."""
    limit = largest
    if kernel is not None:
        limit = min(limit, int(getattr(kernel, "max_threads_per_threadgroup", largest)))
    size = max(multiple, min(int(requested), limit))
    return size - size % multiple


def dispatch(family: str, base: str, dtype: torch.dtype, signature: Sequence[str], *, groups: int,
             group_size: int, **values) -> None:
    """Launch <base>_<dtype> with `groups` threadgroups of `group_size` threads.

    compile_shader's `threads` is the total grid, so threads = groups * group_size.
    """
    if groups <= 0:
        return
    name = kernel_name(base, dtype)
    try:
        kernel = getattr(library(family), name)
    except (AttributeError, RuntimeError) as error:
        hint = " (bfloat kernels need MSL 3.1: macOS 14 or later)" if dtype == torch.bfloat16 else ""
        raise RuntimeError(f"Metal kernel {name} is not in the compiled {family} library{hint}") from error
    size = group_size_for(group_size, kernel)
    arguments = ordered_arguments(signature, dtype, values)
    kernel(*arguments, threads=groups * size, group_size=size)


def groups_for(total_threads: int, group_size: int) -> int:
    """Threadgroups that cover `total_threads` one-thread-per-element work items."""
    return -(-int(total_threads) // int(group_size))


# ---------------------------------------------------------------------------------------------
# routing gate: compile and run a tiny kernel, compare with the expected values

SMOKE_SOURCE = """
#include <metal_stdlib>
using namespace metal;
kernel void rlx_smoke_affine(device const float* x [[buffer(0)]], device float* out [[buffer(1)]],
                             constant float& scale [[buffer(2)]], constant long& offset [[buffer(3)]],
                             uint index [[thread_position_in_grid]]) {
  out[index] = x[index] * scale + float(offset);
}
"""
SMOKE_ELEMENTS = 16


@functools.lru_cache(maxsize=None)
def smoke_test() -> Optional[str]:
    """None when Metal kernels compile and run correctly on MPS, else the reason they do not.

    A real compile-and-run check, since torch.backends.mps.is_available() can be True where MPS
    cannot run (virtualised macOS runners).
    """
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return "torch.backends.mps.is_available() is False"
    try:
        smoke = _compile(SMOKE_SOURCE)
        x = torch.arange(SMOKE_ELEMENTS, dtype=torch.float32, device="mps")
        out = torch.full_like(x, float("nan"))
        smoke.rlx_smoke_affine(x, out, 0.5, 3, threads=SMOKE_ELEMENTS, group_size=SMOKE_ELEMENTS)
        torch.mps.synchronize()
        expected = torch.arange(SMOKE_ELEMENTS, dtype=torch.float32) * 0.5 + 3
        if not torch.equal(out.cpu(), expected):
            return f"Metal smoke test computed {out.cpu().tolist()}, expected {expected.tolist()}"
    except Exception as error:  # any failure to compile or run means the backend does not run here
        return f"Metal smoke test failed: {type(error).__name__}: {error}"
    return None
