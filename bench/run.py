"""Runs any subset of the benchmarks side by side in one process; writes the results only when asked.

    python bench/run.py [--quick] [--out bench/results] [--json PATH] [NAME ...]

Each bench module exposes cases(quick) -> its case descriptions and run(quick, progress) -> list of result
dicts (bench, shape, dtype, rlx_us, baseline, baseline_us, speedup, gbps). A markdown table goes to stdout; with --out DIR the same table goes to
DIR/<date>-<device>.md, with a PNG of the speedup per case and DIR/<date>-<device>.json (device,
torch, triton, the measured copy bandwidth, the cases and a summary), and the run's rows are appended to
DIR/all_benchmark_data.csv (RECORD_FIELDS: kernel, provider, mode, metric, x value, p20/p50/p80, GPU,
timestamp, package version, git SHA), from which DIR/latest-<bench>.png plots each bench's latest run per GPU; --json PATH writes that report
to PATH ('-': to stdout, instead of the table). Progress goes to stderr: one unit per case of every bench
selected, with the total and an ETA.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import math
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlx_triton.perf.cases import BENCH_NAMES  # noqa: E402  (after the checkout is on sys.path)

BENCHES = {name: f"bench.{name}" for name in BENCH_NAMES}
# summary key -> bench name whose speedups it summarises (geometric mean)
SPEEDUP_KEYS = {
    "sdpa_decode_geomean_speedup": "sdpa_decode",
    "fbank_speedup": "fbank",
    "sincnet_speedup": "sincnet",
    "lstm_speedup": "lstm",
    "pyannote_segmentation_speedup": "pyannote_segmentation",
    "embedding_speedup": "embedding",
}


def geomean(values: List[float]) -> Optional[float]:
    values = [v for v in values if v and v > 0]
    if not values:
        return None
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 4)


def summarise(cases: List[dict], copy_gbps: float, device_type: str) -> Dict[str, Optional[float]]:
    """The summary keys; a key is null where its bench did not run or was not measured on a GPU kernel."""
    summary: Dict[str, Optional[float]] = {}
    for key, bench in SPEEDUP_KEYS.items():
        summary[key] = geomean([c["speedup"] for c in cases if c["bench"] == bench and c.get("backend") != "torch"])
    big = [c["gbps"] for c in cases if c["bench"] == "sdpa_decode" and c.get("bw_case") and c.get("gbps")]
    summary["decode_bw_fraction"] = round(sorted(big)[len(big) // 2] / copy_gbps, 4) if big and copy_gbps else None
    if device_type != "cuda":
        # CPU runs measure fallback paths and dispatch overhead only; no kernel speedup is claimed
        summary.update({key: None for key in SPEEDUP_KEYS})
        summary["decode_bw_fraction"] = None
    return summary


def markdown(report: dict) -> str:
    lines = [f"# rlx_triton benchmarks, {report['date']} on {report['device']}", "",
             f"torch {report['torch']}, triton {report['triton']}, copy bandwidth {report['copy_gbps']:.1f} GB/s"
             f"{' (quick mode)' if report['quick'] else ''}", "",
             "| bench | shape | dtype | route | rlx us | baseline | baseline us | speedup | GB/s |",
             "|---|---|---|---|---:|---|---:|---:|---:|"]
    for c in report["cases"]:
        speedup = f"{c['speedup']:.2f}x" if c.get("speedup") else "-"
        if c.get("metric") == "dispatch_overhead":
            speedup = f"{c['rlx_us'] - c['baseline_us']:+.2f} us overhead"
        lines.append(f"| {c['bench']} | {c['shape']} | {c['dtype']} | {c.get('backend', '-')} | {c['rlx_us']:.1f} | "
                     f"{c['baseline']} | {c['baseline_us']:.1f} | {speedup} | {c.get('gbps') or '-'} |")
    lines += ["", "## Summary", ""]
    lines += [f"- {key}: {value if value is not None else 'not measured'}" for key, value in report["summary"].items()]
    if report["errors"]:
        lines += ["", "## Benchmarks that failed", ""] + [f"- {name}: {err}" for name, err in report["errors"].items()]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> bool:
    """A horizontal bar per case (label on the left, ratio on a log axis): every label stays readable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cases = [c for c in report["cases"] if c.get("speedup")]
    if not cases:
        return False
    speedups = [c["speedup"] for c in cases]
    labels = [f"{c['bench']}  {c['shape']}  {c['dtype']}  vs {c['baseline']}" for c in cases]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.28 * len(cases)))
    rows = range(len(cases))
    # bars grow from 1x (parity), right when rlx_triton is faster, left when slower
    ax.barh(rows, [s - 1.0 for s in speedups], left=1.0, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    for row, speedup in zip(rows, speedups):
        ax.annotate(f"{speedup:.2f}x", (max(speedup, 1.0), row), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(list(rows))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()  # first case on top, as in the table
    low, high = min(speedups + [1.0]), max(speedups + [1.0])
    ax.set_xlim(low / 1.3, high * 1.6)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100) if low / 1.3 <= t <= high * 1.6]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.grid(axis="x", linewidth=0.3)
    ax.set_xlabel("speedup over the baseline (log scale; > 1: rlx_triton is faster)")
    ax.set_title(f"rlx_triton on {report['device']}, {report['date']}{' (quick)' if report['quick'] else ''}")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return True


