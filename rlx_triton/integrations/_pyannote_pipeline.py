"""pyannote.audio's SpeakerDiarization pipeline with each chunk embedded once (`optimize(pipeline)`).

pyannote.audio (4.x) `SpeakerDiarization.get_embeddings` yields one (waveform, mask) pair per (chunk, local
speaker) to the embedding model: with 3 local speakers, the Kaldi fbank and the whole ResNet trunk run 3
times on the same 10 s chunk, and only the masked statistics pooling differs. A WeSpeaker model's forward
accepts weights of shape (batch, speakers, frames) and pools every speaker from one feature map, so
`SharedTrunkEmbeddings` (installed as the pipeline's `get_embeddings`) feeds it chunks with all their
speakers' masks at once: fbank + trunk once per chunk, chunks batched, pooling per speaker.

What stays as pyannote defines it: the masks (NaN frames as 0, `embedding_exclude_overlap` with the
`min_num_frames` fallback to the whole mask, decided per speaker as the stock loop does), the order of the
(chunk, speaker) rows, the NaN rows of speakers without active frames, the training cache, the pipeline's
parameters and batch-size attributes, and the `hook` calls: `embedding_batch_size` keeps its meaning, one
hook call per batch of that many (chunk, speaker) pairs, with that batch's embeddings.

The number of chunks per forward is chosen from the device (`chunks_per_forward`); it changes no value,
since an eval-mode model computes each chunk independently. A pipeline whose embedding model is not a
WeSpeaker ResNet (or is in training mode, where BatchNorm would see the batch) keeps the stock method.

What runs where. The segmentation model runs on the current stream, as pyannote calls it. On CUDA, when a
file has more chunks than one segmentation batch (`overlap`, see rlx_triton.integrations._pyannote_overlap),
the pipeline's `get_segmentations` (`OverlappedSegmentation`) queues the embedding of each chunk batch on a
side stream as soon as the segmentation of its chunks has come back, so embedding batch i runs while the
segmentation of the next chunks does; `get_embeddings` then only waits for those results (when it is called
with the binarized segmentations they were computed from; otherwise it computes them itself). Without the
overlap the embedding forwards run on the current stream in `get_embeddings`. Either way the host crops each
chunk's audio and builds its masks while the device computes the previous chunk batch: inputs go to the
device from pinned memory and results come back to pinned memory without the host waiting, until it reads
them. With `cuda_graphs=True` the embedding forward (fbank, trunk, pooling, projection) replays a CUDA graph
at its fixed batch shape (the last, shorter batch is padded to it; padded rows are dropped). Off CUDA
everything runs in sequence on the calling thread.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from rlx_triton.integrations._pyannote_graphs import TrunkGraphs
from rlx_triton.integrations._pyannote_overlap import EmbeddingPrefetch, OverlappedSegmentation, Queue, QueuedBatch
from rlx_triton.integrations._pyannote_recognisers import recognised

CPU_CHUNKS_PER_FORWARD = 1     # on CPU a batch of chunks costs more per chunk (measured: 0.33 s alone, 0.45 s in 4): its feature maps leave the caches
MAX_CUDA_CHUNKS_PER_FORWARD = 32
# activation memory of a WeSpeaker ResNet34 forward per input sample (fp32: 32 channels x 80 bins at 100
# frames/s is 64 bytes per sample per feature map, a few maps live at once), with headroom
ACTIVATION_BYTES_PER_SAMPLE = 512
CUDA_MEMORY_SHARE = 0.5        # of the free memory, for one batch's activations


def chunks_per_forward(device: torch.device, num_samples: int) -> int:
    """Chunks of `num_samples` samples per embedding forward on `device`: on CUDA as many as half the free
    memory holds (at most MAX_CUDA_CHUNKS_PER_FORWARD), elsewhere CPU_CHUNKS_PER_FORWARD."""
    if device.type == "cuda":
        free_bytes, _total = torch.cuda.mem_get_info(device)
        fitting = int(CUDA_MEMORY_SHARE * free_bytes) // max(1, ACTIVATION_BYTES_PER_SAMPLE * num_samples)
        return max(1, min(MAX_CUDA_CHUNKS_PER_FORWARD, fitting))
    return CPU_CHUNKS_PER_FORWARD


def _embedding_model(pipeline) -> Optional[nn.Module]:
    """The pipeline's WeSpeaker model when its forward pools (batch, speakers, frames) weights per speaker."""
    embedding = getattr(pipeline, "_embedding", None)
    model = getattr(embedding, "model_", None)
    if not isinstance(model, nn.Module) or not recognised("wespeaker_resnet", model):
        return None
    if getattr(model.resnet, "two_emb_layer", False) or getattr(model, "fbank_only", False):
        return None   # seg_bn_1 would see the speakers axis as channels; fbank_only pools nothing
    return model


