"""Ahead-of-time compile audit: every candidate of every Triton kernel, built for sm_80 and sm_90 with no GPU.

Each family module lists its kernels in `AUDIT_KERNELS` (AuditSpec: the @triton.jit function, its
signature with a "{dt}" placeholder, the constexprs and launch options per candidate). The audit
compiles each (kernel, candidate, dtype, arch) with `triton.compile(ASTSource(...), target=GPUTarget(...))`
and the ptxas shipped in the triton wheel, then reads the cubin with the wheel's cuobjdump:
registers, stack and local memory per thread (spills; LOCAL:0 can still hide STACK), shared memory
from the kernel's metadata, and whether tensor-core (MMA) instructions appear (read from the PTX: its
mma.sync / wgmma become the SASS's HMMA / HGMMA). Variants that hand triton.compile the same thing are
compiled once; bf16 beside fp16 is compiled on the default candidate (every one with every_dtype).

A variant is not ok when it fails to compile or needs more shared memory than one block may have
on that architecture. `run_audit` reports failures; the CLI exits non-zero on any failure and on
any spill in a family's default candidate.

Kernels compile in worker processes started without TRITON_INTERPRET: under the interpreter
@triton.jit returns interpreted functions that the compiler cannot lower. Ctrl-C stops the pool at
once (`compile_workers`): queued variants are cancelled, the workers terminated, and `Interrupted`
carries the records that had come back.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from rlx_triton.devices import cuda_profiles

ARCHS = {"sm_80": 80, "sm_90": 90}
# Largest dynamic shared memory one block may use (opt-in maximum), bytes: the smallest of the GPU
# profiles of each arch
SHARED_LIMIT = {
    arch: min(gpu.shared_per_cta for gpu in cuda_profiles() if gpu.arch_number == arch and gpu.shared_per_cta)
    for arch in ARCHS.values()
}
_MMA = re.compile(r"\b(HMMA|IMMA|HGMMA|QGMMA|IGMMA|BMMA|DMMA)\b")
_PTX_MMA = re.compile(r"^\s*(@%p\d+\s+)?(mma\.sync|mma\.sp|wgmma\.mma_async)", re.MULTILINE)
_RES = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


@dataclass(frozen=True)
class AuditSpec:
    name: str
    family: str
    kernel: Any  # the @triton.jit function
    signature: Dict[str, str]  # arg -> "*{dt}", "*fp32", "i32", "fp32", "constexpr", ...
    meta: Callable[[Any, str], Dict[str, Any]]  # (candidate, dtype) -> constexprs + num_warps/num_stages
    candidates: Tuple[Any, ...]
    default: Any
    dtypes: Tuple[str, ...] = ("fp32",)
    expects_mma: Union[bool, Callable[[Any, str], bool]] = False
    # arguments a real call hands the JIT as multiples of 16 (aligned pointers, strides of padded rows):
    # compiled with triton's divisibility hint, as the JIT specialises them (vector loads, cp.async)
    divisible: Tuple[str, ...] = ()
    # the oldest architecture (e.g. 89) the launchers compile this variant for: older ones run another variant
    # (fp8 e4m3 caches are read as bytes and decoded by hand before sm_89)
    min_arch: int = 0
    # bf16 beside fp16 changes the element type and nothing else a candidate sets (tiles, stages, warps, the
    # loop): every candidate compiles in fp16 and the default in bf16 too, unless every_dtype asks for all

    def mma_expected(self, candidate, dtype: str) -> bool:
        return self.expects_mma(candidate, dtype) if callable(self.expects_mma) else bool(self.expects_mma)


@dataclass
class AuditRecord:
    family: str
    kernel: str
    candidate: str
    arch: str
    dtype: str
    default: bool
    ok: bool = False
    registers: Optional[int] = None
    spills: Optional[int] = None  # bytes per thread: STACK + LOCAL
    shared_bytes: Optional[int] = None
    uses_mma: Optional[bool] = None
    mma_expected: Optional[bool] = None
    error: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _jit_function(kernel):
    from triton.runtime.jit import JITFunction

    return kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)


def compile_spec(spec: AuditSpec, candidate, dtype: str, arch: int = 90):
    """Compiles one variant ahead of time (no GPU); returns triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    meta = dict(spec.meta(candidate, dtype))
    options = {key: meta.pop(key) for key in ("num_warps", "num_stages", "num_ctas", "maxnreg") if key in meta}
    signature = {name: kind.replace("{dt}", dtype) for name, kind in spec.signature.items()}
    attrs = {(index,): [["tt.divisibility", 16]] for index, name in enumerate(signature) if name in spec.divisible}
    source = ASTSource(_jit_function(spec.kernel), signature=signature, constexprs=meta, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def read_cubin(cubin: bytes, *, sass: bool = True) -> Tuple[int, int, int, str]:
    """(registers, spill bytes per thread, static shared bytes, SASS text) read with the wheel's cuobjdump; with
    sass=False the SASS text is "" (disassembling takes most of the time: ~0.7 s for a decode kernel)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", handle.name], capture_output=True, text=True,
                               check=True).stdout
        text = subprocess.run([_tool("cuobjdump"), "-sass", handle.name], capture_output=True, text=True,
                              check=True).stdout if sass else ""
    match = _RES.search(usage)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{usage}")
    registers, stack, shared, local = (int(group) for group in match.groups())
    return registers, stack + local, shared, text


def inspect_cubin(cubin: bytes) -> Tuple[int, int, bool]:
    """(registers, spill bytes per thread, uses tensor-core instructions) read with the wheel's cuobjdump."""
    registers, spills, _shared, sass = read_cubin(cubin)
    return registers, spills, bool(_MMA.search(sass))


def inspect_compiled(compiled) -> Tuple[int, int, bool]:
    """inspect_cubin's facts of a compiled kernel without disassembling it: the tensor-core instructions read
    from its PTX (mma.sync, wgmma), each of which ptxas turns into the SASS ones `_MMA` names."""
    registers, spills, _shared, _ = read_cubin(compiled.asm["cubin"], sass=False)
    return registers, spills, bool(_PTX_MMA.search(compiled.asm["ptx"]))


def audit_variant(module_name: str, spec_name: str, candidate_index: int, dtype: str, arch: int) -> AuditRecord:
    module = importlib.import_module(module_name)
    spec = next(spec for spec in module.AUDIT_KERNELS if spec.name == spec_name)
    candidate = spec.candidates[candidate_index]
    record = AuditRecord(family=spec.family, kernel=spec.name, candidate=candidate.tag(), arch=f"sm_{arch}",
                         dtype=dtype, default=candidate == spec.default,
                         mma_expected=spec.mma_expected(candidate, dtype))
    started = time.perf_counter()
    try:
        compiled = compile_spec(spec, candidate, dtype, arch)
        record.shared_bytes = int(compiled.metadata.shared)
        record.registers, record.spills, record.uses_mma = inspect_compiled(compiled)
        record.ok = record.shared_bytes <= SHARED_LIMIT[arch]
        if not record.ok:
            record.error = f"needs {record.shared_bytes} B of shared memory, sm_{arch} allows {SHARED_LIMIT[arch]} B"
    except Exception as error:  # the record says what broke; the audit goes on with the next variant
        record.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    record.seconds = round(time.perf_counter() - started, 3)
    return record


def triton_family_modules() -> List[str]:
    """Every module of the triton backend that may declare AUDIT_KERNELS."""
    from rlx_triton.backends import triton as backend

    names = list(backend.FAMILIES) + sorted({module for _op, module in backend.OP_MODULES})
    return [f"{backend.__name__}.{name}" for name in dict.fromkeys(names)]


def _variants(modules: Iterable[str], archs: Sequence[int], families: Optional[Sequence[str]] = None,
              every_dtype: bool = False):
    for module_name in modules:
        module = importlib.import_module(module_name)
        for spec in getattr(module, "AUDIT_KERNELS", ()):
            if families and spec.family not in families:
                continue
            for index, candidate in enumerate(spec.candidates):
                for dtype in spec.dtypes:
                    if not every_dtype and dtype == "bf16" and "fp16" in spec.dtypes and candidate != spec.default:
                        continue   # AuditSpec: bf16 beside fp16 on the default candidate
                    for arch in archs:
                        if arch >= spec.min_arch:
                            yield module_name, spec.name, index, dtype, arch


def _worker_init() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    # triton 3.9 warns once per process unless the FP-fusion default is stated; fusion is what we compile with
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # Ctrl-C reaches every process of the terminal's group: the parent stops the pool, a worker must not
    # print a traceback of its own
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _SigintIgnoredFromStart(multiprocessing.context.SpawnProcess):
    """A spawned worker that ignores SIGINT from its first instruction: an ignored signal stays ignored
    across exec, so a Ctrl-C that reaches a worker still importing torch (before `_worker_init` runs)
    prints no traceback of its own. The parent ignores SIGINT only while the child is being started."""

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            super().start()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            super().start()
        finally:
            signal.signal(signal.SIGINT, previous)


class _SpawnIgnoringSigint(multiprocessing.context.SpawnContext):
    Process = _SigintIgnoredFromStart


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped a pool of compile workers: `done` holds what had come back, of `total` jobs.

    exit_code is the shell's code for the signal that stopped it (130 for Ctrl-C)."""

    def __init__(self, done: list, total: int, exit_code: int = 130) -> None:
        super().__init__(f"interrupted after {len(done)} of {total}")
        self.done, self.total, self.exit_code = done, total, exit_code


@contextlib.contextmanager
def compile_workers(workers: int) -> Iterator[concurrent.futures.ProcessPoolExecutor]:
    """A pool of `workers` processes that compile for real: spawned, without TRITON_INTERPRET (the parent may run
    under the interpreter; the workers must import the real @triton.jit kernels).

    On normal exit the pool finishes its jobs; on an exception, Ctrl-C included, queued jobs are cancelled and the
    workers terminated instead of waited for."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=_SpawnIgnoringSigint(),
                                                  initializer=_worker_init)
    try:
        yield pool
    except BaseException:
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(timeout=10)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def run_audit(archs: Sequence[int] = (80, 90), modules: Optional[Sequence[str]] = None,
              workers: Optional[int] = None, progress: Optional[Callable[[AuditRecord], None]] = None,
              on_total: Optional[Callable[[int], None]] = None,
              families: Optional[Sequence[str]] = None, every_dtype: bool = False) -> List[AuditRecord]:
    """Compiles every variant of every listed module (default: the whole triton backend), or of the kernels of
    `families` only. `on_total` is told the number of variants once they are listed, `progress` gets each
    record as its compile ends.

    Raises:
        Interrupted: Ctrl-C stopped the audit; its `done` holds the records compiled until then."""
    modules = list(modules or triton_family_modules())
    records: List[AuditRecord] = []
    variants: List[tuple] = []
    try:
        with compile_workers(workers or max(1, os.cpu_count() or 1)) as pool:
            variants = _collect(modules, archs, pool, families, every_dtype)
            if on_total is not None:
                on_total(len(variants))
            sharing: Dict[Hashable, List[Tuple[tuple, Dict[str, Any]]]] = {}
            for variant, (key, names) in zip(variants, pool.submit(_compile_keys, variants).result()):
                sharing.setdefault(key, []).append((variant, names))
            jobs = {pool.submit(audit_variant, *same[0][0]): same for same in sharing.values()}
            for job in concurrent.futures.as_completed(jobs):
                compiled = job.result()
                for index, (_variant, names) in enumerate(jobs[job]):
                    record = compiled if index == 0 else dataclasses.replace(compiled, **names)
                    records.append(record)
                    if progress is not None:
                        progress(record)
    except KeyboardInterrupt as stop:
        raise Interrupted(_sorted(records), len(variants), getattr(stop, "exit_code", 130)) from None
    return _sorted(records)


def _sorted(records: List[AuditRecord]) -> List[AuditRecord]:
    return sorted(records, key=lambda r: (r.family, r.kernel, r.candidate, r.dtype, r.arch))


def _collect(modules, archs, pool, families=None, every_dtype=False) -> List[tuple]:
    # enumerate variants in a worker too: the parent's modules may hold interpreted kernels
    return pool.submit(_list_variants, modules, tuple(archs), families, every_dtype).result()


def _list_variants(modules, archs, families=None, every_dtype=False) -> List[tuple]:
    return list(_variants(modules, archs, families, every_dtype))


def _compile_keys(variants: Sequence[tuple]) -> List[Tuple[Hashable, Dict[str, Any]]]:
    """Per variant: what it hands triton.compile (kernel, signature, constexprs and options, divisibility, arch),
    and the names its record carries. Specs that differ in name or candidate can compile to the same thing (two
    candidates whose fields map to the same meta-parameters; draft trees of 16 and 64 tokens, both in 64-row
    tiles): each such kernel is compiled once and its facts reported under every variant's names."""
    listed: List[Tuple[Hashable, Dict[str, Any]]] = []
    for module_name, spec_name, index, dtype, arch in variants:
        module = importlib.import_module(module_name)
        spec = next(spec for spec in module.AUDIT_KERNELS if spec.name == spec_name)
        candidate = spec.candidates[index]
        fn = _jit_function(spec.kernel).fn
        key = (f"{fn.__module__}.{fn.__qualname__}",
               tuple((name, kind.replace("{dt}", dtype)) for name, kind in spec.signature.items()),
               tuple(sorted((name, repr(value)) for name, value in spec.meta(candidate, dtype).items())),
               tuple(spec.divisible), arch)
        names = dict(family=spec.family, kernel=spec.name, candidate=candidate.tag(),
                     default=candidate == spec.default, mma_expected=spec.mma_expected(candidate, dtype))
        listed.append((key, names))
    return listed


def failures(records: Iterable[AuditRecord]) -> List[Tuple[AuditRecord, str]]:
    """Variants that fail the audit, with why: not ok, or a spilling default candidate."""
    bad = []
    for record in records:
        if not record.ok:
            bad.append((record, record.error or "not ok"))
        elif record.default and record.spills:
            bad.append((record, f"default candidate spills {record.spills} B per thread"))
    return bad


def format_table(records: Sequence[AuditRecord]) -> str:
    header = f"{'kernel':28} {'candidate':44} {'arch':5} {'dtype':5} {'ok':3} {'regs':>4} {'spill':>5} " \
             f"{'smem':>7} {'mma':4} note"
    lines = [header, "-" * len(header)]
    for r in records:
        mma = "-" if r.uses_mma is None else ("yes" if r.uses_mma else "no")
        note = r.error
        if r.ok and r.uses_mma is not None and r.mma_expected is not None and r.uses_mma != r.mma_expected:
            note = f"tensor cores {'expected' if r.mma_expected else 'unexpected'}"
        lines.append(f"{r.kernel[:28]:28} {r.candidate[:44]:44} {r.arch:5} {r.dtype:5} {'yes' if r.ok else 'NO':3} "
                     f"{r.registers if r.registers is not None else '-':>4} "
                     f"{r.spills if r.spills is not None else '-':>5} "
                     f"{r.shared_bytes if r.shared_bytes is not None else '-':>7} {mma:4} "
                     f"{'(default) ' if r.default else ''}{note}")
    return "\n".join(lines)
