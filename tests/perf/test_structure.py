"""The issue and latency-chain terms of the performance model, on hand-built launch records and facts.

A loop's passes come from the launch (a kernel stated in rlx_triton/perf/structure.py, else the launch's
work over the work of one pass), the issue time from the warp instructions over the SMs' schedulers at
the warps each one holds, and the chain from the kernel's dependent steps priced at the profile's
latencies; est_us = the waves + the chain + the launch latency, inside [est_low_us, est_high_us].
"""
import math

import pytest
import torch

from rlx_triton.backends.triton import lstm as lstm_kernels
from rlx_triton.backends.triton import sdpa_decode as decode_kernels
from rlx_triton.backends.triton.launches import Launch
from rlx_triton.devices import profile
from rlx_triton.perf.compiled import Compiled
from rlx_triton.perf.launch_estimate import estimate
from rlx_triton.perf.roofline import constants
from rlx_triton.perf.structure import chain_steps, loop_trips
from rlx_triton.planner import LstmVariant
from rlx_triton.router.device import routing_as
from tests.perf.kernels import row_sum_kernel

H200 = profile("h200")
NOMINAL = constants(H200)


def _loop(own, *, spin=False, pass_flops=0, pass_bytes=0, start=0x100, bar=0):
    return {"start": start, "end": start + 16 * own, "depth": 0, "size": own, "own": own, "spin": spin, "mma": 0,
            "ldg128": 0, "ldgsts": 0, "ffma": pass_flops // 64, "pass_flops": pass_flops, "pass_bytes": pass_bytes,
            "bar": bar}


def _facts(loops, kernel_instructions, registers=32, num_warps=4):
    return Compiled(ok=True, registers=registers, shared=0, num_warps=num_warps, spills=0, scope="loop",
                    kernel_instructions=kernel_instructions, loops=loops)


def _row_sum(ctas, *, flops=0, bytes_read=0, num_warps=4):
    x = torch.empty(16, device="meta")
    return Launch(row_sum_kernel, (ctas,), (x, x, 4096), meta={"BLOCK": 128}, num_warps=num_warps, num_stages=2,
                  bytes_read=bytes_read, flops=flops)


def test_passes_of_the_work_loop_are_the_launchs_flops_over_one_pass():
    loops = [_loop(100, pass_flops=64 * 40), _loop(20, pass_flops=64, start=0x2000)]
    record = _row_sum(264, flops=264 * 4 * 64 * 40 * 50)
    trips, rule = loop_trips(record, loops)
    assert rule == "work" and trips == [50.0, 1.0]   # the other loop: one pass per CTA


def test_without_flops_the_passes_come_from_the_bytes_its_loads_move():
    loops = [_loop(30, pass_bytes=512)]
    trips, _ = loop_trips(_row_sum(10, bytes_read=10 * 4 * 512 * 32), loops)
    assert trips == [32.0]


def test_issue_time_of_a_known_trip_count_by_hand():
    # 264 CTAs of 4 warps fit in one wave (16 per SM by registers and warps): 2 CTAs on each SM, 2 warps per
    # scheduler, so each scheduler issues 2 / issue_interval instructions per cycle
    loops = [_loop(100, pass_flops=64 * 40)]
    record = _row_sum(264, flops=264 * 4 * 64 * 40 * 50)
    kernel = estimate(record, _facts(loops, kernel_instructions=160), H200)
    per_warp = 60 + 100 * 50
    rate = min(1.0, 2 / NOMINAL["issue_interval"])
    issue_us = per_warp * 2 * 4 / (4 * H200.clock_hz * rate) * 1e6
    assert kernel.warp_instructions == per_warp * 4 * 264
    assert kernel.issue_us == pytest.approx(issue_us, rel=1e-3)
    assert kernel.bound == "issue" and kernel.chain_steps == {} and kernel.chain_us == 0
    assert kernel.est_us == pytest.approx(issue_us + H200.launch_us, rel=1e-3)


