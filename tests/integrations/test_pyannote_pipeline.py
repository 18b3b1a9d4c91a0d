"""rt.integrations.pyannote.optimize on pyannote.audio's SpeakerDiarization pipeline: get_embeddings runs the
fbank and trunk once per chunk and pools every local speaker from it, with the stock method's embeddings (same
NaN rows, same order), masks (NaN frames, embedding_exclude_overlap both ways, the min_num_frames fallback),
batch sizes and hook calls; the whole pipeline's output is the stock one, under torch.inference_mode() too.
The pipelines are built offline with random weights (tests/reference/diarization_pipeline.py); the rlx modules
run their torch route (the interpreted kernels are checked per module in tests/integrations/test_pyannote.py
and test_wespeaker.py; a whole pipeline through the interpreter would take minutes)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import rlx_triton as rt

from tests.reference.diarization_pipeline import pyannote_audio_missing

_MISSING = pyannote_audio_missing()
pytestmark = [pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
              pytest.mark.usefixtures("torch_route_off_cuda")]

CHUNK_SECONDS = 2.0   # short chunks keep the interpreter-free CPU forwards fast
FRAMES = 24           # frames per chunk of the hand-made segmentations
RTOL, ATOL = 1e-4, 1e-5


def _pipeline(**kwargs):
    from tests.reference.diarization_pipeline import speaker_diarization

    return speaker_diarization(CHUNK_SECONDS, small=True, step=0.5, **kwargs)


@pytest.fixture(scope="module")
def stock_pipeline():
    pipeline = _pipeline()
    # pyannote's binary search for the shortest input the model takes (its cached property) runs once
    # here; the optimized copies inherit the value
    assert pipeline._embedding.min_num_samples > 1
    return pipeline


@pytest.fixture(scope="module")
def recording():
    from tests.reference.diarization_pipeline import synthetic_recording

    return synthetic_recording(8.0, seed=1)


def _optimized(pipeline, **kwargs):
    from rlx_triton.integrations import pyannote

    optimized = copy.deepcopy(pipeline)
    assert pyannote.optimize(optimized, **kwargs) is optimized
    return optimized


def _segmentations(chunks: int = 7, step: float = 0.5, seed: int = 0):
    """(chunks, FRAMES, 3) binary segmentations: speaker 0 talks throughout, 1 and 2 overlap with it in
    places, speaker 2 is silent in some chunks (NaN rows), chunk 3 has NaN frames (partial stitching) and
    chunk 5 has only a few clean frames for speaker 1 (the min_num_frames fallback with exclude_overlap)."""
    from pyannote.core import SlidingWindow, SlidingWindowFeature  # type: ignore

    rng = np.random.default_rng(seed)
    data = np.zeros((chunks, FRAMES, 3), dtype=np.float64)
    data[:, :, 0] = 1.0
    data[:, 4:15, 1] = 1.0
    data[:, 10:20, 0] = 0.0
    data[::2, 12:, 2] = 1.0                         # speaker 2 only in even chunks; silent in odd ones
    data[1, rng.integers(0, FRAMES, 5), 1] = 0.0
    data[3, 18:, :] = np.nan                        # frames no window covered
    data[5, :, 1] = 0.0
    data[5, 2:6, 1] = 1.0                           # 4 frames, all overlapping speaker 0 ...
    data[5, 6, 1] = 1.0
    data[5, 6, 0] = 0.0                             # ... but one: too few clean frames
    window = SlidingWindow(start=0.0, duration=CHUNK_SECONDS, step=step)
    return SlidingWindowFeature(data, window)


def _file(seconds: float = 6.0, seed: int = 0, nan_at: float = None):
    """Noise; with nan_at, 10 ms of NaN samples from that time on (the chunks over them embed to NaN)."""
    gen = torch.Generator().manual_seed(seed)
    waveform = 0.1 * torch.randn(1, int(seconds * 16000), generator=gen)
    if nan_at is not None:
        waveform[:, int(nan_at * 16000):int(nan_at * 16000) + 160] = float("nan")
    return {"waveform": waveform, "sample_rate": 16000, "uri": "noise"}


def _assert_same_embeddings(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL * np.nanmax(np.abs(want)))


@pytest.mark.parametrize("exclude_overlap", [False, True], ids=["whole-masks", "exclude-overlap"])
def test_get_embeddings_equal_stock_on_hand_made_segmentations(stock_pipeline, exclude_overlap):
    optimized = _optimized(stock_pipeline)
    segmentations, file = _segmentations(), _file(nan_at=4.2)
    want = stock_pipeline.get_embeddings(file, segmentations, exclude_overlap=exclude_overlap)
    got = optimized.get_embeddings(file, segmentations, exclude_overlap=exclude_overlap)
    _assert_same_embeddings(got, want)
    assert np.isnan(got[5:]).all() and not np.isnan(got[:5]).any()    # chunks 5 and 6 cover the NaN samples
    np.testing.assert_allclose(got[3, 2], got[1, 2], rtol=1e-6)       # a silent speaker: zero statistics


@pytest.mark.parametrize("chunks_per_forward", [1, 3])
def test_the_optimized_pipeline_runs_the_embedding_model_once_per_chunk_batch(stock_pipeline, monkeypatch,
                                                                              chunks_per_forward):
    from rlx_triton.integrations import _pyannote_pipeline

    monkeypatch.setattr(_pyannote_pipeline, "CPU_CHUNKS_PER_FORWARD", chunks_per_forward)
    optimized = _optimized(stock_pipeline)
    batch_sizes = []
    handle = optimized._embedding.model_.register_forward_hook(
        lambda module, args, output: batch_sizes.append(args[0].shape[0]))
    try:
        optimized.get_embeddings(_file(), _segmentations(chunks=7))
    finally:
        handle.remove()
    assert batch_sizes == [chunks_per_forward] * (7 // chunks_per_forward) + [7 % chunks_per_forward] * (7 % chunks_per_forward > 0)


def test_exclude_overlap_falls_back_to_the_whole_mask_below_min_num_frames(stock_pipeline):
    from rlx_triton.integrations._pyannote_pipeline import optimize_pipeline

    shared = copy.deepcopy(stock_pipeline)
    assert optimize_pipeline(shared)   # the shared trunk alone, on the stock models
    segmentations, file = _segmentations(), _file()
    clean = shared.get_embeddings(file, segmentations, exclude_overlap=True)
    whole = shared.get_embeddings(file, segmentations, exclude_overlap=False)
    np.testing.assert_allclose(clean[5, 1], whole[5, 1], rtol=1e-6)      # too few clean frames: whole mask
    assert not np.allclose(clean[0, 1], whole[0, 1], rtol=1e-3)          # enough: overlap excluded
    _assert_same_embeddings(clean, stock_pipeline.get_embeddings(file, segmentations, exclude_overlap=True))


@pytest.mark.parametrize("embedding_batch_size", [1, 4, 32])
def test_hook_calls_follow_pyannotes_embedding_batch_size(stock_pipeline, embedding_batch_size):
    optimized = _optimized(stock_pipeline)
    segmentations, file = _segmentations(), _file()
    calls = {"stock": [], "optimized": []}

    def recorder(name):
        def hook(step, artefact, total=None, completed=None):
            calls[name].append((step, None if artefact is None else artefact.copy(), total, completed))
        return hook

    for pipeline, name in ((stock_pipeline, "stock"), (optimized, "optimized")):
        saved = pipeline.embedding_batch_size
        pipeline.embedding_batch_size = embedding_batch_size
        try:
            pipeline.get_embeddings(file, segmentations, hook=recorder(name))
        finally:
            pipeline.embedding_batch_size = saved
    assert [c[0::2] for c in calls["optimized"]] == [c[0::2] for c in calls["stock"]]
    assert len(calls["stock"]) == 1 + -(-7 * 3 // embedding_batch_size)
    for (_, got, _, _), (_, want, _, _) in zip(calls["optimized"][1:], calls["stock"][1:]):
        _assert_same_embeddings(got, want)


def test_chunks_per_forward_changes_no_value(stock_pipeline, monkeypatch):
    from rlx_triton.integrations import _pyannote_pipeline

    optimized = _optimized(stock_pipeline)
    segmentations, file = _segmentations(), _file()
    monkeypatch.setattr(_pyannote_pipeline, "CPU_CHUNKS_PER_FORWARD", 1)
    one = optimized.get_embeddings(file, segmentations)
    monkeypatch.setattr(_pyannote_pipeline, "CPU_CHUNKS_PER_FORWARD", 3)
    three = optimized.get_embeddings(file, segmentations)
    _assert_same_embeddings(three, one)


def test_optimize_leaves_parameters_batch_sizes_and_models_as_pyannote_defines_them(stock_pipeline):
    from rlx_triton.integrations._pyannote_pipeline import SharedTrunkEmbeddings

    optimized = _optimized(stock_pipeline)
    assert optimized.parameters(instantiated=True) == stock_pipeline.parameters(instantiated=True)
    assert (optimized.embedding_batch_size, optimized.segmentation_batch_size) == (1, 1)
    assert isinstance(optimized.get_embeddings, SharedTrunkEmbeddings)
    assert "rlx_front_end" in optimized._embedding.model_._modules          # the model swap happened too
    stock_keys = list(stock_pipeline._embedding.model_.state_dict())
    assert list(optimized._embedding.model_.state_dict()) == stock_keys
    again = optimized.get_embeddings
    from rlx_triton.integrations import pyannote

    pyannote.optimize(optimized)
    assert optimized.get_embeddings is again                               # idempotent


def test_an_embedding_model_in_training_mode_keeps_the_stock_method(stock_pipeline, monkeypatch):
    optimized = _optimized(stock_pipeline)
    optimized._embedding.model_.train()
    stock_calls = []
    stock = type(optimized).get_embeddings
    monkeypatch.setattr(type(optimized), "get_embeddings",
                        lambda self, *a, **k: stock_calls.append(1) or stock(self, *a, **k))
    optimized.get_embeddings(_file(), _segmentations())
    assert stock_calls == [1]


def test_the_optimized_segmentation_model_keeps_pyannotes_frame_geometry(stock_pipeline):
    stock_model = copy.deepcopy(stock_pipeline._segmentation.model)
    optimized = _optimized(stock_pipeline)._segmentation.model
    optimized.__dict__.pop("receptive_field", None)      # computed again from the swapped SincNet
    assert optimized.num_frames(32000) == stock_model.num_frames(32000)
    assert optimized.receptive_field.step == stock_model.receptive_field.step
    assert optimized.receptive_field.duration == stock_model.receptive_field.duration


@pytest.mark.parametrize("inference_mode", [False, True], ids=["grad-mode", "inference-mode"])
def test_whole_pipeline_output_equals_stock(stock_pipeline, recording, inference_mode):
    optimized = _optimized(stock_pipeline)
    with torch.inference_mode(inference_mode):
        want = stock_pipeline(recording)
        got = optimized(recording)
    assert len(want.speaker_diarization.labels()) > 1
    assert list(got.speaker_diarization.itertracks(yield_label=True)) == \
        list(want.speaker_diarization.itertracks(yield_label=True))
    assert list(got.exclusive_speaker_diarization.itertracks(yield_label=True)) == \
        list(want.exclusive_speaker_diarization.itertracks(yield_label=True))
    _assert_same_embeddings(got.speaker_embeddings, want.speaker_embeddings)


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_get_embeddings_on_cuda_equal_stock(cuda_graphs):
    stock = _pipeline()
    stock.to(torch.device("cuda"))
    optimized = _optimized(stock, cuda_graphs=cuda_graphs)
    segmentations, file = _segmentations(chunks=40, step=0.1), _file()
    want = stock.get_embeddings(file, segmentations, exclude_overlap=True)
    for _ in range(3):   # eager, captured, replayed
        got = optimized.get_embeddings(file, segmentations, exclude_overlap=True)
        _assert_same_embeddings(got, want)
    graphs = optimized.get_embeddings.graphs
    assert (graphs is not None and len(graphs.graphs) == 1) == cuda_graphs
