"""rt.integrations.pyannote.diarize_files and `rlx-triton diarize` on three short WAV files.

The pipeline: pyannote.audio 4.0.7's SpeakerDiarization built offline, with a segmentation model whose output
follows the audio (tests/reference/following_segmentation.py: local speakers by pitch, so each file has many
turns and several speakers), a narrow random WeSpeaker ResNet and agglomerative (centroid) clustering. The
RTTM files written must equal stock pyannote's output for the same audio (segments within 20 ms, labels up
to a one-to-one renaming), for every runner byte for byte. The rlx modules run their torch route (as in
test_pyannote_pipeline.py)."""
from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.reference.diarization_pipeline import pyannote_audio_missing

_MISSING = pyannote_audio_missing()
pytestmark = [pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
              pytest.mark.usefixtures("torch_route_off_cuda")]

CHUNK_SECONDS = 2.0
SECONDS = (6.0, 5.0, 7.0)
TOLERANCE = 0.020            # seconds, segment boundaries against stock pyannote
SUMMARY_KEYS = {"file", "uri", "status", "error", "seconds", "audio_seconds", "rtf"}


def _stock_pipeline():
    from tests.reference.diarization_pipeline import speaker_diarization
    from tests.reference.following_segmentation import PitchSegmentation

    # 1 s step; batches of 16 keep the stock reference quick (batch sizes change no value)
    return speaker_diarization(CHUNK_SECONDS, small=True, step=0.5, segmentation=PitchSegmentation(CHUNK_SECONDS),
                               segmentation_batch_size=16, embedding_batch_size=16)


@pytest.fixture(scope="module")
def stock():
    pipeline = _stock_pipeline()
    assert pipeline._embedding.min_num_samples > 1   # pyannote's cached search, once for every copy
    return pipeline


@pytest.fixture(scope="module")
def optimized(stock):
    from rlx_triton.integrations import pyannote

    return pyannote.optimize(copy.deepcopy(stock))


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    import soundfile

    from tests.reference.diarization_pipeline import synthetic_recording

    folder = tmp_path_factory.mktemp("audio")
    paths = []
    for seed, seconds in enumerate(SECONDS):
        recording = synthetic_recording(seconds, seed=seed)
        path = folder / f"talk{seed}.wav"
        soundfile.write(path, recording["waveform"][0].numpy(), 16000, subtype="PCM_16")
        paths.append(str(path))
    return paths


def _outputs(folder: Path) -> dict:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.suffix == ".rttm"}


@pytest.fixture(scope="module")
def baseline(optimized, audio, tmp_path_factory):
    import rlx_triton as rt
    from rlx_triton.integrations.pyannote import diarize_files

    out = tmp_path_factory.mktemp("baseline")
    with rt.use_backend("auto" if torch.cuda.is_available() else "torch"):   # as torch_route_off_cuda
        summary = diarize_files(optimized, audio, out)
    return out, summary, _outputs(out)


def _turns(rttm: str):
    turns = []
    for line in rttm.splitlines():
        fields = line.split()
        start, duration = float(fields[3]), float(fields[4])
        turns.append((start, start + duration, fields[7]))
    return turns


def _assert_same_turns(got, want):
    assert len(got) == len(want)
    renaming = {}
    for (start, end, label), (want_start, want_end, want_label) in zip(got, want):
        assert abs(start - want_start) <= TOLERANCE and abs(end - want_end) <= TOLERANCE
        assert renaming.setdefault(label, want_label) == want_label     # one label maps to one label ...
    assert len(set(renaming.values())) == len(renaming)                 # ... and no two to the same


def test_rttm_files_equal_stock_pyannote(stock, audio, baseline):
    import soundfile

    out, summary, outputs = baseline
    assert summary["done"] == 3 and summary["failed"] == 0
    for path in audio:
        uri = Path(path).stem
        data, rate = soundfile.read(path, dtype="float32")
        want = stock({"waveform": torch.from_numpy(data)[None], "sample_rate": rate, "uri": uri})
        got = _turns(outputs[f"{uri}.rttm"].decode())
        _assert_same_turns(got, _turns(want.speaker_diarization.to_rttm()))
        _assert_same_turns(_turns(outputs[f"{uri}.exclusive.rttm"].decode()),
                           _turns(want.exclusive_speaker_diarization.to_rttm()))
        assert len(got) >= 8 and len({label for _, _, label in got}) >= 2      # the model follows the audio
        assert all(line.split()[1] == uri for line in outputs[f"{uri}.rttm"].decode().splitlines())


@pytest.mark.parametrize("seconds", [1.5, 6.3], ids=["shorter-than-a-chunk", "padded-last-chunk"])
def test_streamed_segmentations_equal_the_pipelines(stock, seconds):
    from rlx_triton.integrations._pyannote_streaming import segmentations_of
    from tests.reference.diarization_pipeline import synthetic_recording

    file = synthetic_recording(seconds, seed=5)
    want = stock.get_segmentations(dict(file))
    for batch_size in (1, 3):
        stock._segmentation.batch_size, saved = batch_size, stock._segmentation.batch_size
        try:
            got = segmentations_of(stock, dict(file))
        finally:
            stock._segmentation.batch_size = saved
        assert got.data.dtype == want.data.dtype
        np.testing.assert_array_equal(got.data, want.data)
        assert (got.sliding_window.start, got.sliding_window.duration, got.sliding_window.step) == \
            (want.sliding_window.start, want.sliding_window.duration, want.sliding_window.step)


