"""Optimize pyannote.audio models and pipelines in place by swapping in rlx_triton modules.

    model = rlx_triton.integrations.pyannote.optimize(model)      # a PyanNet, or any nn.Module
    pipeline = rlx_triton.integrations.pyannote.optimize(pipeline)  # every model it holds; one trunk per chunk
    model = rlx_triton.integrations.pyannote.optimize(model, cuda_graphs=True)  # + CUDA-graph replay
    routes = rlx_triton.integrations.pyannote.explain(model, waveforms)  # {module path: Route}
    summary = rlx_triton.integrations.pyannote.diarize_files(pipeline, paths, "out/")  # RTTM files, resumable

With `cuda_graphs=True` every PyanNet's segmentation forward is captured in a CUDA graph per input shape
and replayed (see `SegmentationGraphs`): pyannote feeds fixed 32 x 10 s batches, so after the first
batch of a shape each forward is one graph launch; other shapes, inputs off CUDA and calls that record
autograd run eagerly.

What runs where in an optimized SpeakerDiarization pipeline (details in
rlx_triton.integrations._pyannote_pipeline and _pyannote_overlap):
- segmentation: the PyanNet, on the current stream, batch by batch as pyannote's Inference feeds it;
- embeddings: the WeSpeaker model once per chunk for all its local speakers, chunk batches sized from the
  device. On CUDA, when a file has more chunks than one segmentation batch, each chunk batch is queued on a
  side stream as soon as the segmentation of its chunks has come back, so embedding and segmentation
  overlap; `get_embeddings` then waits for those results (or, called with other binarized segmentations,
  computes its own). Without the overlap (`get_embeddings.overlap = False`, off CUDA, one segmentation
  batch) the embedding forwards run on the current stream inside `get_embeddings`;
- host: audio cropping and speaker masks per chunk, done while the device computes the previous batch;
  clustering and reconstruction, as pyannote runs them.

Models are recognised by structure (class names and attributes as pyannote.audio 3.x and 4.x define
them); pyannote is never imported. Recognition is a table of recognisers, each a structure predicate
and a swap function; other modules add theirs with `register_recogniser`:

    register_recogniser("wespeaker_resnet", matches=lambda module: ..., swap=lambda module: module)

`diarize_files(pipeline, files, out_dir, *, resume=False, workers=1, runner="local", batch_size=None,
progress=False, **pipeline_kwargs)` runs an (optimized) SpeakerDiarization pipeline over many files and writes
their RTTM files (rlx_triton.integrations._pyannote_files): resumable, in memory that grows with each file's
audio only (clustering in torch, reconstruction chunk by chunk: _pyannote_streaming, _pyannote_clustering),
in several processes or as Ray tasks.

`optimize` imports `rlx_triton.integrations._wespeaker` (if that module exists) so that its
registrations are in the table. Modules and models no recogniser matches are left unchanged.
"""
from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, cast

import torch
from torch import nn

from rlx_triton.explaining import explain_model
# the graphs and the recogniser table live below this module (the pipeline optimizer uses them too); their
# names are this module's as well
from rlx_triton.integrations._pyannote_graphs import MAX_GRAPH_SHAPES, GraphCapture, SegmentationGraphs
from rlx_triton.integrations._pyannote_recognisers import (_RECOGNISERS, Recogniser, recognisers,
                                                        register_recogniser)


# ---------------------------------------------------------------------------------------------
# PyanNet
# ---------------------------------------------------------------------------------------------
def _class_name(obj) -> str:
    return type(obj).__name__


def _is_lstm(module) -> bool:
    """torch's nn.LSTM, or the rt.nn.LSTM an optimize swapped in for one."""
    from rlx_triton.nn.lstm import LSTM

    return isinstance(module, (nn.LSTM, LSTM))


def _is_lstm_stack(lstm) -> bool:
    if _is_lstm(lstm):
        return True
    return isinstance(lstm, nn.ModuleList) and len(lstm) > 0 and all(_is_lstm(m) for m in lstm)


def is_pyannet(module: nn.Module) -> bool:
    """pyannote.audio's PyanNet: sincnet (SincNet), lstm (nn.LSTM or ModuleList of them), optional
    linear (ModuleList of nn.Linear), classifier (nn.Linear) and activation (nn.Module)."""
    if _class_name(module) != "PyanNet" or not isinstance(module, nn.Module):
        return False
    linear = module._modules.get("linear")
    return (_class_name(module._modules.get("sincnet")) == "SincNet"
            and _is_lstm_stack(module._modules.get("lstm"))
            and (linear is None or isinstance(linear, nn.ModuleList) and all(isinstance(l, nn.Linear) for l in linear))
            and isinstance(module._modules.get("classifier"), nn.Linear)
            and isinstance(module._modules.get("activation"), nn.Module))