def test_one_warp_per_scheduler_issues_at_one_instruction_per_issue_interval():
    loops = [_loop(100, pass_flops=64 * 40)]
    record = _row_sum(132, flops=132 * 4 * 64 * 40 * 50)   # one CTA of 4 warps per SM: one warp per scheduler
    kernel = estimate(record, _facts(loops, kernel_instructions=100), H200)
    assert kernel.issue_us == pytest.approx(100 * 50 * NOMINAL["issue_interval"] / H200.clock_hz * 1e6, rel=1e-3)


def test_memory_runs_at_the_achievable_bandwidth():
    record = _row_sum(264, bytes_read=10**9)
    kernel = estimate(record, _facts([_loop(10, pass_bytes=512)], kernel_instructions=20), H200)
    assert H200.achievable_bw == 4.3e12 and kernel.bound == "memory"
    assert kernel.est_us == pytest.approx(10**9 / 4.3e12 * 1e6 + H200.launch_us, rel=1e-3)
    assert kernel.est_low_us == pytest.approx(10**9 / 4.8e12 * 1e6 + 0.75 * H200.launch_us, rel=1e-3)
    assert kernel.floor_us == pytest.approx(10**9 / 4.8e12 * 1e6, abs=1e-3)


def test_a_spin_loop_is_reported_apart_and_makes_no_counted_pass():
    loops = [_loop(900, pass_flops=64 * 500), _loop(12, spin=True, start=0x4000)]
    record = _row_sum(64, flops=64 * 4 * 64 * 500 * 589)
    kernel = estimate(record, _facts(loops, kernel_instructions=1000), H200)
    assert kernel.spin_loops == [{"start": 0x4000, "size": 12}]
    assert kernel.warp_instructions == (1000 - 912 + 900 * 589) * 4 * 64


@pytest.fixture(scope="module")
def onchip_record():
    x = torch.empty(32, 589, 60, device="meta")
    module = torch.nn.LSTM(60, 128, 1, bidirectional=True, batch_first=True).to("meta")
    with routing_as(H200):
        plan, _ = lstm_kernels.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=1, dropout=0.0,
                                         training=False, bidirectional=True, batch_first=True,
                                         candidate=LstmVariant.ONCHIP_IEEE.candidate())
    return plan[1]


def _onchip_loops(bar=6):
    """The time loop (FMA work, its CTA barriers) and the poll nested in it (a spin loop with barriers of its own)."""
    return [_loop(385, pass_flops=64 * 131, bar=bar), _loop(26, spin=True, start=0x4000, bar=2)]


def test_the_exchange_chain_is_two_l2_trips_and_the_time_loops_cta_barriers_per_step(onchip_record):
    assert onchip_record.name == "_lstm_onchip_kernel" and onchip_record.meta["SYNC"]
    assert chain_steps(onchip_record) == {"l2_hit": 2 * 589}          # without the SASS: the exchange alone
    assert chain_steps(onchip_record, _onchip_loops(bar=6)) == {"l2_hit": 2 * 589, "cta_barrier": 6 * 589}
    trips, rule = loop_trips(onchip_record, _onchip_loops())
    assert rule == "table" and trips == [589.0, 0.0]


def test_one_launch_per_step_reads_the_exchange_once_without_polling():
    x = torch.empty(2, 5, 3, device="meta")
    module = torch.nn.LSTM(3, 16, 1, bidirectional=True, batch_first=True).to("meta")
    plan, _ = lstm_kernels.lstm_plan(x, None, module._flat_weights, has_biases=True, num_layers=1, dropout=0.0,
                                     training=False, bidirectional=True, batch_first=True,
                                     candidate=LstmVariant.ONCHIP_IEEE.candidate(), step_launches=True)
    step = [record for record in plan if record.name == "_lstm_onchip_kernel"][0]
    assert not step.meta["SYNC"]
    assert chain_steps(step, [_loop(300, pass_flops=64 * 131, bar=4)]) == {"l2_hit": 1, "cta_barrier": 4}


