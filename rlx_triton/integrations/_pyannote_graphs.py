"""CUDA graphs of the pyannote models' forwards, captured per input shape and replayed.

`SegmentationGraphs` is installed as a PyanNet's forward by `rt.integrations.pyannote.optimize(model,
cuda_graphs=True)`; `TrunkGraphs` replays a WeSpeaker model's forward(waveforms, weights=masks) for the
pipeline's shared-trunk embeddings (rlx_triton.integrations._pyannote_pipeline). Both follow the same rules:
the second call of an input shape is captured, at most MAX_GRAPH_SHAPES shapes, captured again when a
parameter changes, eager off CUDA, under autograd or while a graph is being captured around the call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch
from torch import nn

from rlx_triton.explaining import explaining_now

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


__all__ = ["GraphCapture", "MAX_GRAPH_SHAPES", "SegmentationGraphs", "TrunkGraphs"]
