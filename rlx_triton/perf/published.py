"""`rlx-triton perf --published FILE.csv`: the model's estimates beside published measurements of library kernels.

A published file holds measurements somebody published of a library kernel on a real GPU, one per row, each
with its source. Lines starting with `#` are comments; the first other line is the header
`source,gpu,impl,op,shape,dtype,metric,value`:

- gpu: a device profile key (rlx_triton/devices.py: h100-sxm, h200, a100-80gb, l40s, rtx-4090);
- impl: fa2, fa3, cudnn, cublas, cufft, triton, flashinfer or torch (triton: this project's own kernel for the op);
- op and shape (`key=value;...`, integers): attention_prefill, attention_decode (batch, heads, kv_heads, seq_q,
  seq_kv, head_dim, causal), paged_decode (the same and page_size), conv2d (batch, c_in, c_out, h, w, kernel,
  stride, padding), lstm (batch, seq, input, hidden, layers, bidirectional), gemm (m, n, k), rfft (batch, n);
- dtype: fp16, bf16, fp32, tf32 or fp8; metric: `us` (time per call) or `tflops` (attention FLOPs
  4 x batch x heads x seq_q x seq_kv x head_dim, halved when causal; gemm 2 m n k; conv2d 2 x batch x c_out x
  output pixels x c_in x kernel^2; lstm 8 x hidden x (input + hidden) per step, batch, layer and direction;
  rfft 2.5 n log2 n per transform).

Each row is priced with the library models (rlx_triton.perf.library) at the profile's constants, the same for
every row (nothing is fitted to a row); the report gives published, estimate and error = estimate / published
- 1 per row, and the median |error| over the rows it could price. A row the models cannot price says why
(`unmodelled`); a malformed row is a PublishedFormatError naming its line.
"""
from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

HEADER = ("source", "gpu", "impl", "op", "shape", "dtype", "metric", "value")
IMPLS = ("fa2", "fa3", "cudnn", "cublas", "cufft", "triton", "flashinfer", "torch")
_ATTENTION = ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal")
SHAPE_KEYS: Mapping[str, Tuple[str, ...]] = {
    "attention_prefill": _ATTENTION,
    "attention_decode": _ATTENTION,
    "paged_decode": _ATTENTION + ("page_size",),
    "conv2d": ("batch", "c_in", "c_out", "h", "w", "kernel", "stride", "padding"),
    "lstm": ("batch", "seq", "input", "hidden", "layers", "bidirectional"),
    "gemm": ("m", "n", "k"),
    "rfft": ("batch", "n"),
}
DTYPES = ("fp16", "bf16", "fp32", "tf32", "fp8")
METRICS = ("us", "tflops")
# shape keys that may be 0 (flags and padding); every other key is >= 1
_MAY_BE_ZERO = ("causal", "bidirectional", "padding")
_FLAGS = ("causal", "bidirectional")


