"""`rlx-triton perf`: how fast each routed kernel can be on a named GPU, from its launch plan, without the GPU.

    python -m rlx_triton.perf [--device h200] [--profile PATH] [--json PATH] [--markdown PATH] [BENCH ...]
    python -m rlx_triton.perf --calibrate bench/results/<file>.json [--write-profile PATH]

For every case of every bench in bench/ (their own case lists, as a CUDA run measures them) the call
is traced on meta tensors as on the device profile (rlx_triton/devices.py): routed by the router as on
that device, its launch plan built by the family's launcher and collected by the executor instead of
run (rlx_triton/backends/triton/launches.py). Each distinct launch configuration is compiled for the
profile's architecture with the JIT's specialisation (rlx_triton.perf.compiled, cached on disk), and
each launch is read against the profile: CTAs, CTAs per SM, waves, SM fill, registers, shared memory,
spills, the SASS instruction mix of the loop executing the most instructions (spin loops apart), and an
estimate beside the physical floor (rlx_triton.perf.roofline: memory at the achievable bandwidth, compute,
issue and the latency chain, with a low-high range from the constants' ranges; the assumptions are printed
and written to the JSON, the profile's constants under "profile"). Per model (PyanNet
segmentation, WeSpeaker ResNet34): Triton launches and host synchronisations of one forward at the
bench shape. A case whose family's launcher still launches outside the executor is reported as
"no launch plan yet" (its launches are counted, its time is not estimated). Where the families of a
case's ops state their torch path's kernels (`library_kernels(request, profile)` in backends/torch_ref/<family>.py),
the case also gets a "library path estimate" (JSON key "library_estimate"): the kernels torch runs for each
op call, eager op by eager op, with the library calls modelled by their launch rules in rlx_triton.perf.library
(cuBLAS tiles, waves and split-K; cuDNN's implicit GEMM and Winograd convolutions and its LSTM algorithms;
cuFFT's passes), read by the same roofline and constants as the Triton launches (waves of SMs x resident CTAs,
the main loop at its efficiency of the unit's sustained rate, the latency chain, one launch latency each); the
case's estimate is their sum (on the routed row of a case; a row pinned to a candidate has none). A case with an
op the models do not cover (rlx_triton.perf.library.Unmodelled) has none. Estimates are uncalibrated unless
--profile names a calibrated profile; where bench/results/*.json holds a run on the same GPU, measured /
estimated is shown. `--calibrate RESULTS` fits the profile's constants to that measured run (rlx_triton.perf.calibrate: least squares over the
cases it can match), prints each case's error before and after, and writes the calibrated profile
(default bench/results/profiles/<results stem>.json), which --profile reads.

Exit codes: 0 every case analysed or reported, 1 a case failed to trace or a launch failed to compile,
2 bad usage (unknown device or bench, a profile that is not a CUDA GPU, triton not installed).

`add_arguments(parser)` and `run(args)` let the rlx-triton command wire this in as its `perf` subcommand.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_DEVICE = "h200"
# where measured bench results are read from and calibrated profiles written to by default
REPO_ROOT = Path(__file__).resolve().parents[2]
# the benches in bench/ whose cases launch kernels (rlx_triton.perf.cases states their case lists)
BENCHES = ("sdpa_decode", "attention_serving", "fbank", "sincnet", "lstm", "pyannote_segmentation", "embedding")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The perf command's options on `parser` (imports nothing heavy, so a CLI can build its parser fast)."""
    from rlx_triton.devices import cuda_profiles

    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help=f"the GPU to analyse for: {', '.join(p.key for p in cuda_profiles())} "
                             f"(default {DEFAULT_DEVICE})")
    parser.add_argument("--json", metavar="PATH", help="write the analysis as JSON to PATH ('-': stdout, nothing else)")
    parser.add_argument("--workers", type=int, default=None, help="compile processes (default: one per CPU)")
    parser.add_argument("--cache-dir", default=None,
                        help="compiled-kernel facts cache (default $XDG_CACHE_HOME/rlx_triton/perf)")
    parser.add_argument("--no-cache", action="store_true", help="compile every configuration afresh")
    parser.add_argument("--markdown", metavar="PATH",
                        help="write the case table as markdown to PATH (estimates beside the measured columns)")
    parser.add_argument("--results", default=None,
                        help="folder of bench results to read measured times from (default bench/results)")
    parser.add_argument("--profile", metavar="PATH", default=None,
                        help="a calibrated profile written by --calibrate (its device replaces --device)")
    parser.add_argument("--calibrate", metavar="RESULTS", default=None,
                        help="fit the device constants to a measured bench run (bench/results/<file>.json)")
    parser.add_argument("--write-profile", metavar="PATH", default=None,
                        help="where --calibrate writes the calibrated profile "
                             "(default bench/results/profiles/<results stem>.json)")
    parser.add_argument("--published", metavar="FILE", default=None,
                        help="price the published measurements in FILE (CSV: source,gpu,impl,op,shape,dtype,metric,"
                             "value; see bench/published.csv) and print estimate and error per row")
    parser.add_argument("benches", nargs="*", metavar="BENCH", help=f"subset of {', '.join(BENCHES)}")
    return parser


