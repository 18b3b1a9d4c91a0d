"""Optimize pyannote.audio models and pipelines in place by swapping in rlx_triton modules.

    model = rlx_triton.integrations.pyannote.optimize(model)      # a PyanNet, or any nn.Module
    pipeline = rlx_triton.integrations.pyannote.optimize(pipeline)  # every model it holds; one trunk per chunk
    model = rlx_triton.integrations.pyannote.optimize(model, cuda_graphs=True)  # + CUDA-graph replay
    routes = rlx_triton.integrations.pyannote.explain(model, waveforms)  # {module path: Route}

With `cuda_graphs=True` every PyanNet's segmentation forward is captured in a CUDA graph per input shape
and replayed (see `SegmentationGraphs`): pyannote feeds fixed 32 x 10 s batches, so after the first
batch of a shape each forward is one graph launch; other shapes, inputs off CUDA and calls that record
autograd run eagerly.

Models are recognised by structure (class names and attributes as pyannote.audio 3.x and 4.x define
them); pyannote is never imported. Recognition is a table of recognisers, each a structure predicate
and a swap function; other modules add theirs with `register_recogniser`:

    register_recogniser("wespeaker_resnet", matches=lambda module: ..., swap=lambda module: module)

`optimize` imports `rlx_triton.integrations._wespeaker` (if that module exists) so that its
registrations are in the table. Modules and models no recogniser matches are left unchanged.
"""
from __future__ import annotations

import importlib
import importlib.util
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch
from torch import nn

from rlx_triton.explaining import explain_model, explaining_now


@dataclass(frozen=True)
class Recogniser:
    name: str
    matches: Callable[[nn.Module], bool]  # structure predicate; must not raise for unknown modules
    swap: Callable[[nn.Module], nn.Module]  # swaps rlx modules in, in place; returns the module to keep


_RECOGNISERS: Dict[str, Recogniser] = {}
_EXTENSIONS = ("rlx_triton.integrations._wespeaker",)


