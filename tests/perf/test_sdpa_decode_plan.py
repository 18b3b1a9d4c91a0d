"""End to end on one real kernel: the split-K decode launcher's own launch plan (`sdpa_decode_plan`).

In the interpreter the launcher runs exactly the plan's records (same kernels, grids, specialisation and
options, nothing launched around the executor; outputs equal to running the records by hand); at a
bench shape, as on an H200, the records are compiled for sm_90 and the analysis is checked against a
hand count.
"""
import math

import pytest
import torch

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import sdpa_decode as kernels
from rlx_triton.devices import profile
from rlx_triton.perf import analyse_plan, launch_count_mismatches
from rlx_triton.perf.roofline import case_totals, occupancy
from rlx_triton.perf.trace import as_compiled
from rlx_triton.router.device import profile_facts, routing_as
from tests.perf.jit_reference import jit_specialization
from tests.reference.sdpa_decode import attention_reference

H200 = profile("h200")


def _routed_candidate(q, k, v):
    import rlx_triton as rt

    with as_compiled(), routing_as(H200):
        return rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).candidate


@pytest.mark.parametrize("kwargs", [
    {},
    {"attn_mask": "bool", "causal": "top_left"},
    {"attn_mask": "float"},
    {"causal": "bottom_right", "cache_seqlens": torch.tensor([64, 9], dtype=torch.int32)},
], ids=["plain", "bool-mask-top-left", "float-mask", "cache-lengths"])
def test_the_launcher_runs_exactly_its_plan(kwargs):
    q, k, v = torch.randn(2, 4, 2, 16), torch.randn(2, 2, 64, 16), torch.randn(2, 2, 64, 16)
    kwargs = dict(kwargs)
    if kwargs.get("attn_mask") == "bool":
        kwargs["attn_mask"] = torch.rand(2, 1, 2, 64) > 0.3
    elif kwargs.get("attn_mask") == "float":
        kwargs["attn_mask"] = torch.randn(1, 4, 1, 64)
    candidate = _routed_candidate(q.to("meta"), k.to("meta"), v.to("meta"))
    with launches.recording() as by_launcher:   # as on 132 SMs: the rule splits, the last split merges
        out, lse = kernels.sdpa_decode(q, k, v, candidate=candidate, sm_count=132, **kwargs)
    plan, (planned_out, planned_lse) = kernels.sdpa_decode_plan(q, k, v, candidate=candidate, sm_count=132, **kwargs)
    assert plan[0].grid[1] > 1 or kwargs.get("causal") == "top_left"   # top-left: 2 keys, one tile
    with launches.recording() as by_plan:
        launches.run(plan)
    assert by_launcher.outside == [] and by_plan.outside == []
    assert [r.describe() for r in by_launcher.records] == [r.describe() for r in plan]
    torch.testing.assert_close(planned_out, out, rtol=0, atol=0)
    torch.testing.assert_close(planned_lse, lse, rtol=0, atol=0)
    ref, _ = attention_reference(q, k, v, **kwargs)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_a_plan_builds_from_meta_tensors_without_allocating():
    q = torch.empty(64, 32, 1, 128, device="meta", dtype=torch.float16)
    k = torch.empty(64, 8, 65536, 128, device="meta", dtype=torch.float16)   # 16 GiB of K and V
    plan, (out, lse) = kernels.sdpa_decode_plan(q, k, k, candidate=_routed_candidate(q, k, k))
    assert out.device.type == "meta" and lse.shape == (64, 32, 1)
    assert plan[0].bytes_read >= 2 * k.numel() * 2


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("perf-cache"))


@pytest.fixture(scope="module")
def bench_shape_analysis(cache_dir):
    """Llama-3-8B decode at batch 1, 16k keys, fp16 (a bench case), routed and planned as on an H200."""
    dims = dict(batch=1, heads=32, kv_heads=8, head_dim=128, seq_kv=16384)
    q = torch.empty(1, 32, 1, 128, device="meta", dtype=torch.float16)
    k = torch.empty(1, 8, 16384, 128, device="meta", dtype=torch.float16)
    candidate = _routed_candidate(q, k, k)
    with as_compiled(), routing_as(H200):   # meta tensors stand for an H200: its 132 SMs feed the split rule
        plan, _ = kernels.sdpa_decode_plan(q, k, k, candidate=candidate)
    kernels_ = analyse_plan(plan, H200, cache_dir=cache_dir)
    return dims, q, k, plan, kernels_


def test_the_grid_is_kv_heads_times_the_devices_splits(bench_shape_analysis):
    _dims, _q, _k, plan, analysed = bench_shape_analysis
    # 1 sequence x 8 KV heads x 1 row block; 16 splits (the candidate's cap): 128 programs for 132 SMs
    assert plan[0].grid == (8, 16) and analysed[0].ctas == 128
    assert plan[0].grid[1] == kernels.kv_splits(132, 8, 16384, plan[0].meta["BLOCK_N"], 16)
    assert [k.name for k in analysed] == ["_sdpa_decode_kernel"]        # the merge runs in the same launch


