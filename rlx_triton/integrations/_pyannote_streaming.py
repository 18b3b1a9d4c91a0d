"""One file through a pyannote.audio SpeakerDiarization pipeline in memory that grows with the waveform only.

`diarize(pipeline, file, ...)` returns what `pipeline(file)` returns as its speaker_diarization and
exclusive_speaker_diarization (pyannote.audio 4.x `SpeakerDiarization.apply`, the same steps in the same
order), with the seconds each stage took. Where the stock apply holds something that grows faster than the
audio, it does otherwise:

- clustering: scipy's linkage holds all N * (N - 1) / 2 pairwise distances of the N (chunk, speaker)
  embeddings; here it is rlx_triton.integrations._pyannote_clustering (torch, on the pipeline's device,
  memory linear in N) for VBx and centroid-linkage agglomerative clustering, the pipeline's own clustering
  object otherwise;
- reconstruction: the stock `reconstruct` builds a (chunks, frames per chunk, clusters) float64 array of the
  clustered segmentations, twice (the diarization, then the exclusive one), and overlap-adds it; here each
  chunk's clustered scores are added into the (frames, clusters) output as the chunk is visited, so nothing
  of size chunks x frames x clusters exists;
- the audio: with `release_audio=True` the file's waveform is dropped from the file dict once the embeddings
  are computed, so the clustering and reconstruction run without it.

- segmentation: the chunks (batches of `batch_size`) go through the pipeline's segmentation Inference
  (`infer`) as its `slide` sends them, and each batch's scores are copied into one array (`segmentations_of`:
  the stock slide keeps a small array per batch, which holds the allocator's memory up).

Speaker counting and the embeddings (the pipeline's `get_embeddings`, optimized by
rt.integrations.pyannote.optimize) are the pipeline's own methods; what they keep is a few float32 values
per frame of each chunk, a fraction of the waveform's size.
"""
from __future__ import annotations

import contextlib
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional

import numpy as np
import torch

STAGES = ("segmentation", "embeddings", "clustering")


@dataclass
class Diarization:
    """What diarize returns: the two annotations (pyannote.core Annotation, labels SPEAKER_00, ...) and the
    seconds of each stage (segmentation: segmentation and binarisation; embeddings: speaker counting and
    embeddings; clustering: clustering, reconstruction and the annotations)."""
    speaker_diarization: Any
    exclusive_speaker_diarization: Any
    seconds: Dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _segmentation_batch(pipeline, batch_size: Optional[int]) -> Iterator[None]:
    inference = pipeline._segmentation
    saved = inference.batch_size
    if batch_size is not None:
        inference.batch_size = batch_size
    try:
        yield
    finally:
        inference.batch_size = saved


def segmentations_of(pipeline, file):
    """The pipeline's segmentations of `file`, as pyannote's Inference.slide computes them (its chunks: a view
    of the waveform; the last, shorter chunk zero-padded; `infer` per batch), each batch's scores copied into
    one array allocated after the first batch.

    The stock slide keeps every batch's small result array until it stacks them at the end; between those,
    each batch's large temporaries come and go, and the allocator can give little of that memory back while
    the small arrays sit above it (measured: 590 MB more peak RSS for 60 min of audio than for 10 min, of which
    the arrays themselves are 25 MB). With CUDA embeddings the pipeline's own get_segmentations runs instead,
    as it may overlap the embeddings with the segmentation (rlx_triton.integrations._pyannote_overlap)."""
    from pyannote.audio.utils.reproducibility import fix_reproducibility
    from pyannote.core import SlidingWindow, SlidingWindowFeature

    inference = pipeline._segmentation
    if torch.device(pipeline._embedding.device).type == "cuda" or getattr(inference, "window", "sliding") != "sliding":
        return pipeline.get_segmentations(file)
    fix_reproducibility(inference.device)
    waveform, sample_rate = inference.model.audio(file)
    window = inference.model.audio.get_num_samples(inference.duration)
    step = round(inference.step * sample_rate)
    num_samples = waveform.shape[1]
    whole = (num_samples - window) // step + 1 if num_samples >= window else 0
    has_last = num_samples < window or (num_samples - window) % step > 0
    chunks = waveform.unfold(1, window, step).permute(1, 0, 2) if whole else None
    out: Optional[np.ndarray] = None
    filled = 0

    def keep(scores) -> None:
        nonlocal out, filled
        if not isinstance(scores, np.ndarray):
            raise TypeError("a segmentation model with several outputs")
        if out is None:
            out = np.empty((whole + has_last, *scores.shape[1:]), dtype=scores.dtype)
        out[filled:filled + scores.shape[0]] = scores
        filled += scores.shape[0]

    for c in range(0, whole, inference.batch_size):
        assert chunks is not None
        keep(inference.infer(chunks[c:c + inference.batch_size]))
    if has_last:
        last = torch.nn.functional.pad(waveform[:, whole * step:], (0, window - (num_samples - whole * step)))
        keep(inference.infer(last[None]))
    assert out is not None and filled == out.shape[0]
    return SlidingWindowFeature(out, SlidingWindow(start=0.0, duration=inference.duration, step=inference.step))


