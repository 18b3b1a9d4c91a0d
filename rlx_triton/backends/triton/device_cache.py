"""Device tensors the Triton launchers build once and reuse: packed weights and per-option-set constants.

Both live in bounded LRUs of rlx_triton.caches ("weight_packs", "fbank_constants"), safe for concurrent
callers, and safe under CUDA graph capture:
- an entry read while a graph is captured is pinned, so it is never evicted under the graph that reads it;
- a weight pack missing during capture is built inside the capture and not cached: the graph holds it and
  replays the packing (it is correct, only slower; a warm-up call before capturing caches it instead);
- a constant missing during capture cannot be built there (it is copied from the host), so the call raises
  one RuntimeError naming the warm-up: one eager call with the same options on the same device.

Weight packs are keyed per weight version (storage, version counter, layout, dtype, device) and tied to the
source tensors by weak references, so an in-place update or load_state_dict packs again and a pack is never
served for another tensor that reuses a freed storage. Inference tensors have no version counter and can
change in place inside torch.inference_mode(), so they are packed on every call (device copies, which a
captured graph replays).
"""
from __future__ import annotations

import functools
import weakref
from typing import Callable, Sequence, TypeVar

import torch

from rlx_triton.caches import BoundedCache

T = TypeVar("T")

_weight_packs: BoundedCache[tuple, tuple] = BoundedCache("weight_packs")
_constants: BoundedCache[tuple, object] = BoundedCache("fbank_constants")


def capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on the current stream of this (CUDA) device."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def weight_version(tensor: torch.Tensor) -> tuple:
    return (tensor.data_ptr(), tensor._version, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
            tensor.device)


def packed_weights(kind: str, tensors: Sequence[torch.Tensor], build: Callable[[], T], *extra) -> T:
    """build() for these source tensors, cached per weight version under (kind, *extra); see the module
    docstring for inference tensors and CUDA graph capture."""
    tensors = list(tensors)
    if any(t.is_inference() for t in tensors):
        return build()
    key = (kind, *extra) + tuple(weight_version(t) for t in tensors)
    in_capture = any(capturing(t.device) for t in tensors)
    hit = _weight_packs.get(key)
    if hit is not None:
        if all(ref() is t for ref, t in zip(hit[0], tensors)):
            if in_capture:
                _weight_packs.pin(key)
            return hit[1]
    if in_capture:
        return build()
    # built as normal tensors even inside inference mode: the cache outlives the call
    with torch.inference_mode(False):
        value = build()
    # a held entry of dead tensors is stale: another tensor reuses a freed storage at the same version
    stored = _weight_packs.put(key, (tuple(weakref.ref(t) for t in tensors), value),
                               replace_stale=lambda held: any(ref() is None for ref in held[0]))
    return stored[1]


def device_constants(build: Callable[..., T]) -> Callable[..., T]:
    """Caches build(*args, device) (hashable args, the device last) in the "fbank_constants" LRU."""

    @functools.wraps(build)
    def cached(*args):
        key = (build.__qualname__, *args)
        value = _constants.get(key, _MISSING)
        device = args[-1]
        if value is _MISSING:
            if capturing(device):
                raise RuntimeError(
                    f"rlx_triton: {build.__name__} for these options on {device} is built from host data, which "
                    f"cannot run inside a CUDA graph capture; warm up first: make one eager call with the same "
                    f"options on {device} before capturing")
            with torch.inference_mode(False):
                value = _constants.put(key, build(*args))
        elif capturing(device):
            _constants.pin(key)
        return value

    return cached


_MISSING = object()
