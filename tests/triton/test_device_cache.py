"""Packed weights and fbank constants (backends/triton/device_cache.py): cached per weight version, bounded,
pinned under CUDA graph capture, and a constant missing during capture refused with the warm-up to do.

Capture is played by patching `capturing` (a CPU has no CUDA graphs); the GPU check captures for real."""
from __future__ import annotations

import pytest
import torch

from rlx_triton.backends.triton import device_cache


@pytest.fixture
def small_packs(monkeypatch):
    """The weight-pack cache emptied and bounded to 4 entries for the test, its pins dropped after it."""
    packs = device_cache._weight_packs
    monkeypatch.setattr(packs, "limit", 4)
    saved = (dict(packs._entries), dict(packs._pinned))
    packs._entries.clear()
    packs._pinned.clear()
    yield packs
    packs._entries.clear()
    packs._pinned.clear()
    packs._entries.update(saved[0])
    packs._pinned.update(saved[1])


def pack(weight):
    return device_cache.packed_weights("test", [weight], lambda: weight.detach() * 2)


def capture(monkeypatch, on=True):
    monkeypatch.setattr(device_cache, "capturing", lambda device: on)


def test_a_pack_is_built_once_per_weight_version(small_packs):
    weight = torch.randn(3, 4)
    first = pack(weight)
    assert pack(weight) is first
    with torch.no_grad():
        weight.add_(1.0)
    assert pack(weight) is not first and torch.equal(pack(weight), weight * 2)


def test_a_full_cache_evicts_the_oldest_pack_not_all_of_them(small_packs):
    weights = [torch.randn(2) for _ in range(5)]
    packs = [pack(w) for w in weights]
    assert len(small_packs) == 4
    assert pack(weights[4]) is packs[4] and pack(weights[1]) is packs[1]


def test_a_pack_a_capture_reads_is_pinned_and_never_evicted(small_packs, monkeypatch):
    weight = torch.randn(2, 2)
    held = pack(weight)
    capture(monkeypatch)
    assert pack(weight) is held          # the graph reads this pack
    capture(monkeypatch, on=False)
    others = [torch.randn(2) for _ in range(8)]
    for other in others:
        pack(other)
    small_packs.clear()
    assert pack(weight) is held and small_packs.counts() == (0, 1)


def test_a_pack_missing_during_capture_is_built_in_the_graph_and_not_cached(small_packs, monkeypatch):
    weight = torch.randn(2, 2)
    capture(monkeypatch)
    first = pack(weight)
    assert torch.equal(first, weight * 2) and len(small_packs) == 0
    assert pack(weight) is not first


def test_inference_tensors_are_packed_on_every_call(small_packs):
    with torch.inference_mode():
        weight = torch.randn(2)
    assert pack(weight) is not pack(weight) and len(small_packs) == 0


def test_a_constant_missing_during_capture_names_the_warm_up(monkeypatch):
    calls = []

    @device_cache.device_constants
    def ramp(size, device):
        calls.append(size)
        return torch.arange(size, dtype=torch.float32, device=device)

    capture(monkeypatch)
    with pytest.raises(RuntimeError, match="warm up first: make one eager call with the same options on cpu"):
        ramp(5, torch.device("cpu"))
    capture(monkeypatch, on=False)
    built = ramp(5, torch.device("cpu"))
    capture(monkeypatch)
    assert ramp(5, torch.device("cpu")) is built and calls == [5]
    assert ("test_a_constant_missing_during_capture_names_the_warm_up.<locals>.ramp", 5, torch.device("cpu")) \
        in device_cache._constants._pinned


def test_fbank_constants_built_in_inference_mode_are_normal_tensors():
    from rlx_triton.backends.torch_ref.fbank import FbankOptions
    from rlx_triton.backends.triton.fbank import launch as fbank

    with torch.inference_mode():
        window = fbank._window(FbankOptions(window_type="hamming", frame_length=20.0), torch.device("cpu"))
    assert not window.is_inference()