def test_the_chain_is_priced_at_the_profiles_latencies_and_added_after_the_waves(onchip_record):
    kernel = estimate(onchip_record, _facts(_onchip_loops(), kernel_instructions=672, registers=76, num_warps=8), H200)
    assert kernel.chain_steps == {"l2_hit": 2 * 589, "cta_barrier": 6 * 589}
    steps = kernel.chain_steps
    chain_ns = sum(count * NOMINAL[kind] for kind, count in steps.items())
    assert kernel.chain_us == pytest.approx(chain_ns / 1000, rel=1e-4)
    waves_us = kernel.est_us - kernel.chain_us - H200.launch_us
    assert waves_us == pytest.approx(max(kernel.issue_us, kernel.memory_us, kernel.compute_us), rel=1e-3)
    assert kernel.bound == "latency" and kernel.est_low_us < kernel.est_us < kernel.est_high_us


def _decode_record(seq_kv, kv_heads=1, **options):
    q = torch.empty(1, 32, 1, 128, device="meta", dtype=torch.float16)
    k = torch.empty(1, kv_heads, seq_kv, 128, device="meta", dtype=torch.float16)
    candidate = decode_kernels.RECIPES["sm90"]
    from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeCandidate

    with routing_as(H200):
        plan, _ = decode_kernels.sdpa_decode_plan(q, k, k, candidate=SdpaDecodeCandidate.from_tag(candidate),
                                                  **options)
    return plan[0]


