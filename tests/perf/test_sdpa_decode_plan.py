"""End to end on one real kernel: today's split-K decode launcher written as launch records by hand.

`decode_plan` states, as records, what rlx_triton.backends.triton.sdpa_decode.sdpa_decode launches for a
call without mask, causal masking or cache lengths: the grid and meta from its `_meta` and its launcher's
arithmetic. In the interpreter the records run and agree with the launcher (same kernels, grids,
specialisation and options; same output); at a bench shape, as on an H200, they are compiled for sm_90
and the analysis is checked against a hand count.
"""
import math

import pytest
import torch
import triton

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import sdpa_decode as kernels
from rlx_triton.backends.triton.launches import Launch, describe_call
from rlx_triton.devices import profile
from rlx_triton.perf import analyse_plan
from rlx_triton.perf.roofline import case_totals, occupancy
from rlx_triton.perf.trace import as_compiled
from rlx_triton.router.device import profile_facts, routing_as
from tests.perf.jit_reference import jit_specialization

H200 = profile("h200")
_UNITS = {torch.float16: "fp16_mma", torch.bfloat16: "bf16_mma"}


def decode_plan(query, key, value, candidate):
    """The launcher's launches as records (plus the output buffers): split kernel, then merge unless single pass."""
    batch, num_heads, seq_q, head_dim = query.shape
    num_kv_heads, seq_kv, head_dim_v = key.shape[1], key.shape[2], value.shape[-1]
    group = num_heads // num_kv_heads
    rows = group * seq_q
    meta = kernels._meta(candidate, rows=rows, head_dim=head_dim, head_dim_v=head_dim_v, dtype=query.dtype)
    num_warps, num_stages = meta.pop("num_warps"), meta.pop("num_stages")
    split_k = meta["SPLIT_K"]
    num_m_blocks = triton.cdiv(rows, meta["BLOCK_M"])
    device = query.device
    out = torch.empty((batch, num_heads, seq_q, head_dim_v), device=device, dtype=query.dtype)
    lse = torch.empty((batch, num_heads, seq_q), device=device, dtype=torch.float32)
    if meta["SINGLE_PASS"]:
        part_o, part_lse = out, lse
    else:
        part_o = torch.empty((batch, num_heads, seq_q, split_k, head_dim_v), device=device, dtype=torch.float32)
        part_lse = torch.empty((batch, num_heads, seq_q, split_k), device=device, dtype=torch.float32)
    size = query.element_size()
    q_bytes = query.numel() * size
    kv_bytes = (key.numel() + value.numel()) * size
    written = part_o.numel() * part_o.element_size() + part_lse.numel() * 4
    split = Launch(
        kernels._sdpa_decode_split_kernel, (batch * num_kv_heads * num_m_blocks, split_k),
        (query, key, value, query, query, out, lse, part_o, part_lse,
         query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
         value.stride(0), value.stride(1), value.stride(2), 0, 0, 0, 0,
         num_kv_heads, group, seq_q, seq_kv, head_dim, head_dim_v, num_m_blocks,
         1.0 / math.sqrt(head_dim) * kernels.LOG2E),
        meta=dict(MASK_KIND=kernels.MASK_NONE, CAUSAL=kernels.CAUSAL_NONE, HAS_SEQLENS=False, **meta),
        num_warps=num_warps, num_stages=num_stages, bytes_read=q_bytes + kv_bytes, bytes_written=written,
        flops=2 * batch * num_heads * seq_q * seq_kv * (head_dim + head_dim_v),
        unit=_UNITS.get(query.dtype, "fp32_fma") if meta["DOT_LOWP"] else "fp32_fma")
    plan = [split]
    if not meta["SINGLE_PASS"]:
        plan.append(Launch(
            kernels._sdpa_decode_merge_kernel, (batch * num_heads * seq_q,),
            (part_o, part_lse, out, lse, query, num_heads * seq_q, seq_kv, head_dim_v),
            meta=dict(SPLIT_K=split_k, BLOCK_N=meta["BLOCK_N"], BLOCK_S=triton.next_power_of_2(split_k),
                      BLOCK_DV=meta["BLOCK_DV"], HAS_SEQLENS=False),
            num_warps=4, bytes_read=written, bytes_written=out.numel() * size + lse.numel() * 4,
            flops=3 * part_o.numel()))
    return plan, (out, lse)


def _routed_candidate(q, k, v):
    import rlx_triton as rt

    with as_compiled(), routing_as(H200):
        return rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=True).candidate


def test_the_records_run_what_the_launcher_runs():
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    candidate = _routed_candidate(q.to("meta"), k.to("meta"), v.to("meta"))
    with launches.recording() as by_launcher:
        expected, expected_lse = kernels.sdpa_decode(q, k, v, candidate=candidate)
    plan, (out, lse) = decode_plan(q, k, v, candidate)
    with launches.recording() as by_plan:
        launches.run(plan)
    assert [describe_call(*call) for call in by_launcher.bypassing_calls] == [r.describe() for r in plan]
    assert by_plan.outside == [] and by_plan.records == plan
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-6, atol=1e-6)


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
    with as_compiled():
        plan, _ = decode_plan(q, k, k, candidate)
    kernels_ = analyse_plan(plan, H200, cache_dir=cache_dir)
    return dims, q, k, plan, kernels_


