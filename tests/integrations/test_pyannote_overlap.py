"""The optimized SpeakerDiarization pipeline with segmentation and embedding overlapped
(rlx_triton.integrations._pyannote_overlap): the embeddings prefetched while the segmentation runs are exactly
the ones get_embeddings computes without the overlap, and are used only for the inputs they were computed
from. Off CUDA the overlap is forced (`overlap=True`) and runs in sequence on the calling thread, which checks
its logic; the side stream itself is checked on CUDA (gpu mark). Pipelines are built offline with random
weights, powerset (tests/reference/diarization_pipeline.py) and multi-label segmentation, on the torch route."""
from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import rlx_triton as rt

from tests.reference.diarization_pipeline import pyannote_audio_missing

_MISSING = pyannote_audio_missing()
pytestmark = [pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
              pytest.mark.usefixtures("torch_route_off_cuda")]

CHUNK_SECONDS = 2.0
RTOL, ATOL = 1e-4, 1e-5




def _powerset_pipeline(**kwargs):
    from tests.reference.diarization_pipeline import speaker_diarization

    return speaker_diarization(CHUNK_SECONDS, small=True, step=0.5, **kwargs)


def _multilabel_pipeline():
    """SpeakerDiarization whose PyanNet is multi-label (sigmoid scores), so apply binarizes with the
    segmentation threshold."""
    from pyannote.audio.core.task import Problem, Resolution, Specifications  # type: ignore
    from pyannote.audio.models.segmentation import PyanNet  # type: ignore
    from pyannote.audio.pipelines import SpeakerDiarization  # type: ignore

    from tests.reference.diarization_pipeline import SAMPLE_RATE, embedding_model, random_plda

    torch.manual_seed(0)
    model = PyanNet(sincnet={"stride": 10},
                    lstm={"hidden_size": 16, "num_layers": 1, "bidirectional": True, "monolithic": True,
                          "dropout": 0.0},
                    linear={"hidden_size": 128, "num_layers": 2}, sample_rate=SAMPLE_RATE, num_channels=1)
    model.specifications = Specifications(problem=Problem.MULTI_LABEL_CLASSIFICATION, resolution=Resolution.FRAME,
                                          duration=CHUNK_SECONDS, classes=["speaker#1", "speaker#2", "speaker#3"],
                                          permutation_invariant=True)
    model.build()
    with torch.no_grad():
        model.classifier.weight.mul_(8.0)     # scores far from the threshold, changing with the input
        model.classifier.bias.zero_()
    model.eval()
    with tempfile.TemporaryDirectory() as folder:
        plda = random_plda(Path(folder))
    pipeline = SpeakerDiarization(segmentation=model, embedding=embedding_model(0, m_channels=4, blocks=(1, 1, 1, 1)),
                                  plda=plda, clustering="AgglomerativeClustering", segmentation_step=0.5)
    pipeline.instantiate({"segmentation": {"threshold": 0.5, "min_duration_off": 0.0},
                          "clustering": {"method": "centroid", "min_cluster_size": 2, "threshold": 0.3}})
    return pipeline


@pytest.fixture(scope="module")
def stock_pipeline():
    pipeline = _powerset_pipeline()
    assert pipeline._embedding.min_num_samples > 1   # pyannote's cached search runs once, here
    return pipeline


@pytest.fixture(scope="module")
def recording():
    from tests.reference.diarization_pipeline import synthetic_recording

    return synthetic_recording(8.0, seed=1)


def _optimized(pipeline, overlap=None, **kwargs):
    from rlx_triton.integrations import pyannote

    optimized = copy.deepcopy(pipeline)
    assert pyannote.optimize(optimized, **kwargs) is optimized
    optimized.get_embeddings.overlap = overlap
    return optimized


def _embeddings_of(pipeline, file, **kwargs):
    """(output, the embeddings apply passed on to clustering, get_embeddings' overlap report)."""
    seen = {}

    def hook(step, artefact, file=None, total=None, completed=None):
        if step == "embeddings" and completed is None:
            seen["embeddings"] = artefact

    output = pipeline(file, hook=hook, **kwargs)
    report = getattr(pipeline.get_embeddings, "overlap_report", None)
    return output, seen["embeddings"], report


def _tracks(annotation):
    return list(annotation.itertracks(yield_label=True))


def _assert_same_output(got, want):
    assert _tracks(got.speaker_diarization) == _tracks(want.speaker_diarization)
    assert _tracks(got.exclusive_speaker_diarization) == _tracks(want.exclusive_speaker_diarization)


def _assert_close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.nanmax(np.abs(want)))


