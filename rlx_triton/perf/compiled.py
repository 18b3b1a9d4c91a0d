"""Compiled facts of a launch: its kernel built ahead of time for a GPU architecture, read from the cubin.

A launch record's configuration (kernel, the JIT's specialisation, num_warps, num_stages, arch) is
compiled with `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` and the ptxas in the
triton wheel, in worker processes started without TRITON_INTERPRET (the audit's helpers). The wheel's
cuobjdump gives registers, spills (stack + local bytes per thread) and the SASS, read as its loops
(`sass_loops`: every backward branch, its body, what the body holds besides its nested loops, and whether
it is a spin loop: a body that polls global memory with a strong load or an atomic and does no
arithmetic or store, as a barrier's wait does). Which loop the instruction mix is counted over
depends on the launch (the loop executing the most instructions, body x trips: rlx_triton.perf.structure),
so the facts keep every loop; `sass_mix` gives the mix of the largest non-spin loop for a reader without
a launch. Results are cached on disk under the user cache dir, keyed on the kernel's source hash (triton's
`cache_key`, which covers the @jit functions it calls), the specialisation, the options, the arch and
the triton version.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import hashlib
import importlib
import json
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

CACHE_VERSION = 4

_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")
_UNCONDITIONAL_EXIT = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+EXIT\b")


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
    kernel_instructions: int = 0   # every instruction of the kernel's SASS
    loops: List[dict] = field(default_factory=list)   # sass_loops: every loop of the SASS, in address order
    cached: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


# SASS opcodes that poll global memory (what a spin loop waits on) and that do a loop's work
_POLL = re.compile(r"^(ATOMG|ATOM|RED|LDG\.[A-Z0-9_.]*STRONG|LD\.[A-Z0-9_.]*STRONG)")
_WORK = re.compile(r"^(FFMA|DFMA|FMUL|FADD|HMMA|HGMMA|IMMA|QGMMA|STG|ST\.)")
_HMMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "884": (8, 8, 4), "16832": (16, 8, 32)}
_GMMA_SHAPE = re.compile(r"^[HQI]GMMA\.(\d+)x(\d+)x(\d+)")
_LOAD_WIDTH = re.compile(r"\.(128|64|U16|S16|U8|S8)(?:\.|$)")
_LOAD_BYTES = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def mma_flops(opcode: str) -> int:
    """FLOPs of one warp's issue of a tensor-core instruction (an FMA is two): HMMA.16816 is m16n8k16, HMMA.1688
    m16n8k8; a warpgroup's HGMMA.64xNxK is issued by each of its four warps, a quarter each. 0 for others."""
    parts = opcode.split(".")
    if parts[0] in ("HMMA", "IMMA") and len(parts) > 1 and parts[1] in _HMMA_SHAPES:
        m, n, k = _HMMA_SHAPES[parts[1]]
        return 2 * m * n * k
    match = _GMMA_SHAPE.match(opcode)
    if match:
        return 2 * int(match.group(1)) * int(match.group(2)) * int(match.group(3)) // 4
    return 0


def load_bytes(opcode: str) -> int:
    """Bytes one warp's global load instruction moves (32 lanes x its width), 0 for other instructions."""
    if not (opcode.startswith("LDG.") or opcode.startswith("LDGSTS.")):
        return 0
    match = _LOAD_WIDTH.search(opcode)
    return 32 * (_LOAD_BYTES[match.group(1)] if match else 4)


def _parse(sass: str) -> List[Tuple[int, str, str]]:
    rows: List[Tuple[int, str, str]] = []
    for line in sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            rows.append((int(match.group(1), 16), match.group(2), match.group(3)))
    return rows


def _counts(body) -> Dict[str, int]:
    from rlx_triton.backends.triton.audit import _MMA

    return {"mma": sum(1 for _, op, _ in body if _MMA.search(op)),
            "ldg128": sum(1 for _, op, _ in body if op.startswith(("LDG.", "LDGSTS")) and ".128" in op),
            "ldgsts": sum(1 for _, op, _ in body if op.startswith("LDGSTS") and ".128" in op),
            "ffma": sum(1 for _, op, _ in body if op.startswith("FFMA")),
            "instructions": len(body)}