class _HeadLinears(nn.ModuleList):
    """The model's `linear` list once the fused head runs them: still registered (state_dict keys,
    .to(), parameters) but empty to iteration, so the model's own forward loop skips them."""

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(())

    def layers(self) -> List[nn.Module]:
        return list(self._modules.values())

    def __repr__(self) -> str:
        return nn.Module.__repr__(self)

    def extra_repr(self) -> str:
        return "run by the fused head (classifier)"


_SINCNET_GEOMETRY = ("num_frames", "receptive_field_size", "receptive_field_center")


def _swap_sincnet(model: nn.Module) -> None:
    stock = cast(nn.Module, model.sincnet)
    if _class_name(stock) != "SincNet" or not importlib.util.find_spec("rlx_triton.nn.conv"):
        return
    try:
        from rlx_triton.nn import SincNet
    except (ImportError, AttributeError):
        return
    if isinstance(stock, SincNet):
        return
    try:
        model.sincnet = SincNet.from_pyannote(stock)
    except ValueError:  # a SincNet configuration the rlx forward does not reproduce stays as it is
        return
    # pyannote 4's PyanNet.receptive_field / num_frames call these on its sincnet; they read only `stride`
    for name in _SINCNET_GEOMETRY:
        method = getattr(type(stock), name, None)
        if callable(method) and not hasattr(model.sincnet, name):
            object.__setattr__(model.sincnet, name, types.MethodType(method, model.sincnet))


def _swap_lstm(model: nn.Module) -> None:
    from rlx_triton.nn.lstm import LSTM

    lstm = cast(nn.Module, model.lstm)
    if isinstance(lstm, nn.LSTM):
        model.lstm = LSTM.from_torch(lstm)
    elif not isinstance(lstm, LSTM):
        layers = cast(nn.ModuleList, lstm)
        for i, layer in enumerate(layers):
            if not isinstance(layer, LSTM):
                layers[i] = LSTM.from_torch(cast(nn.LSTM, layer))


def _swap_head(model: nn.Module) -> None:
    from rlx_triton.nn.segdense import SegDense, activation_name

    classifier = cast(nn.Linear, model.classifier)
    activation = activation_name(cast(nn.Module, model.activation))
    if isinstance(classifier, SegDense) or activation is None:
        return
    linear = model._modules.get("linear")
    head_linears = None
    if linear is not None:
        head_linears = _HeadLinears(list(cast(nn.ModuleList, linear)))
    linears = cast(Iterable[nn.Linear], head_linears if head_linears is not None else nn.ModuleList())
    model.classifier = SegDense(linears, classifier, activation, register_linears=False)
    if head_linears is not None:
        model.linear = head_linears
    model.activation = nn.Identity()


def swap_pyannet(model: nn.Module) -> nn.Module:
    """SincNet -> rlx SincNet, the LSTM stack -> rlx LSTMs (shared parameters), the dense head
    (linear + leaky ReLU stack, classifier, activation) -> one SegDense; state_dict keys unchanged
    for the LSTM and the head."""
    _swap_sincnet(model)
    _swap_lstm(model)
    _swap_head(model)
    return model


register_recogniser("pyannet", is_pyannet, swap_pyannet)


# ---------------------------------------------------------------------------------------------
# CUDA graphs of the segmentation forward (rlx_triton.integrations._pyannote_graphs)
# ---------------------------------------------------------------------------------------------
def _is_optimized_pyannet(module: nn.Module) -> bool:
    from rlx_triton.nn.segdense import SegDense

    return _class_name(module) == "PyanNet" and isinstance(module._modules.get("classifier"), SegDense)


def _install_graphs(module: nn.Module) -> None:
    if not isinstance(module.__dict__.get("forward"), SegmentationGraphs):
        module.forward = SegmentationGraphs(module)


# ---------------------------------------------------------------------------------------------
# optimize / explain
# ---------------------------------------------------------------------------------------------
def _take_the_mode_of_their_owners(module: nn.Module, training: bool, originals: set) -> None:
    """Every module under `module` that a swap created (not in `originals`) takes the train/eval mode of
    its nearest original owner, so an eval model stays eval through and through (nn.Module starts in train
    mode, and code that reads `module.training`, pyannote's included, must see the mode the user set)."""
    for child in module.children():
        if id(child) not in originals:
            child.training = training
        _take_the_mode_of_their_owners(child, child.training, originals)