def test_the_split_grid_is_kv_heads_times_splits(bench_shape_analysis):
    _dims, _q, _k, plan, analysed = bench_shape_analysis
    split = analysed[0]
    assert plan[0].grid == (8, 4) and split.ctas == 32          # 1 sequence x 8 KV heads x 1 row block, 4 splits
    assert [k.name for k in analysed] == ["_sdpa_decode_split_kernel", "_sdpa_decode_merge_kernel"]
    assert analysed[1].ctas == 32                               # one program per query row


def test_the_split_reads_k_and_v_once(bench_shape_analysis):
    _dims, q, k, plan, analysed = bench_shape_analysis
    kv_bytes = 2 * 8 * 16384 * 128 * 2
    partials = 32 * 4 * 128 * 4 + 32 * 4 * 4
    assert analysed[0].bytes == kv_bytes + q.numel() * 2 + partials
    assert analysed[0].floor_us == pytest.approx(analysed[0].bytes / 4.8e12 * 1e6, abs=1e-3)
    assert analysed[0].unit == "fp16_mma" and analysed[0].flops == 2 * 32 * 16384 * 256


def test_occupancy_waves_and_fill_follow_the_compiled_resources(bench_shape_analysis):
    _dims, _q, _k, plan, analysed = bench_shape_analysis
    split = analysed[0]
    assert split.regs > 0 and split.spills == 0 and split.smem > 0
    per_warp = math.ceil(split.regs * 32 / 256) * 256
    by_hand = min(65536 // (per_warp * split.num_warps), 233472 // (split.smem + 1024), 64 // split.num_warps, 32)
    assert split.ctas_per_sm == by_hand == occupancy(H200, split.regs, split.smem, split.num_warps).ctas_per_sm
    assert split.waves == pytest.approx(32 / (132 * by_hand), abs=1e-4)
    assert split.sm_fill == pytest.approx(32 / 132, abs=1e-4)                # 24% of the SMs busy
    memory_us = split.bytes / 4.8e12 * 1e6
    assert split.est_us == pytest.approx(memory_us * 132 / 32 + H200.launch_us, abs=1e-2)
    assert split.mma > 0                                                     # fp16 dot on tensor cores


def test_the_case_sums_its_launches(bench_shape_analysis):
    analysed = bench_shape_analysis[4]
    floor_us, est_us, bw_fraction = case_totals(analysed, H200)
    assert est_us == pytest.approx(sum(k.est_us for k in analysed), abs=1e-2)
    assert floor_us == pytest.approx(sum(k.floor_us for k in analysed), abs=1e-2)
    assert bw_fraction == pytest.approx(sum(k.bytes for k in analysed) / (est_us * 1e-6) / 4.8e12, abs=1e-4)


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
    assert facts.device_class == "sm90" and candidate.split_k == 4 and candidate.use_f16_kv


def test_perf_analyses_a_launcher_that_runs_its_plan(monkeypatch, cache_dir):
    """With the decode launcher running `decode_plan` through the executor (the conversion this module
    prototypes), a bench case traced as on an H200 yields its records and an estimate, not "no launch plan"."""
    from rlx_triton.perf.benches import perf_cases
    from rlx_triton.perf.trace import trace

    launcher = kernels.sdpa_decode

    def planned_launcher(query, key, value, *, attn_mask=None, causal="none", scale=None, cache_seqlens=None,
                         candidate):
        if attn_mask is not None or causal != "none" or cache_seqlens is not None or scale is not None:
            return launcher(query, key, value, attn_mask=attn_mask, causal=causal, scale=scale,
                            cache_seqlens=cache_seqlens, candidate=candidate)
        plan, outputs = decode_plan(query, key, value, candidate)
        launches.run(plan)
        return outputs

    monkeypatch.setattr(kernels, "sdpa_decode", planned_launcher)
    facts = profile_facts(H200)
    case = next(c for c in perf_cases("sdpa_decode", facts)
                if c.case == "llama3-8b-gqa b1 h32/8 d128 kv16384" and c.dtype == "float16")
    result = trace(case.call, facts)
    assert not result.error and result.unplanned_families() == []
    assert [r.name for r in result.records] == ["_sdpa_decode_split_kernel", "_sdpa_decode_merge_kernel"]
    analysed = analyse_plan(result.records, H200, cache_dir=cache_dir)
    floor_us, est_us, _bw = case_totals(analysed, H200)
    assert 0 < floor_us < est_us and analysed[0].sm_fill == pytest.approx(32 / 132, abs=1e-4)
