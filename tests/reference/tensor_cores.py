"""Tensor-core dot rounding in triton's interpreter: tl.dot with input_precision "tf32" / "tf32x3" as a GPU computes it.

The interpreter evaluates every fp32 tl.dot with numpy in float32, whatever its input_precision, so an
interpreter test of a "tf32x3" kernel would measure an ieee kernel. `emulated_tensor_cores()` makes the
interpreter's dot round its operands the way NVIDIA tensor cores and triton's lowering do:
- "tf32": both operands rounded to TF32 (10 explicit mantissa bits, round to nearest with ties away
  from zero, as cvt.rna.tf32.f32), products accumulated in float32;
- "tf32x3": each operand split into big = tf32(a) and small = tf32(a - big); the sum
  small_a @ big_b + big_a @ small_b (NaN there replaced by 0, as triton does so that infinite inputs
  keep their value) plus big_a @ big_b plus the accumulator, in float32;
- "ieee": unchanged (float32).
Accumulation order inside one product is numpy's, not the tensor cores'; both are float32.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

_TF32_DROPPED = 13  # float32 has 23 mantissa bits, TF32 keeps 10


def tf32(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (nearest, ties away from zero); NaN and Inf are kept."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    half = np.uint32(1 << (_TF32_DROPPED - 1))
    mask = np.uint32(~((1 << _TF32_DROPPED) - 1) & 0xFFFFFFFF)
    rounded = ((bits + half) & mask).view(np.float32)
    return np.where(np.isfinite(values), rounded, values)


def tf32x3_matmul(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a @ b as triton's tf32x3 lowering computes it on tensor cores (float32 accumulation)."""
    a_big, b_big = tf32(a), tf32(b)
    with np.errstate(invalid="ignore"):
        a_small, b_small = tf32(a - a_big), tf32(b - b_big)
        small = np.matmul(a_small, b_big, dtype=np.float32) + np.matmul(a_big, b_small, dtype=np.float32)
    small = np.where(np.isnan(small), np.float32(0.0), small)
    return np.matmul(a_big, b_big, dtype=np.float32) + (small + acc)


@contextlib.contextmanager
def emulated_tensor_cores() -> Iterator[None]:
    """Inside the block the interpreter's fp32 tl.dot rounds as tensor cores do (see the module docstring)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        name = getattr(input_precision, "name", "")
        if a.data.dtype != np.float32 or b.data.dtype != np.float32 or name not in ("TF32", "TF32x3"):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        if name == "TF32":
            data = np.matmul(tf32(a.data), tf32(b.data), dtype=np.float32) + d.data
        else:
            data = tf32x3_matmul(a.data, b.data, d.data)
        return interpreter.TensorHandle(data.astype(d.data.dtype), d.dtype.scalar)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        builder.create_dot = original