def is_speaker_diarization(obj) -> bool:
    """pyannote.audio's SpeakerDiarization (by structure): get_embeddings, an embedding inference wrapper
    (`_embedding` with `model_`, `device`, `min_num_samples`, `sample_rate`), `_audio.crop` and an
    `embedding_batch_size`."""
    embedding = getattr(obj, "_embedding", None)
    return (not isinstance(obj, nn.Module) and callable(getattr(type(obj), "get_embeddings", None))
            and embedding is not None and hasattr(embedding, "model_") and hasattr(embedding, "device")
            and callable(getattr(getattr(obj, "_audio", None), "crop", None))
            and isinstance(getattr(obj, "embedding_batch_size", None), int))


def _segments_in_batches(obj) -> bool:
    """Whether the pipeline's segmentation is pyannote's Inference as SpeakerDiarization uses it (a
    get_segmentations method, `_segmentation` with `infer`, `batch_size`, `duration`, `step` and the model's
    specifications), which the overlap watches batch by batch."""
    inference = getattr(obj, "_segmentation", None)
    return (callable(getattr(type(obj), "get_segmentations", None)) and inference is not None
            and callable(getattr(type(inference), "infer", None))
            and all(hasattr(inference, name) for name in ("batch_size", "duration", "step"))
            and hasattr(getattr(inference, "model", None), "specifications"))


def speaker_masks(chunk: np.ndarray, exclude_overlap: bool, min_num_frames: int) -> np.ndarray:
    """(speakers, frames) float32 masks of one chunk's (frames, speakers) binarized segmentation, each chosen as
    the stock loop chooses it: NaN frames as 0; with exclude_overlap the frames where fewer than two speakers
    are active, unless that leaves a speaker no more than min_num_frames frames (then its whole mask)."""
    clean = chunk * (1.0 * (np.sum(chunk, axis=1, keepdims=True) < 2)) if exclude_overlap else chunk
    masks = np.nan_to_num(chunk, nan=0.0).astype(np.float32)
    clean_masks = np.nan_to_num(clean, nan=0.0).astype(np.float32)
    return np.stack([clean_mask if np.sum(clean_mask) > min_num_frames else mask
                     for mask, clean_mask in zip(masks.T, clean_masks.T)])


class HookBatches:
    """pyannote's hook calls of get_embeddings: ("embeddings", None, total=batches, completed=0) at once, then
    one per batch of `pairs_per_hook` (chunk, speaker) pairs, with that batch's embeddings, as rows arrive."""

    def __init__(self, hook: Optional[Callable], pairs: int, pairs_per_hook: int):
        self.hook, self.pairs, self.pairs_per_hook = hook, pairs, pairs_per_hook
        self.count = math.ceil(pairs / pairs_per_hook)
        self.out: Optional[np.ndarray] = None   # (pairs, dimension), filled as rows arrive
        self.received = 0
        self.reported = 0
        if hook is not None:
            hook("embeddings", None, total=self.count, completed=0)

    def add(self, rows: np.ndarray) -> None:
        if self.out is None:
            self.out = np.empty((self.pairs, rows.shape[1]), dtype=rows.dtype)
        self.out[self.received:self.received + rows.shape[0]] = rows
        self.received += rows.shape[0]
        while (self.reported < self.count
               and min((self.reported + 1) * self.pairs_per_hook, self.pairs) <= self.received):
            self.reported += 1
            if self.hook is not None:
                start = (self.reported - 1) * self.pairs_per_hook
                self.hook("embeddings", self.out[start:self.reported * self.pairs_per_hook], total=self.count,
                          completed=self.reported)

    def all_rows(self) -> np.ndarray:
        assert self.out is not None and self.received == self.pairs, "every (chunk, speaker) pair is embedded"
        return self.out