def test_the_summary_is_the_return_value_with_every_key(audio, baseline):
    out, summary, _ = baseline
    assert json.loads((out / "summary.json").read_text()) == summary
    assert set(summary) == {"files", "done", "skipped", "failed"}
    assert [record["file"] for record in summary["files"]] == audio
    for record, seconds in zip(summary["files"], SECONDS):
        assert set(record) == SUMMARY_KEYS and record["status"] == "done" and record["error"] is None
        assert set(record["seconds"]) == {"segmentation", "embeddings", "clustering", "total"}
        assert record["audio_seconds"] == pytest.approx(seconds)
        assert record["rtf"] == pytest.approx(record["seconds"]["total"] / record["audio_seconds"], rel=1e-3)
    assert not [path for path in out.iterdir() if path.name.startswith(".")]     # no temporary file left


def test_resume_skips_complete_files_and_redoes_the_others(optimized, audio, baseline, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    out = tmp_path / "out"
    shutil.copytree(baseline[0], out)
    (out / "talk1.rttm").unlink()                           # an interrupted file: only its exclusive RTTM
    (out / ".talk1.rttm.999.tmp").write_text("partial")     # and what a killed write left
    kept = (out / "talk0.rttm").stat().st_mtime_ns
    summary = diarize_files(optimized, audio, out, resume=True)
    assert [r["status"] for r in summary["files"]] == ["skipped", "done", "skipped"]
    assert (summary["done"], summary["skipped"], summary["failed"]) == (1, 2, 0)
    assert summary["files"][0]["audio_seconds"] == pytest.approx(SECONDS[0])
    assert summary["files"][0]["seconds"]["total"] is None
    assert (out / "talk0.rttm").stat().st_mtime_ns == kept
    assert _outputs(out) == baseline[2]
    assert not list(out.glob(".*"))


def test_unreadable_files_fail_with_their_name_while_the_others_finish(optimized, audio, baseline, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    missing = str(tmp_path / "missing.wav")
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all\n")
    summary = diarize_files(optimized, [missing, audio[0], str(text), *audio[1:]], tmp_path / "out")
    statuses = [record["status"] for record in summary["files"]]
    assert statuses == ["failed", "done", "failed", "done", "done"]
    assert missing in summary["files"][0]["error"] and str(text) in summary["files"][2]["error"]
    assert summary["failed"] == 2 and summary["done"] == 3
    assert _outputs(tmp_path / "out") == baseline[2]


def test_two_worker_processes_write_the_same_bytes(optimized, audio, baseline, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    summary = diarize_files(optimized, audio, tmp_path, workers=2)
    assert summary["done"] == 3
    assert _outputs(tmp_path) == baseline[2]
    assert not list(tmp_path.glob(".*"))


def test_a_killed_worker_fails_its_file_and_resume_redoes_it(optimized, audio, baseline, tmp_path, monkeypatch):
    from rlx_triton.integrations import _pyannote_files
    from rlx_triton.integrations.pyannote import diarize_files

    original = _pyannote_files.diarize_one

    def dies_on_talk1(pipeline, job, options):
        if job.uri == "talk1" and os.getpid() != parent:
            os._exit(9)                     # as an out-of-memory kill would end the worker
        return original(pipeline, job, options)

    parent = os.getpid()
    monkeypatch.setattr(_pyannote_files, "diarize_one", dies_on_talk1)   # the forked workers inherit it
    summary = diarize_files(optimized, audio, tmp_path, workers=2)
    assert [record["status"] for record in summary["files"]] == ["done", "failed", "done"]
    assert "talk1.wav" in summary["files"][1]["error"] and "died" in summary["files"][1]["error"]
    monkeypatch.setattr(_pyannote_files, "diarize_one", original)
    again = diarize_files(optimized, audio, tmp_path, resume=True)
    assert [record["status"] for record in again["files"]] == ["skipped", "done", "skipped"]
    assert _outputs(tmp_path) == baseline[2]


@pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="ray is not installed "
                    "(pip install 'rlx-triton[ray]')")
def test_the_ray_runner_writes_the_same_bytes_on_a_local_cluster(optimized, audio, baseline, tmp_path):
    import ray

    from rlx_triton.integrations.pyannote import diarize_files

    # Ray's workers are new processes: the torch route off CUDA reaches them through the environment
    env = {"PYTHONPATH": os.pathsep.join(sys.path), "RLX_TRITON_BACKEND": "torch", "PYANNOTE_METRICS_ENABLED": "false"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        summary = diarize_files(optimized, audio, tmp_path, runner="ray")
    finally:
        ray.shutdown()
    assert summary["done"] == 3
    assert _outputs(tmp_path) == baseline[2]


def test_the_ray_runner_without_ray_raises_import_error_naming_it(optimized, audio, tmp_path, monkeypatch):
    from rlx_triton.integrations.pyannote import diarize_files

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match="ray"):
        diarize_files(optimized, audio, tmp_path, runner="ray")
    assert not list(tmp_path.iterdir())


def test_num_speakers_reaches_every_pipeline_call(optimized, audio, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    for speakers in (1, 3):
        out = tmp_path / str(speakers)
        assert diarize_files(optimized, audio[:2], out, num_speakers=speakers)["done"] == 2
        for path in audio[:2]:
            assert len({label for *_, label in _turns((out / f"{Path(path).stem}.rttm").read_text())}) == speakers


def test_a_failed_write_leaves_neither_a_temporary_nor_a_partial_file(optimized, audio, tmp_path, monkeypatch):
    from pyannote.core import Annotation

    from rlx_triton.integrations.pyannote import diarize_files

    def broken(self, handle):
        handle.write("SPEAKER half a line")
        raise OSError("disk full")

    monkeypatch.setattr(Annotation, "write_rttm", broken)
    summary = diarize_files(optimized, audio[:1], tmp_path)
    assert summary["failed"] == 1 and "disk full" in summary["files"][0]["error"]
    assert audio[0] in summary["files"][0]["error"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["summary.json"]


def test_diarize_files_under_inference_mode_writes_the_same_bytes(optimized, audio, baseline, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    with torch.inference_mode():
        diarize_files(optimized, audio[:1], tmp_path)
    assert _outputs(tmp_path) == {name: data for name, data in baseline[2].items() if name.startswith("talk0.")}


def test_progress_shows_hours_of_audio_and_the_running_rtf(optimized, audio, tmp_path, capsys):
    from rlx_triton.integrations.pyannote import diarize_files

    diarize_files(optimized, audio[:1], tmp_path, progress=True, batch_size=4)
    err = capsys.readouterr().err
    assert "diarize: 1/1 file" in err and "h audio, RTF 0." in err


def test_bad_arguments_name_the_argument(optimized, audio, tmp_path):
    from rlx_triton.integrations.pyannote import diarize_files

    cases = [(dict(pipeline=object()), TypeError, "pipeline"), (dict(files=[1]), TypeError, "files"),
             (dict(out_dir=3), TypeError, "out_dir"), (dict(workers=0), ValueError, "workers"),
             (dict(runner="dask"), ValueError, "runner"), (dict(batch_size=0), ValueError, "batch_size"),
             (dict(resume="yes"), TypeError, "resume"), (dict(speakers=2), TypeError, "speakers"),
             (dict(num_speakers=0), ValueError, "num_speakers"),
             (dict(min_speakers=3, max_speakers=2), ValueError, "min_speakers"),
             (dict(files=[audio[0], audio[0]]), ValueError, "talk0")]
    for change, error, name in cases:
        arguments = dict(pipeline=optimized, files=audio, out_dir=tmp_path / "out")
        arguments.update(change)
        with pytest.raises(error, match=name):
            diarize_files(arguments.pop("pipeline"), arguments.pop("files"), arguments.pop("out_dir"), **arguments)
    assert not (tmp_path / "out").exists()


def test_cli_help_documents_every_option(capsys):
    import argparse

    from rlx_triton import cli_diarize
    from rlx_triton.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["diarize", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    parser = argparse.ArgumentParser()
    cli_diarize.add_arguments(parser)
    for action in parser._actions:                  # whatever option the command has, with its own help text
        assert action.help and " ".join(action.help.split()[:4]) in text, action.dest
        assert all(option in text for option in action.option_strings), action.option_strings
    for option in ("AUDIO_OR_DIR", "--pipeline NAME_OR_PATH", "--out DIR", "--resume", "--workers N",
                   "--ray [ADDRESS]", "--num-speakers N", "--min-speakers N", "--max-speakers N",
                   "--device cpu|cuda", "--json PATH", "--quiet", "Exit code: 0", "HF_TOKEN"):
        assert option in text, option


def test_cli_diarizes_a_folder_and_exits_1_when_a_file_failed(optimized, audio, baseline, tmp_path, monkeypatch,
                                                              capsys):
    from rlx_triton import cli_diarize
    from rlx_triton.cli import main

    monkeypatch.setattr(cli_diarize, "load_pipeline", lambda name: optimized)
    folder = tmp_path / "in"
    shutil.copytree(Path(audio[0]).parent, folder)
    assert main(["diarize", str(folder), "--pipeline", "built-in-code", "--out", str(tmp_path / "out"),
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "3 done, 0 skipped, 0 failed" in out and "real-time factor" in out and len(out.splitlines()) <= 12
    assert _outputs(tmp_path / "out") == baseline[2]
    code = main(["diarize", str(folder), str(tmp_path / "gone.wav"), "--pipeline", "x", "--out",
                 str(tmp_path / "out"), "--resume", "--quiet", "--json", "-"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and (report["skipped"], report["failed"]) == (3, 1)
    (tmp_path / "empty").mkdir()
    assert main(["diarize", str(tmp_path / "empty"), "--pipeline", "x", "--out", str(tmp_path / "o2")]) == 2
    assert "no audio files" in capsys.readouterr().err