@dataclass
class CaseReport:
    bench: str
    case: str
    shape: Dict[str, Any]
    backend: str
    candidate: Optional[str]
    launches: int
    floor_us: Optional[float]
    est_us: Optional[float]
    bw_fraction: Optional[float]
    kernels: list = field(default_factory=list)   # KernelEstimate
    dtype: str = ""
    note: str = ""
    measured_us: Optional[float] = None
    library: Optional[dict] = None   # the library path estimate (rlx_triton.perf.roofline.library_estimate)
    est_low_us: Optional[float] = None
    est_high_us: Optional[float] = None
    decided_by: str = ""             # what chose each op call's route (router/speed.py), joined by "+"
    routed: bool = True              # the route the router takes (False: a row pinned to a candidate)
    on_library_us: Optional[float] = None   # of est_us: the calls the router sent to the library op

    def as_json(self) -> dict:
        data = {"bench": self.bench, "case": self.case, "shape": self.shape, "backend": self.backend,
                "candidate": self.candidate, "routed": self.routed, "decided_by": self.decided_by,
                "launches": self.launches, "floor_us": self.floor_us,
                "est_us": self.est_us, "est_low_us": self.est_low_us, "est_high_us": self.est_high_us,
                "on_library_us": self.on_library_us,
                "bw_fraction": self.bw_fraction, "kernels": [kernel.as_json() for kernel in self.kernels]}
        if self.library is not None:
            data["library_estimate"] = self.library
        return data


def _route_summary(case, routes) -> tuple:
    """(backend, candidate, shape) of a traced case from the routes it took."""
    if case.pinned is not None:
        return "triton", case.pinned, None
    calls = _op_calls(routes)
    if not calls:
        return "torch", None, None
    backends = sorted({route.backend for route in calls})
    if len(calls) == 1 or len({(r.family, r.op, r.request) for r in calls}) == 1:
        route = calls[0]
        shape = dict(route.request.fields) if route.request is not None else {}
        if route.request is not None:
            shape["dtype"] = route.request.dtype
        return route.backend, route.candidate_tag, shape
    tags = []
    for route in calls:
        entry = f"{route.family}.{route.op}={route.candidate_tag or route.backend}"
        if entry not in tags:
            tags.append(entry)
    return "+".join(backends), ", ".join(tags), None


def _op_calls(routes) -> list:
    """Routes with consecutive lookups of the same request (an op routing twice per call) merged."""
    calls: List[Any] = []
    for route in routes:
        if calls and calls[-1].request == route.request and calls[-1].backend == route.backend:
            continue
        calls.append(route)
    return calls


def _decided_by(case, routes) -> str:
    """What chose the case's routes: "forced" for a pinned row, else each op call's decided_by, joined by "+"."""
    if case.pinned is not None:
        return "forced"
    seen: List[str] = []
    for route in _op_calls(routes):
        if route.decided_by not in seen:
            seen.append(route.decided_by)
    return "+".join(seen) or "default"