def _swap(recogniser: Recogniser, module: nn.Module) -> nn.Module:
    originals = list(module.modules())   # held, so that no new module can reuse a replaced one's id
    training = module.training
    swapped = recogniser.swap(module)
    if swapped is not module:
        swapped.training = training
    _take_the_mode_of_their_owners(swapped, swapped.training, {id(m) for m in originals})
    return swapped


def _optimize_module(module: nn.Module, table: List[Recogniser]) -> nn.Module:
    for recogniser in table:
        if recogniser.matches(module):
            return _swap(recogniser, module)
    for name, child in list(module._modules.items()):
        if child is None:
            continue
        new_child = _optimize_module(child, table)
        if new_child is not child:
            setattr(module, name, new_child)
    return module


def _held_modules(obj, depth: int, seen: set) -> Iterator[Tuple[Any, Any, nn.Module]]:
    """(owner, attribute or key, module) for every nn.Module reachable through a pipeline's attributes and
    the dicts, lists and tuples they hold (e.g. `_segmentation.model`, `_embedding.model_`, and pyannote.audio's
    `Pipeline._models` dict), at most `depth` levels deep."""
    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return
    for name, value in list(attrs.items()):
        yield from _held_in(obj, name, value, depth, seen)


def _held_in(owner, name, value, depth: int, seen: set) -> Iterator[Tuple[Any, Any, nn.Module]]:
    if isinstance(value, nn.Module):
        if id(value) not in seen:
            seen.add(id(value))
            yield owner, name, value
    elif isinstance(value, (str, bytes, int, float, bool, torch.Tensor)) or value is None:
        return
    elif isinstance(value, (dict, list, tuple)):
        if depth <= 0 or id(value) in seen:
            return
        seen.add(id(value))
        for key, item in list(value.items() if isinstance(value, dict) else enumerate(value)):
            yield from _held_in(value, key, item, depth - 1, seen)
    else:
        yield from _held_modules(value, depth - 1, seen)


def _put(owner, name, module: nn.Module) -> None:
    """Stores a replacement module where the original was held (a tuple's item cannot be replaced)."""
    if isinstance(owner, (dict, list)):
        owner[name] = module
    elif not isinstance(owner, tuple):
        setattr(owner, name, module)


def optimize(model, *, cuda_graphs: bool = False):
    """Swap rlx_triton modules into a pyannote.audio model, or into every model a pipeline holds, in place.

    Recognised by structure (pyannote is never imported): PyanNet (SincNet -> rt.nn.SincNet, the LSTM
    stack -> rt.nn.LSTM, the linear + classifier + activation head -> one rt.nn.SegDense) and WeSpeaker
    ResNet (fbank front end, ResNet trunk with BatchNorm folded, statistics pooling, projection).
    Other modules are left as they are; more recognisers can be added with register_recogniser.
    A SpeakerDiarization pipeline with a WeSpeaker embedding model also gets a `get_embeddings` that runs
    fbank and trunk once per chunk for all its local speakers (`_pyannote_pipeline.SharedTrunkEmbeddings`:
    same embeddings, NaN rows, order and hook calls as pyannote's), and a `get_segmentations` that can
    start those embeddings while the segmentation runs (`_pyannote_overlap.OverlappedSegmentation`: the
    same results as without it; on CUDA for files with more chunks than one segmentation batch, and
    `pipeline.get_embeddings.overlap = True | False | None` forces it, turns it off or leaves it to that rule).

    The state_dict keeps its keys and values (the rlx modules hold the model's own Parameter and buffer
    objects): a stock checkpoint loads into the optimized model with strict=True, and the optimized
    model's state_dict loads into a stock model. Optimize in eval mode, after loading weights.

    Args:
        model: an nn.Module, or an object (a pyannote Pipeline) whose attributes hold nn.Modules.
        cuda_graphs: bool (TypeError otherwise); True: every PyanNet found also replays its segmentation
            forward from CUDA graphs, one per input shape (`SegmentationGraphs`; other shapes, inputs off
            CUDA and calls that record autograd run eagerly), and a SpeakerDiarization pipeline's embedding
            forward replays a graph at its fixed chunk-batch shape (`TrunkGraphs`).

    Returns:
        the same object (for a module a recogniser replaces whole, the replacement).

    Example:
        >>> import torch, rlx_triton as rt
        >>> plain = torch.nn.Sequential(torch.nn.Linear(4, 4))   # no recognised part: unchanged
        >>> rt.integrations.pyannote.optimize(plain) is plain
        True
    """
    if not isinstance(cuda_graphs, bool):
        raise TypeError(f"optimize: cuda_graphs must be True or False, got {cuda_graphs!r}")
    table = recognisers()
    if isinstance(model, nn.Module):
        optimized = [_optimize_module(model, table)]
    else:
        optimized = []
        for owner, name, module in list(_held_modules(model, depth=4, seen=set())):
            new_module = _optimize_module(module, table)
            if new_module is not module:
                _put(owner, name, new_module)
            optimized.append(new_module)
    if cuda_graphs:
        for root in optimized:
            for module in root.modules():
                if _is_optimized_pyannet(module):
                    _install_graphs(module)
    if isinstance(model, nn.Module):
        return optimized[0]
    from rlx_triton.integrations._pyannote_pipeline import optimize_pipeline

    optimize_pipeline(model, cuda_graphs=cuda_graphs)
    return model


