"""Reads the kernels out of a metal/*.metal source, the way the Metal compiler would name them.

The shaders declare each family's kernels once inside a `#define RLX_..._KERNELS(T, SUFFIX)` macro
and instantiate it per element type (`RLX_..._KERNELS(half, half)`), the bfloat instantiation
inside `#if __METAL_VERSION__ >= 310`. This module expands those macros textually and parses each
`kernel void name(...)` parameter list into its [[buffer(i)]] arguments.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Tuple

_DEFINE = re.compile(r"#define\s+(\w+)\((\w+),\s*(\w+)\)\s*(.*)")
_KERNEL = re.compile(r"kernel\s+void\s+(\w+)\s*\(")
_BUILTIN = re.compile(r"^uint\s+\w+\s*\[\[(?P<attribute>\w+)\]\]$")
_BUFFER = re.compile(r"^(?P<type>.+?)\s*(?P<ref>[*&])\s*(?P<name>\w+)\s*\[\[buffer\((?P<index>\d+)\)\]\]$")


@dataclass(frozen=True)
class BufferArgument:
    index: int
    name: str
    kind: str  # "T", "float32", "int64" (device pointers) or "long", "float" (constant scalars)
    writable: bool


@dataclass(frozen=True)
class Kernel:
    name: str
    arguments: Tuple[BufferArgument, ...]
    min_metal_version: int  # 310 for kernels inside `#if __METAL_VERSION__ >= 310`, else 0
    builtins: Tuple[str, ...] = ()  # thread-position attributes of the trailing uint parameters, in order


def _join_continuations(source: str) -> List[str]:
    return source.replace("\\\n", " ").splitlines()


def _argument_kind(type_text: str, ref: str, element: str) -> Tuple[str, bool]:
    words = type_text.split()
    if ref == "&":
        if words[0] != "constant" or len(words) != 2 or words[1] not in ("long", "float"):
            raise ValueError(f"scalar arguments must be `constant long&` or `constant float&`, got {type_text}&")
        return {"long": "long", "float": "float"}[words[1]], False
    if words[0] != "device":
        raise ValueError(f"buffer arguments must be device pointers, got {type_text}*")
    writable = "const" not in words
    base = words[-1]
    kind = "T" if base == element else {"float": "float32", "long": "int64"}[base]
    return kind, writable


def _split_parameters(text: str) -> List[str]:
    depth, current, parts = 0, [], []
    for char in text:
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        depth += char in "(["
        depth -= char in ")]"
        current.append(char)
    parts.append("".join(current).strip())
    return [part for part in parts if part]


def _kernels_in(body: str, element: str, min_version: int) -> Dict[str, Kernel]:
    kernels = {}
    for match in _KERNEL.finditer(body):
        start = match.end()
        depth, end = 1, start
        while depth:
            depth += {"(": 1, ")": -1}.get(body[end], 0)
            end += 1
        arguments, builtins = [], []
        for parameter in _split_parameters(body[start:end - 1]):
            buffer = _BUFFER.match(parameter)
            if buffer is None:
                builtin = _BUILTIN.match(parameter)
                if builtin is None:
                    raise ValueError(f"{match.group(1)}: unrecognised parameter {parameter!r}")
                builtins.append(builtin["attribute"])
                continue
            if builtins:
                raise ValueError(f"{match.group(1)}: buffer {buffer['name']} follows the thread-position parameters")
            kind, writable = _argument_kind(buffer["type"], buffer["ref"], element)
            arguments.append(BufferArgument(int(buffer["index"]), buffer["name"], kind, writable))
        kernels[match.group(1)] = Kernel(match.group(1), tuple(arguments), min_version, tuple(builtins))
    return kernels


def kernels(source: str) -> Dict[str, Kernel]:
    """Every kernel the source defines, by its host name (e.g. "sdpa_decode_split_half")."""
    lines = _join_continuations(source)
    macros = {}
    for line in lines:
        define = _DEFINE.match(line.strip())
        if define:
            macros[define.group(1)] = (define.group(2), define.group(3), define.group(4))
    found: Dict[str, Kernel] = {}
    version_guard = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#if"):
            guarded = re.search(r"__METAL_VERSION__\s*>=\s*(\d+)", stripped)
            version_guard.append(int(guarded.group(1)) if guarded else 0)
        elif stripped.startswith("#endif"):
            version_guard.pop()
        elif not stripped.startswith("#"):
            call = re.match(r"(\w+)\((\w+),\s*(\w+)\)$", stripped)
            if call and call.group(1) in macros:
                type_parameter, suffix_parameter, body = macros[call.group(1)]
                # the element type stays the macro parameter, so `T*` reads as kind "T" even
                # in the float instantiation (where a `float*` buffer is kind "float32")
                expanded = body.replace(f"##{suffix_parameter}", call.group(3))
                found.update(_kernels_in(expanded, type_parameter, max(version_guard, default=0)))
    return found
