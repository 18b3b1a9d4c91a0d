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

On CUDA each chunk batch's host work (cropping, masks) runs while the previous batch computes, and with
`cuda_graphs=True` the embedding forward (fbank, trunk, pooling, projection) replays a CUDA graph at its
fixed batch shape (the last, shorter batch is padded to it; padded rows are dropped).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from rlx_triton.integrations.pyannote import SegmentationGraphs

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
    from rlx_triton.integrations._wespeaker import is_wespeaker_model

    embedding = getattr(pipeline, "_embedding", None)
    model = getattr(embedding, "model_", None)
    if not isinstance(model, nn.Module) or not is_wespeaker_model(model):
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


class TrunkGraphs(SegmentationGraphs):
    """A WeSpeaker model's forward(waveforms, weights=masks), captured in a CUDA graph per input shapes and
    replayed, with SegmentationGraphs' rules (the second call of a shape is captured, at most
    MAX_GRAPH_SHAPES shapes, captured again when a parameter changes, eager off CUDA or under autograd)."""

    def eager(self, waveforms, weights):
        return self.model(waveforms, weights=weights)

    def _pair_key(self, waveforms: torch.Tensor, weights: torch.Tensor) -> tuple:
        return self._key(waveforms) + self._key(weights)

    def decide(self, args, kwargs) -> Tuple[str, str]:
        """("replay" | "capture" | "eager", why) for a call forward(waveforms, weights)."""
        if kwargs or len(args) != 2 or not all(isinstance(a, torch.Tensor) for a in args):
            return "eager", "only a call with a waveforms and a weights tensor is captured"
        waveforms, weights = args
        if waveforms.device.type != "cuda" or weights.device != waveforms.device:
            return "eager", "the waveforms and the weights are not both on the same CUDA device"
        if torch.is_grad_enabled() and (waveforms.requires_grad or weights.requires_grad
                                        or any(p.requires_grad for p in self.model.parameters())):
            return "eager", "autograd would record the forward (run under torch.no_grad or torch.inference_mode)"
        if torch.cuda.is_current_stream_capturing():
            return "eager", "a CUDA graph is being captured around the call"
        return self._decide_shape(self._pair_key(waveforms, weights), tuple(waveforms.shape))

    def __call__(self, waveforms: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        decision, _reason = self.decide((waveforms, weights), {})
        if decision == "eager":
            if waveforms.device.type == "cuda":
                key = self._pair_key(waveforms, weights)
                self.seen[key] = self.seen.get(key, 0) + 1
            return self.eager(waveforms, weights)
        return self._replay(self._pair_key(waveforms, weights), decision, (waveforms, weights))


def _clean_segmentations(binary_segmentations, exclude_overlap: bool, embedding) -> Tuple[Any, int]:
    """(segmentations the masks are taken from, min_num_frames): the stock method's own expressions."""
    from pyannote.core import SlidingWindowFeature  # type: ignore  # a pipeline implies pyannote is installed

    duration = binary_segmentations.sliding_window.duration
    _num_chunks, num_frames, _num_speakers = binary_segmentations.data.shape
    if exclude_overlap:
        min_num_samples = embedding.min_num_samples
        num_samples = duration * embedding.sample_rate
        min_num_frames = math.ceil(num_frames * min_num_samples / num_samples)
        clean_frames = 1.0 * (np.sum(binary_segmentations.data, axis=2, keepdims=True) < 2)
        return SlidingWindowFeature(binary_segmentations.data * clean_frames,
                                    binary_segmentations.sliding_window), min_num_frames
    return SlidingWindowFeature(binary_segmentations.data, binary_segmentations.sliding_window), -1


class SharedTrunkEmbeddings:
    """SpeakerDiarization.get_embeddings(file, binary_segmentations, exclude_overlap=False, hook=None) with
    fbank + trunk once per chunk (see the module docstring); installed on a pipeline by `optimize`."""

    def __init__(self, pipeline, cuda_graphs: bool = False):
        self.pipeline = pipeline
        self.cuda_graphs = cuda_graphs
        self.graphs: Optional[TrunkGraphs] = None

    def __deepcopy__(self, memo):
        pipeline = memo.get(id(self.pipeline))
        return SharedTrunkEmbeddings(pipeline if pipeline is not None else self.pipeline, self.cuda_graphs)

    def __getstate__(self):
        return {"pipeline": self.pipeline, "cuda_graphs": self.cuda_graphs, "graphs": None}

    def stock(self, *args, **kwargs):
        return type(self.pipeline).get_embeddings(self.pipeline, *args, **kwargs)

    def shares_the_trunk(self) -> bool:
        model = _embedding_model(self.pipeline)
        return model is not None and not any(module.training for module in model.modules())

    def __call__(self, file, binary_segmentations, exclude_overlap: bool = False,
                 hook: Optional[Callable] = None):
        pipeline = self.pipeline
        num_chunks, _num_frames, num_speakers = binary_segmentations.data.shape
        if not self.shares_the_trunk() or num_chunks == 0 or num_speakers == 0:
            return self.stock(file, binary_segmentations, exclude_overlap=exclude_overlap, hook=hook)
        if pipeline.training:
            cache = file.get("training_cache/embeddings", dict())
            if ("embeddings" in cache) and (pipeline._segmentation.model.specifications.powerset
                                            or (cache["segmentation.threshold"] == pipeline.segmentation.threshold)):
                return cache["embeddings"]
        embeddings = self._embed(file, binary_segmentations, exclude_overlap, hook)
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
        pipeline = self.pipeline
        clean_segmentations, min_num_frames = _clean_segmentations(binary_segmentations, exclude_overlap,
                                                                   pipeline._embedding)
        waveforms: List[torch.Tensor] = []
        masks: List[np.ndarray] = []
        for (chunk, chunk_masks), (_, clean_masks) in zip(binary_segmentations, clean_segmentations):
            waveform, _ = pipeline._audio.crop(file, chunk, mode="pad")
            chunk_masks = np.nan_to_num(chunk_masks, nan=0.0).astype(np.float32)
            clean_masks = np.nan_to_num(clean_masks, nan=0.0).astype(np.float32)
            masks.append(np.stack([clean_mask if np.sum(clean_mask) > min_num_frames else mask
                                   for mask, clean_mask in zip(chunk_masks.T, clean_masks.T)]))
            waveforms.append(waveform[None])
            if len(waveforms) == chunks:
                yield torch.vstack(waveforms), torch.from_numpy(np.stack(masks))
                waveforms, masks = [], []
        if waveforms:
            yield torch.vstack(waveforms), torch.from_numpy(np.stack(masks))

    def _forward(self, model: nn.Module, waveforms: torch.Tensor, masks: torch.Tensor, chunks: int):
        """The (chunks, speakers, dimension) embeddings on the model's device, not waited for."""
        device = self.pipeline._embedding.device
        waveforms, masks = waveforms.to(device), masks.to(device)
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

    def _embed(self, file, binary_segmentations, exclude_overlap: bool, hook: Optional[Callable]) -> np.ndarray:
        pipeline = self.pipeline
        model = _embedding_model(pipeline)
        num_chunks, _num_frames, num_speakers = binary_segmentations.data.shape
        num_samples = int(round(binary_segmentations.sliding_window.duration * pipeline._embedding.sample_rate))
        chunks = chunks_per_forward(torch.device(pipeline._embedding.device), num_samples)
        pairs_per_hook = pipeline.embedding_batch_size
        batch_count = math.ceil(num_chunks * num_speakers / pairs_per_hook)
        if hook is not None:
            hook("embeddings", None, total=batch_count, completed=0)
        rows: List[np.ndarray] = []
        done = [0, 0]   # pairs computed, hook batches reported

        def collect(pending: torch.Tensor) -> None:
            rows.append(pending.cpu().numpy().reshape(-1, pending.shape[-1]))
            done[0] += rows[-1].shape[0]
            while done[1] < batch_count and (min((done[1] + 1) * pairs_per_hook, num_chunks * num_speakers)
                                             <= done[0]):
                done[1] += 1
                if hook is not None:
                    flat = np.concatenate(rows) if len(rows) > 1 else rows[0]
                    rows[:] = [flat]
                    start = (done[1] - 1) * pairs_per_hook
                    hook("embeddings", flat[start:done[1] * pairs_per_hook], total=batch_count, completed=done[1])

        pending = None
        # the forward of batch i is queued before batch i-1 is copied back and batch i+1 is cropped, so on
        # CUDA the host work overlaps the device's
        for waveforms, masks in self._chunk_batches(file, binary_segmentations, exclude_overlap, chunks):
            launched = self._forward(model, waveforms, masks, chunks)
            if pending is not None:
                collect(pending)
            pending = launched
        if pending is not None:
            collect(pending)
        embeddings = np.concatenate(rows) if len(rows) > 1 else rows[0]
        return embeddings.reshape(num_chunks, num_speakers, -1)


def optimize_pipeline(pipeline, cuda_graphs: bool = False) -> bool:
    """Install SharedTrunkEmbeddings as a SpeakerDiarization pipeline's get_embeddings (in place, once);
    True when the pipeline is one."""
    if not is_speaker_diarization(pipeline):
        return False
    current = pipeline.__dict__.get("get_embeddings")
    if isinstance(current, SharedTrunkEmbeddings) and current.pipeline is pipeline:
        current.cuda_graphs = current.cuda_graphs or cuda_graphs
        return True
    # an instance attribute: pyannote's Pipeline.__setattr__ only sorts Parameters, sub-pipelines and models
    object.__setattr__(pipeline, "get_embeddings", SharedTrunkEmbeddings(pipeline, cuda_graphs=cuda_graphs))
    return True


__all__ = ["SharedTrunkEmbeddings", "TrunkGraphs", "chunks_per_forward", "is_speaker_diarization",
           "optimize_pipeline"]