def diarize_files(pipeline, files, out_dir, *, resume: bool = False, workers: int = 1, runner: str = "local",
                  batch_size: Optional[int] = None, progress: bool = False, **pipeline_kwargs) -> dict:
    """Diarize audio files with a pyannote.audio SpeakerDiarization pipeline; RTTM files and a summary out.

    Args:
        pipeline: a SpeakerDiarization pipeline object (built in code or loaded), optimized here with
            rt.integrations.pyannote.optimize unless it already is (in place). Workers get this object.
        files: audio paths (a single path is one file). WAV/FLAC/OGG are read with soundfile, other formats
            with pyannote's own loader; every file is mixed down to mono and resampled to the pipeline's rate.
            Their stems (the uris) must differ.
        out_dir: the output folder, created if missing. Per file `<uri>.rttm` (the diarization, pyannote's
            Annotation.write_rttm) and `<uri>.exclusive.rttm` (pyannote 4's exclusive diarization: no
            overlapping turns), each written whole or not at all; then `summary.json`.
        resume: skip the files whose two RTTM files are already in out_dir.
        workers: processes of the local runner (one torch thread each; 1: this process).
        runner: "local" or "ray" (Ray tasks on the cluster this process has initialised, or on a local one
            that ray.init() starts; ImportError without ray: pip install 'rlx-triton[ray]').
        batch_size: chunks per segmentation batch (None: the pipeline's segmentation_batch_size).
        progress: a progress bar over the files on stderr, with hours of audio done and the running RTF.
        **pipeline_kwargs: num_speakers, min_speakers, max_speakers, given to every pipeline call.

    Returns:
        what summary.json holds: {"files": [{"file", "uri", "status": "done" | "skipped" | "failed",
        "error": None or a message naming the file, "seconds": {"segmentation", "embeddings", "clustering",
        "total"}, "audio_seconds", "rtf"}, ...] in the order given, "done": n, "skipped": n, "failed": n}.
        Seconds and rtf are None for files not diarized in this call. A file that cannot be read or
        diarized is "failed"; the others go on, and nothing is raised for it.

    Every runner writes the same bytes. The memory a file takes grows with its audio, not faster
    (rlx_triton.integrations._pyannote_streaming).
    """
    from rlx_triton.integrations._pyannote_files import run_files

    return run_files(pipeline, files, out_dir, resume=resume, workers=workers, runner=runner, batch_size=batch_size,
                     progress=progress, optimizer=optimize, pipeline_kwargs=pipeline_kwargs)


def explain(model: nn.Module, *inputs, **kwargs) -> Dict[str, Any]:
    """{module path: Route} for every rlx module of `model` that runs in `model(*inputs, **kwargs)`
    (rlx_triton.explaining.explain_model, what rt.explain returns for a model).

    The forward runs once, eagerly, under torch.no_grad(); each rlx module records the route its call
    takes (a module called twice gets a second key, "<path>#<n>"). A model optimized with cuda_graphs=True
    also reports, under "<path>#cuda_graphs" ("#cuda_graphs" for the model itself), a GraphCapture:
    whether such a call replays a CUDA graph, is captured, or runs eagerly, and why.

    Example:
        >>> import torch, rlx_triton as rt
        >>> lstm = torch.nn.Sequential(rt.nn.LSTM(8, 16, batch_first=True))
        >>> sorted(rt.integrations.pyannote.explain(lstm, torch.randn(2, 5, 8)))
        ['0']
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"explain: model must be an nn.Module, got {type(model).__name__}")
    return explain_model(model, *inputs, **kwargs)