@pytest.mark.parametrize("seq_kv, kv_heads", [(32768, 1), (65536, 8)], ids=["two-level", "one-level"])
def test_the_merge_loop_chain_is_a_ticket_the_lse_vector_and_one_l2_trip_per_chunk_of_partials(seq_kv, kv_heads):
    record = _decode_record(seq_kv, kv_heads)
    splits = record.grid[1]
    group = decode_kernels.MERGE_GROUP
    chunk = record.meta["MERGE_CHUNK"]
    assert chunk == 4   # D 128: four partials' loads in flight at once
    if splits > group:   # the group's merge, a second ticket, the merge of the groups
        groups = math.ceil(splits / group)
        expected = {"atomic": 2, "l2_hit": (1 + group // chunk) + (1 + math.ceil(groups / chunk))}
    else:
        expected = {"atomic": 1, "l2_hit": 1 + math.ceil(splits / chunk)}
    assert splits > 1 and chain_steps(record) == expected
    assert (splits > group) == (seq_kv == 32768)
    trips, rule = loop_trips(record, _decode_loops(merge=True))
    tiles = math.ceil(seq_kv / record.meta["BLOCK_N"])
    # no mask: every tile of a whole bucket is a whole tile no mask reaches (the edge loop makes no pass)
    assert rule == "table" and trips == [pytest.approx(tiles / splits), 0.0, 0.0, 0.0, 0.0]


def _decode_loops(merge: bool):
    """The compiled decode kernel's loops: the whole tiles', the edge tiles', and with splits the three merge loops."""
    kv = [_loop(500, pass_flops=131200), _loop(560, pass_flops=131200, start=0x4000)]
    return kv + ([_loop(60, start=0x8000 + i) for i in range(3)] if merge else [])


@pytest.mark.parametrize("tokens, causal", [(8, "none"), (64, "none"), (5, "bottom_right")], ids=["tree8", "tree64",
                                                                                                "causal5"])
def test_only_the_tiles_holding_the_newest_keys_pass_through_the_edge_loop(tokens, causal):
    # 1000 keys in tiles of BLOCK_N: the tree (or the causal diagonal) reaches the tiles from key 1000 - Q on
    q = torch.empty(1, 32, tokens, 128, device="meta", dtype=torch.float16)
    k = torch.empty(1, 8, 1000, 128, device="meta", dtype=torch.float16)
    tree = torch.empty(tokens, tokens, device="meta", dtype=torch.bool) if causal == "none" else None
    from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeCandidate

    with routing_as(H200):
        plan, _ = decode_kernels.sdpa_decode_plan(q, k, k, tree_mask=tree, causal=causal,
                                                  candidate=SdpaDecodeCandidate.from_tag(decode_kernels.RECIPES["sm90"]))
    record = plan[0]
    block_n, splits = record.meta["BLOCK_N"], record.grid[1]
    edge = math.ceil(1000 / block_n) - (1000 - tokens) // block_n
    trips, rule = loop_trips(record, _decode_loops(merge=record.meta["MAX_SPLITS"] > 1))
    assert rule == "table" and 1 <= edge <= 3
    assert trips[:2] == [pytest.approx((math.ceil(1000 / block_n) - edge) / splits), pytest.approx(edge / splits)]


def test_a_mask_that_reaches_every_key_runs_every_tile_as_an_edge_tile():
    q = torch.empty(1, 32, 2, 128, device="meta", dtype=torch.float16)
    k = torch.empty(1, 8, 1000, 128, device="meta", dtype=torch.float16)
    mask = torch.empty(1, 1, 2, 1000, device="meta", dtype=torch.bool)
    from rlx_triton.planner.candidates.sdpa_decode import SdpaDecodeCandidate

    with routing_as(H200):
        plan, _ = decode_kernels.sdpa_decode_plan(q, k, k, attn_mask=mask,
                                                  candidate=SdpaDecodeCandidate.from_tag(decode_kernels.RECIPES["sm90"]))
    record = plan[0]
    trips, _ = loop_trips(record, _decode_loops(merge=record.meta["MAX_SPLITS"] > 1))
    assert trips[0] == 0.0 and trips[1] == pytest.approx(math.ceil(1000 / record.meta["BLOCK_N"]) / record.grid[1])


def test_a_single_split_has_no_merge_chain():
    record = _decode_record(512, 8, sm_count=8)   # 8 row blocks fill 8 SMs: no split
    assert record.grid[1] == 1 and chain_steps(record) == {}


def test_the_tf32x3_conv2d_loops_pass_once_per_tap_and_once_per_tap_and_channel_chunk():
    """The trunk's tf32x3 GEMM loops per tap (pixel offsets, padding masks), then per channel chunk: 9 and 9 x 8
    passes for a 3x3 over 128 channels in chunks of 16 (a downsampling layer: the direct form); the other forms
    one flat loop."""
    from rlx_triton.backends.triton import conv2d as conv2d_kernels
    from rlx_triton.planner import ConvVariant

    x, weight = torch.empty(2, 128, 20, 25, device="meta"), torch.empty(128, 128, 3, 3, device="meta")
    (record,), _ = conv2d_kernels.conv2d_plan(x, weight, stride=2, padding=1,
                                              candidate=ConvVariant["TF32X3_P64_CO64"].candidate())
    loops = [_loop(60), _loop(170, pass_flops=64 * 12, start=0x400)]
    assert not record.meta["WINOGRAD"] and loop_trips(record, loops) == ([9.0, 72.0], "table")
    (flat,), _ = conv2d_kernels.conv2d_plan(x, weight, padding=1, candidate=ConvVariant["IEEE_P64_CO32"].candidate())
    assert loop_trips(flat, [_loop(300, pass_flops=64 * 16)]) == ([9.0 * 4], "table")


def test_the_winograd_conv2d_loops_pass_per_kernel_row_and_chunk_and_never_recompute():
    """The Winograd form loops per kernel row, then per channel chunk (3 and 3 x 8 passes over 128 channels in
    chunks of 16); the direct recompute of a non-finite tile, compiled after it, makes no pass on finite data."""
    from rlx_triton.backends.triton import conv2d as conv2d_kernels
    from rlx_triton.planner import ConvVariant

    x, weight = torch.empty(2, 128, 20, 25, device="meta"), torch.empty(128, 128, 3, 3, device="meta")
    (record,), _ = conv2d_kernels.conv2d_plan(x, weight, padding=1,
                                              candidate=ConvVariant["TF32X3_P128_CO32"].candidate())
    loops = [_loop(40), _loop(360, pass_flops=64 * 24, start=0x400), _loop(40, start=0x2000),
             _loop(270, pass_flops=64 * 12, start=0x2400)]
    assert record.meta["WINOGRAD"] and loop_trips(record, loops) == ([3.0, 24.0, 0.0, 0.0], "table")
