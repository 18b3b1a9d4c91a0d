"""A SpeakerDiarization pipeline's embeddings computed while its segmentation runs (`OverlappedSegmentation`).

pyannote.audio (4.x) `SpeakerDiarization.apply` runs `get_segmentations` to the end, binarizes the
segmentations (a powerset model's are binary already; otherwise `binarize(segmentations, onset=threshold,
initial_state=False)`, which thresholds each (chunk, speaker) row on its own), counts speakers and only then
calls `get_embeddings(file, binarized, exclude_overlap=embedding_exclude_overlap)`. `OverlappedSegmentation`,
installed as the pipeline's `get_segmentations`, runs the stock method and watches its segmentation batches
(the `infer` calls of the pipeline's Inference): as each batch's scores arrive it binarizes those chunks as
apply will, crops their audio and builds their speaker masks on the host, and as soon as a chunk batch of the
embedding model is complete, queues its embedding forward on a side stream. On CUDA the embedding of chunk
batch i then runs while the segmentation of the next batches does; off CUDA the side stream is the current
thread, so the work is done in sequence (what the tests check on CPU).

The embeddings are kept in an `EmbeddingPrefetch` for that one file. `get_embeddings` returns them only when
it is called with exactly what they were computed from: the same file object (and waveform), the same
binarized segmentations (arrays compared), exclude_overlap, sliding window, embedding model (and its
parameters), device, sample rate and min_num_samples; anything else, and it computes as it does without the
overlap. Each `get_segmentations` call drops the previous file's prefetch, and `get_embeddings` consumes it,
so nothing carries over from one file to the next.

The overlap engages (`overlap=None`) on CUDA when a file has more chunks than one segmentation batch holds;
`overlap=True` forces it (CPU included), `overlap=False` turns it off. The pipeline in training mode (its
segmentation and embedding caches) never overlaps.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
import torch


class Queue:
    """Where an embedding forward is queued: a side CUDA stream (its work first waits for what the current
    stream queued before), the current CUDA stream, or, off CUDA, the calling thread (the work is done when
    the call returns)."""

    def __init__(self, device: torch.device, side: bool):
        self.device = device
        self.side = side and device.type == "cuda"
        self.stream = None
        if device.type == "cuda":
            self.stream = torch.cuda.Stream(device=device) if side else torch.cuda.current_stream(device)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        if not self.side or self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device, copied on this queue without waiting for it (from pinned memory,
        which torch's host allocator keeps until the copy ran)."""
        if self.stream is None:
            return tensor.to(self.device)
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def to_host(self, tensor: torch.Tensor) -> Tuple[torch.Tensor, Any]:
        """(host tensor, event): the copy back is queued; the host tensor is complete once the event is."""
        if self.stream is None:
            return tensor.cpu(), None
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        done = torch.cuda.Event()
        done.record(self.stream)
        return host, done


@dataclass
class QueuedBatch:
    """One chunk batch's embeddings, (chunks, speakers, dimension), on the host once `done` has completed."""
    rows: torch.Tensor
    done: Any = None

    def wait(self) -> np.ndarray:
        if self.done is not None:
            self.done.synchronize()
        return self.rows.numpy()


def _file_state(file) -> tuple:
    """What identifies the audio of a file between two calls: the waveform tensor's identity and version."""
    waveform = file.get("waveform") if hasattr(file, "get") else None
    if isinstance(waveform, torch.Tensor):
        return id(waveform), None if waveform.is_inference() else waveform._version, tuple(waveform.shape)
    return ()


def _window_key(window) -> tuple:
    return window.start, window.duration, window.step


