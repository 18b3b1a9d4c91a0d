"""The segdense launcher as a launch plan: its records are the launches of `reference_launches` below
(the kernel calls the launcher makes, written out by hand), running them gives the same output, a call
copies nothing from the host, and `launch_count` states how many launches there are."""
from __future__ import annotations

import pytest
import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import segdense as kernels
from rlx_triton.backends.triton.segdense import kernels as segdense_kernels
from rlx_triton.backends.triton.segdense import launch as segdense_launch
from rlx_triton.backends.triton.launches import describe_call
from rlx_triton.planner import SegdenseVariant
from rlx_triton.router import Request
from tests.reference.segdense import random_head


def reference_launches(x, weights, biases, wc, bc, *, activation, candidate):
    """The launcher's kernel calls, written out (direct calls): the head kernel with the layer widths as
    constexprs, then the activation pass unless it is fused."""
    f_in = x.shape[-1]
    rows = x.reshape(-1, f_in).float().contiguous()
    R, C, num_linear = rows.shape[0], wc.shape[0], len(weights)
    dims = [f_in] + [w.shape[0] for w in weights]
    d_max = max(dims)
    w_stack = torch.zeros(max(num_linear, 1), d_max, d_max)
    b_stack = torch.zeros(max(num_linear, 1), d_max)
    for layer, (w, b) in enumerate(zip(weights, biases)):
        w_stack[layer, :w.shape[0], :w.shape[1]] = w.detach()
        b_stack[layer, :w.shape[0]] = b.detach()
    scratch = torch.empty(2 if num_linear else 1, max(R, 1), d_max)
    out = torch.empty(R, C)
    act = kernels.ACTIVATIONS.index(activation)
    meta = segdense_launch._meta(candidate, C)
    grid = (triton.cdiv(R, meta["BLOCK_R"]),)
    segdense_kernels._segdense_kernel[grid](rows, w_stack, b_stack, wc.detach(), bc.detach(), scratch, out,
                                   R, f_in, C, d_max, NUM_LINEAR=num_linear, DIMS=tuple(dims[1:]), ACTIVATION=act,
                                   **meta)
    if not candidate.fused_activation and act != 0:
        segdense_kernels._segdense_activation_kernel[grid](out, R, C, ACTIVATION=act, BLOCK_R=meta["BLOCK_R"],
                                                  BLOCK_C=meta["BLOCK_C"], num_warps=meta["num_warps"])
    return out.reshape(*x.shape[:-1], C)


def _request(rows, activation):
    fields = {"rows": rows, "in_features": 24, "hidden": 16, "classes": 7, "tokens": rows}
    features = {"activation": activation, "linear_layers": 2, "requires_grad": False}
    return Request.make("segdense", "segdense", device="cpu", dtype=torch.float32, fields=fields, features=features)


@pytest.mark.parametrize("variant", [SegdenseVariant.R32_IEEE, SegdenseVariant.R32_IEEE_SPLIT_ACTIVATION],
                         ids=lambda v: v.name)
@pytest.mark.parametrize("activation", ["log_softmax", "none"])
def test_the_records_are_the_launches_the_launcher_made_and_give_its_output(variant, activation):
    candidate = variant.candidate()
    x = torch.randn(2, 21, 24)
    head = random_head(24, [16, 16], 7)
    with launches.recording() as before:
        expected = reference_launches(x, *head, activation=activation, candidate=candidate)
    with launches.recording() as planned:
        got = kernels.segdense(x, *head, activation=activation, candidate=candidate)
    assert planned.outside == [] and len(planned.records) == len(before.bypassing_calls)
    assert [r.describe() for r in planned.records] == [describe_call(*call) for call in before.bypassing_calls]
    assert torch.equal(got, expected)
    assert kernels.launch_count(_request(42, activation), candidate) == len(planned.records)


def test_zero_rows_launch_nothing():
    head = random_head(24, [16, 16], 7)
    with launches.recording() as planned:
        out = kernels.segdense(torch.randn(0, 24), *head, activation="log_softmax",
                               candidate=SegdenseVariant.R32_IEEE.candidate())
    assert out.shape == (0, 7) and planned.records == []
    assert kernels.launch_count(_request(0, "log_softmax"), SegdenseVariant.R32_IEEE.candidate()) == 0


def test_the_pyannote_head_plan_states_its_bytes_and_flops():
    """32 x 589 frames, 256 -> 128 -> 128 -> 7: built from meta tensors, counted by hand."""
    weights, biases, wc, bc = random_head(256, [128, 128], 7)
    weights, biases = [w.to("meta") for w in weights], [b.to("meta") for b in biases]
    wc, bc = wc.to("meta"), bc.to("meta")
    plan, out = kernels.segdense_plan(torch.empty(32, 589, 256, device="meta"), weights, biases, wc, bc,
                                      activation="log_softmax", candidate=SegdenseVariant.R32_IEEE.candidate())
    rows = 32 * 589
    (record,) = plan
    assert out.shape == (rows, 7) and record.grid == (triton.cdiv(rows, 32),)
    assert record.flops == 2 * rows * (256 * 128 + 128 * 128 + 128 * 7)
    assert record.bytes_written == 4 * rows * (128 + 128) + 4 * rows * 7


def test_a_call_copies_nothing_from_the_host_and_packs_once_per_weight_version():
    """The widths are constexprs, the packed weights are cached per version: a second call on meta tensors
    (as on a GPU) makes no host-to-device copy and no new packed weights, and an in-place edit repacks."""
    from rlx_triton.perf.trace import HostSyncs

    weights, biases, wc, bc = random_head(24, [16, 16], 7)
    weights = [w.to("meta") for w in weights]
    biases = [b.to("meta") for b in biases]
    wc, bc = wc.to("meta"), bc.to("meta")
    x = torch.empty(3, 5, 24, device="meta")
    candidate = SegdenseVariant.R32_IEEE.candidate()
    with HostSyncs() as syncs:
        first, _ = kernels.segdense_plan(x, weights, biases, wc, bc, activation="log_softmax", candidate=candidate)
        second, _ = kernels.segdense_plan(x, weights, biases, wc, bc, activation="log_softmax", candidate=candidate)
    assert syncs.events == []
    assert first[0].args[1] is second[0].args[1]            # the same packed weight stack
    with torch.no_grad():
        weights[0].add_(1.0)
    third, _ = kernels.segdense_plan(x, weights, biases, wc, bc, activation="log_softmax", candidate=candidate)
    assert third[0].args[1] is not first[0].args[1]
