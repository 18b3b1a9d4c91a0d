"""`rlx-triton perf --published FILE.csv`: the format of published measurements, how rows are priced, the report."""
import json
from pathlib import Path

import pytest

from rlx_triton import perf
from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.perf import published
from rlx_triton.perf.published import PublishedFormatError, compare, parse_published, read_published, row_flops

HEADER = "source,gpu,impl,op,shape,dtype,metric,value"
PREFILL = "batch=2;heads=16;kv_heads=16;seq_q=4096;seq_kv=4096;head_dim=128;causal=1"
REPOSITORY_FILE = Path(__file__).resolve().parents[2] / "bench" / "published.csv"


def parse(*rows, header=HEADER):
    return parse_published(["# a comment", "", header, *rows], "f.csv")


def test_a_row_is_read_with_its_line_number_and_typed_shape():
    (row,) = parse(f"FA2 paper fig. 4,a100-80gb,fa2,attention_prefill,{PREFILL},fp16,tflops,187.5")
    assert (row.line, row.gpu, row.impl, row.op, row.dtype, row.metric, row.value) == (
        4, "a100-80gb", "fa2", "attention_prefill", "fp16", "tflops", 187.5)
    assert row.shape == {"batch": 2, "heads": 16, "kv_heads": 16, "seq_q": 4096, "seq_kv": 4096, "head_dim": 128,
                         "causal": 1}


def test_a_quoted_source_may_hold_commas_and_a_gpu_prefix_names_its_profile():
    (row,) = parse(f'"Dao, 2023, fig. 4",a100,fa2,attention_prefill,{PREFILL},fp16,tflops,187.5')
    assert row.source == "Dao, 2023, fig. 4" and row.gpu == "a100-80gb"


@pytest.mark.parametrize("text, message", [
    ("x,h100-sxm,fa2,attention_prefill", "4 fields, the header has 8"),
    (f"x,h300,fa2,attention_prefill,{PREFILL},fp16,us,1", "gpu: unknown device 'h300'"),
    (f"x,m2-max,fa2,attention_prefill,{PREFILL},fp16,us,1", "not a CUDA GPU"),
    (f"x,h100-sxm,fa9,attention_prefill,{PREFILL},fp16,us,1", "impl 'fa9' is not one of"),
    (f"x,h100-sxm,fa2,attention,{PREFILL},fp16,us,1", "op 'attention' is not one of"),
    (f"x,h100-sxm,fa2,attention_prefill,{PREFILL},int4,us,1", "dtype 'int4' is not one of"),
    (f"x,h100-sxm,fa2,attention_prefill,{PREFILL},fp16,ms,1", "metric 'ms' is not one of"),
    (f"x,h100-sxm,fa2,attention_prefill,{PREFILL},fp16,us,fast", "value 'fast' is not a number"),
    (f"x,h100-sxm,fa2,attention_prefill,{PREFILL},fp16,us,0", "value must be a positive number"),
    (f",h100-sxm,fa2,attention_prefill,{PREFILL},fp16,us,1", "the source is empty"),
    ("x,h100-sxm,cublas,gemm,m=1;n=2,fp16,us,1", "missing k"),
    ("x,h100-sxm,cublas,gemm,m=1;n=2;k=3;l=4,fp16,us,1", "unknown l"),
    ("x,h100-sxm,cublas,gemm,m=1;n=two;k=3,fp16,us,1", "shape n='two' is not an integer"),
    ("x,h100-sxm,cublas,gemm,m=1;n;k=3,fp16,us,1", "shape item 'n' is not key=value"),
    ("x,h100-sxm,cublas,gemm,m=0;n=2;k=3,fp16,us,1", "shape m must be >= 1"),
    ("x,h100-sxm,cublas,gemm,m=1;m=2;n=2;k=3,fp16,us,1", "shape key 'm' is given twice"),
    (f"x,h100-sxm,fa2,attention_prefill,{PREFILL.replace('causal=1', 'causal=2')},fp16,us,1",
     "shape causal must be 0 or 1"),
])
def test_a_malformed_row_is_an_error_naming_its_line(text, message):
    with pytest.raises(PublishedFormatError, match="f.csv line 4: ") as caught:
        parse(text)
    assert message in str(caught.value)


def test_a_file_without_the_header_is_refused():
    with pytest.raises(PublishedFormatError, match="line 3: the header must be"):
        parse("x,h100-sxm,cublas,gemm,m=1;n=2;k=3,fp16,us,1", header="source,gpu,impl,op,shape,dtype,value")
    with pytest.raises(PublishedFormatError, match="no header line"):
        parse_published(["# only a comment"], "f.csv")