def clustered_activations(segmentations, hard_clusters: np.ndarray, frames):
    """The (frames, clusters) overlap-add of each chunk's clustered segmentation (per cluster, the largest score
    of the chunk's speakers assigned to it; chunks without the cluster leave it out), as pyannote's
    `reconstruct` + `Inference.aggregate(..., hamming=False, missing=0.0, skip_average=True)` compute it, one
    chunk at a time. `frames`: the counting's SlidingWindow (the output frames)."""
    from pyannote.core import SlidingWindow, SlidingWindowFeature

    num_chunks, num_frames, _ = segmentations.data.shape
    num_clusters = int(np.max(hard_clusters)) + 1
    chunks = segmentations.sliding_window
    frames = SlidingWindow(start=chunks.start, duration=frames.duration, step=frames.step)
    total = frames.closest_frame(chunks.start + chunks.duration + (num_chunks - 1) * chunks.step
                                 + 0.5 * frames.duration) + 1
    summed = np.zeros((total, num_clusters), dtype=np.float32)
    covered = np.zeros((total, num_clusters), dtype=np.float32)
    for c in range(num_chunks):
        assigned, scores = hard_clusters[c], segmentations.data[c]
        clustered = np.full((num_frames, num_clusters), np.nan)
        for k in np.unique(assigned):
            if k != -2:
                clustered[:, k] = np.max(scores[:, assigned == k], axis=1)
        present = 1 - np.isnan(clustered)
        np.nan_to_num(clustered, copy=False, nan=0.0)
        start = frames.closest_frame(chunks[c].start + 0.5 * frames.duration)
        summed[start:start + num_frames] += clustered * present
        covered[start:start + num_frames] = np.maximum(covered[start:start + num_frames], present)
    summed[covered == 0.0] = 0.0
    return SlidingWindowFeature(summed, frames)


def discrete_diarization(segmentations, hard_clusters: np.ndarray, count):
    """pyannote's SpeakerDiarization.reconstruct: in every frame, the `count` clusters of highest activation
    are on (1.0), the others off, as a (frames, clusters) SlidingWindowFeature."""
    from pyannote.core import SlidingWindowFeature

    activations = clustered_activations(segmentations, hard_clusters, count.sliding_window)
    most = int(np.max(count.data))
    if activations.data.shape[1] < most:
        activations.data = np.pad(activations.data, ((0, 0), (0, most - activations.data.shape[1])))
    extent = activations.extent & count.extent
    activations = activations.crop(extent, return_data=False)
    count = count.crop(extent, return_data=False)
    ranked = np.argsort(-activations.data, axis=-1)
    # rank r of frame t is on when r < count[t]: every column gets its value once, at its rank's place
    on = (np.arange(ranked.shape[1])[None] < count.data[:, :1].astype(np.int64)).astype(activations.data.dtype)
    binary = np.zeros_like(activations.data)
    np.put_along_axis(binary, ranked, on, axis=1)
    return SlidingWindowFeature(binary, activations.sliding_window)


def _empty(file, seconds: Dict[str, float]) -> Diarization:
    from pyannote.core import Annotation

    return Diarization(Annotation(uri=file["uri"]), Annotation(uri=file["uri"]), seconds)


def _cluster(pipeline, embeddings, binarized, num_speakers, min_speakers, max_speakers, file):
    from rlx_triton.integrations import _pyannote_clustering

    if _pyannote_clustering.supported(pipeline.clustering):
        with torch.inference_mode():
            return _pyannote_clustering.cluster(pipeline.clustering, embeddings, binarized, num_speakers,
                                                min_speakers, max_speakers, device=pipeline._embedding.device)
    return pipeline.clustering(embeddings=embeddings, segmentations=binarized, num_clusters=num_speakers,
                               min_clusters=min_speakers, max_clusters=max_speakers, file=file,
                               frames=pipeline._segmentation.model.receptive_field)


