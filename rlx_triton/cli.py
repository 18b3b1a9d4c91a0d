"""The `rlx-triton` command (also `python -m rlx_triton`): info, explain, tune, audit, bench, perf, diarize.

Exit codes: 0 success, 1 the command ran and found a failure (audit, a failing benchmark), 2 a usage
error or nothing the command can do on this machine (e.g. tuning where no kernel backend runs),
always with one line on stderr that says what is valid. `--json PATH` means the same in every
command: the machine-readable result goes to PATH, or to stdout alone with `--json -`.
`diarize` exits 1 when any file failed (rlx_triton/cli_diarize.py).
Progress of tune, audit, bench and diarize goes to stderr (rlx_triton/progress.py). The first Ctrl-C (or a
SIGTERM, as `timeout` sends) stops a command: what had finished is summarised, exit code 130 (143).

This module imports neither torch nor triton at import time, so `--version` and `--help` are quick.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, List, Optional

from rlx_triton.cli_explain import UsageError
from rlx_triton.json_output import write_json

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 128 + signal.SIGINT


class Terminated(KeyboardInterrupt):
    """SIGTERM, stopping a command the way Ctrl-C does (partial summary, workers terminated)."""

    exit_code = 128 + signal.SIGTERM

# subcommands whose module is imported only when the subcommand runs: name -> (module, help)
LAZY_COMMANDS = {
    "perf": ("rlx_triton.perf", "how fast the routed kernels can be on a named GPU, without one"),
}


def _version() -> str:
    from rlx_triton import __version__

    return __version__


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (and exit 2), and an epilog that may be built when the help
    is shown (`lazy_epilog`: explain's lists every op's fields, which takes importing the ops)."""

    lazy_epilog: Optional[Callable[[], str]] = None

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        if self.lazy_epilog is not None:
            self.epilog, self.lazy_epilog = self.lazy_epilog(), None
        return super().format_help()


def _add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", metavar="PATH", help=f"write {what} as JSON to PATH ('-': stdout, nothing else)")


# ------------------------------------------------------------------------------------------ info

def _versions() -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"rlx_triton": _version(), "torch": torch.__version__, "triton": triton_version}