def register_recogniser(name: str, matches: Callable[[nn.Module], bool],
                        swap: Callable[[nn.Module], nn.Module]) -> None:
    """Add (or replace, by name) a recogniser. `optimize` walks every module of a model top-down; the
    first recogniser whose `matches(module)` is true gets `swap(module)`, whose result replaces the
    module in its parent (return the module itself for an in-place swap), and the walk does not
    descend into a swapped module."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_recogniser: name must be a non-empty str, got {name!r}")
    if not callable(matches) or not callable(swap):
        raise TypeError("register_recogniser: matches and swap must be callables taking an nn.Module")
    _RECOGNISERS[name] = Recogniser(name, matches, swap)


def recognisers() -> List[Recogniser]:
    _load_extensions()
    return list(_RECOGNISERS.values())


def _load_extensions() -> None:
    for module_name in _EXTENSIONS:
        if importlib.util.find_spec(module_name) is not None:
            importlib.import_module(module_name)


# ---------------------------------------------------------------------------------------------
# PyanNet
# ---------------------------------------------------------------------------------------------
def _class_name(obj) -> str:
    return type(obj).__name__


def _is_lstm_stack(lstm) -> bool:
    if isinstance(lstm, nn.LSTM):
        return True
    return isinstance(lstm, nn.ModuleList) and len(lstm) > 0 and all(isinstance(m, nn.LSTM) for m in lstm)


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
    if _class_name(model.sincnet) != "SincNet" or not importlib.util.find_spec("rlx_triton.nn.conv"):
        return
    try:
        from rlx_triton.nn import SincNet
    except (ImportError, AttributeError):
        return
    if isinstance(model.sincnet, SincNet):
        return
    stock = model.sincnet
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

    lstm = model.lstm
    if isinstance(lstm, nn.LSTM):
        if not isinstance(lstm, LSTM):
            model.lstm = LSTM.from_torch(lstm)
    else:
        for i, layer in enumerate(lstm):
            if not isinstance(layer, LSTM):
                lstm[i] = LSTM.from_torch(layer)


def _swap_head(model: nn.Module) -> None:
    from rlx_triton.nn.segdense import SegDense, activation_name

    if isinstance(model.classifier, SegDense) or activation_name(model.activation) is None:
        return
    linear = model._modules.get("linear")
    head_linears = None
    if linear is not None:
        head_linears = _HeadLinears(list(linear))
    model.classifier = SegDense(head_linears if head_linears is not None else nn.ModuleList(), model.classifier,
                                activation_name(model.activation), register_linears=False)
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
# CUDA graphs of the segmentation forward
# ---------------------------------------------------------------------------------------------
MAX_GRAPH_SHAPES = 8   # captured input shapes per model; further shapes run eagerly

@dataclass(frozen=True)
class GraphCapture:
    """What `explain` reports for a model whose forward replays CUDA graphs: the captured input shapes and
    whether a call with the explained inputs replays one, is captured, or runs eagerly (and why)."""
    module: str
    captured_shapes: Tuple[Tuple[int, ...], ...]
    decision: str   # "replay" | "capture" | "eager"
    reason: str
    backend: str = "cuda_graph"

    def __str__(self) -> str:
        shapes = ", ".join(str(shape) for shape in self.captured_shapes) or "none yet"
        return (f"cuda graphs of {self.module or 'the model'}: {self.decision} ({self.reason}); "
                f"captured shapes: {shapes}")


@dataclass
class _Graph:
    graph: Any
    static_inputs: Tuple[torch.Tensor, ...]
    static_output: torch.Tensor
    weights: tuple


class SegmentationGraphs:
    """A PyanNet's forward, captured in a CUDA graph per input shape and replayed.

    Installed by `optimize(model, cuda_graphs=True)` as the model's `forward` (the class's forward stays the
    eager path). A waveform batch on CUDA, with no autograd to record (no_grad, inference_mode, or no
    parameter requiring grad), of a shape seen before: the first call of a shape runs eagerly (it compiles,
    tunes and packs the weights), the second captures the forward (after a warm-up on a side stream) and
    every later one copies the input into the graph's buffer, replays the graph and returns a copy of its
    output. At most MAX_GRAPH_SHAPES shapes are captured; other shapes, devices and calls run eagerly. A
    graph is captured again when a parameter or buffer is replaced or changed in place (the version
    counters; inference tensors, which have none, are re-read by the graph at every replay, since the rlx
    modules pack them inside the forward). The rlx modules' forwards make no host synchronisation and copy
    nothing from the host, which is what makes the forward capturable."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.graphs: Dict[tuple, _Graph] = {}
        self.seen: Dict[tuple, int] = {}

    def eager(self, *args, **kwargs):
        return type(self.model).forward(self.model, *args, **kwargs)

    def __deepcopy__(self, memo):
        # graphs and their memory pools stay with the original; the copy captures its own
        model = memo.get(id(self.model))
        return type(self)(model if model is not None else self.model)

    def __getstate__(self):
        return {"model": self.model, "graphs": {}, "seen": {}}

    def _weights(self) -> tuple:
        state = []
        for tensor in list(self.model.parameters()) + list(self.model.buffers()):
            version = None if tensor.is_inference() else tensor._version
            state.append((tensor.data_ptr(), version, tensor.dtype, tuple(tensor.shape)))
        return tuple(state)

    @staticmethod
    def _key(x: torch.Tensor) -> tuple:
        return (tuple(x.shape), x.dtype, x.device, tuple(x.stride()), torch.is_inference_mode_enabled())

    def decide(self, args, kwargs) -> Tuple[str, str]:
        """("replay" | "capture" | "eager", why) for a call with these arguments."""
        if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor):
            return "eager", "only a call with one waveform tensor is captured"
        x = args[0]
        if x.device.type != "cuda":
            return "eager", f"the input is on {x.device.type}, not CUDA"
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.model.parameters())):
            return "eager", "autograd would record the forward (run under torch.no_grad or torch.inference_mode)"
        if torch.cuda.is_current_stream_capturing():
            return "eager", "a CUDA graph is being captured around the call"
        return self._decide_shape(self._key(x), tuple(x.shape))

    def explain_forward(self, path: str, inputs: tuple, kwargs: dict, called_directly: bool) -> Dict[str, Any]:
        """What explain_model reports for the module this forward is installed on: its GraphCapture."""
        decision, reason = self.decide(inputs, kwargs) if called_directly else (
            "eager", "not decided here: it depends on the input this submodule receives")
        shapes = tuple(key[0] for key in self.graphs)
        return {f"{path}#cuda_graphs": GraphCapture(path, shapes, decision, reason)}

    def _decide_shape(self, key: tuple, shape: Tuple[int, ...]) -> Tuple[str, str]:
        """The decision for a capturable call, from what was captured and seen of its key."""
        graph = self.graphs.get(key)
        if graph is not None:
            if graph.weights == self._weights():
                return "replay", f"a graph of input shape {shape} is captured"
            return "capture", "a parameter or buffer changed since the graph was captured"
        if len(self.graphs) >= MAX_GRAPH_SHAPES:
            return "eager", f"{MAX_GRAPH_SHAPES} input shapes are captured already"
        if self.seen.get(key, 0) < 1:
            return "eager", f"the first call of input shape {shape} runs eagerly; the next one is captured"
        return "capture", f"input shape {shape} is called again"

    def __call__(self, *args, **kwargs):
        if explaining_now():   # explain sees every rlx module run, which a replay hides
            return self.eager(*args, **kwargs)
        decision, _reason = self.decide(args, kwargs)
        if decision == "eager":
            if args and isinstance(args[0], torch.Tensor) and not kwargs and len(args) == 1:
                key = self._key(args[0])
                self.seen[key] = self.seen.get(key, 0) + 1
            return self.eager(*args, **kwargs)
        return self._replay(self._key(args[0]), decision, args)

    def _replay(self, key: tuple, decision: str, inputs: Tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Replays the graph of `key` (captured first when the decision is "capture") on these inputs."""
        if decision == "capture":
            self.graphs.pop(key, None)
            self.graphs[key] = self._capture(*inputs)
        graph = self.graphs[key]
        for static_input, x in zip(graph.static_inputs, inputs):
            static_input.copy_(x)
        graph.graph.replay()
        return graph.static_output.clone()

    def _capture(self, *inputs: torch.Tensor) -> _Graph:
        static_inputs = tuple(x.clone() for x in inputs)
        device = inputs[0].device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.eager(*static_inputs)      # lazy initialisation happens outside the capture
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_output = self.eager(*static_inputs)
        return _Graph(graph, static_inputs, static_output, self._weights())


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
    same embeddings, NaN rows, order and hook calls as pyannote's).

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
