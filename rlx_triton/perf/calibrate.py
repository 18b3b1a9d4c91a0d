"""`rlx-triton perf --calibrate RESULTS`: the device constants fitted to a measured bench run.

The measured run is a bench results file as bench/run.py writes it (bench/gpu_check.sh runs it):

    {"device": "<torch.cuda.get_device_name()>", "quick": true | false, "copy_gbps": <float, optional>,
     "cases": [{"bench": "<bench name>", "shape": "<the bench's case label>", "dtype": "float16",
                "candidate": "<candidate tag, optional>", "rlx_us": <measured microseconds>}, ...]}

The device name picks the profile (rlx_triton.devices.profile_for_name); every bench case of that run
(`quick` picks the case list it measured) is traced and analysed as `rlx-triton perf` does, and the rows
whose (bench, shape, dtype, candidate) match a case give its measured time. The constants of
`rlx_triton.devices.CALIBRATION_KEYS` (achievable bandwidth, launch latency, the latency constants and
the issue interval) are then fitted by least squares on the log of estimated / measured time over the
matched cases (Levenberg-Marquardt on the logs of the constants, numeric Jacobian), with a weak pull
towards the profile's nominal values so a constant no matched case depends on stays where it was. The
estimate is re-evaluated from each launch's terms (rlx_triton.perf.roofline.kernel_time), so nothing is
compiled twice. The calibrated profile (`calibrated: true`) is written as JSON (devices.profile_file),
which `rlx-triton perf --profile PATH` reads.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from rlx_triton.devices import CALIBRATION_KEYS

# how strongly a constant is held at its starting value (per unit of log): weak against any matched case
PRIOR_WEIGHT = 1e-3
_MAX_ITERATIONS = 200


@dataclass
class MeasuredCase:
    """One bench case: the terms of its launches (roofline.KernelTerms) and its measured time."""
    label: str
    terms: list
    measured_us: float


def _values_of(profile) -> Dict[str, float]:
    from rlx_triton.perf.roofline import constants

    nominal = constants(profile, "nominal")
    values = {"achievable_bw": nominal["bandwidth"], "launch_us": nominal["launch_us"]}
    values.update({key: nominal[key] for key in CALIBRATION_KEYS if key in nominal})
    return values


def _priced(values: Dict[str, float], profile) -> dict:
    from rlx_triton.perf.roofline import constants

    priced = dict(constants(profile, "nominal"))
    priced.update({key: value for key, value in values.items() if key not in ("achievable_bw",)})
    priced["bandwidth"] = values["achievable_bw"]
    return priced


def case_estimate(case: MeasuredCase, values: Dict[str, float], profile) -> float:
    """A case's estimate (us) at `values`: its launches priced by roofline.kernel_time, summed."""
    from rlx_triton.perf.roofline import kernel_time

    priced = _priced(values, profile)
    return sum(kernel_time(terms, priced)["est_us"] for terms in case.terms)


def fit(cases: Sequence[MeasuredCase], profile, keys: Sequence[str] = CALIBRATION_KEYS) -> Dict[str, float]:
    """The constants (CALIBRATION_KEYS) minimising sum over cases of log(estimate / measured)^2, started at the
    profile's nominal values."""
    start = _values_of(profile)
    keys = [key for key in keys if key in start]
    if not cases:
        raise ValueError("calibration needs at least one measured case that matches a bench case")
    theta0 = np.log([start[key] for key in keys])
    measured = np.log([case.measured_us for case in cases])

    def residuals(theta: np.ndarray) -> np.ndarray:
        values = dict(start, **{key: float(math.exp(t)) for key, t in zip(keys, theta)})
        estimates = np.log([max(case_estimate(case, values, profile), 1e-9) for case in cases])
        return np.concatenate([estimates - measured, PRIOR_WEIGHT * (theta - theta0)])

    theta = theta0.copy()
    current = residuals(theta)
    damping = 1e-3
    for _ in range(_MAX_ITERATIONS):
        jacobian = np.empty((current.size, theta.size))
        for j in range(theta.size):
            step = 1e-6 * max(1.0, abs(theta[j]))
            shifted = theta.copy()
            shifted[j] += step
            jacobian[:, j] = (residuals(shifted) - current) / step
        normal = jacobian.T @ jacobian
        gradient = jacobian.T @ current
        improved = False
        while damping < 1e12:
            delta = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient)
            trial = residuals(theta + delta)
            if trial @ trial < current @ current:
                theta, current, damping, improved = theta + delta, trial, max(damping / 10, 1e-12), True
                break
            damping *= 10
        if not improved or np.max(np.abs(delta)) < 1e-10:
            break
    return dict(start, **{key: float(math.exp(t)) for key, t in zip(keys, theta)})


def read_results(path: Path) -> dict:
    """A measured results file (the module docstring's format); ValueError naming what is missing."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict) or not isinstance(data.get("device"), str) or not isinstance(data.get("cases"), list):
        raise ValueError(f"{path}: a results file needs \"device\" (a string) and \"cases\" (a list)")
    return data


def measured_table(data: dict) -> Dict[tuple, float]:
    """(bench, shape, dtype, candidate) -> rlx_us of a results file's rows (the first row of each key)."""
    table: Dict[tuple, float] = {}
    for row in data["cases"]:
        if isinstance(row, dict) and isinstance(row.get("rlx_us"), (int, float)) and row["rlx_us"] > 0:
            table.setdefault((row.get("bench"), row.get("shape"), row.get("dtype"), row.get("candidate")),
                             float(row["rlx_us"]))
    return table


def matched_cases(reports: Sequence, table: Dict[tuple, float]) -> List[MeasuredCase]:
    """The analysed cases (perf CaseReports) with a measured time and an estimate of every launch."""
    cases = []
    for report in reports:
        measured = table.get((report.bench, report.case, report.dtype, report.candidate))
        terms = [kernel.terms for kernel in report.kernels]
        if measured is None or not terms or any(t is None for t in terms) or report.est_us is None:
            continue
        cases.append(MeasuredCase(f"{report.bench} {report.case} {report.dtype} {report.candidate or ''}".strip(),
                                  terms, measured))
    return cases


def run(args) -> int:
    """The --calibrate command (see rlx_triton.perf.add_arguments); returns the exit code."""
    from rlx_triton import devices
    from rlx_triton.json_output import write_json
    from rlx_triton.perf import BENCHES, EXIT_FAILED, EXIT_OK, EXIT_USAGE, analyse
    from rlx_triton.perf.benches import REPO_ROOT
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
    before = _values_of(profile)
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
