"""rlx_triton.integrations._pyannote_clustering (torch clustering without the distance matrix) and
_pyannote_streaming's chunk-by-chunk reconstruction, against pyannote.audio 4.0.7 and scipy on the same inputs:
the centroid linkage's dendrogram equals scipy's (ids and sizes exactly, distances to float64 rounding), the
hard clusters equal those of pyannote's AgglomerativeClustering and VBxClustering objects, and the discrete
diarization equals SpeakerDiarization.reconstruct. No model runs here."""
from __future__ import annotations

import tracemalloc
import types

import numpy as np
import pytest
import torch

from tests.reference.diarization_pipeline import pyannote_audio_missing

_MISSING = pyannote_audio_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")

DIMENSION = 16


def _points(n: int, centres: int = 5, spread: float = 0.35, seed: int = 0, dimension: int = DIMENSION):
    rng = np.random.default_rng(seed)
    middle = rng.normal(size=(centres, dimension))
    points = middle[rng.integers(0, centres, n)] + spread * rng.normal(size=(n, dimension))
    return (points / np.linalg.norm(points, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("n", [2, 3, 40, 700])
def test_centroid_linkage_equals_scipys(n):
    from scipy.cluster.hierarchy import fcluster, linkage

    from rlx_triton.integrations._pyannote_clustering import centroid_linkage

    points = _points(n, seed=n)
    want = linkage(points, method="centroid", metric="euclidean")
    got = centroid_linkage(points)
    assert got.shape == want.shape and got.dtype == np.float64
    np.testing.assert_array_equal(got[:, [0, 1, 3]], want[:, [0, 1, 3]])
    np.testing.assert_allclose(got[:, 2], want[:, 2], rtol=1e-12, atol=1e-14)
    for threshold in (0.2, 0.5, 0.8):
        np.testing.assert_array_equal(fcluster(got, threshold, "distance"), fcluster(want, threshold, "distance"))


def test_centroid_linkage_refuses_what_scipy_refuses():
    from rlx_triton.integrations._pyannote_clustering import centroid_linkage

    with pytest.raises(ValueError, match="points"):
        centroid_linkage(np.zeros((1, 4)))
    with pytest.raises(ValueError, match="finite"):
        centroid_linkage(np.array([[0.0, 1.0], [np.nan, 0.0]]))


def _chunks(num_chunks: int = 60, seed: int = 0):
    """(embeddings (chunks, 3, D) float32 with NaN rows, binarized segmentations (chunks, 50, 3)): speakers of
    three voices talk alone most of the time, some overlap, some are silent in their chunk."""
    rng = np.random.default_rng(seed)
    voices = rng.normal(size=(4, DIMENSION))
    who = rng.integers(0, 4, size=(num_chunks, 3))
    embeddings = (voices[who] + 0.45 * rng.normal(size=(num_chunks, 3, DIMENSION))).astype(np.float32)
    segmentations = np.zeros((num_chunks, 50, 3), dtype=np.float32)
    for c in range(num_chunks):
        cut = rng.integers(10, 40)
        segmentations[c, :cut, 0] = 1.0
        segmentations[c, cut:, 1] = 1.0
        segmentations[c, cut - 5:cut + 5, 2] = 1.0 if c % 3 else 0.0
    segmentations[::7, :, 1] = 0.0            # a silent speaker
    embeddings[::9, 2] = np.nan               # an embedding that could not be computed
    return embeddings, segmentations


def _agglomerative(threshold=0.9, min_cluster_size=3, constrained=False):
    from pyannote.audio.pipelines.clustering import AgglomerativeClustering  # type: ignore

    clustering = AgglomerativeClustering(metric="cosine", constrained_assignment=constrained)
    clustering.instantiate({"method": "centroid", "threshold": threshold, "min_cluster_size": min_cluster_size})
    return clustering


def _vbx(tmp_path, threshold=0.7):
    from pyannote.audio.pipelines.clustering import VBxClustering  # type: ignore

    from tests.reference.diarization_pipeline import random_plda

    clustering = VBxClustering(random_plda(tmp_path, dimension=DIMENSION, lda_dimension=8))
    clustering.instantiate({"threshold": threshold, "Fa": 0.07, "Fb": 0.8})
    return clustering


def _same(clustering, embeddings, segmentations, **speakers):
    from pyannote.core import SlidingWindow, SlidingWindowFeature  # type: ignore

    from rlx_triton.integrations._pyannote_clustering import cluster

    windows = SlidingWindowFeature(segmentations, SlidingWindow(start=0.0, duration=2.0, step=0.5))
    # the bounds as SpeakerDiarization.apply passes them (set_num_speakers: 1 and infinity by default)
    want_hard, _, want_centroids = clustering(embeddings=embeddings.copy(), segmentations=windows,
                                              num_clusters=speakers.get("num_clusters"),
                                              min_clusters=speakers.get("min_clusters", 1),
                                              max_clusters=speakers.get("max_clusters", np.inf))
    got_hard, _, got_centroids = cluster(clustering, embeddings.copy(), windows, **speakers)
    np.testing.assert_array_equal(got_hard, want_hard)
    np.testing.assert_allclose(got_centroids, want_centroids, rtol=1e-6, atol=1e-6)
    return got_hard


@pytest.mark.parametrize("speakers", [{}, {"num_clusters": 2}, {"num_clusters": 5}, {"min_clusters": 4},
                                      {"max_clusters": 1}], ids=["free", "n2", "n5", "min4", "max1"])
def test_agglomerative_clusters_equal_stock(speakers):
    embeddings, segmentations = _chunks()
    hard = _same(_agglomerative(), embeddings, segmentations, **speakers)
    if "num_clusters" in speakers:
        assert len(np.unique(hard)) == speakers["num_clusters"]


def test_agglomerative_small_clusters_and_constrained_assignment_equal_stock():
    embeddings, segmentations = _chunks(seed=3)
    _same(_agglomerative(threshold=0.6, min_cluster_size=6), embeddings, segmentations)
    _same(_agglomerative(constrained=True), embeddings, segmentations)


@pytest.mark.parametrize("speakers", [{}, {"num_clusters": 3}], ids=["free", "n3"])
def test_vbx_clusters_equal_stock(tmp_path, speakers):
    embeddings, segmentations = _chunks(seed=1)
    hard = _same(_vbx(tmp_path), embeddings, segmentations, **speakers)
    assert len(np.unique(hard[hard >= 0])) >= 2


def test_vbx_iterations_equal_pyannotes_in_float64():
    from pyannote.audio.utils.vbx import cluster_vbx  # type: ignore

    from rlx_triton.integrations._pyannote_clustering import vbx

    rng = np.random.default_rng(4)
    features = rng.normal(size=(80, 8)) + np.repeat(rng.normal(size=(4, 8)) * 3, 20, axis=0)
    phi = 1.0 + rng.random(8)
    initial = np.repeat(np.arange(5), 16)
    want_gamma, want_prior = cluster_vbx(initial, features, phi, Fa=0.07, Fb=0.8, maxIters=20)
    gamma, prior = vbx(torch.from_numpy(features), torch.from_numpy(phi), initial, 0.07, 0.8)
    np.testing.assert_allclose(gamma.numpy(), want_gamma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(prior.numpy(), want_prior, rtol=1e-9, atol=1e-12)


def test_clustering_under_inference_mode_and_refusals(tmp_path):
    from pyannote.audio.pipelines.clustering import KMeansClustering  # type: ignore

    from rlx_triton.integrations._pyannote_clustering import cluster, supported

    embeddings, segmentations = _chunks(seed=2)
    plain = cluster(_agglomerative(), embeddings, segmentations)[0]
    with torch.inference_mode():
        np.testing.assert_array_equal(cluster(_agglomerative(), embeddings, segmentations)[0], plain)
    assert not supported(KMeansClustering())
    average = _agglomerative()
    average.method = "average"
    assert not supported(average)
    with pytest.raises(TypeError, match="clustering"):
        cluster(average, embeddings, segmentations)


def _reconstruction_inputs(num_chunks=40, frames=30, speakers=3, clusters=4, seed=0, binary=True, step=0.5):
    from pyannote.core import SlidingWindow, SlidingWindowFeature  # type: ignore

    from tests.reference.diarization_pipeline import speaker_diarization  # noqa: F401  (pyannote present)

    rng = np.random.default_rng(seed)
    scores = rng.random((num_chunks, frames, speakers)).astype(np.float32)
    if binary:
        scores = (scores > 0.6).astype(np.float32)
    segmentations = SlidingWindowFeature(scores, SlidingWindow(start=0.0, duration=2.0, step=step))
    hard = rng.integers(0, clusters, size=(num_chunks, speakers))
    hard[rng.random((num_chunks, speakers)) < 0.15] = -2
    count_frames = SlidingWindow(start=0.0, duration=2.0 / frames, step=2.0 / frames)
    return segmentations, hard, count_frames


@pytest.mark.parametrize("binary", [True, False], ids=["powerset", "soft-scores"])
def test_discrete_diarization_equals_pyannotes_reconstruct(binary):
    from pyannote.audio.pipelines import SpeakerDiarization  # type: ignore
    from pyannote.core import SlidingWindowFeature  # type: ignore

    from rlx_triton.integrations._pyannote_streaming import discrete_diarization

    segmentations, hard, frames = _reconstruction_inputs(binary=binary)
    total = frames.closest_frame(2.0 + 39 * 0.5 + 0.5 * frames.duration) + 1
    count = SlidingWindowFeature(np.random.default_rng(1).integers(0, 4, size=(total, 1)).astype(np.int8), frames)
    stock = types.SimpleNamespace(to_diarization=SpeakerDiarization.to_diarization)   # what reconstruct uses
    want = SpeakerDiarization.reconstruct(stock, segmentations, hard, count)
    got = discrete_diarization(segmentations, hard, count)
    window = lambda swf: (swf.sliding_window.start, swf.sliding_window.duration, swf.sliding_window.step)  # noqa: E731
    assert got.data.dtype == want.data.dtype and window(got) == window(want)
    np.testing.assert_array_equal(got.data, want.data)


def test_reconstruction_holds_no_array_of_chunks_by_frames_by_clusters():
    from pyannote.core import SlidingWindowFeature  # type: ignore

    from rlx_triton.integrations._pyannote_streaming import discrete_diarization

    # chunks 20 times as long as their step, as in pyannote (10 s chunks, 1 s step)
    segmentations, hard, frames = _reconstruction_inputs(num_chunks=1500, frames=100, clusters=6, step=0.1)
    total = frames.closest_frame(2.0 + 1499 * 0.1 + 0.5 * frames.duration) + 1
    count = SlidingWindowFeature(np.ones((total, 1), dtype=np.int8), frames)
    stock_array = 1500 * 100 * 6 * 8          # what the stock reconstruct allocates (float64), twice in a pipeline
    tracemalloc.start()
    try:
        discrete_diarization(segmentations, hard, count)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # output-sized buffers only (frames x clusters: sums, coverage, ranks, result: 48 bytes per entry at most)
    assert peak < 48 * total * 6 and peak < stock_array / 3, (peak, total)