def _local_devices() -> List[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def cmd_info(args) -> int:
    from rlx_triton.config import settings
    from rlx_triton.router import plans
    from rlx_triton.router.device import device_facts

    env = settings()
    devices: List[Dict[str, Any]] = []
    for name in _local_devices():
        facts = device_facts(name)
        devices.append({
            "device": name, "name": facts.name, "class": facts.device_class,
            "capability": list(facts.capability) if facts.capability else None, "sm_count": facts.sm_count,
            "memory_bytes": facts.memory_bytes, "fingerprint": facts.fingerprint,
            "backends": {backend: (reason or "runs here") for backend, reason in facts.backend_reasons},
        })
    try:
        table = plans.winner_table()
        tune_cache = {"path": str(table.path), "entries": len(table)}
    except Exception as error:  # a broken table must not hide the rest of the report
        tune_cache = {"path": env.tune_cache_path, "entries": None, "error": str(error)}
    report = {**_versions(), "backend_setting": env.backend, "strict": env.strict, "profile": env.profile,
              "interpreter": env.interpret, "devices": devices, "tune_cache": tune_cache}
    if write_json(args.json, report):
        return EXIT_OK
    print(f"rlx_triton {report['rlx_triton']}  torch {report['torch']}  triton {report['triton'] or 'not installed'}")
    print(f"backend setting: {env.backend} (strict={env.strict}), profile: {env.profile}, "
          f"TRITON_INTERPRET: {'on' if env.interpret else 'off'}")
    for device in devices:
        print(f"\n{device['device']}: {device['name']} [{device['class']}]")
        for backend, state in device["backends"].items():
            print(f"  {backend:7} {state}")
    print(f"\ntune cache: {tune_cache['path']} ({tune_cache['entries']} entries)")
    return EXIT_OK


# ------------------------------------------------------------------------------------------ explain

def _profile_keys() -> List[str]:
    from rlx_triton.devices import PROFILES

    return list(PROFILES)


def find_profile(name: str):
    """The device profile `name` names: its key ("h200", "a100-80gb"), or a unique prefix of a key
    with or without dashes ("a100", "h100", "rtx4090"); None when it names none (devices.profile's rule)."""
    from rlx_triton.devices import profile

    try:
        found = profile(name)
    except ValueError:
        return None
    # a prefix must reach the end of the model number: "a" or "a1" names no GPU yet, "a100" does
    return None if len(_plain(name)) < _model_length(found.key) else found


def _plain(name: str) -> str:
    return name.strip().lower().replace("-", "").replace("_", "")


def _model_length(key: str) -> int:
    """Characters of a profile key up to its model number, dashes aside: 4 for a100-80gb, 7 for rtx-4090."""
    length = 0
    for part in key.lower().replace("_", "-").split("-"):
        length += len(part)
        if any(character.isdigit() for character in part):
            break
    return length


def _explain_device(name: str):
    """(torch.device, profile or None) for --device: a local device that exists, or a named GPU profile."""
    import torch

    local = name.split(":")[0]
    if local in ("cpu", "cuda", "mps"):
        try:
            device = torch.device(name)
        except (RuntimeError, ValueError):
            raise UsageError(f"--device {name!r} is not a device name (cpu, cuda, cuda:N, mps)") from None
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(f"--device {name}: no CUDA device is visible to torch here; name a GPU "
                                 f"profile instead to explain a call for it ({', '.join(_profile_keys())})")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise UsageError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UsageError(f"--device mps: no Apple GPU is available to torch here; name an Apple GPU profile "
                             f"instead ({', '.join(k for k in _profile_keys() if k.startswith('m'))})")
        return device, None
    profile = find_profile(name)
    if profile is None:
        raise UsageError(f"--device {name!r} is neither cpu, cuda[:N], mps nor a GPU profile "
                         f"({', '.join(_profile_keys())})")
    return torch.device(profile.kind), profile


def cmd_explain(args) -> int:
    import contextlib

    import torch

    from rlx_triton import cli_explain
    from rlx_triton.router import route, use_backend

    spec = cli_explain.op_spec(args.family, args.op)
    dtype = cli_explain.check_dtype(spec, args.dtype)
    given, features, filled = cli_explain.resolve(spec, args.field, args.feature)
    device, profile = _explain_device(args.device)
    request = spec.make(given, features, device=device, dtype=getattr(torch, dtype))
    if profile is not None:
        from rlx_triton.router.device import routing_as

        as_device: ContextManager[object] = routing_as(profile)
    else:
        as_device = contextlib.nullcontext()
    with as_device, use_backend(args.backend, strict=False):
        decided = route(request)
    legend = cli_explain.tag_legend(spec.family, decided.candidate, dtype) if decided.candidate is not None else []
    report = {
        "family": decided.family, "op": decided.op, "device": args.device,
        "profile": profile.name if profile is not None else None, "dtype": dtype, "backend": decided.backend,
        "candidate": decided.candidate_tag, "kernel": decided.kernel_name, "evidence": decided.evidence,
        "detail": decided.evidence_detail, "accuracy": decided.approval.label() if decided.approval else None,
        "speed": decided.speed, "skipped": {name: str(reason) for name, reason in decided.skipped},
        "fields": request.field_map, "filled": {name: why for name, _value, why in filled},
        "features": request.feature_map,
        "legend": dict(legend),
    }
    if write_json(args.json, report):
        return EXIT_OK
    if profile is not None:
        print(f"as on {profile.name} ({profile.arch or profile.kind}; device profile '{profile.key}')")
    print(decided)
    if filled:
        print("\nfilled in (not given):")
        width = max(len(f"{name}={value}") for name, value, _ in filled)
        for name, value, why in filled:
            print(f"  {f'{name}={value}':{width}}  {why}")
    if legend:
        print(f"\ncandidate {decided.candidate_tag}:")
        width = max(len(part) for part, _ in legend)
        for part, meaning in legend:
            print(f"  {part:{width}}  {meaning}")
    return EXIT_OK


# ------------------------------------------------------------------------------------------ audit

def cmd_audit(args) -> int:
    from rlx_triton.backends.triton.audit import ARCHS

    try:
        archs = [ARCHS[name] for name in (args.arch or ["sm_80", "sm_90"])]
    except KeyError as error:
        raise UsageError(f"--arch must be one of {', '.join(ARCHS)}, got {error.args[0]!r}") from None
    if importlib.util.find_spec("triton") is None:
        raise UsageError("triton is not installed (the audit compiles with the ptxas in its wheel)")
    from rlx_triton.backends.triton import FAMILIES

    unknown = [name for name in args.family or () if name not in FAMILIES]
    if unknown:
        raise UsageError(f"--family must be one of {', '.join(FAMILIES)}, got {unknown[0]!r}")
    from rlx_triton.backends.triton import audit
    from rlx_triton.progress import Progress

    with Progress(0, "audit", unit="variant", enabled=not args.quiet) as progress:
        def advance(record) -> None:
            progress.set_label(f"{record.kernel} {record.candidate} {record.dtype} {record.arch}")
            progress.update()

        try:
            records = audit.run_audit(archs, workers=args.workers, progress=advance, on_total=progress.set_total,
                                      families=args.family, every_dtype=args.every_dtype)
        except audit.Interrupted as stop:
            interrupted: Optional[audit.Interrupted] = stop
            records = stop.done
        else:
            interrupted = None
    bad = audit.failures(records)
    if interrupted is not None:
        print(f"rlx-triton audit: interrupted after {len(records)} of {interrupted.total} variants; "
              f"{len(bad)} of those failing", file=sys.stderr)
        for record, why in bad:
            print(f"  FAIL {record.kernel} {record.candidate} {record.dtype} {record.arch}: {why}", file=sys.stderr)
        return interrupted.exit_code
    if not write_json(args.json, [r.as_dict() for r in records]):
        if not args.quiet:
            print(audit.format_table(records))
        print(f"\naudit: {len(records)} variants compiled for {', '.join(f'sm_{a}' for a in archs)}; "
              f"{len(bad)} failing")
    for record, why in bad:
        print(f"  FAIL {record.kernel} {record.candidate} {record.dtype} {record.arch}: {why}", file=sys.stderr)
    if not records:
        print("rlx-triton audit: no Triton kernels were found", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if bad else EXIT_OK


# ------------------------------------------------------------------------------------------ bench

def _bench_root() -> Optional[Path]:
    """The source checkout that holds bench/run.py: the working directory, or the one this package is in."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (root / "bench" / "run.py").is_file():
            return root
    return None


def cmd_bench(args) -> int:
    """Runs bench/run.py of the source checkout in its own process (the package never imports bench/)."""
    from rlx_triton.perf.cases import BENCH_NAMES

    root = _bench_root()
    if root is None:
        raise UsageError("the benchmarks live in the source checkout's bench/ folder, which the installed package "
                         "does not ship: run this command inside a clone of the repository")
    unknown = [name for name in args.only or () if name not in BENCH_NAMES]
    if unknown:
        raise UsageError(f"unknown bench {', '.join(unknown)}; choose from {', '.join(BENCH_NAMES)}")
    argv = (["--quick"] if args.quick else []) + (["--out", args.out] if args.out else []) + \
        (["--json", args.json] if args.json else []) + list(args.only or [])
    return subprocess.run([sys.executable, str(root / "bench" / "run.py"), *argv]).returncode


# ------------------------------------------------------------------------------------------ tune

def cmd_tune(args) -> int:
    from rlx_triton.tune import MODEL_SHAPES, tune_model

    if args.model not in MODEL_SHAPES:
        raise UsageError(f"model must be one of {', '.join(sorted(MODEL_SHAPES))}, got {args.model!r}")
    try:
        summary = tune_model(args.model, device=args.device, progress=True)
    except RuntimeError as error:
        raise UsageError(str(error)) from None
    if not write_json(args.json, summary):
        print(f"tuned {summary['cases']} cases of {args.model}; winner table {summary['tune_cache']} "
              f"now holds {summary['entries']} entries")
    return EXIT_OK


# ------------------------------------------------------------------------------------------ lazy commands

def _lazy_command(name: str) -> Callable[[Any], int]:
    module_name, help_text = LAZY_COMMANDS[name]

    def run(args) -> int:
        module = importlib.import_module(module_name)
        parser = _Parser(prog=f"rlx-triton {name}", description=help_text)
        module.add_arguments(parser)
        return module.run(parser.parse_args(args.rest))

    return run


def _module_exists(name: str) -> bool:
    """Whether `name` is a module or a package with an __init__ (a bare folder is a namespace, not a command)."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace")


# ------------------------------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    from rlx_triton import cli_explain

    parser = _Parser(prog="rlx-triton", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"rlx-triton {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    info = sub.add_parser("info", help="devices, backends that run here and why not, versions, tune cache")
    _add_json(info, "the report")
    info.set_defaults(run=cmd_info)

    explain = sub.add_parser(
        "explain", help="the route a call of a given shape takes, here or on a named GPU",
        description="The route (backend, candidate, evidence, why every other backend was skipped) that a call "
                    "of the given shape would take, without running it.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    explain.lazy_epilog = cli_explain.help_text
    explain.add_argument("family", help="a kernel family (listed below)")
    explain.add_argument("op", nargs="?", help="an op of the family (default: the family's first op)")
    explain.add_argument("--field", action="append", metavar="NAME=VALUE",
                         help="a field of the call, as listed below (repeatable)")
    explain.add_argument("--feature", action="append", metavar="NAME=VALUE",
                         help="change a feature of the plain call (repeatable)")
    explain.add_argument("--dtype", default="float32",
                         help="the call's dtype, e.g. float16 or bfloat16 (default float32)")
    explain.add_argument("--device", default="cpu",
                         help="cpu, cuda[:N], mps, or a GPU profile to explain for without one: "
                              + ", ".join(_profile_keys()) + " (a unique prefix will do: a100, h100, rtx4090)")
    explain.add_argument("--backend", default="auto", choices=["auto", "triton", "metal", "torch"])
    _add_json(explain, "the route")
    explain.set_defaults(run=cmd_explain)

    tune = sub.add_parser("tune", help="time every approved candidate of a model's shapes and keep the winners")
    tune.add_argument("model", help="llama3-8b, pyannote-segmentation, wespeaker")
    tune.add_argument("--device", default="cuda", help="the CUDA device to time on: cuda or cuda:N (default cuda)")
    _add_json(tune, "the summary")
    tune.set_defaults(run=cmd_tune)

    audit = sub.add_parser("audit", help="compile every Triton candidate ahead of time (no GPU needed)")
    audit.add_argument("--arch", action="append", help="sm_80 and/or sm_90 (repeatable; default both)")
    audit.add_argument("--family", action="append", metavar="NAME",
                       help="audit this kernel family only: sdpa_decode, conv, fbank, lstm, segdense (repeatable)")
    _add_json(audit, "one record per compiled variant")
    audit.add_argument("--workers", type=int, default=None, help="compile processes (default: one per core)")
    audit.add_argument("--quiet", action="store_true", help="print only the summary and failures, no progress")
    audit.add_argument("--every-dtype", action="store_true",
                       help="compile every candidate in bf16 too where fp16 is audited (default: bf16 on the default "
                            "candidate only, as bf16 changes the element type and nothing a candidate sets)")
    audit.set_defaults(run=cmd_audit)

    bench = sub.add_parser(
        "bench", help="side-by-side benchmarks against torch (needs a source checkout)",
        description="Times each routed op beside the torch op it replaces, in one process, and prints a table; "
                    "with --out, also a dated report, a plot and rows appended to the CSV of every run.")
    bench.add_argument("--quick", action="store_true", help="small case set, fewer repetitions")
    bench.add_argument("--out", metavar="DIR", help="write <date>-<device>.md/.json/.png there (e.g. bench/results)")
    _add_json(bench, "the results")
    bench.add_argument("only", nargs="*", metavar="NAME", help="bench names (default: all)")
    bench.set_defaults(run=cmd_bench)

    from rlx_triton import cli_diarize

    cli_diarize.add_parser(sub)

    for name, (module_name, help_text) in LAZY_COMMANDS.items():
        if not _module_exists(module_name):
            continue
        lazy = sub.add_parser(name, help=help_text, add_help=False, prefix_chars="\0")
        lazy.add_argument("rest", nargs=argparse.REMAINDER)
        lazy.set_defaults(run=_lazy_command(name))
    return parser


def _check_environment() -> None:
    """A bad RLX_TRITON_* variable is a usage error of every command, said in one line before anything runs."""
    from rlx_triton.config import settings

    try:
        settings()
    except ValueError as error:
        raise UsageError(str(error)) from None


def _terminate(signum, frame) -> None:
    raise Terminated()


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous = None
    try:
        _check_environment()
        return args.run(args)
    except UsageError as error:
        print(f"rlx-triton {args.command}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as stop:
        # the audit's Interrupted says how far it got
        done, total = getattr(stop, "done", None), getattr(stop, "total", None)
        after = f" after {len(done)} of {total} compiles" if done is not None else ""
        print(f"rlx-triton {args.command}: interrupted{after}", file=sys.stderr)
        return getattr(stop, "exit_code", EXIT_INTERRUPTED)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
