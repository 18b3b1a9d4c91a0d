"""Compiled facts of a launch: its kernel built ahead of time for a GPU architecture, read from the cubin.

A launch record's configuration (kernel, the JIT's specialisation, num_warps, num_stages, arch) is
compiled with `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` and the ptxas in the
triton wheel, in worker processes started without TRITON_INTERPRET (the audit's helpers). The wheel's
cuobjdump gives registers, spills (stack + local bytes per thread) and the SASS, whose instruction mix is
counted over the kernel's innermost loop (the body of a backward branch that holds no other one; of
several, the one with the most tensor-core instructions, then FFMA, then instructions), or the whole
kernel when it has no loop. Results are cached on disk under the user cache dir, keyed on the kernel's source hash (triton's
`cache_key`, which covers the @jit functions it calls), the specialisation, the options, the arch and
the triton version.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

CACHE_VERSION = 1

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")


@dataclass(frozen=True)
class CompileJob:
    """One configuration to compile: picklable, and hashable for deduplication."""
    module: str
    qualname: str
    signature: Tuple[Tuple[str, str], ...]
    constexprs: Tuple[Tuple[Tuple[int, ...], Any], ...]
    attrs: Tuple[Tuple[Tuple[int, ...], Tuple[Tuple[str, int], ...]], ...]
    num_warps: int
    num_stages: int
    arch: int

    @classmethod
    def of(cls, launch, arch: int) -> "CompileJob":
        spec = launch.specialization()
        module, qualname = launch.kernel_name.split(":")
        constexprs = tuple((path, getattr(value, "value", value)) for path, value in spec.constexprs.items())
        attrs = tuple((path, tuple(tuple(entry) for entry in entries)) for path, entries in spec.attrs.items())
        return cls(module, qualname, tuple(spec.signature.items()), constexprs, attrs, int(launch.num_warps),
                   int(launch.num_stages), int(arch))


@dataclass
class Compiled:
    """What the analysis reads from one compiled configuration (counts from `scope`: "loop" or "kernel")."""
    ok: bool
    error: str = ""
    registers: int = 0
    spills: int = 0           # bytes per thread: STACK + LOCAL
    shared: int = 0           # bytes per CTA: triton's dynamic allocation + the cubin's static shared memory
    num_warps: int = 0        # as compiled (warp specialisation may change it)
    scope: str = "kernel"
    mma: int = 0              # HMMA / HGMMA / IMMA ... (tensor cores)
    ldg128: int = 0           # 128-bit global loads: LDG.E.128 and LDGSTS.128 (cp.async into shared memory)
    ldgsts: int = 0           # of which cp.async
    ffma: int = 0
    instructions: int = 0
    cached: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def sass_mix(sass: str) -> Dict[str, Any]:
    """Instruction counts of the innermost hot loop of a SASS listing (or of the whole kernel)."""
    from rlx_triton.backends.triton.audit import _MMA

    rows: List[Tuple[int, str, str]] = []
    for line in sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            rows.append((int(match.group(1), 16), match.group(2), match.group(3)))
    loops = []
    for address, opcode, operands in rows:
        if opcode.startswith("BRA"):
            target = _BRANCH_TARGET.search(operands)
            if target is not None and int(target.group(1), 16) < address:
                loops.append((int(target.group(1), 16), address))
    innermost = [(lo, hi) for lo, hi in loops
                 if not any((lo2, hi2) != (lo, hi) and lo <= lo2 and hi2 <= hi for lo2, hi2 in loops)]

    def counts(body) -> Dict[str, int]:
        mma = sum(1 for _, op, _ in body if _MMA.search(op))
        ldgsts = sum(1 for _, op, _ in body if op.startswith("LDGSTS") and ".128" in op)
        ldg = sum(1 for _, op, _ in body if op.startswith("LDG.") and ".128" in op)
        ffma = sum(1 for _, op, _ in body if op.startswith("FFMA"))
        return {"mma": mma, "ldg128": ldg + ldgsts, "ldgsts": ldgsts, "ffma": ffma, "instructions": len(body)}

    if not innermost:
        return {"scope": "kernel", **counts(rows)}
    bodies = [[row for row in rows if lo <= row[0] <= hi] for lo, hi in innermost]
    hottest = max(bodies, key=lambda body: (counts(body)["mma"], counts(body)["ffma"], len(body)))
    return {"scope": "loop", **counts(hottest)}


def _cache_path(cache_dir: str, job: CompileJob, source_key: str) -> Path:
    import triton

    material = json.dumps([CACHE_VERSION, source_key, job.module, job.qualname, job.signature,
                           [(list(path), repr(value)) for path, value in job.constexprs],
                           [(list(path), entries) for path, entries in job.attrs],
                           job.num_warps, job.num_stages, job.arch, triton.__version__], default=repr)
    return Path(cache_dir) / f"{hashlib.sha256(material.encode()).hexdigest()}.json"


def compile_job(job: CompileJob, cache_dir: Optional[str]) -> Compiled:
    """Compiles one configuration (in a worker without TRITON_INTERPRET), or reads it from the cache."""
    from rlx_triton.backends.triton.audit import _jit_function, read_cubin

    try:
        module = importlib.import_module(job.module)
        kernel = module
        for part in job.qualname.split("."):
            kernel = getattr(kernel, part)
        jit = _jit_function(kernel)
        path = _cache_path(cache_dir, job, jit.cache_key) if cache_dir else None
        if path is not None and path.exists():
            return Compiled(**{**json.loads(path.read_text()), "cached": True})
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        source = ASTSource(jit, signature=dict(job.signature), constexprs=dict(job.constexprs),
                           attrs={path_: [list(entry) for entry in entries] for path_, entries in job.attrs})
        compiled = triton.compile(source, target=GPUTarget("cuda", job.arch, 32),
                                  options={"num_warps": job.num_warps, "num_stages": job.num_stages})
        registers, spills, static_shared, sass = read_cubin(compiled.asm["cubin"])
        result = Compiled(ok=True, registers=registers, spills=spills,
                          shared=int(compiled.metadata.shared) + static_shared,
                          num_warps=int(getattr(compiled.metadata, "num_warps", job.num_warps)), **sass_mix(sass))
    except Exception as error:  # the analysis reports the configuration as not compiled, and goes on
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        # a CompilationError's first line is the source position, its last the reason
        summary = " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else ""
        return Compiled(ok=False, error=f"{type(error).__name__}: {summary}")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps({k: v for k, v in result.as_dict().items() if k != "cached"}))
        temporary.replace(path)
    return result


def default_cache_dir(env=None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "rlx_triton", "perf")


def compile_all(jobs: Iterable[CompileJob], cache_dir: Optional[str] = None, workers: Optional[int] = None,
                progress: Optional[Callable[[CompileJob, Compiled], None]] = None) -> Dict[CompileJob, Compiled]:
    """Compiles each distinct job once, in parallel worker processes (cached jobs are read, not compiled).

    Ctrl-C stops the workers at once and raises audit.Interrupted with the results that had come back."""
    from rlx_triton.backends.triton.audit import Interrupted, compile_workers

    unique = list(dict.fromkeys(jobs))
    results: Dict[CompileJob, Compiled] = {}
    if not unique:
        return results
    try:
        with compile_workers(max(1, min(workers or os.cpu_count() or 1, len(unique)))) as pool:
            futures = {pool.submit(compile_job, job, cache_dir): job for job in unique}
            for future in concurrent.futures.as_completed(futures):
                job = futures[future]
                results[job] = future.result()
                if progress is not None:
                    progress(job, results[job])
    except KeyboardInterrupt as stop:
        raise Interrupted(list(results.values()), len(unique), getattr(stop, "exit_code", 130)) from None
    return results