@pytest.mark.parametrize("op, shape, flops", [
    ("attention_prefill", dict(batch=2, heads=3, kv_heads=1, seq_q=5, seq_kv=7, head_dim=11, causal=0),
     4 * 2 * 3 * 5 * 7 * 11),
    ("attention_prefill", dict(batch=2, heads=3, kv_heads=1, seq_q=5, seq_kv=7, head_dim=11, causal=1),
     2 * 2 * 3 * 5 * 7 * 11),
    ("gemm", dict(m=3, n=5, k=7), 2 * 3 * 5 * 7),
    ("conv2d", dict(batch=2, c_in=3, c_out=5, h=8, w=6, kernel=3, stride=2, padding=1), 2 * 2 * 5 * (4 * 3) * 3 * 9),
    ("lstm", dict(batch=2, seq=5, input=3, hidden=4, layers=2, bidirectional=1),
     2 * 5 * (8 * 4 * (3 + 4) * 2 + 8 * 4 * (8 + 4) * 2)),
    ("rfft", dict(batch=3, n=512), 2.5 * 512 * 9 * 3),
])
def test_the_tflops_metric_counts_the_agreed_flops(op, shape, flops):
    assert row_flops(op, shape) == pytest.approx(flops)


@pytest.fixture
def one_microsecond_gemm(monkeypatch):
    """A cuBLAS model whose every kernel takes the launch latency alone (4 us on the H200 profile) plus 1 ns."""
    from rlx_triton.perf import library

    def model(shape, dtype, profile):
        if dtype == "fp8":
            raise library.Unmodelled("no fp8 GEMM in this model")
        return [LibraryKernel("gemm", 0, 0)]

    monkeypatch.setattr(library, "models", lambda: {("gemm", "cublas"): model})
    return model


def test_each_row_is_priced_and_the_median_error_is_over_the_modelled_rows(one_microsecond_gemm):
    rows = parse("a,h200,cublas,gemm,m=64;n=64;k=64,fp16,us,2",
                 "b,h200,cublas,gemm,m=64;n=64;k=64,fp16,us,8",
                 "c,h200,cublas,gemm,m=64;n=64;k=64,fp8,us,8",
                 "d,h200,cudnn,conv2d,batch=1;c_in=1;c_out=1;h=3;w=3;kernel=3;stride=1;padding=0,fp32,us,1")
    report = compare(rows)
    assert [row["estimate"] for row in report["rows"]] == [4.0, 4.0, None, None]
    assert [row["error"] for row in report["rows"]] == [1.0, -0.5, None, None]
    assert report["rows"][2]["unmodelled"] == "no fp8 GEMM in this model"
    assert report["rows"][3]["unmodelled"] == "no model of cudnn for conv2d"
    assert (report["modelled"], report["rows_total"], report["median_abs_error"]) == (2, 4, 0.75)


def test_a_tflops_row_is_compared_in_tflops(one_microsecond_gemm):
    (row,) = compare(parse("a,h200,cublas,gemm,m=1000;n=1000;k=1000,fp16,tflops,1.0"))["rows"]
    assert row["estimate"] == pytest.approx(2e9 / 4.0 / 1e6)   # 2 m n k FLOPs in the 4 us estimate
    assert row["error"] == pytest.approx(row["estimate"] - 1.0)


def test_a_triton_row_without_triton_is_unmodelled_with_the_reason(one_microsecond_gemm):
    (row,) = compare(parse("a,h200,triton,gemm,m=64;n=64;k=64,fp32,us,2"))["rows"]
    assert row["estimate"] is None and "priced only where triton is installed" in row["unmodelled"]


def test_the_command_writes_the_agreed_json(one_microsecond_gemm, tmp_path, monkeypatch):
    source = tmp_path / "p.csv"
    source.write_text("\n".join([HEADER, "a,h200,cublas,gemm,m=64;n=64;k=64,fp16,us,2"]) + "\n")
    out = tmp_path / "out.json"
    assert perf.main(["--published", str(source), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report) == ["rows", "median_abs_error", "modelled", "rows_total"]
    assert list(report["rows"][0]) == ["line", "source", "gpu", "impl", "op", "shape", "dtype", "metric", "published",
                                       "estimate", "error", "unmodelled"]


def test_the_command_refuses_a_malformed_file_naming_the_line(tmp_path, capsys):
    source = tmp_path / "p.csv"
    source.write_text("\n".join([HEADER, "a,h200,cublas,gemm,m=64;n=64,fp16,us,2"]) + "\n")
    assert perf.main(["--published", str(source)]) == 2
    assert "line 2: shape of gemm needs exactly m, n, k (missing k)" in capsys.readouterr().err


def test_the_repository_file_holds_at_least_20_sourced_rows_of_at_least_4_ops():
    rows = read_published(REPOSITORY_FILE)
    assert len(rows) >= 20 and len({row.op for row in rows}) >= 4
    assert all(row.source.strip() for row in rows)


def test_every_row_of_the_repository_file_names_a_modelled_op_and_impl():
    modelled = set(published.SHAPE_KEYS)
    assert {row.op for row in read_published(REPOSITORY_FILE)} <= modelled