class PublishedFormatError(ValueError):
    """A published file that cannot be read: the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class PublishedRow:
    line: int
    source: str
    gpu: str
    impl: str
    op: str
    shape: Mapping[str, int]
    dtype: str
    metric: str
    value: float

    def shape_text(self) -> str:
        return ";".join(f"{key}={value}" for key, value in self.shape.items())


def _shape(text: str, op: str, where: str) -> Dict[str, int]:
    values: Dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PublishedFormatError(f"{where}: shape item {item!r} is not key=value")
        if key in values:
            raise PublishedFormatError(f"{where}: shape key {key!r} is given twice")
        try:
            number = int(value.strip())
        except ValueError:
            raise PublishedFormatError(f"{where}: shape {key}={value.strip()!r} is not an integer") from None
        values[key] = number
    wanted = SHAPE_KEYS[op]
    missing = [key for key in wanted if key not in values]
    unknown = [key for key in values if key not in wanted]
    if missing or unknown:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unknown {', '.join(unknown)}"] if unknown else [])
        raise PublishedFormatError(f"{where}: shape of {op} needs exactly {', '.join(wanted)} ({'; '.join(parts)})")
    for key, number in values.items():
        low = 0 if key in _MAY_BE_ZERO else 1
        if number < low or (key in _FLAGS and number > 1):
            allowed = "0 or 1" if key in _FLAGS else f">= {low}"
            raise PublishedFormatError(f"{where}: shape {key} must be {allowed}, got {number}")
    return {key: values[key] for key in wanted}


def parse_published(lines: Sequence[str], name: str = "<published>") -> List[PublishedRow]:
    """The rows of a published file's lines; PublishedFormatError naming the first malformed line."""
    from rlx_triton import devices

    rows: List[PublishedRow] = []
    header_seen = False
    numbered = [(number, text) for number, text in enumerate(lines, start=1)
                if text.strip() and not text.lstrip().startswith("#")]
    for number, cells in zip((n for n, _ in numbered), csv.reader(text for _, text in numbered)):
        where = f"{name} line {number}"
        cells = [cell.strip() for cell in cells]
        if not header_seen:
            if tuple(cells) != HEADER:
                raise PublishedFormatError(f"{where}: the header must be {','.join(HEADER)}, got {','.join(cells)}")
            header_seen = True
            continue
        if len(cells) != len(HEADER):
            raise PublishedFormatError(f"{where}: {len(cells)} fields, the header has {len(HEADER)} "
                                       f"({','.join(HEADER)})")
        source, gpu, impl, op, shape, dtype, metric, value = cells
        if not source:
            raise PublishedFormatError(f"{where}: the source is empty (every row names where it is published)")
        try:
            profile = devices.profile(gpu)
        except ValueError as error:
            raise PublishedFormatError(f"{where}: gpu: {error}") from None
        if profile.kind != "cuda":
            raise PublishedFormatError(f"{where}: gpu {gpu!r} is not a CUDA GPU")
        for field_name, given, allowed in (("impl", impl, IMPLS), ("op", op, tuple(SHAPE_KEYS)),
                                           ("dtype", dtype, DTYPES), ("metric", metric, METRICS)):
            if given not in allowed:
                raise PublishedFormatError(f"{where}: {field_name} {given!r} is not one of {', '.join(allowed)}")
        try:
            number_value = float(value)
        except ValueError:
            raise PublishedFormatError(f"{where}: value {value!r} is not a number") from None
        if not math.isfinite(number_value) or number_value <= 0:
            raise PublishedFormatError(f"{where}: value must be a positive number, got {value}")
        rows.append(PublishedRow(number, source, profile.key, impl, op, _shape(shape, op, where), dtype, metric,
                                 number_value))
    if not header_seen:
        raise PublishedFormatError(f"{name}: no header line ({','.join(HEADER)})")
    return rows


def read_published(path: Union[str, Path]) -> List[PublishedRow]:
    """The rows of a published file; PublishedFormatError for a malformed one, OSError for an unreadable one."""
    path = Path(path)
    return parse_published(path.read_text().splitlines(), str(path))


def row_flops(op: str, shape: Mapping[str, int]) -> float:
    """The FLOPs a row's tflops metric counts (see the module docstring)."""
    if op in ("attention_prefill", "attention_decode", "paged_decode"):
        flops = 4.0 * shape["batch"] * shape["heads"] * shape["seq_q"] * shape["seq_kv"] * shape["head_dim"]
        return flops / 2 if shape["causal"] else flops
    if op == "gemm":
        return 2.0 * shape["m"] * shape["n"] * shape["k"]
    if op == "conv2d":
        out_h = (shape["h"] + 2 * shape["padding"] - shape["kernel"]) // shape["stride"] + 1
        out_w = (shape["w"] + 2 * shape["padding"] - shape["kernel"]) // shape["stride"] + 1
        return 2.0 * shape["batch"] * shape["c_out"] * out_h * out_w * shape["c_in"] * shape["kernel"] ** 2
    if op == "lstm":
        directions = 2 if shape["bidirectional"] else 1
        total = 0.0
        for layer in range(shape["layers"]):
            inputs = shape["input"] if layer == 0 else shape["hidden"] * directions
            total += 8.0 * shape["hidden"] * (inputs + shape["hidden"]) * directions
        return total * shape["batch"] * shape["seq"]
    if op == "rfft":
        return 2.5 * shape["n"] * math.log2(shape["n"]) * shape["batch"]
    raise ValueError(f"row_flops: unknown op {op!r}")