def _parameter_state(model: nn.Module) -> tuple:
    return tuple((t.data_ptr(), None if t.is_inference() else t._version)
                 for t in list(model.parameters()) + list(model.buffers()))


class SharedTrunkEmbeddings:
    """SpeakerDiarization.get_embeddings(file, binary_segmentations, exclude_overlap=False, hook=None) with
    fbank + trunk once per chunk (see the module docstring); installed on a pipeline by `optimize`.

    overlap (also settable on the installed object, `pipeline.get_embeddings.overlap = ...`): whether the
    embeddings of a file are computed while its segmentation runs (rlx_triton.integrations._pyannote_overlap).
    None: on CUDA, when the file has more chunks than one segmentation batch; True: always (off CUDA the work
    then runs in sequence, with the same results); False: never."""

    def __init__(self, pipeline, cuda_graphs: bool = False, overlap: Optional[bool] = None):
        self.pipeline = pipeline
        self.cuda_graphs = cuda_graphs
        self.overlap = overlap
        self.graphs: Optional[TrunkGraphs] = None
        self.prefetch: Optional[EmbeddingPrefetch] = None
        self.overlap_report = "no file embedded yet"   # why the last get_embeddings call used a prefetch or not

    @property
    def overlap(self) -> Optional[bool]:
        return self._overlap

    @overlap.setter
    def overlap(self, value: Optional[bool]) -> None:
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"overlap must be None, True or False, got {value!r}")
        self._overlap = value

    def __deepcopy__(self, memo):
        pipeline = memo.get(id(self.pipeline))
        return SharedTrunkEmbeddings(pipeline if pipeline is not None else self.pipeline, self.cuda_graphs,
                                     self.overlap)

    def __getstate__(self):
        return {"pipeline": self.pipeline, "cuda_graphs": self.cuda_graphs, "_overlap": self.overlap,
                "graphs": None, "prefetch": None, "overlap_report": "no file embedded yet"}

    def stock(self, *args, **kwargs):
        return type(self.pipeline).get_embeddings(self.pipeline, *args, **kwargs)

    def model(self) -> Optional[nn.Module]:
        return _embedding_model(self.pipeline)

    def shares_the_trunk(self) -> bool:
        model = self.model()
        return model is not None and not any(module.training for module in model.modules())

    def device(self) -> torch.device:
        return torch.device(self.pipeline._embedding.device)

    def chunks_per_forward(self, num_samples: int) -> int:
        return chunks_per_forward(self.device(), num_samples)

    def input_state(self, exclude_overlap: bool) -> tuple:
        """What the embeddings of given chunks and masks depend on besides them: the model and its parameters,
        the device, the sample rate, the audio reader, min_num_samples (with exclude_overlap) and cuda_graphs."""
        model = self.model()
        embedding = self.pipeline._embedding
        return (id(model), None if model is None else _parameter_state(model), str(self.device()),
                embedding.sample_rate, id(self.pipeline._audio),
                embedding.min_num_samples if exclude_overlap else None, self.cuda_graphs)

    def min_num_frames(self, duration: float, num_frames: int, exclude_overlap: bool) -> int:
        """The stock method's min_num_frames: the frames min_num_samples spans (-1 without exclude_overlap)."""
        if not exclude_overlap:
            return -1
        embedding = self.pipeline._embedding
        return math.ceil(num_frames * embedding.min_num_samples / (duration * embedding.sample_rate))

    def chunk_input(self, file, segment, chunk: np.ndarray, exclude_overlap: bool,
                    min_num_frames: int) -> Tuple[torch.Tensor, np.ndarray]:
        """(waveform (1, 1, samples), masks (speakers, frames)) of one chunk, cropped as the stock loop does."""
        waveform, _ = self.pipeline._audio.crop(file, segment, mode="pad")
        return waveform[None], speaker_masks(chunk, exclude_overlap, min_num_frames)

    def prefetch_for(self, file) -> Optional[EmbeddingPrefetch]:
        """A new, empty prefetch of `file`'s embeddings, replacing any earlier one (None: the overlap cannot
        apply to this pipeline now)."""
        self.prefetch = None
        pipeline = self.pipeline
        if self.overlap is False or pipeline.training or not self.shares_the_trunk() \
                or not _segments_in_batches(pipeline):
            return None
        device = self.device()
        exclude_overlap = bool(getattr(pipeline, "embedding_exclude_overlap", False))
        self.prefetch = EmbeddingPrefetch(self, file, exclude_overlap, Queue(device, side=True))
        return self.prefetch

    def __call__(self, file, binary_segmentations, exclude_overlap: bool = False,
                 hook: Optional[Callable] = None):
        pipeline = self.pipeline
        prefetch, self.prefetch = self.prefetch, None
        num_chunks, _num_frames, num_speakers = binary_segmentations.data.shape
        if not self.shares_the_trunk() or num_chunks == 0 or num_speakers == 0:
            self.overlap_report = "stock get_embeddings"
            return self.stock(file, binary_segmentations, exclude_overlap=exclude_overlap, hook=hook)
        if pipeline.training:
            cache = file.get("training_cache/embeddings", dict())
            if ("embeddings" in cache) and (pipeline._segmentation.model.specifications.powerset
                                            or (cache["segmentation.threshold"] == pipeline.segmentation.threshold)):
                return cache["embeddings"]
        embeddings = self._embed(file, binary_segmentations, exclude_overlap, hook, prefetch)
        if pipeline.training:
            if pipeline._segmentation.model.specifications.powerset:
                file["training_cache/embeddings"] = {"embeddings": embeddings}
            else:
                file["training_cache/embeddings"] = {"segmentation.threshold": pipeline.segmentation.threshold,
                                                     "embeddings": embeddings}
        return embeddings

    def _chunk_batches(self, file, binary_segmentations, exclude_overlap: bool, chunks: int):
        """(waveforms (chunks, 1, samples), masks (chunks, speakers, frames)) per batch of chunks, each
        speaker's mask chosen as the stock loop chooses it."""
        num_frames = binary_segmentations.data.shape[1]
        min_num_frames = self.min_num_frames(binary_segmentations.sliding_window.duration, num_frames,
                                             exclude_overlap)
        waveforms: List[torch.Tensor] = []
        masks: List[np.ndarray] = []
        for segment, chunk in binary_segmentations:
            waveform, chunk_masks = self.chunk_input(file, segment, chunk, exclude_overlap, min_num_frames)
            waveforms.append(waveform)
            masks.append(chunk_masks)
            if len(waveforms) == chunks:
                yield torch.vstack(waveforms), torch.from_numpy(np.stack(masks))
                waveforms, masks = [], []
        if waveforms:
            yield torch.vstack(waveforms), torch.from_numpy(np.stack(masks))

    def _forward(self, model: nn.Module, waveforms: torch.Tensor, masks: torch.Tensor, chunks: int,
                 queue: Queue) -> torch.Tensor:
        """The (chunks, speakers, dimension) embeddings on the model's device, queued on `queue`."""
        waveforms, masks = queue.to_device(waveforms), queue.to_device(masks)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not (self.cuda_graphs and waveforms.device.type == "cuda"):
                return model(waveforms, weights=masks)
            real = waveforms.shape[0]
            if real < chunks:   # one graph shape: the last batch padded with silent, maskless chunks
                waveforms = torch.cat([waveforms, waveforms.new_zeros((chunks - real, *waveforms.shape[1:]))])
                masks = torch.cat([masks, masks.new_zeros((chunks - real, *masks.shape[1:]))])
            if self.graphs is None or self.graphs.model is not model:
                self.graphs = TrunkGraphs(model)
            return self.graphs(waveforms, masks)[:real]

    def queue_forward(self, model: nn.Module, waveforms: torch.Tensor, masks: torch.Tensor, chunks: int,
                      queue: Queue) -> QueuedBatch:
        """One chunk batch's embeddings, queued on `queue` with their copy back to the host."""
        with queue.entered():
            rows, done = queue.to_host(self._forward(model, waveforms, masks, chunks, queue))
        return QueuedBatch(rows, done)

    def _queued_batches(self, file, binary_segmentations, exclude_overlap: bool) -> Iterator[QueuedBatch]:
        """The chunk batches' embeddings on the current stream; batch i+1 is queued (its audio cropped, its
        masks built) before batch i is handed over, so on CUDA the host work overlaps the device's."""
        model = self.model()
        assert model is not None
        num_samples = int(round(binary_segmentations.sliding_window.duration * self.pipeline._embedding.sample_rate))
        chunks = self.chunks_per_forward(num_samples)
        queue = Queue(self.device(), side=False)
        pending = None
        for waveforms, masks in self._chunk_batches(file, binary_segmentations, exclude_overlap, chunks):
            launched = self.queue_forward(model, waveforms, masks, chunks, queue)
            if pending is not None:
                yield pending
            pending = launched
        if pending is not None:
            yield pending

    def _embed(self, file, binary_segmentations, exclude_overlap: bool, hook: Optional[Callable],
               prefetch: Optional[EmbeddingPrefetch]) -> np.ndarray:
        num_chunks, _num_frames, num_speakers = binary_segmentations.data.shape
        mismatch = "no prefetch" if prefetch is None else prefetch.mismatch(file, binary_segmentations,
                                                                            exclude_overlap)
        batches: Any
        if prefetch is not None and mismatch is None:
            batches = prefetch.batches
            self.overlap_report = f"prefetched while segmenting: {num_chunks} chunks in {len(batches)} batches"
        else:
            batches = self._queued_batches(file, binary_segmentations, exclude_overlap)
            self.overlap_report = f"computed in get_embeddings ({mismatch})"
        reporter = HookBatches(hook, num_chunks * num_speakers, self.pipeline.embedding_batch_size)
        for batch in batches:
            rows = batch.wait()
            reporter.add(rows.reshape(-1, rows.shape[-1]))
        return reporter.all_rows().reshape(num_chunks, num_speakers, -1)


