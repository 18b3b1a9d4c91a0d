"""The `rlx-triton` command (also `python -m rlx_triton`): info, explain, tune, audit, bench.

Exit codes: 0 success, 1 the command ran and found a failure (audit), 2 bad usage or nothing the
command can do on this machine (e.g. tuning where no kernel backend runs).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _versions() -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    import rlx_triton

    return {"rlx_triton": rlx_triton.__version__, "torch": torch.__version__, "triton": triton_version}


def _devices() -> List[str]:
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
    devices = []
    for name in _devices():
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
    if args.json:
        print(json.dumps(report, indent=2))
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


def _parse_pairs(pairs: Optional[List[str]], what: str, numeric: bool) -> dict:
    parsed = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise ValueError(f"--{what} expects name=value, got {pair!r}")
        name, raw = pair.split("=", 1)
        if numeric:
            try:
                parsed[name] = int(raw)
            except ValueError:
                raise ValueError(f"--{what} {name} must be an integer, got {raw!r}") from None
        else:
            lowered = raw.lower()
            parsed[name] = {"true": True, "false": False}.get(lowered, int(raw) if raw.lstrip("-").isdigit() else raw)
    return parsed


def cmd_explain(args) -> int:
    import torch

    from rlx_triton.router import Request, route, use_backend

    try:
        fields = _parse_pairs(args.field, "field", numeric=True)
        features = _parse_pairs(args.feature, "feature", numeric=False)
        dtype = getattr(torch, args.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"--dtype must name a torch dtype, got {args.dtype!r}")
        request = Request.make(args.family, args.op or args.family, device=args.device, dtype=dtype,
                               fields=fields, features=features)
        with use_backend(args.backend, strict=False):
            decided = route(request)
    except (ValueError, TypeError, KeyError) as error:
        print(f"rlx-triton explain: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps({
            "family": decided.family, "op": decided.op, "backend": decided.backend,
            "candidate": decided.candidate_tag, "kernel": decided.kernel_name, "evidence": decided.evidence,
            "detail": decided.evidence_detail, "accuracy": decided.approval.label() if decided.approval else None,
            "speed": decided.speed, "skipped": {name: str(reason) for name, reason in decided.skipped},
        }, indent=2))
    else:
        print(decided)
    return EXIT_OK


def cmd_audit(args) -> int:
    from rlx_triton.backends.triton.audit import ARCHS, failures, format_table, run_audit

    try:
        archs = [ARCHS[name] for name in (args.arch or ["sm_80", "sm_90"])]
    except KeyError as error:
        print(f"rlx-triton audit: --arch must be one of {', '.join(ARCHS)}, got {error.args[0]!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        import triton  # noqa: F401
    except ImportError:
        print("rlx-triton audit: triton is not installed", file=sys.stderr)
        return EXIT_USAGE
    done = [0]

    def progress(record):
        done[0] += 1
        if not args.quiet and sys.stderr.isatty():
            print(f"\r  compiled {done[0]} variants", end="", file=sys.stderr, flush=True)

    records = run_audit(archs, workers=args.workers, progress=progress)
    if sys.stderr.isatty() and not args.quiet:
        print(file=sys.stderr)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([r.as_dict() for r in records], indent=1))
    if not args.quiet:
        print(format_table(records))
    bad = failures(records)
    print(f"\naudit: {len(records)} variants compiled for {', '.join(f'sm_{a}' for a in archs)}; "
          f"{len(bad)} failing")
    for record, why in bad:
        print(f"  FAIL {record.kernel} {record.candidate} {record.dtype} {record.arch}: {why}")
    if not records:
        print("audit: no Triton kernels were found", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if bad else EXIT_OK


def _bench_dir() -> Optional[Path]:
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (root / "bench" / "run.py").is_file():
            return root
    return None


def cmd_bench(args) -> int:
    root = _bench_dir()
    if root is None:
        print("rlx-triton bench: bench/run.py not found (run it from a source checkout)", file=sys.stderr)
        return EXIT_USAGE
    sys.path.insert(0, str(root))
    from bench import run as bench_run

    argv = (["--quick"] if args.quick else []) + (args.only or [])
    return bench_run.main(argv)


def cmd_tune(args) -> int:
    from rlx_triton.tune import MODEL_SHAPES, tune_model

    if args.model not in MODEL_SHAPES:
        print(f"rlx-triton tune: model must be one of {', '.join(sorted(MODEL_SHAPES))}, got {args.model!r}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = tune_model(args.model, device=args.device, progress=not args.json)
    except RuntimeError as error:
        print(f"rlx-triton tune: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"tuned {summary['cases']} cases of {args.model}; winner table {summary['tune_cache']} "
              f"now holds {summary['entries']} entries")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlx-triton", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="devices, backends that run here and why not, versions, tune cache")
    info.add_argument("--json", action="store_true")
    info.set_defaults(run=cmd_info)

    explain = sub.add_parser("explain", help="the route for a shape given on the command line")
    explain.add_argument("family", help="sdpa_decode | conv | fbank | lstm | segdense")
    explain.add_argument("op", nargs="?", help="op of the family (default: the family name)")
    explain.add_argument("--field", action="append", metavar="NAME=INT", help="launch field, repeatable")
    explain.add_argument("--feature", action="append", metavar="NAME=VALUE", help="feature flag, repeatable")
    explain.add_argument("--dtype", default="float32")
    explain.add_argument("--device", default="cpu")
    explain.add_argument("--backend", default="auto", choices=["auto", "triton", "metal", "torch"])
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(run=cmd_explain)

    tune = sub.add_parser("tune", help="pre-tune the buckets of a named model shape set and persist winners")
    tune.add_argument("model")
    tune.add_argument("--device", default="cuda")
    tune.add_argument("--json", action="store_true")
    tune.set_defaults(run=cmd_tune)

    audit = sub.add_parser("audit", help="compile every Triton candidate ahead of time (no GPU needed)")
    audit.add_argument("--arch", action="append", help="sm_80 and/or sm_90 (default both)")
    audit.add_argument("--json", metavar="PATH")
    audit.add_argument("--workers", type=int, default=None)
    audit.add_argument("--quiet", action="store_true", help="print only the summary and failures")
    audit.set_defaults(run=cmd_audit)

    bench = sub.add_parser("bench", help="run bench/run.py side-by-side benchmarks")
    bench.add_argument("--quick", action="store_true")
    bench.add_argument("only", nargs="*", help="bench names (default: all)")
    bench.set_defaults(run=cmd_bench)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