# impl "triton": the project's own kernel for the op, traced and compiled as `rlx-triton perf` does it
TritonPricer = Callable[[PublishedRow, Any], float]


def price_row(row: PublishedRow, profile, triton_us: Optional[TritonPricer] = None) -> Tuple[Optional[float], str]:
    """(estimated microseconds, "") of one row on its profile, or (None, why it is not modelled)."""
    from rlx_triton.perf.library import Unmodelled, kernels_of
    from rlx_triton.perf.roofline import library_estimate

    if row.impl == "triton":
        if triton_us is None:
            return None, "the project's own kernels are priced only where triton is installed"
        try:
            return triton_us(row, profile), ""
        except Unmodelled as why:
            return None, str(why)
    try:
        kernels = kernels_of(row.op, row.impl, row.shape, row.dtype, profile)
    except Unmodelled as why:
        return None, str(why)
    return float(library_estimate(kernels, profile)["est_us"]), ""


def compare(rows: Sequence[PublishedRow], triton_us: Optional[TritonPricer] = None) -> dict:
    """The report: every row with its estimate and error, the median |error| over the modelled rows."""
    from rlx_triton import devices

    out: List[Dict[str, Any]] = []
    errors: List[float] = []
    for row in rows:
        profile = devices.profile(row.gpu)
        estimate_us, why = price_row(row, profile, triton_us)
        estimate: Optional[float] = None
        error: Optional[float] = None
        if estimate_us is not None and estimate_us > 0:
            estimate = estimate_us if row.metric == "us" else row_flops(row.op, row.shape) / estimate_us / 1e6
            error = estimate / row.value - 1.0
            errors.append(abs(error))
        out.append({"line": row.line, "source": row.source, "gpu": row.gpu, "impl": row.impl, "op": row.op,
                    "shape": row.shape_text(), "dtype": row.dtype, "metric": row.metric, "published": row.value,
                    "estimate": None if estimate is None else round(estimate, 4),
                    "error": None if error is None else round(error, 4), "unmodelled": why or None})
    return {"rows": out, "median_abs_error": round(statistics.median(errors), 4) if errors else None,
            "modelled": len(errors), "rows_total": len(rows)}


def format_comparison(report: dict, name: str) -> str:
    """The printed form: one row per measurement, then the median and the count."""
    lines = [f"rlx-triton perf --published {name}: published measurements beside the model's estimates", "",
             f"{'line':>4} {'gpu':10} {'impl':10} {'op':17} {'dtype':5} {'metric':6} {'published':>10} "
             f"{'estimate':>10} {'error':>7}  shape / why not modelled"]
    for row in report["rows"]:
        estimate = "-" if row["estimate"] is None else f"{row['estimate']:.1f}"
        error = "-" if row["error"] is None else f"{row['error']:+.0%}"
        detail = row["shape"] if row["unmodelled"] is None else f"{row['shape']}  [{row['unmodelled']}]"
        lines.append(f"{row['line']:>4} {row['gpu'][:10]:10} {row['impl']:10} {row['op']:17} {row['dtype']:5} "
                     f"{row['metric']:6} {row['published']:>10.1f} {estimate:>10} {error:>7}  {detail}")
    median = report["median_abs_error"]
    lines += ["", f"modelled {report['modelled']} of {report['rows_total']} rows; median |estimate / published - 1| "
                  f"= {'-' if median is None else f'{median:.1%}'}"]
    return "\n".join(lines)
