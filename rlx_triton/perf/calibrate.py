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
which `rlx-triton perf --profile PATH` reads. The command itself (reading the file, analysing, printing,
writing) is rlx_triton.perf's; this module holds the fit and the matching it uses.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

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


def profile_values(profile) -> Dict[str, float]:
    """The profile's constants the fit moves (achievable bandwidth, launch latency, CALIBRATION_KEYS), nominal."""
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
    start = profile_values(profile)
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