# one row per (case, provider, metric), appended run after run, as Liger-Kernel's all_benchmark_data.csv
RECORDS_FILE = "all_benchmark_data.csv"
RECORD_FIELDS = ("kernel_name", "kernel_provider", "kernel_operation_mode", "metric_name", "metric_unit", "x_name",
                 "x_value", "dtype", "route", "y_value_20", "y_value_50", "y_value_80", "gpu_name", "timestamp",
                 "rlx_triton_version", "git_sha", "torch_version", "triton_version", "quick")


def git_sha(root: Path = ROOT) -> Optional[str]:
    """The checkout's commit (with "-dirty" when files differ from it), None outside a git checkout."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if dirty else sha


def records(report: dict) -> List[dict]:
    """The CSV rows of a report: per case, rlx_triton's and the baseline's times (p20, p50, p80 in us), and for
    a dispatch-overhead case the overhead itself as a metric of its own."""
    common = {"gpu_name": report["device"], "timestamp": report["timestamp"],
              "rlx_triton_version": report["rlx_triton"], "git_sha": report["git_sha"],
              "torch_version": report["torch"], "triton_version": report["triton"], "quick": report["quick"]}
    rows = []
    for c in report["cases"]:
        case_fields = {"kernel_name": c["bench"], "kernel_operation_mode": "forward", "x_name": "shape",
                       "x_value": c["shape"], "dtype": c["dtype"], "route": c.get("backend", ""), **common}
        for provider, side in (("rlx_triton", "rlx"), (c["baseline"], "baseline")):
            rows.append({**case_fields, "kernel_provider": provider, "metric_name": "time", "metric_unit": "us",
                         "y_value_20": c.get(f"{side}_p20_us", c[f"{side}_us"]), "y_value_50": c[f"{side}_us"],
                         "y_value_80": c.get(f"{side}_p80_us", c[f"{side}_us"])})
        if c.get("metric") == "dispatch_overhead":
            overhead = round(c["rlx_us"] - c["baseline_us"], 3)
            rows.append({**case_fields, "kernel_provider": "rlx_triton", "metric_name": "dispatch_overhead",
                         "metric_unit": "us", "y_value_20": None, "y_value_50": overhead, "y_value_80": None})
    return rows


def append_records(rows: List[dict], path: Path) -> None:
    """Appends rows to the CSV at path, writing the header when the file is new."""
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=RECORD_FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def plot_families(path: Path, out: Path, stem: str) -> List[Path]:
    """One PNG per kernel family of the CSV at path: the median time of each provider per case of the latest
    run on each GPU, with its p20-p80 range as an error bar (log scale). Returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    with path.open(newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row["metric_name"] == "time"]
    latest: Dict[tuple, str] = {}
    for row in rows:
        key = (row["kernel_name"], row["gpu_name"])
        latest[key] = max(latest.get(key, ""), row["timestamp"])
    written = []
    for family in dict.fromkeys(row["kernel_name"] for row in rows):
        chosen = [row for row in rows if row["kernel_name"] == family
                  and row["timestamp"] == latest[(family, row["gpu_name"])]]
        cases = list(dict.fromkeys(f"{row['x_value']} {row['dtype']} ({row['gpu_name']})" for row in chosen))
        providers = list(dict.fromkeys(row["kernel_provider"] for row in chosen))
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.3 * len(cases) * len(providers)))
        height = 0.8 / len(providers)
        for index, provider in enumerate(providers):
            mine = {f"{row['x_value']} {row['dtype']} ({row['gpu_name']})": row for row in chosen
                    if row["kernel_provider"] == provider}
            ys = [position + index * height for position, label in enumerate(cases) if label in mine]
            values = [mine[label] for label in cases if label in mine]
            p50 = [float(v["y_value_50"]) for v in values]
            low = [p - float(v["y_value_20"]) for p, v in zip(p50, values)]
            high = [float(v["y_value_80"]) - p for p, v in zip(p50, values)]
            ax.barh(ys, p50, height=height, xerr=[low, high], label=provider, capsize=2)
        ax.set_yticks([position + 0.4 - height / 2 for position in range(len(cases))])
        ax.set_yticklabels(cases, fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("median time per call, us (log scale; bars: 20th to 80th percentile)")
        ax.set_title(f"{family}: latest run per GPU")
        ax.legend(fontsize=7)
        target = out / f"{stem}-{family}.png"
        fig.savefig(target, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(target)
    return written


def _failed(errors: Dict[str, str], name: str, error: Exception) -> None:
    traceback.print_exc()
    errors[name] = f"{type(error).__name__}: {error}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small case set, fewer repetitions")
    parser.add_argument("--out", metavar="DIR", help="write <date>-<device>.md/.json/.png there (e.g. bench/results)")
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON to PATH ('-': stdout)")
    parser.add_argument("names", nargs="*", help=f"subset of {', '.join(BENCHES)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.names if name not in BENCHES]
    if unknown:
        print(f"bench/run.py: unknown bench {', '.join(unknown)}; choose from {', '.join(BENCHES)}", file=sys.stderr)
        return 2

    import torch

    from bench.common import bench_device, copy_bandwidth_gbps
    from rlx_triton.json_output import write_json
    from rlx_triton.progress import Progress

    device = bench_device()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    copy_gbps = copy_bandwidth_gbps(device, args.quick)
    cases: List[dict] = []
    errors: Dict[str, str] = {}
    modules, counts = {}, {}
    for name in args.names or BENCHES:
        try:
            module = importlib.import_module(BENCHES[name])
            counts[name] = len(module.cases(args.quick))
            modules[name] = module
        except Exception as error:  # one broken bench must not lose the others' results
            _failed(errors, name, error)
    with Progress(sum(counts.values()), "bench", unit="case") as progress:
        for name, module in modules.items():
            progress.set_label(name)
            finished = progress.done + counts[name]
            try:
                cases.extend(module.run(args.quick, progress=progress))
            except Exception as error:
                _failed(errors, name, error)
            if progress.done < finished:  # the cases a failed bench did not reach still count, so the ETA holds
                progress.update(finished - progress.done)
    date = datetime.date.today().isoformat()
    slug = "".join(ch if ch.isalnum() else "-" for ch in device_name).strip("-").lower()
    import rlx_triton

    report = {"date": date, "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": device_name, "rlx_triton": rlx_triton.__version__, "git_sha": git_sha(),
              "torch": torch.__version__, "triton": triton_version,
              "quick": args.quick, "copy_gbps": round(copy_gbps, 2), "cases": cases,
              "summary": summarise(cases, copy_gbps, device.type), "errors": errors}
    table = markdown(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"{date}-{slug}"
        stem.with_suffix(".json").write_text(json.dumps(report, indent=1))
        stem.with_suffix(".md").write_text(table)
        plot(report, stem.with_suffix(".png"))
        append_records(records(report), out / RECORDS_FILE)
        plot_families(out / RECORDS_FILE, out, "latest")
    if not write_json(args.json, report):
        print(table)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