@pytest.mark.parametrize("inference_mode", [False, True], ids=["grad-mode", "inference-mode"])
def test_the_overlapped_pipeline_gives_the_sequential_embeddings_and_the_stock_output(stock_pipeline, recording,
                                                                                      inference_mode):
    sequential, overlapped = _optimized(stock_pipeline, overlap=False), _optimized(stock_pipeline, overlap=True)
    with torch.inference_mode(inference_mode):
        want, want_embeddings, _ = _embeddings_of(stock_pipeline, recording)
        plain, plain_embeddings, plain_report = _embeddings_of(sequential, recording)
        got, got_embeddings, report = _embeddings_of(overlapped, recording)
    assert report.startswith("prefetched while segmenting") and plain_report.startswith("computed in get_embeddings")
    np.testing.assert_array_equal(got_embeddings, plain_embeddings)
    _assert_close(got_embeddings, want_embeddings)
    assert len(want.speaker_diarization.labels()) > 1
    _assert_same_output(got, want)
    _assert_same_output(plain, want)


def test_a_multilabel_segmentation_is_binarized_as_apply_binarizes_it(recording):
    stock = _multilabel_pipeline()
    assert not stock._segmentation.model.specifications.powerset
    sequential, overlapped = _optimized(stock, overlap=False), _optimized(stock, overlap=True)
    want, want_embeddings, _ = _embeddings_of(stock, recording)
    _, plain_embeddings, _ = _embeddings_of(sequential, recording)
    got, got_embeddings, report = _embeddings_of(overlapped, recording)
    assert report.startswith("prefetched while segmenting")
    np.testing.assert_array_equal(got_embeddings, plain_embeddings)
    _assert_close(got_embeddings, want_embeddings)
    _assert_same_output(got, want)