def sass_loops(sass: str) -> Tuple[List[dict], int]:
    """(loops, instructions of the kernel) of a SASS listing. A loop is the span [start, end] of a backward branch
    to start; per loop: its depth (loops around it), `size` (instructions in its span), `own` (those not in a loop
    nested in it), the mix of its own instructions (mma, ldg128, ldgsts, ffma; `bar`: its CTA barriers), the FLOPs
    of one pass of its own FFMA (64 per warp instruction) and tensor-core instructions, the bytes of one pass of
    its global loads, and
    `spin`: a loop without nested loops whose body polls global memory (a strong load or an atomic) and does no
    floating-point arithmetic, tensor-core work or store: it only waits (a barrier's poll, a wait for tagged
    words), however many words one poll reads.
    A backward branch over an unpredicated EXIT is not a loop: it returns from code the compiler placed after
    the kernel's end (an out-of-line path, such as sm_80's convergence path for a warp shuffle after divergent
    code), which execution never reaches by falling through from the branch's target."""
    rows = _parse(sass)
    exits = [int(match.group(1), 16) for match in map(_UNCONDITIONAL_EXIT.match, sass.splitlines()) if match]
    spans = []
    for address, opcode, operands in rows:
        if opcode.startswith("BRA"):
            target = _BRANCH_TARGET.search(operands)
            if target is not None and int(target.group(1), 16) < address:
                start = int(target.group(1), 16)
                if not any(start <= exit_address < address for exit_address in exits):
                    spans.append((start, address))
    spans = sorted(set(spans))
    loops = []
    for lo, hi in spans:
        nested = [(a, b) for a, b in spans if (a, b) != (lo, hi) and lo <= a and b <= hi]
        body = [row for row in rows if lo <= row[0] <= hi]
        own = [row for row in body if not any(a <= row[0] <= b for a, b in nested)]
        depth = sum(1 for a, b in spans if (a, b) != (lo, hi) and a <= lo and hi <= b)
        spin = (not nested and any(_POLL.match(op) for _, op, _ in own)
                and not any(_WORK.match(op) for _, op, _ in own))
        flops = sum(64 if op.startswith("FFMA") else mma_flops(op) for _, op, _ in own)
        loops.append({"start": lo, "end": hi, "depth": depth, "size": len(body), "own": len(own), "spin": spin,
                      **{k: v for k, v in _counts(own).items() if k != "instructions"},
                      "bar": sum(1 for _, op, _ in own if op.startswith("BAR.")),
                      "pass_flops": flops, "pass_bytes": sum(load_bytes(op) for _, op, _ in own)})
    return loops, len(rows)


def sass_mix(sass: str) -> Dict[str, Any]:
    """Instruction counts of the largest non-spin loop of a SASS listing (or of the whole kernel without one), and
    every loop (`sass_loops`). A launch's analysis picks its loop by body x trips (rlx_triton.perf.structure)."""
    loops, total = sass_loops(sass)
    work = [loop for loop in loops if not loop["spin"]]
    common = {"loops": loops, "kernel_instructions": total}
    if not work:
        return {"scope": "kernel", **_counts(_parse(sass)), **common}
    largest = max(work, key=lambda loop: (loop["own"], loop["mma"], loop["ffma"]))
    return {"scope": "loop", "mma": largest["mma"], "ldg128": largest["ldg128"], "ldgsts": largest["ldgsts"],
            "ffma": largest["ffma"], "instructions": largest["own"], **common}


def _cache_path(cache_dir: str, job: CompileJob, source_key: str) -> Path:
    import triton

    material = json.dumps([CACHE_VERSION, source_key, job.module, job.qualname, job.signature,
                           [(list(path), repr(value)) for path, value in job.constexprs],
                           [(list(path), entries) for path, entries in job.attrs],
                           job.num_warps, job.num_stages, job.arch, triton.__version__], default=repr)
    return Path(cache_dir) / f"{hashlib.sha256(material.encode()).hexdigest()}.json"