def library_path(routes, profile, *, merged: bool = False) -> Optional[dict]:
    """The library path estimate of a traced case: the torch path's kernels of every op call it routed, read by
    the roofline (None unless every call's family states `library_kernels(request, profile)` in its torch module
    and the library models cover every call: rlx_triton.perf.library.Unmodelled). `merged`: the routes are op
    calls already (`_op_calls`), so two equal requests side by side are two calls (a selection of calls, such
    as those the router sent to the library, puts calls side by side that were not)."""
    from rlx_triton.perf.roofline import library_estimate
    from rlx_triton.router import registry

    from rlx_triton.perf.library import Unmodelled

    calls = [route for route in (routes if merged else _op_calls(routes)) if route.request is not None]
    kernels = []
    for route in calls:
        module = registry.family_module(registry.library_backend().name, route.family, route.op)
        stated = getattr(module, "library_kernels", None)
        if stated is None:
            return None
        try:
            kernels.extend(stated(route.request, profile))
        except Unmodelled:   # a dtype or shape the library models do not cover: no estimate rather than a guess
            return None
    return library_estimate(kernels, profile) if calls else None


def launch_count_mismatches(trace) -> List[str]:
    """Families that state `launch_count(request, candidate)` and whose count differs from what launched."""
    problems = []
    counts = trace.log.launches_per_route() if trace.log is not None else []
    merged: List[List[int]] = []
    for index, route in enumerate(trace.routes):
        previous = trace.routes[index - 1] if index else None
        if previous is not None and previous.request == route.request and previous.backend == route.backend:
            merged[-1].append(index)
        else:
            merged.append([index])
    for group in merged:
        route = trace.routes[group[0]]
        formula = getattr(route.module, "launch_count", None) if route.backend == "triton" else None
        if formula is None:
            continue
        launched = sum(counts[i] for i in group)
        stated = formula(route.request, route.candidate)
        if stated != launched:
            problems.append(f"{route.family}.{route.op}: launch_count states {stated}, the launcher made {launched}")
    return problems


def _measured(profile, results_dir: Path) -> Dict[tuple, float]:
    """(bench, case label, dtype, candidate) -> rlx_us from the newest results file of this GPU."""
    files = sorted(results_dir.glob("*.json")) if results_dir.is_dir() else []
    for path in reversed(files):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(report, dict) or not profile.matches(str(report.get("device", ""))):
            continue
        table: Dict[tuple, float] = {}
        for row in report.get("cases", []):
            key = (row.get("bench"), row.get("shape"), row.get("dtype"), row.get("candidate"))
            if row.get("rlx_us") is not None:
                table.setdefault(key, row["rlx_us"])
        return table
    return {}


def analyse_plan(records: Sequence[Any], profile, *, workers: Optional[int] = None,
                 cache_dir: Optional[str] = None) -> list:
    """KernelEstimates of launch records on a profile (each distinct configuration compiled once)."""
    from rlx_triton.perf.compiled import CompileJob, compile_all
    from rlx_triton.perf.launch_estimate import estimate

    jobs = [CompileJob.of(record, profile.arch_number) for record in records]
    compiled = compile_all(jobs, cache_dir=cache_dir, workers=workers)
    return [estimate(record, compiled[job], profile) for record, job in zip(records, jobs)]