@dataclass
class EmbeddingPrefetch:
    """The embeddings of one file's chunks, queued as its segmentation batches arrived (see the module
    docstring), with everything they were computed from."""
    embeddings: Any                  # the pipeline's SharedTrunkEmbeddings
    file: Any
    exclude_overlap: bool
    queue: Queue
    window: Any = None               # the segmentation's SlidingWindow
    inputs: tuple = ()               # SharedTrunkEmbeddings.input_state() when the prefetch began
    file_state: tuple = ()
    chunks: int = 0                  # chunks per embedding forward
    min_num_frames: Optional[int] = None
    model: Any = None
    binarized: List[np.ndarray] = field(default_factory=list)
    batches: List[QueuedBatch] = field(default_factory=list)
    waveforms: List[torch.Tensor] = field(default_factory=list)   # the chunks of the batch being gathered
    masks: List[np.ndarray] = field(default_factory=list)
    num_chunks: int = 0
    engaged: bool = False
    reason: str = "no segmentation batch was seen"

    def begin(self, total_chunks: Optional[int]) -> None:
        """Called when the segmentation announces its chunk count: decides whether to overlap."""
        embeddings = self.embeddings
        pipeline = embeddings.pipeline
        batch_size = pipeline._segmentation.batch_size
        if embeddings.overlap is None:
            if self.queue.device.type != "cuda":
                self.reason = f"the embedding model is on {self.queue.device.type}, not CUDA"
                return
            if total_chunks is None or total_chunks <= batch_size:
                self.reason = f"{total_chunks} chunks fit in one segmentation batch of {batch_size}"
                return
        from pyannote.core import SlidingWindow  # a pipeline implies pyannote is installed

        inference = pipeline._segmentation
        self.window = SlidingWindow(start=0.0, duration=inference.duration, step=inference.step)
        self.model = embeddings.model()
        self.inputs = embeddings.input_state(self.exclude_overlap)
        self.file_state = _file_state(self.file)
        num_samples = int(round(inference.duration * pipeline._embedding.sample_rate))
        self.chunks = embeddings.chunks_per_forward(num_samples)
        self.engaged = True
        self.reason = "overlapped"

    def add(self, scores) -> None:
        """One segmentation batch's scores (chunks, frames, classes), as Inference.infer returned them."""
        if not self.engaged:
            return
        try:
            self._add(scores)
        except Exception as error:   # the stock get_embeddings runs instead, and meets any real problem itself
            self.abandon(f"{type(error).__name__}: {error}")

    def _add(self, scores) -> None:
        if not isinstance(scores, np.ndarray) or scores.ndim != 3:
            self.abandon(f"a segmentation batch is a {type(scores).__name__}, "
                         "not one (chunks, frames, classes) array")
            return
        from pyannote.core import SlidingWindowFeature

        pipeline = self.embeddings.pipeline
        if pipeline._segmentation.model.specifications.powerset:
            binarized = scores
        else:
            from pyannote.audio.utils.signal import binarize

            binarized = binarize(SlidingWindowFeature(scores, self.window), onset=pipeline.segmentation.threshold,
                                 initial_state=False).data
        self.binarized.append(binarized)
        if self.min_num_frames is None:
            self.min_num_frames = self.embeddings.min_num_frames(self.window.duration, binarized.shape[1],
                                                                 self.exclude_overlap)
        for chunk_data in binarized:
            segment = self.window[self.num_chunks]
            self.num_chunks += 1
            waveform, masks = self.embeddings.chunk_input(self.file, segment, chunk_data, self.exclude_overlap,
                                                          self.min_num_frames)
            self.waveforms.append(waveform)
            self.masks.append(masks)
            if len(self.waveforms) == self.chunks:
                self._queue_gathered()

    def _queue_gathered(self) -> None:
        waveforms, masks = torch.vstack(self.waveforms), torch.from_numpy(np.stack(self.masks))
        self.waveforms, self.masks = [], []
        self.batches.append(self.embeddings.queue_forward(self.model, waveforms, masks, self.chunks, self.queue))

    def end(self) -> None:
        """Called when the segmentation has returned: the last, shorter chunk batch is queued."""
        if self.engaged and self.waveforms:
            try:
                self._queue_gathered()
            except Exception as error:
                self.abandon(f"{type(error).__name__}: {error}")

    def abandon(self, reason: str) -> None:
        self.engaged = False
        self.reason = f"abandoned: {reason}"
        self.batches, self.binarized, self.waveforms, self.masks = [], [], [], []

    def mismatch(self, file, binary_segmentations, exclude_overlap: bool) -> Optional[str]:
        """Why these get_embeddings arguments are not the ones the prefetch was computed from (None: they are)."""
        if not self.engaged:
            return f"not overlapped ({self.reason})"
        if file is not self.file or _file_state(file) != self.file_state:
            return "another file, or the file's waveform changed"
        if bool(exclude_overlap) != self.exclude_overlap:
            return "another exclude_overlap"
        if (self.embeddings.input_state(self.exclude_overlap) != self.inputs
                or self.embeddings.model() is not self.model):
            return "the embedding model, its parameters, device or sample rate changed"
        window = getattr(binary_segmentations, "sliding_window", None)
        if window is None or _window_key(window) != _window_key(self.window):
            return "another sliding window"
        data = binary_segmentations.data
        computed = np.concatenate(self.binarized) if len(self.binarized) != 1 else self.binarized[0]
        if data.shape != computed.shape or data.dtype != computed.dtype or not np.array_equal(data, computed,
                                                                                              equal_nan=True):
            return "other binarized segmentations"
        return None


class OverlappedSegmentation:
    """SpeakerDiarization.get_segmentations(file, hook=None) that also prefetches the file's embeddings (see
    the module docstring); installed on a pipeline by `optimize`, beside its SharedTrunkEmbeddings."""

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def __deepcopy__(self, memo):
        pipeline = memo.get(id(self.pipeline))
        return OverlappedSegmentation(pipeline if pipeline is not None else self.pipeline)

    def stock(self, file, hook: Optional[Callable] = None):
        return type(self.pipeline).get_segmentations(self.pipeline, file, hook=hook)

    def __call__(self, file, hook: Optional[Callable] = None):
        pipeline = self.pipeline
        embeddings = pipeline.__dict__.get("get_embeddings")
        if embeddings is None or not hasattr(embeddings, "prefetch_for"):
            return self.stock(file, hook=hook)
        prefetch = embeddings.prefetch_for(file)   # drops any earlier file's prefetch
        if prefetch is None:
            return self.stock(file, hook=hook)
        inference = pipeline._segmentation
        own_infer = inference.__dict__.get("infer")
        infer = own_infer if own_infer is not None else type(inference).infer.__get__(inference)

        def watched_infer(chunks):
            scores = infer(chunks)
            prefetch.add(scores)
            return scores

        def watched_hook(*args, **kwargs):
            if kwargs.get("completed") == 0 and not prefetch.engaged:
                prefetch.begin(kwargs.get("total"))
            if hook is not None:
                hook(*args, **kwargs)

        inference.infer = watched_infer
        try:
            segmentations = self.stock(file, hook=watched_hook)
        finally:
            if own_infer is not None:
                inference.infer = own_infer
            else:
                del inference.infer
        prefetch.end()
        return segmentations


__all__ = ["EmbeddingPrefetch", "OverlappedSegmentation", "QueuedBatch", "Queue"]