def optimize_pipeline(pipeline, cuda_graphs: bool = False, overlap: Optional[bool] = None) -> bool:
    """Install SharedTrunkEmbeddings as a SpeakerDiarization pipeline's get_embeddings and, where its
    segmentation is pyannote's Inference, OverlappedSegmentation as its get_segmentations (in place, once);
    True when the pipeline is one. A second call keeps cuda_graphs once set, and sets overlap when given."""
    if not is_speaker_diarization(pipeline):
        return False
    current = pipeline.__dict__.get("get_embeddings")
    if isinstance(current, SharedTrunkEmbeddings) and current.pipeline is pipeline:
        current.cuda_graphs = current.cuda_graphs or cuda_graphs
        if overlap is not None:
            current.overlap = overlap
    else:
        # an instance attribute: pyannote's Pipeline.__setattr__ only sorts Parameters, sub-pipelines and models
        object.__setattr__(pipeline, "get_embeddings",
                           SharedTrunkEmbeddings(pipeline, cuda_graphs=cuda_graphs, overlap=overlap))
    segmentations = pipeline.__dict__.get("get_segmentations")
    if _segments_in_batches(pipeline) and not (isinstance(segmentations, OverlappedSegmentation)
                                               and segmentations.pipeline is pipeline):
        object.__setattr__(pipeline, "get_segmentations", OverlappedSegmentation(pipeline))
    return True


__all__ = ["HookBatches", "SharedTrunkEmbeddings", "TrunkGraphs", "chunks_per_forward", "is_speaker_diarization",
           "optimize_pipeline", "speaker_masks"]