def test_the_launch_reads_k_and_v_once(bench_shape_analysis):
    _dims, q, k, plan, analysed = bench_shape_analysis
    kv_bytes = 2 * 8 * 16384 * 128 * 2
    out_lse = 32 * 128 * 2 + 32 * 4
    partials = 32 * 16 * (128 + 1) * 4 + 8 * 4              # written by each split, read back by the merge; tickets
    assert analysed[0].bytes == kv_bytes + q.numel() * 2 + out_lse + 2 * partials
    assert analysed[0].floor_us == pytest.approx(analysed[0].bytes / 4.8e12 * 1e6, abs=1e-3)
    # the dots as executed: 8 KV heads x 16 packed rows (4 query heads padded), D + Dv = 256
    assert analysed[0].unit == "fp16_mma" and analysed[0].flops == 2 * 8 * 16 * 16384 * 256


def test_occupancy_waves_and_fill_follow_the_compiled_resources(bench_shape_analysis):
    _dims, _q, _k, plan, analysed = bench_shape_analysis
    split = analysed[0]
    assert split.regs > 0 and split.spills == 0 and split.smem > 0
    assert plan[0].num_stages == 3 and split.ldgsts > 0                     # K and V double-buffered with cp.async
    per_warp = math.ceil(split.regs * 32 / 256) * 256
    by_hand = min(65536 // (per_warp * split.num_warps), 233472 // (split.smem + 1024), 64 // split.num_warps, 32)
    assert split.ctas_per_sm == by_hand == occupancy(H200, split.regs, split.smem, split.num_warps).ctas_per_sm
    assert by_hand >= 2
    assert split.waves == pytest.approx(128 / (132 * by_hand), abs=1e-4)
    assert split.sm_fill == pytest.approx(128 / 132, abs=1e-4)               # 97% of the SMs busy
    # the waves at the achievable bandwidth on the busy SMs (memory-bound), then the merge chain after the last
    # split: 16 splits merge in one level, a ticket, the LSE vector and four partials per dependent L2 read
    memory_us = split.bytes / 4.3e12 * 1e6
    assert split.bound == "memory" and split.chain_steps == {"atomic": 1, "l2_hit": 5}
    assert split.chain_us == pytest.approx((H200.latency_ns("atomic") + 5 * H200.latency_ns("l2_hit")) / 1000,
                                           abs=1e-3)
    assert split.est_us == pytest.approx(memory_us * 132 / 128 + split.chain_us + H200.launch_us, abs=1e-2)
    assert split.mma > 0                                                     # fp16 dot on tensor cores


def test_the_case_sums_its_launches(bench_shape_analysis):
    analysed = bench_shape_analysis[4]
    floor_us, est_us, bw_fraction = case_totals(analysed, H200)
    assert est_us == pytest.approx(sum(k.est_us for k in analysed), abs=1e-2)
    assert floor_us == pytest.approx(sum(k.floor_us for k in analysed), abs=1e-2)
    assert bw_fraction == pytest.approx(sum(k.bytes for k in analysed) / (est_us * 1e-6) / 4.3e12, abs=1e-4)


def test_the_recorded_specialisation_is_the_jits(bench_shape_analysis):
    plan = bench_shape_analysis[3]
    for record in plan:
        mine = record.specialization()
        signature, constexprs, attrs = jit_specialization(record.jit, record.args, record.meta)
        assert (dict(mine.signature), dict(mine.constexprs), dict(mine.attrs)) == (signature, constexprs, attrs)
    split = plan[0].specialization()
    assert split.signature["k_ptr"] == "*fp16" and split.attrs[(1,)] == [["tt.divisibility", 16]]
    assert split.signature["seq_q"] == "constexpr"                        # Lq = 1 specialises to a constant


def test_the_routed_candidate_is_what_the_profile_routes_to():
    q = torch.empty(1, 32, 1, 128, device="meta", dtype=torch.float16)
    k = torch.empty(1, 8, 16384, 128, device="meta", dtype=torch.float16)
    facts = profile_facts(H200)
    candidate = _routed_candidate(q, k, k)
    assert facts.device_class == "sm90" and candidate.tag() == kernels.RECIPES["sm90"]
    assert candidate.split_k == 16 and candidate.use_f16_kv


def test_perf_analyses_the_bench_case_from_the_launchers_plan(cache_dir):
    """A bench case traced as on an H200 yields the launcher's records, its stated launch count and an
    estimate (not "no launch plan yet")."""
    from rlx_triton.perf.benches import perf_cases
    from rlx_triton.perf.trace import trace

    facts = profile_facts(H200)
    case = next(c for c in perf_cases("sdpa_decode", facts)
                if c.case == "llama3-8b-gqa b1 h32/8 d128 kv16384" and c.dtype == "float16")
    result = trace(case.call, facts)
    assert not result.error and result.unplanned_families() == []
    assert launch_count_mismatches(result) == []
    assert [r.name for r in result.records] == ["_sdpa_decode_kernel"]
    analysed = analyse_plan(result.records, H200, cache_dir=cache_dir)
    floor_us, est_us, _bw = case_totals(analysed, H200)
    assert 0 < floor_us < est_us and analysed[0].sm_fill == pytest.approx(128 / 132, abs=1e-4)
