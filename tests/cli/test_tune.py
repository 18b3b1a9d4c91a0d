"""Pre-tuning: approved candidates and the library op are timed one by one; the fastest becomes the bucket's winner."""
import pytest
import torch

from rlx_triton import tune
from rlx_triton.config import override_settings
from rlx_triton.router import clear_route_cache


def test_every_named_model_has_cases():
    assert set(tune.MODEL_SHAPES) >= {"llama3-8b", "pyannote-segmentation", "wespeaker"}
    assert all(tune.MODEL_SHAPES[name] for name in tune.MODEL_SHAPES)


def test_wespeaker_tunes_every_conv_geometry_of_the_embedding_bench():
    """`rlx-triton tune wespeaker` times the trunk layers bench/embedding.py measures (and recipes cover)."""
    from rlx_triton.perf.cases import embedding_cases

    layers = [spec for spec in embedding_cases(gpu=True) if "c_in" in spec]
    expected = {f"conv2d b{s['batch']} {s['c_in']}->{s['c_out']} {s['height']}x{s['width']} k{s['kernel']} "
                f"s{s['stride']}" for s in layers}
    labels = [label for label, _ in tune.MODEL_SHAPES["wespeaker"] if label.startswith("conv2d")]
    assert len(labels) == len(set(labels)) and set(labels) == expected


def test_tuning_where_no_kernel_backend_runs_is_refused():
    with override_settings(interpret=False), pytest.raises(RuntimeError, match="nothing to tune"):
        tune.tune_model("wespeaker", device="cpu", progress=False)


def test_tuning_times_every_approved_candidate_and_the_library_op_and_records_the_fastest(tmp_path, monkeypatch):
    # a tiny segdense case keeps the interpreter run short; every approved candidate is timed, and the library op
    from rlx_triton.planner.tune_cache import LIBRARY_WINNER
    from rlx_triton.router import recording_routes

    monkeypatch.setitem(tune.MODEL_SHAPES, "tiny", [tune._segdense_case(5, 8, 16, 3)])
    with override_settings(interpret=True, tune_cache_path=str(tmp_path / "t.tsv"), tune_cache_load=True,
                           tune_cache_persist=True):
        summary = tune.tune_model("tiny", device="cpu", progress=False)
        result = summary["results"][0]
        assert result["backend"] == "triton"
        assert LIBRARY_WINNER in result["ms"] and len(result["ms"]) >= 3
        assert result["winner"] == min(result["ms"], key=result["ms"].get)
        clear_route_cache()
        with recording_routes() as seen:
            tune.MODEL_SHAPES["tiny"][0][1](torch.device("cpu"))()
    # the winner routes the bucket: the library op (on a CPU it beats the interpreter), or the winning candidate
    assert seen[0].decided_by == "measured"
    if result["winner"] == LIBRARY_WINNER:
        assert seen[0].backend == "torch"
    else:
        assert seen[0].evidence == "TuneFile" and seen[0].candidate_tag == result["winner"]
    assert seen[0].timings[0].time_us == pytest.approx(result["ms"][result["winner"]] * 1e3, abs=0.1)   # ms to 4 places
    assert summary["entries"] >= 1 and (tmp_path / "t.tsv").exists()