def diarize(pipeline, file: dict, *, num_speakers: Optional[int] = None, min_speakers: Optional[int] = None,
            max_speakers: Optional[int] = None, batch_size: Optional[int] = None,
            release_audio: bool = False) -> Diarization:
    """`pipeline(file, num_speakers=..., min_speakers=..., max_speakers=...)`'s two annotations, computed as the
    module docstring says, with the seconds of each stage.

    Args:
        pipeline: a pyannote.audio SpeakerDiarization pipeline (optimized or not), not in training mode.
        file: pyannote's file dict: {"waveform": (channels, samples) tensor, "sample_rate": int, "uri": str}.
        batch_size: chunks per segmentation batch (None: the pipeline's segmentation_batch_size).
        release_audio: drop file["waveform"] once the embeddings are computed.
    """
    from pyannote.audio.pipelines.utils.diarization import set_num_speakers
    from pyannote.audio.utils.signal import binarize

    num_speakers, min_speakers, max_speakers = set_num_speakers(num_speakers, min_speakers, max_speakers)
    if pipeline._expects_num_speakers and num_speakers is None:
        if "annotation" not in file:
            raise ValueError(f"num_speakers must be provided when using {pipeline.klustering} clustering")
        num_speakers = len(file["annotation"].labels())
    seconds = {stage: 0.0 for stage in STAGES}
    start = time.perf_counter()
    with _segmentation_batch(pipeline, batch_size):
        segmentations = segmentations_of(pipeline, file)
    model = pipeline._segmentation.model
    if model.specifications.powerset:
        binarized = segmentations
    else:
        binarized = binarize(segmentations, onset=pipeline.segmentation.threshold, initial_state=False)
    seconds["segmentation"] = time.perf_counter() - start

    start = time.perf_counter()
    count = pipeline.speaker_count(binarized, model.receptive_field, warm_up=(0.0, 0.0))
    if np.nanmax(count.data) == 0.0:
        seconds["embeddings"] = time.perf_counter() - start
        return _empty(file, seconds)
    embeddings = pipeline.get_embeddings(file, binarized, exclude_overlap=pipeline.embedding_exclude_overlap)
    if release_audio:
        file.pop("waveform", None)
    seconds["embeddings"] = time.perf_counter() - start

    start = time.perf_counter()
    hard_clusters, _, _ = _cluster(pipeline, embeddings, binarized, num_speakers, min_speakers, max_speakers, file)
    found = int(np.max(hard_clusters)) + 1
    if found < min_speakers or found > max_speakers:
        warnings.warn(textwrap.dedent(f"""
            The detected number of speakers ({found}) for {file["uri"]} is outside
            the given bounds [{min_speakers}, {max_speakers}]. This can happen if the
            given audio file is too short to contain {min_speakers} or more speakers.
            Try to lower the desired minimal number of speakers."""))
    count.data = np.minimum(count.data, max_speakers).astype(np.int8)
    hard_clusters = np.asarray(hard_clusters).copy()
    hard_clusters[np.sum(binarized.data, axis=1) == 0] = -2      # speakers silent in a chunk: no cluster
    min_duration_off = pipeline.segmentation.min_duration_off
    diarization = pipeline.to_annotation(discrete_diarization(segmentations, hard_clusters, count),
                                         min_duration_on=0.0, min_duration_off=min_duration_off)
    diarization.uri = file["uri"]
    count.data = np.minimum(count.data, 1).astype(np.int8)
    exclusive = pipeline.to_annotation(discrete_diarization(segmentations, hard_clusters, count),
                                       min_duration_on=0.0, min_duration_off=min_duration_off)
    exclusive.uri = file["uri"]
    if "annotation" in file and file["annotation"]:
        _, mapping = pipeline.optimal_mapping(file["annotation"], diarization, return_mapping=True)
        mapping = {label: mapping.get(label, label) for label in diarization.labels()}
    else:
        mapping = dict(zip(diarization.labels(), pipeline.classes()))
    result = Diarization(diarization.rename_labels(mapping=mapping), exclusive.rename_labels(mapping=mapping),
                         seconds)
    seconds["clustering"] = time.perf_counter() - start
    return result


__all__ = ["Diarization", "STAGES", "clustered_activations", "diarize", "discrete_diarization"]