@pytest.mark.parametrize("segmentation_batch_size,chunks_per_forward", [(1, 3), (4, 1), (4, 3), (32, 2)])
def test_segmentation_and_embedding_batches_of_any_sizes_give_the_same_embeddings(
        stock_pipeline, recording, monkeypatch, segmentation_batch_size, chunks_per_forward):
    from rlx_triton.integrations import _pyannote_pipeline

    monkeypatch.setattr(_pyannote_pipeline, "CPU_CHUNKS_PER_FORWARD", chunks_per_forward)
    sequential, overlapped = _optimized(stock_pipeline, overlap=False), _optimized(stock_pipeline, overlap=True)
    batch_sizes = []
    handle = overlapped._embedding.model_.register_forward_hook(
        lambda module, args, output: batch_sizes.append(args[0].shape[0]))
    try:
        for pipeline in (sequential, overlapped):
            pipeline.segmentation_batch_size = segmentation_batch_size
        _, plain_embeddings, _ = _embeddings_of(sequential, recording)
        _, got_embeddings, report = _embeddings_of(overlapped, recording)
    finally:
        handle.remove()
    assert report.startswith("prefetched while segmenting")
    np.testing.assert_array_equal(got_embeddings, plain_embeddings)
    chunks = plain_embeddings.shape[0]
    assert batch_sizes == [chunks_per_forward] * (chunks // chunks_per_forward) + \
        [chunks % chunks_per_forward] * (chunks % chunks_per_forward > 0)


def _segment_then_binarize(pipeline, file):
    """What apply passes to get_embeddings, from the (optimized) pipeline's own get_segmentations."""
    segmentations = pipeline.get_segmentations(file)
    assert pipeline._segmentation.model.specifications.powerset
    return segmentations


def test_changed_binarized_segmentations_are_embedded_not_taken_from_the_prefetch(stock_pipeline, recording):
    overlapped = _optimized(stock_pipeline, overlap=True)
    segmentations = _segment_then_binarize(overlapped, recording)
    changed = copy.deepcopy(segmentations)
    changed.data[2, :, :] = 0.0
    changed.data[2, 5:30, 1] = 1.0
    got = overlapped.get_embeddings(recording, changed)
    assert "other binarized segmentations" in overlapped.get_embeddings.overlap_report
    _assert_close(got, stock_pipeline.get_embeddings(recording, changed))


def test_another_exclude_overlap_is_embedded_not_taken_from_the_prefetch(stock_pipeline, recording):
    overlapped = _optimized(stock_pipeline, overlap=True)
    segmentations = _segment_then_binarize(overlapped, recording)
    got = overlapped.get_embeddings(recording, segmentations, exclude_overlap=True)
    assert "another exclude_overlap" in overlapped.get_embeddings.overlap_report
    _assert_close(got, stock_pipeline.get_embeddings(recording, segmentations, exclude_overlap=True))


def test_the_prefetch_is_used_once(stock_pipeline, recording):
    overlapped = _optimized(stock_pipeline, overlap=True)
    segmentations = _segment_then_binarize(overlapped, recording)
    first = overlapped.get_embeddings(recording, segmentations)
    assert overlapped.get_embeddings.overlap_report.startswith("prefetched while segmenting")
    second = overlapped.get_embeddings(recording, segmentations)
    assert overlapped.get_embeddings.overlap_report == "computed in get_embeddings (no prefetch)"
    np.testing.assert_array_equal(first, second)


def test_no_prefetch_carries_over_from_one_file_to_the_next(stock_pipeline, recording):
    from tests.reference.diarization_pipeline import synthetic_recording

    other = synthetic_recording(6.0, seed=7, uri="other")
    overlapped = _optimized(stock_pipeline, overlap=True)
    _embeddings_of(overlapped, recording)
    want, want_embeddings, _ = _embeddings_of(stock_pipeline, other)
    got, got_embeddings, report = _embeddings_of(overlapped, other)
    assert report.startswith("prefetched while segmenting")
    _assert_close(got_embeddings, want_embeddings)
    _assert_same_output(got, want)
    # the segmentation of one file, then get_embeddings of another: computed for the other
    segmentations = _segment_then_binarize(overlapped, recording)
    other_segmentations = stock_pipeline.get_segmentations(other)
    got = overlapped.get_embeddings(other, other_segmentations)
    assert "another file" in overlapped.get_embeddings.overlap_report
    _assert_close(got, stock_pipeline.get_embeddings(other, other_segmentations))
    assert segmentations.data.shape != other_segmentations.data.shape


def test_a_waveform_changed_in_place_after_segmentation_is_embedded_again(stock_pipeline, recording):
    overlapped = _optimized(stock_pipeline, overlap=True)
    file = {key: (value.clone() if isinstance(value, torch.Tensor) else value) for key, value in recording.items()}
    segmentations = _segment_then_binarize(overlapped, file)
    file["waveform"].mul_(0.5)
    got = overlapped.get_embeddings(file, segmentations)
    assert "waveform changed" in overlapped.get_embeddings.overlap_report
    _assert_close(got, stock_pipeline.get_embeddings(file, segmentations))


def test_the_hook_calls_are_the_stock_ones(stock_pipeline, recording):
    calls = {}
    for name, pipeline in (("stock", stock_pipeline), ("overlapped", _optimized(stock_pipeline, overlap=True))):
        calls[name] = []
        pipeline(recording, hook=lambda step, artefact, file=None, total=None, completed=None, name=name:
                 calls[name].append((step, total, completed)))
    assert calls["overlapped"] == calls["stock"]
    assert ("embeddings", None, None) in calls["stock"]


def test_by_default_the_overlap_waits_for_cuda(stock_pipeline, recording):
    optimized = _optimized(stock_pipeline)
    assert optimized.get_embeddings.overlap is None
    _, _, report = _embeddings_of(optimized, recording)
    assert report == "computed in get_embeddings (not overlapped (the embedding model is on cpu, not CUDA))"


def test_the_pipeline_in_training_mode_does_not_overlap(stock_pipeline, recording):
    overlapped = _optimized(stock_pipeline, overlap=True)
    overlapped.training = True
    file = dict(recording)
    overlapped.get_segmentations(file)
    assert overlapped.get_embeddings.prefetch is None


def test_optimize_installs_the_overlap_once_and_the_setting_is_checked(stock_pipeline):
    from rlx_triton.integrations import pyannote
    from rlx_triton.integrations._pyannote_overlap import OverlappedSegmentation

    optimized = _optimized(stock_pipeline, overlap=False)
    segmentation = optimized.get_segmentations
    assert isinstance(segmentation, OverlappedSegmentation) and segmentation.pipeline is optimized
    pyannote.optimize(optimized)
    assert optimized.get_segmentations is segmentation and optimized.get_embeddings.overlap is False
    copied = copy.deepcopy(optimized)
    assert copied.get_segmentations.pipeline is copied and copied.get_embeddings.overlap is False
    with pytest.raises(TypeError, match="overlap must be None, True or False"):
        optimized.get_embeddings.overlap = "yes"


def test_off_cuda_the_queue_runs_in_the_calling_thread():
    from rlx_triton.integrations._pyannote_overlap import Queue

    queue = Queue(torch.device("cpu"), side=True)
    x = torch.arange(6.0)
    with queue.entered():
        host, done = queue.to_host(queue.to_device(x) * 2)
    assert done is None and torch.equal(host, 2 * x)


@pytest.mark.gpu
def test_on_cuda_the_overlap_engages_by_default_and_gives_the_sequential_embeddings(recording):
    stock = _powerset_pipeline()
    stock.to(torch.device("cuda"))
    for cuda_graphs in (False, True):
        sequential = _optimized(stock, overlap=False, cuda_graphs=cuda_graphs)
        overlapped = _optimized(stock, cuda_graphs=cuda_graphs)
        with torch.inference_mode():
            want, want_embeddings, _ = _embeddings_of(stock, recording)
            for _ in range(2 if cuda_graphs else 1):   # with graphs: captured, then replayed
                plain, plain_embeddings, _ = _embeddings_of(sequential, recording)
                got, got_embeddings, report = _embeddings_of(overlapped, recording)
                assert report.startswith("prefetched while segmenting"), report
                np.testing.assert_array_equal(got_embeddings, plain_embeddings)
                _assert_close(got_embeddings, want_embeddings)
                _assert_same_output(got, want)