def analyse(profile, names: Sequence[str], *, workers: Optional[int] = None, cache_dir: Optional[str] = None,
            results_dir: Optional[Path] = None, progress=None, quick: bool = False) -> dict:
    """The full analysis: {"report": JSON-ready dict, "cases": [CaseReport], "models": [...], "errors": [...]}.

    progress: a callable taking a message; with it, the cases are counted off on stderr one by one
    (rlx_triton.progress.Progress) and each phase after them says what it did. quick: the case lists a quick
    bench run measures (what --calibrate reads from a quick run)."""
    from rlx_triton.perf.benches import perf_cases
    from rlx_triton.perf.compiled import CompileJob, compile_all, compiling
    from rlx_triton.perf.stock_models import StockModelUnavailable
    from rlx_triton.perf.launch_estimate import estimate
    from rlx_triton.perf.roofline import ASSUMPTIONS, case_range, case_totals
    from rlx_triton.perf.trace import trace
    from rlx_triton.router.device import profile_facts, routing_as

    from rlx_triton.progress import Progress

    say = progress or (lambda message: None)
    facts = profile_facts(profile)
    errors: List[str] = []
    traced = []
    model_traces: Dict[str, Any] = {}
    wanted = list(names)
    cases_of = {}
    for name in wanted:
        try:
            cases_of[name] = perf_cases(name, facts, quick)
        except StockModelUnavailable as error:
            errors.append(f"{name}: {error}")
    # routing a case as on the profile weighs its kernel against the library op, which compiles the kernel's
    # launches (rlx_triton.perf.route_estimate), in this process: into this command's cache, the progress label
    # saying so
    with Progress(sum(map(len, cases_of.values())), "perf", unit="case", enabled=progress is not None) as shown, \
            compiling(cache_dir) as weighed:
        for name, cases in cases_of.items():
            for case in cases:
                label = f"{name} {case.case}"
                shown.set_label(label)
                weighed.announce = lambda kernel, label=label: shown.set_label(f"compiling {kernel} ({label})")
                result = trace(case.call, facts, host_syncs=case.model is not None)
                traced.append((case, result))
                if case.model is not None:
                    model_traces[case.model] = result
                shown.update()
        weighed.announce = None
        for name in ("pyannote_segmentation", "embedding"):   # the models are reported whatever benches ran
            if name in wanted:
                continue
            try:
                model_cases = perf_cases(name, facts, quick)
            except StockModelUnavailable as error:
                say(f"perf: no {name} model report ({error})")
                continue
            for case in model_cases:
                if case.model is not None:
                    model_traces[case.model] = trace(case.call, facts, host_syncs=True)

    jobs: Dict[int, Any] = {}
    for _case, result in traced:
        for record in result.records:
            jobs.setdefault(id(record), CompileJob.of(record, profile.arch_number))
    distinct = set(jobs.values())
    say(f"compiling {len(distinct)} distinct launch configurations for {profile.arch}")
    started = time.perf_counter()
    compiled = {job: facts for job, facts in weighed.compiled.items() if job in distinct}
    compiled.update(compile_all(distinct - set(compiled), cache_dir=cache_dir, workers=workers))
    fresh = sum(1 for c in compiled.values() if not c.cached)
    say(f"compiled {fresh} (cached {len(compiled) - fresh}) in {time.perf_counter() - started:.1f} s")
    for job, facts_of in compiled.items():
        if not facts_of.ok:
            errors.append(f"{job.module}:{job.qualname} (warps {job.num_warps}, stages {job.num_stages}) did not "
                          f"compile for sm_{job.arch}: {facts_of.error}")

    measured = _measured(profile, results_dir if results_dir is not None else REPO_ROOT / "bench" / "results")
    reports: List[CaseReport] = []
    shapes: Dict[tuple, dict] = {}
    routed_tags: Dict[tuple, Optional[str]] = {}
    for case, result in traced:
        backend, candidate, shape = _route_summary(case, result.routes)
        label = case.case
        if case.label is not None and result.output is not None and not result.error:
            label = case.label(result.output)
        if case.pinned is None:
            routed_tags[(case.bench, label)] = candidate
        elif case.unless_routed and routed_tags.get((case.bench, label)) == case.pinned:
            continue  # the bench measures the routed candidate once
        if shape is None:
            shape = shapes.get((case.bench, label), {**case.dims, "dtype": case.dtype} if case.dims else {})
        else:
            shapes.setdefault((case.bench, label), shape)
        kernels = [estimate(record, compiled.get(jobs[id(record)]), profile) for record in result.records]
        floor_us, est_us, bw_fraction = case_totals(kernels, profile)
        est_low_us, est_high_us = case_range(kernels)
        # the calls the router sent to the library op run the library's kernels: their estimate is the case's too
        on_library = None
        if case.pinned is None:
            to_library = [route for route in _op_calls(result.routes) if route.backend != "triton"]
            on_library = library_path(to_library, profile, merged=True) if to_library else None
        if on_library is not None:
            floor_us, est_us, est_low_us, est_high_us = (
                None if part is None else round(part + on_library[key], 3)
                for part, key in ((floor_us if kernels else 0.0, "floor_us"), (est_us if kernels else 0.0, "est_us"),
                                  (est_low_us if kernels else 0.0, "est_low_us"),
                                  (est_high_us if kernels else 0.0, "est_high_us")))
        notes = []
        if result.error:
            notes.append(f"trace failed: {result.error}")
            errors.append(f"{case.bench} {label}: {result.error}")
        unplanned = result.unplanned_families() if case.pinned is None else (
            [case.family or case.bench] if result.log.outside else [])
        if unplanned:
            notes.append(f"no launch plan yet: {', '.join(unplanned)}")
            floor_us = est_us = bw_fraction = est_low_us = est_high_us = None
        with routing_as(facts):   # a family's launch_count reads the device as the traced call saw it
            mismatches = launch_count_mismatches(result)
        for problem in mismatches:
            notes.append(problem)
            errors.append(f"{case.bench} {label}: {problem}")
        report = CaseReport(case.bench, label, shape, backend, candidate, result.launches, floor_us, est_us,
                            bw_fraction, kernels, case.dtype, "; ".join(notes), est_low_us=est_low_us,
                            est_high_us=est_high_us, decided_by=_decided_by(case, result.routes),
                            routed=case.pinned is None,
                            on_library_us=None if on_library is None else on_library["est_us"])
        report.measured_us = measured.get((case.bench, label, case.dtype, candidate))
        report.library = library_path(result.routes, profile)
        reports.append(report)
    # a row pinned to a candidate runs the op calls of its case: where its trace routed none (the row launches
    # the candidate directly), the library path of the routed row with its label
    routed_library = {(r.bench, r.case): r.library for r in reports if r.routed and r.library is not None}
    for report in reports:
        if report.library is None and not report.routed:
            report.library = routed_library.get((report.bench, report.case))

    models = []
    for model in ("PyanNet segmentation", "WeSpeaker ResNet34"):
        forward = model_traces.get(model)
        complete = forward is not None and not forward.error
        if forward is not None and forward.error:
            errors.append(f"model {model}: {forward.error}")
        syncs = list(forward.host_syncs or []) if forward is not None else []
        models.append({"model": model, "launches_per_forward": forward.launches if forward and complete else None,
                       "host_syncs_per_forward": len(syncs) if complete else None, "_syncs": syncs})
    from rlx_triton.devices import profile_block

    written = {"device": profile.key, "calibrated": profile.calibrated, "profile": profile_block(profile),
               "assumptions": list(ASSUMPTIONS),
               "cases": [r.as_json() for r in reports],
               "models": [{k: v for k, v in m.items() if not k.startswith("_")} for m in models]}
    return {"report": written, "cases": reports, "models": models, "errors": errors}