def _jit_of(job: CompileJob):
    from rlx_triton.backends.triton.audit import _jit_function

    kernel: Any = importlib.import_module(job.module)
    for part in job.qualname.split("."):
        kernel = getattr(kernel, part)
    return _jit_function(kernel)


def read_cached(job: CompileJob, cache_dir: str) -> Optional[Compiled]:
    """A configuration's compiled facts from the disk cache, or None where it was not compiled before (or the
    entry cannot be read); compiles nothing, so it may run in any process."""
    path = _cache_path(cache_dir, job, _jit_of(job).cache_key)
    try:
        return Compiled(**{**json.loads(path.read_text()), "cached": True})
    except (OSError, ValueError, TypeError):
        return None


def compile_job(job: CompileJob, cache_dir: Optional[str]) -> Compiled:
    """Compiles one configuration (in a worker without TRITON_INTERPRET), or reads it from the cache."""
    from rlx_triton.backends.triton.audit import read_cubin

    try:
        jit = _jit_of(job)
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


# In-process compiles, for what plans a call while it runs (the router's speed estimate, the LSTM's co-residency
# check on meta tensors): one at a time, and never in a worker process (a user's script without a __main__ guard
# would run again in a spawned one).
_compiling = threading.Lock()


@dataclass
class CompileSetting:
    """Where the configurations compiled in process inside a `compiling` block keep their results: `cache_dir` (None: no disk
    cache, only `compiled`, this block's own), and who hears of each compile (`announce`, given the kernel's name)."""

    cache_dir: Optional[str]
    announce: Optional[Callable[[str], None]] = None
    compiled: Dict[Any, Any] = field(default_factory=dict)


_setting: contextvars.ContextVar[Optional[CompileSetting]] = contextvars.ContextVar("rlx_triton_estimate_compiles",
                                                                                    default=None)


@contextlib.contextmanager
def compiling(cache_dir: Optional[str], announce: Optional[Callable[[str], None]] = None) -> Iterator[CompileSetting]:
    """Inside the block, what `compiled_in_process` compiles (a route decision's estimate, the LSTM's co-residency
    check) uses `cache_dir` (None: none on disk; `rlx-triton
    perf --no-cache`) and announce each compile; the block's value holds every configuration compiled in it, so the
    caller can reuse them. Outside any block: the default disk cache (rlx_triton.perf.compiled.default_cache_dir)."""
    setting = CompileSetting(cache_dir, announce)
    token = _setting.set(setting)
    try:
        yield setting
    finally:
        _setting.reset(token)


def compiled_in_process(jobs, *, interpreted_in_a_worker: bool = False) -> Dict[Any, Any]:
    """Each distinct job's compiled facts: held by the enclosing `compiling` block, read from the disk cache, or
    compiled here, as the JIT compiles a kernel before its first launch. A kernel this process made for triton's
    interpreter (TRITON_INTERPRET=1 when its module was imported, with the helpers it calls) does not compile
    here: where `interpreted_in_a_worker` (a test process planning as on a GPU) a configuration that fails here is
    compiled again in one worker process, else it is reported as not compiled."""
    setting = _setting.get()
    cache_dir = default_cache_dir() if setting is None else setting.cache_dir
    held = {} if setting is None else setting.compiled
    compiled = {}
    for job in dict.fromkeys(jobs):
        facts = held.get(job)
        try:   # an interpreted kernel has no cache key here: that is a failed compile too
            if facts is None and cache_dir is not None:
                facts = read_cached(job, cache_dir)
        except Exception as error:
            facts = Compiled(ok=False, error=f"{type(error).__name__}: {error}")
        if facts is None or not facts.ok:
            if facts is None:
                if setting is not None and setting.announce is not None:
                    setting.announce(job.qualname)
                with _compiling:
                    facts = compile_job(job, cache_dir)
            if not facts.ok:
                if not interpreted_in_a_worker:
                    compiled[job] = facts
                    continue   # not held: a worker may compile it for whoever asks next
                facts = compile_all([job], cache_dir=cache_dir, workers=1)[job]
        compiled[job] = held[job] = facts
    return compiled