def _fmt(value, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "-"
    if percent:
        return f"{100 * value:.0f}%"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _chain_text(steps: dict) -> str:
    return ", ".join(f"{count} {kind}" for kind, count in steps.items()) or "none"


def format_report(profile, analysis: dict) -> str:
    """The printed form: one row per case, one indented row per launch configuration, then the models."""
    lines = [f"rlx-triton perf: {profile.name} ({profile.arch}, {profile.sm_count} SMs, "
             f"{profile.bandwidth / 1e12:.2f} TB/s datasheet, {profile.achievable_bw / 1e12:.2f} TB/s achievable) -- "
             f"estimates are {'CALIBRATED' if profile.calibrated else 'UNCALIBRATED'}", ""]
    header = (f"{'bench':22} {'case':44} {'dtype':8} {'backend':7} {'launches':>8} {'floor us':>10} "
              f"{'est us':>10} {'range us':>19} {'bw':>5} {'meas/est':>8}  candidate / note")
    lines += [header, "-" * len(header)]
    for case in analysis["cases"]:
        ratio = f"{case.measured_us / case.est_us:.2f}" if case.measured_us and case.est_us else "-"
        detail = case.candidate or ""
        if case.decided_by:
            detail = f"{detail} (decided by {case.decided_by})" if detail else f"(decided by {case.decided_by})"
        if case.note:
            detail = f"{detail}  [{case.note}]" if detail else f"[{case.note}]"
        lines.append(f"{case.bench[:22]:22} {case.case[:44]:44} {case.dtype[:8]:8} {case.backend[:7]:7} "
                     f"{case.launches:>8} "
                     f"{_fmt(case.floor_us):>10} {_fmt(case.est_us):>10} "
                     f"{_fmt(case.est_low_us) + '-' + _fmt(case.est_high_us):>19} "
                     f"{_fmt(case.bw_fraction, percent=True):>5} {ratio:>8}  {detail}")
        seen: Dict[tuple, list] = {}
        for kernel in case.kernels:
            key = (kernel.name, tuple(kernel.grid), kernel.regs, kernel.smem)
            seen.setdefault(key, [kernel, 0])[1] += 1
        if case.library is not None:
            parts = ", ".join(f"{k['name']} {_fmt(k['est_us'])}" for k in case.library["kernels"])
            lines.append(f"    {case.library['label']}: {case.library['launches']} launches, floor "
                         f"{_fmt(case.library['floor_us'])} us, est {_fmt(case.library['est_us'])} us ({parts})")
        for (name, _grid, _regs, _smem), (kernel, count) in seen.items():
            times = f" x{count}" if count > 1 else ""
            if kernel.error and kernel.regs is None:
                lines.append(f"    {name}{times}: {kernel.error}")
                continue
            lines.append(
                f"    {name}{times}: grid {tuple(kernel.grid)} = {kernel.ctas} CTAs, {kernel.num_warps} warps, "
                f"{kernel.num_stages} stages; {kernel.regs} regs, {kernel.smem} B smem, {kernel.spills} B spills; "
                f"{kernel.ctas_per_sm} CTAs/SM ({kernel.limiter}), {_fmt(kernel.waves, 2)} waves, "
                f"fill {_fmt(kernel.sm_fill, percent=True)}; {kernel.scope}: {kernel.mma} mma, {kernel.ldg128} "
                f"ldg128 ({kernel.ldgsts} cp.async), {kernel.ffma} ffma"
                + (f", {len(kernel.spin_loops)} spin loop(s) apart" if kernel.spin_loops else "")
                + f"; {kernel.unit}; floor {_fmt(kernel.floor_us)} us, issue {_fmt(kernel.issue_us)} us, chain "
                f"{_fmt(kernel.chain_us)} us ({_chain_text(kernel.chain_steps)}), est {_fmt(kernel.est_us)} us "
                f"({_fmt(kernel.est_low_us)}-{_fmt(kernel.est_high_us)}), {kernel.bound}-bound"
                + (f" [{kernel.error}]" if kernel.error else ""))
    lines += ["", "models (one forward at the bench shape)"]
    for model in analysis["models"]:
        syncs = model["host_syncs_per_forward"]
        kinds: Dict[str, int] = {}
        for kind in model["_syncs"]:
            kinds[kind] = kinds.get(kind, 0) + 1
        detail = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        lines.append(f"  {model['model']:22} launches {_fmt(model['launches_per_forward'])}, host syncs "
                     f"{_fmt(syncs)}{f' ({detail})' if detail else ''}")
    lines += ["", "constants (low / nominal / high):"]
    block = analysis["report"]["profile"]
    lines.append(f"  achievable bandwidth {block['achievable_bw'] / 1e12:.2f} TB/s (datasheet "
                 f"{block['bandwidth'] / 1e12:.2f}), clock {block['clock_hz'] / 1e9:.2f} GHz, "
                 f"{block['schedulers_per_sm']} schedulers/SM, launch {_fmt(block['launch_us'])} us")
    lines.append("  " + ", ".join(f"{key} {'/'.join(_fmt(v, 0) for v in span)}{'' if key == 'issue_interval' else ' ns'}"
                                  for key, span in block["latency"].items()))
    lines += ["", "assumptions (the same for every kernel):"]
    lines += [f"  - {text}" for text in analysis["report"]["assumptions"]]
    if analysis["errors"]:
        lines += ["", "errors:"] + [f"  - {error}" for error in analysis["errors"]]
    return "\n".join(lines)


def markdown_table(profile, analysis: dict) -> str:
    """The case table for the docs: estimates beside the measured columns (empty until a run on this GPU)."""
    state = "calibrated" if profile.calibrated else "uncalibrated"
    lines = [f"`rlx-triton perf --device {profile.key}`: {profile.name}, estimates {state}; measured columns "
             f"from the newest bench/results/*.json of this GPU, empty until one exists.", "",
             "| bench | case | dtype | candidate | launches | SM fill | floor us | est us | measured us | "
             "measured / est |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for case in analysis["cases"]:
        longest = max((k for k in case.kernels if k.est_us is not None), key=lambda k: k.est_us, default=None)
        fill = _fmt(longest.sm_fill, percent=True) if longest is not None else "-"
        est = _fmt(case.est_us) if case.est_us is not None else (case.note or "-")
        ratio = f"{case.measured_us / case.est_us:.2f}" if case.measured_us and case.est_us else ""
        measured = _fmt(case.measured_us) if case.measured_us else ""
        lines.append(f"| {case.bench} | {case.case} | {case.dtype} | {case.candidate or case.backend} | "
                     f"{case.launches} | {fill} | {_fmt(case.floor_us)} | {est} | {measured} | {ratio} |")
    lines += ["", "| model | Triton launches per forward | host syncs per forward |", "|---|---:|---:|"]
    lines += [f"| {m['model']} | {_fmt(m['launches_per_forward'])} | {_fmt(m['host_syncs_per_forward'])} |"
              for m in analysis["models"]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """The perf command on parsed arguments (see add_arguments); returns the exit code."""
    from rlx_triton import devices

    if args.published:
        return _published(args)
    if args.calibrate:
        try:
            import triton  # noqa: F401
        except ImportError:
            print("rlx-triton perf: triton is not installed (the analysis compiles with its ptxas)", file=sys.stderr)
            return EXIT_USAGE
        return _calibrate(args)
    try:
        if args.profile:
            profile = devices.load_profile(json.loads(Path(args.profile).read_text()))
        else:
            profile = devices.profile(args.device)
    except (OSError, ValueError) as error:
        print(f"rlx-triton perf: {'--profile' if args.profile else '--device'}: {error}", file=sys.stderr)
        return EXIT_USAGE
    if profile.kind != "cuda":
        print(f"rlx-triton perf: {profile.name} is not a CUDA GPU; perf analyses Triton launches on CUDA "
              f"profiles: {', '.join(p.key for p in devices.cuda_profiles())}", file=sys.stderr)
        return EXIT_USAGE
    unknown = [name for name in args.benches if name not in BENCHES]
    if unknown:
        print(f"rlx-triton perf: unknown bench {', '.join(unknown)}; choose from {', '.join(BENCHES)}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        import triton  # noqa: F401
    except ImportError:
        print("rlx-triton perf: triton is not installed (the analysis compiles with its ptxas)", file=sys.stderr)
        return EXIT_USAGE
    from rlx_triton.perf.compiled import default_cache_dir

    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    results_dir = Path(args.results) if args.results else None
    analysis = analyse(profile, args.benches or list(BENCHES), workers=args.workers, cache_dir=cache_dir,
                       results_dir=results_dir, progress=lambda message: print(message, file=sys.stderr, flush=True))
    from rlx_triton.json_output import write_json

    # --json -: the JSON alone on stdout (the table goes to stderr), as every rlx-triton command's --json does
    print(format_report(profile, analysis), file=sys.stderr if args.json == "-" else sys.stdout)
    write_json(args.json, analysis["report"])
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown_table(profile, analysis))
    return EXIT_FAILED if analysis["errors"] else EXIT_OK


def _published(args: argparse.Namespace) -> int:
    """The --published command: every row of the file priced, the comparison printed (and written with --json)."""
    from rlx_triton.json_output import write_json
    from rlx_triton.perf.published import PublishedFormatError, compare, format_comparison, read_published

    try:
        rows = read_published(args.published)
    except (OSError, PublishedFormatError) as error:
        print(f"rlx-triton perf: --published: {error}", file=sys.stderr)
        return EXIT_USAGE
    from rlx_triton.perf.published import TritonPricer

    pricer: Optional[TritonPricer] = None
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        from rlx_triton.perf.published_triton import triton_us as pricer
    report = compare(rows, pricer)
    print(format_comparison(report, args.published), file=sys.stderr if args.json == "-" else sys.stdout)
    write_json(args.json, report)
    return EXIT_OK


def _calibrate(args: argparse.Namespace) -> int:
    """The --calibrate command (see add_arguments): fits the profile of the results file's GPU; the exit code."""
    from rlx_triton import devices
    from rlx_triton.json_output import write_json
    from rlx_triton.perf.calibrate import profile_values, case_estimate, fit, matched_cases, measured_table, read_results
    from rlx_triton.perf.compiled import default_cache_dir

    path = Path(args.calibrate)
    try:
        data = read_results(path)
    except ValueError as error:
        print(f"rlx-triton perf: --calibrate: {error}", file=sys.stderr)
        return EXIT_USAGE
    profile = devices.profile_for_name(data["device"])
    if profile is None or profile.kind != "cuda":
        print(f"rlx-triton perf: --calibrate: {data['device']!r} is not a CUDA GPU with a profile "
              f"({', '.join(p.key for p in devices.cuda_profiles())})", file=sys.stderr)
        return EXIT_USAGE
    cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
    analysis = analyse(profile, args.benches or list(BENCHES), workers=args.workers, cache_dir=cache_dir,
                       results_dir=path.parent, quick=bool(data.get("quick")),
                       progress=lambda message: print(message, file=sys.stderr, flush=True))
    cases = matched_cases(analysis["cases"], measured_table(data))
    if not cases:
        print(f"rlx-triton perf: --calibrate: no case of {path} matches a bench case (bench, shape, dtype, "
              f"candidate)", file=sys.stderr)
        return EXIT_FAILED
    before = profile_values(profile)
    after = fit(cases, profile)
    fitted = devices.calibrated(profile, after, str(path))
    lines = [f"calibration of {profile.name} on {len(cases)} measured cases of {path}", "",
             f"{'case':70} {'measured us':>12} {'before us':>10} {'err':>7} {'after us':>10} {'err':>7}"]
    for case in cases:
        old, new = case_estimate(case, before, profile), case_estimate(case, after, profile)
        lines.append(f"{case.label[:70]:70} {case.measured_us:>12.1f} {old:>10.1f} "
                     f"{old / case.measured_us - 1:>+7.0%} {new:>10.1f} {new / case.measured_us - 1:>+7.0%}")
    lines += ["", "constants (before -> after):"]
    lines += [f"  {key}: {before[key]:.4g} -> {after[key]:.4g}" for key in before]
    print("\n".join(lines))
    target = Path(args.write_profile) if args.write_profile else REPO_ROOT / "bench" / "results" / "profiles" / (
        path.stem + ".json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(devices.profile_file(fitted, str(path)), indent=1) + "\n")
    print(f"\ncalibrated profile written to {target} (rlx-triton perf --profile {target})")
    if args.json:
        write_json(args.json, {"profile": devices.profile_file(fitted, str(path)),
                               "cases": [{"case": c.label, "measured_us": c.measured_us,
                                          "before_us": round(case_estimate(c, before, profile), 3),
                                          "after_us": round(case_estimate(c, after, profile), 3)} for c in cases]})
    return EXIT_OK if not analysis["errors"] else EXIT_FAILED


def main(argv: Optional[List[str]] = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="rlx-triton perf", description=__doc__.splitlines()[0]))
    return run(parser.parse_args(argv))
