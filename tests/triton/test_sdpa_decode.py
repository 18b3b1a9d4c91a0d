"""The split-K decode kernel and its split rule against the float64 reference, in the Triton interpreter (tiny shapes).

Kernel tests run the split rule for a GPU of SPLITTING_SMS SMs, so their tiny launches split as far as
the candidate's split_k and the KV tiles allow (a CPU's single SM would never split)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from rlx_triton.backends.triton import launches
from rlx_triton.backends.triton import sdpa_decode as tk
from rlx_triton.backends.triton._kv_dequant import e4m3fn_to_f32
from rlx_triton.backends.triton.sdpa_decode import kernels as tk_kernels
from rlx_triton.backends.triton.sdpa_decode import launch as tk_launch
from rlx_triton.kv_quant import dequantize, quantize, token_head_scales
from tests.reference.sdpa_decode import (DEGENERATE_CASES, assert_outcome, attention_reference, degenerate_inputs,
                                         tree_reference)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SPLITTING_SMS = 64
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1.6e-2}
TICKETS_ARG = tk_kernels._sdpa_decode_kernel.arg_names.index("tickets_ptr")


def candidate(split_k=2, tile_n=16, tile_m=1, use_f16_kv=True, partial_reduce=True, tg_size=128):
    """Any object with the SdpaDecodeCandidate attribute names drives the launcher."""
    return SimpleNamespace(split_k=split_k, tg_size=tg_size, tile_m=tile_m, tile_n=tile_n, tile_k=64,
                           pad_q=1, pad_kv=1, use_f16_kv=use_f16_kv, partial_reduce=partial_reduce)


def make_qkv(batch, num_heads, num_kv_heads, seq_q, seq_kv, head_dim, head_dim_v=None, dtype=torch.float32):
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    q = torch.randn(batch, num_heads, seq_q, head_dim).to(dtype)
    k = torch.randn(batch, num_kv_heads, seq_kv, head_dim).to(dtype)
    v = torch.randn(batch, num_kv_heads, seq_kv, head_dim_v).to(dtype)
    return q, k, v


def assert_matches(out, lse, ref_out, ref_lse, dtype, seq_kv):
    """Relative tolerance per dtype; atol grows with log2 of the reduced (KV) length."""
    tol = TOL[dtype]
    atol = tol * max(1.0, math.log2(seq_kv + 1))
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=atol, equal_nan=True)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5, equal_nan=True)


def run_and_check(q, k, v, cand=None, sm_count=SPLITTING_SMS, **kw):
    out, lse = tk.sdpa_decode(q, k, v, candidate=cand or candidate(), sm_count=sm_count, **kw)
    ref_out, ref_lse = attention_reference(q, k, v, **kw)
    assert_matches(out, lse, ref_out, ref_lse, q.dtype, k.shape[2])
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim,seq_kv", [(7, 1), (16, 7), (80, 80), (13, 333)])
def test_matches_reference_for_odd_head_dims_and_kv_lengths(dtype, head_dim, seq_kv):
    q, k, v = make_qkv(2, 2, 1, 1, seq_kv, head_dim, dtype=dtype)
    run_and_check(q, k, v)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (6, 1), (3, 3)], ids=["gqa", "mqa", "mha"])
def test_query_heads_of_one_kv_head_share_its_keys(num_heads, num_kv_heads):
    q, k, v = make_qkv(1, num_heads, num_kv_heads, 3, 21, 16, dtype=torch.float16)
    run_and_check(q, k, v)


def test_sixteen_query_tokens_with_a_group_beyond_one_row_tile():
    # 8 query heads per KV head x 16 tokens = 128 packed rows: two row tiles of 64
    q, k, v = make_qkv(1, 8, 1, 16, 19, 16)
    run_and_check(q, k, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_value_head_dim_may_differ_from_key_head_dim(dtype):
    q, k, v = make_qkv(1, 2, 2, 2, 23, 12, head_dim_v=40, dtype=dtype)
    out, _ = run_and_check(q, k, v)
    assert out.shape == (1, 2, 2, 40)


def test_head_dim_256():
    q, k, v = make_qkv(1, 2, 1, 1, 9, 256, head_dim_v=200, dtype=torch.bfloat16)
    run_and_check(q, k, v)


@pytest.mark.parametrize("head_dim_v,chunk", [(64, 4), (200, 1)])
def test_the_merge_reads_several_partials_at_once_except_for_the_widest_value_tiles(head_dim_v, chunk):
    # 8 splits, 5 of them live (80 keys in tiles of 16): with 4 partials per step the second holds one
    q, k, v = make_qkv(1, 2, 1, 1, 80, 16, head_dim_v=head_dim_v)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=8), sm_count=SPLITTING_SMS)
    assert plan[0].meta["MERGE_CHUNK"] == chunk and plan[0].grid[1] == 8
    run_and_check(q, k, v, cand=candidate(split_k=8))


@pytest.mark.parametrize("mask_shape", [(17,), (3, 17), (2, 1, 1, 17), (1, 4, 3, 17)],
                         ids=["keys", "tokens-keys", "batch", "heads"])
def test_bool_mask_broadcasts_without_materialisation(mask_shape):
    q, k, v = make_qkv(2, 4, 2, 3, 17, 16)
    mask = torch.rand(mask_shape) > 0.4
    run_and_check(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_float_mask_is_added_to_the_scores(dtype):
    q, k, v = make_qkv(2, 4, 2, 2, 33, 16, dtype=dtype)
    mask = torch.randn(2, 1, 2, 33).to(dtype)
    mask[0, 0, 0, :5] = float("-inf")
    run_and_check(q, k, v, attn_mask=mask)


def test_causal_top_left_matches_torch_alignment():
    q, k, v = make_qkv(1, 2, 1, 4, 9, 16)
    run_and_check(q, k, v, causal="top_left")


def test_causal_bottom_right_within_each_valid_length():
    q, k, v = make_qkv(3, 2, 1, 4, 40, 16)
    lengths = torch.tensor([40, 9, 3], dtype=torch.int32)  # length 3 < 4 tokens: the first token sees nothing
    out, lse = run_and_check(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    assert torch.isinf(lse[2, :, 0]).all() and (out[2, :, 0] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ragged_cache_lengths_leave_splits_empty(dtype):
    # 4 splits of tile 16 over S_max 80: length 1 has one live split, length 80 has all four
    q, k, v = make_qkv(3, 4, 2, 1, 80, 16, dtype=dtype)
    lengths = torch.tensor([1, 37, 80], dtype=torch.int64)
    run_and_check(q, k, v, cand=candidate(split_k=4), cache_seqlens=lengths)


def test_keys_past_the_valid_length_are_never_read():
    q, k, v = make_qkv(2, 2, 1, 1, 48, 16)
    lengths = torch.tensor([5, 30], dtype=torch.int32)
    k[0, :, 5:] = float("nan")
    v[0, :, 5:] = float("nan")
    out, _ = tk.sdpa_decode(q, k, v, cache_seqlens=lengths, candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    assert torch.isfinite(out).all()


def test_fully_masked_rows_give_zero_output_and_negative_infinite_lse():
    q, k, v = make_qkv(1, 2, 2, 2, 20, 16)
    mask = torch.ones(1, 2, 2, 20, dtype=torch.bool)
    mask[0, 1, 0] = False
    out, lse = run_and_check(q, k, v, attn_mask=mask)
    assert (out[0, 1, 0] == 0).all() and lse[0, 1, 0] == float("-inf")


def test_strided_views_are_read_in_place():
    batch, heads, seq_q, s_max, dim = 2, 4, 2, 50, 16
    q = torch.randn(batch, seq_q, heads, dim).transpose(1, 2)  # (B, H, Lq, D) view of a (B, Lq, H, D) buffer
    cache = torch.randn(batch, 2, s_max, 2 * dim)
    k, v = cache[:, :, :31, :dim], cache[:, :, :31, dim:]  # slices of one fused KV buffer
    assert not q.is_contiguous() and not k.is_contiguous()
    run_and_check(q, k, v)


def test_value_with_a_strided_last_dim_is_copied_first():
    q, k, _ = make_qkv(1, 2, 1, 1, 12, 16)
    v = torch.randn(1, 1, 16, 12).transpose(2, 3)  # last dim stride 12
    run_and_check(q, k, v)


def test_custom_scale():
    q, k, v = make_qkv(1, 2, 1, 1, 25, 16)
    run_and_check(q, k, v, scale=0.37)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_single_pass_candidate_writes_the_output_directly(dtype):
    q, k, v = make_qkv(2, 4, 2, 2, 45, 24, dtype=dtype)
    run_and_check(q, k, v, cand=candidate(split_k=1, partial_reduce=False, tile_n=32),
                  attn_mask=torch.rand(2, 1, 2, 45) > 0.2)


def test_fp32_operands_candidate_on_half_inputs():
    q, k, v = make_qkv(1, 4, 1, 1, 30, 16, dtype=torch.float16)
    run_and_check(q, k, v, cand=candidate(use_f16_kv=False))


def _relative_error(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _sweep_inputs(dtype):
    q, k, v = make_qkv(2, 4, 2, 2, 37, 24, head_dim_v=20, dtype=dtype)
    lengths = torch.tensor([37, 11], dtype=torch.int32)
    return q, k, v, dict(cache_seqlens=lengths, causal="bottom_right")


def test_every_candidate_of_the_plan_matches_the_reference():
    from rlx_triton.router import plans

    plan = plans.plan_for("sdpa_decode")
    assert {c.tag() for c in plan.candidates} == set(tk.APPROVALS)
    for cand in plan.candidates:
        for dtype in DTYPES:
            q, k, v, kw = _sweep_inputs(dtype)
            run_and_check(q, k, v, cand=cand, **kw)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_approved_candidates_hold_their_error_bound(dtype):
    """Each candidate holds the bound its approval states for the request dtype: an f16-KV candidate its fp16
    bound on fp16 inputs, and the fp32 candidate's bound on fp32 inputs (where it keeps fp32 operands)."""
    from rlx_triton.planner import SdpaDecodeCandidate

    for tag, approval in tk.APPROVALS.items():
        cand = SdpaDecodeCandidate.from_tag(tag)
        if dtype == torch.float16 and not cand.use_f16_kv:
            continue   # the fp32 candidate is approved for what it is measured on: fp32 inputs
        q, k, v, kw = _sweep_inputs(dtype)
        out, _ = tk.sdpa_decode(q, k, v, candidate=cand, sm_count=SPLITTING_SMS, **kw)
        ref, _ = attention_reference(q, k, v, **kw)
        assert _relative_error(out, ref) <= approval.error_bound(str(dtype).replace("torch.", "")), tag


@pytest.mark.parametrize("storage", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8], ids=str)
def test_approved_candidates_hold_their_bound_on_each_quantised_storage(storage):
    """A quantised cache is approved per storage dtype: each candidate's storage bound, measured against float64
    attention over the same cache dequantised (per-token-head scales, the kind that multiplies inside the loop),
    on the query dtype its float bound is measured on."""
    from rlx_triton.planner import SdpaDecodeCandidate

    name = str(storage).replace("torch.", "")
    for tag, approval in tk.APPROVALS.items():
        cand = SdpaDecodeCandidate.from_tag(tag)
        q, k, v, kw = _sweep_inputs(torch.float16 if cand.use_f16_kv else torch.float32)
        k_scale, v_scale = token_head_scales(k * 3, storage), token_head_scales(v, storage)
        k_cache, v_cache = quantize(k * 3, k_scale, storage), quantize(v, v_scale, storage)
        out, _ = tk.sdpa_decode(q, k_cache, v_cache, k_scale=k_scale, v_scale=v_scale, candidate=cand,
                                sm_count=SPLITTING_SMS, **kw)
        ref, _ = attention_reference(q, dequantize(k_cache, k_scale), dequantize(v_cache, v_scale), **kw)
        assert _relative_error(out, ref) <= approval.for_storage(name).max_rel_err, tag


@triton.jit
def _decode_e4m3_bytes(src_ptr, dst_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, e4m3fn_to_f32(tl.load(src_ptr + offs)))


def test_the_e4m3_byte_decoder_equals_torch_on_every_byte():
    """Before sm_89 an e4m3 cache reaches the kernel as bytes: its decoder gives torch's value for each of the 256,
    subnormals, both zeros and the NaNs included."""
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out = torch.empty(256, dtype=torch.float32)
    _decode_e4m3_bytes[(1,)](raw, out, BLOCK=256)
    torch.testing.assert_close(out, raw.view(torch.float8_e4m3fn).to(torch.float32), rtol=0, atol=0, equal_nan=True)


def test_fp32_candidate_is_approved_for_high_fidelity_and_f16_kv_ones_are_not():
    from rlx_triton.planner.candidates.sdpa_decode import FP32_VARIANT

    for tag, approval in tk.APPROVALS.items():
        assert approval.covers_profile("high_fidelity") == (tag == FP32_VARIANT.candidate().tag())


def test_top_left_causal_with_a_long_cache_reads_only_the_first_keys():
    q, k, v = make_qkv(1, 2, 1, 3, 70, 16)
    k[:, :, 3:] = float("nan")  # keys no token may see under top-left alignment
    out, _ = tk.sdpa_decode(q, k, v, causal="top_left", candidate=candidate(), sm_count=SPLITTING_SMS)
    ref, _ = attention_reference(q, k[:, :, :3], v[:, :, :3], causal="top_left")
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_meta_maps_the_candidate_fields():
    meta = tk_launch._meta(candidate(split_k=4, tile_n=64, tg_size=256), rows=4, head_dim=24, head_dim_v=24,
                           dtype=torch.float16)
    assert (meta["MAX_SPLITS"], meta["BLOCK_N"]) == (4, 64)
    assert meta["num_warps"] == 4                      # tensor-core tiles: one row of 4 warps, at most tg_size // 32
    assert (meta["BLOCK_M"], meta["BLOCK_D"], meta["BLOCK_DV"]) == (16, 32, 32)
    assert meta["DOT_LOWP"]
    fp32 = tk_launch._meta(candidate(split_k=1, partial_reduce=False, use_f16_kv=False, tg_size=256), rows=1,
                           head_dim=8, head_dim_v=8, dtype=torch.float16)
    assert fp32["MAX_SPLITS"] == 1 and not fp32["DOT_LOWP"] and fp32["BLOCK_D"] == 16 and fp32["num_warps"] == 8


@pytest.mark.parametrize("head_dim,rows", [(128, 4), (256, 64)])
def test_meta_shrinks_tiles_to_the_register_budget(head_dim, rows):
    meta = tk_launch._meta(candidate(tile_n=128, tg_size=128, tile_m=64), rows=rows, head_dim=head_dim,
                           head_dim_v=head_dim, dtype=torch.float16)
    width = meta["BLOCK_D"] + meta["BLOCK_DV"]
    tiles = meta["BLOCK_N"] * width * 2 + meta["BLOCK_M"] * width * 4 + meta["BLOCK_M"] * meta["BLOCK_N"] * 16
    per_thread = tiles / (32 * meta["num_warps"])
    assert per_thread <= tk_launch._THREAD_BYTES_LOWP and meta["BLOCK_M"] >= 16 and meta["BLOCK_N"] >= 16


@pytest.mark.parametrize("head_dim,dtype", [(64, torch.float16), (128, torch.float16), (256, torch.bfloat16),
                                            (128, torch.float32)])
def test_meta_double_buffers_k_and_v_within_the_pipeline_budget(head_dim, dtype):
    meta = tk_launch._meta(candidate(tile_n=128, tg_size=256), rows=4, head_dim=head_dim, head_dim_v=head_dim,
                           dtype=dtype)
    element = torch.empty((), dtype=dtype).element_size()
    pipeline = (tk.NUM_STAGES - 1) * meta["BLOCK_N"] * (meta["BLOCK_D"] + meta["BLOCK_DV"]) * element
    assert pipeline <= tk_launch._PIPELINE_BYTES


def test_meta_caps_the_tile_for_a_short_kv_range():
    meta = tk_launch._meta(candidate(tile_n=128), rows=4, head_dim=64, head_dim_v=64, dtype=torch.float16,
                           max_block_n=32)
    assert meta["BLOCK_N"] == 32


def test_a_partial_reduce_candidate_capped_at_one_split_writes_the_output_directly():
    q, k, v = make_qkv(1, 2, 1, 1, 30, 16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=1, partial_reduce=True), sm_count=SPLITTING_SMS)
    assert plan[0].grid[1] == 1 and plan[0].args[7] is plan[0].args[5]   # no partial buffer: out itself
    run_and_check(q, k, v, cand=candidate(split_k=1, partial_reduce=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cand", [candidate(split_k=1, partial_reduce=False, tile_n=32), candidate(split_k=4)],
                         ids=["single-pass", "split-k"])
@pytest.mark.parametrize("case", list(DEGENERATE_CASES))
def test_degenerate_inputs_match_the_reference(case, cand, dtype):
    """Zeros, constants, one key, NaN/Inf in q, k, v and masks: NaN where torch's math SDPA gives NaN,
    0 with lse -inf for rows that see no key, the reference's values everywhere else."""
    q, k, v, kwargs, expect = degenerate_inputs(case, dtype)
    out, _ = run_and_check(q, k, v, cand=cand, **kwargs)
    assert_outcome(out, expect)


# --- the split rule --------------------------------------------------------------------------------
def test_rule_takes_one_split_where_the_row_blocks_fill_the_gpu():
    assert tk.kv_splits(132, 128, 16384, 64, 16) == 1           # 128 of 132 SMs, as full as any split count gives
    assert tk.kv_splits(108, 216, 4096, 64, 16) == 1            # two whole waves on an A100


def test_rule_splits_up_to_the_candidates_cap_for_few_row_blocks():
    assert tk.kv_splits(132, 8, 65536, 64, 16) == 16            # Llama-3-8B at batch 1: 128 programs
    assert tk.kv_splits(132, 32, 65536, 64, 4) == 4             # split_k bounds it where 32 x 4 fill the GPU


def test_rule_lifts_the_cap_where_split_k_cannot_fill_one_wave():
    # MQA at batch 1 and 2: 16 splits of one or two row blocks would keep 12% or 24% of 132 SMs busy
    assert tk.kv_splits(132, 1, 65536, 64, 16) == 119           # the fewest splits that keep 90% busy
    assert tk.kv_splits(132, 2, 65536, 64, 16) == 60
    assert tk.kv_splits(132, 8, 65536, 64, 4) == 15             # 8 x 4 = 32 programs: lifted as well
    assert tk.last_wave_fill(119, 132) >= tk.MIN_FILL


def test_a_lifted_cap_still_gives_every_split_a_tile_and_stops_at_the_maximum():
    assert tk.kv_splits(132, 1, 1024, 64, 16) == 16             # 16 tiles in the bucket
    assert tk.kv_splits(1000, 1, 1 << 20, 64, 16) == tk.MAX_LIFTED_SPLITS
    assert tk.kv_splits(132, 1, 1 << 20, 64, 256) == tk.MAX_LIFTED_SPLITS     # nor past it for a wide split_k


def test_a_candidate_that_never_splits_is_never_lifted():
    assert tk.kv_splits(132, 1, 65536, 64, 1) == 1


def test_rule_never_gives_a_split_less_than_one_tile_of_the_bucket():
    assert tk.kv_splits(132, 8, 100, 64, 16) == 2               # bucket 128: two tiles of 64
    assert tk.kv_splits(132, 8, 1, 16, 16) == 1


def test_rule_reads_the_kv_length_bucket_so_the_grid_is_fixed_within_it():
    assert {tk.kv_splits(132, 3, n, 16, 16) for n in (65, 100, 128)} == {tk.kv_splits(132, 3, 128, 16, 16)}
    q = torch.randn(1, 4, 1, 16)
    grids = {tk.sdpa_decode_plan(q, torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16), candidate=candidate(split_k=16),
                                 sm_count=132)[0][0].grid for n in (33, 50, 64)}
    assert len(grids) == 1


def test_rule_picks_the_fullest_last_wave_whatever_the_programs_per_sm():
    # 512 row blocks on 132 SMs: 3 waves + 116 (0.88); 9 splits: 4608 = 34 waves + 120 (0.91)
    assert tk.last_wave_fill(512, 132) == pytest.approx(116 / 132)
    assert tk.kv_splits(132, 512, 4096, 64, 16) == 9
    assert tk.last_wave_fill(264, 132) == 1.0


def test_rule_counts_the_programs_resident_per_sm_in_a_wave():
    # 512 row blocks, 3 resident per SM: a wave holds 396; one split leaves a 116-program tail (0.88),
    # two leave 232, more than the 132 SMs (every SM busy)
    assert tk.last_wave_fill(512, 132, 3) == pytest.approx(116 / 132)
    assert tk.last_wave_fill(1024, 132, 3) == 1.0
    assert tk.kv_splits(132, 512, 512, 64, 16, programs_per_sm=3) == 2
    assert tk.kv_splits(132, 128, 65536, 64, 16, programs_per_sm=3) == 2   # 256 programs in one wave


def test_programs_per_sm_follow_the_devices_occupancy_rules():
    from rlx_triton import devices
    from rlx_triton.router.device import routing_as

    tile = dict(block_m=16, block_n=64, block_d=128, block_dv=128, element_bytes=2, num_warps=4, lowp=True)
    with routing_as(devices.profile("h200")):   # 2 x 64 x 256 x 2 B of K/V stages + the 16 x 128 fp32 tile
        assert tk.programs_per_sm(torch.device("meta"), **tile) == 3
    with routing_as(devices.profile("a100")):
        assert tk.programs_per_sm(torch.device("meta"), **tile) == 2
    assert tk.programs_per_sm(torch.device("cpu"), **tile) == 1


def test_a_cpu_never_splits():
    assert tk.kv_splits(1, 3, 65536, 64, 16) == 1
    q, k, v = make_qkv(1, 2, 1, 1, 300, 16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=16))   # CPU tensors: no SMs
    assert plan[0].grid == (1, 1)


def test_short_kv_ranges_take_smaller_tiles_to_reach_more_sms():
    assert tk.block_n_for_short_kv(132, 8, 512, 64) == 32      # 8 x 16 tiles of 32 for 132 SMs
    assert tk.block_n_for_short_kv(132, 8, 65536, 64) == 64
    assert tk.block_n_for_short_kv(132, 1, 16, 64) == 16       # never below 16


def test_one_split_matches_float64():
    q, k, v = make_qkv(2, 4, 2, 1, 70, 16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=4), sm_count=4)   # 4 row blocks, 4 SMs
    assert plan[0].grid == (4, 1)
    run_and_check(q, k, v, cand=candidate(split_k=4), sm_count=4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_maximum_splits_match_float64(dtype):
    # one row block on 132 SMs: the cap lifts to the bucket's 32 tiles of 16; the 21 tiles of 333 keys have
    # 21 live splits, more than MERGE_GROUP, so they merge in two levels (16 + 5)
    q, k, v = make_qkv(1, 4, 1, 1, 333, 16, dtype=dtype)
    cand = candidate(split_k=16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=cand, sm_count=132)
    assert plan[0].grid == (1, 32)
    run_and_check(q, k, v, cand=cand, sm_count=132)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_and_two_level_merges_side_by_side_match_float64(dtype):
    # 30 splits per sequence; live splits 1, 16 (one level, at its limit), 17 (a group of one) and 21
    q, k, v = make_qkv(4, 2, 1, 1, 333, 16, dtype=dtype)
    lengths = torch.tensor([1, 256, 272, 333], dtype=torch.int32)
    cand = candidate(split_k=16)
    plan, (out, lse) = tk.sdpa_decode_plan(q, k, v, candidate=cand, sm_count=132, cache_seqlens=lengths)
    assert plan[0].grid == (4, 30)
    tickets = plan[0].args[TICKETS_ARG]
    for _ in range(2):  # the second launch of the record (a graph replay, a benchmark) reuses the counters
        launches.run(plan)
        assert int(tickets.abs().sum()) == 0
    assert_matches(out, lse, *attention_reference(q, k, v, cache_seqlens=lengths), dtype, 333)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silence_and_constant_values_through_two_merge_levels_under_inference_mode(dtype):
    # zero queries weigh every key alike; constant values make every partial, and so the output, that constant
    q, k, v = make_qkv(1, 4, 1, 1, 333, 16, dtype=dtype)
    q.zero_()
    v.fill_(0.75)
    with torch.inference_mode():
        out, lse = run_and_check(q, k, v, cand=candidate(split_k=16), sm_count=132)   # 21 live splits
    torch.testing.assert_close(out.double(), torch.full_like(out, 0.75, dtype=torch.float64), rtol=TOL[dtype],
                               atol=TOL[dtype])
    torch.testing.assert_close(lse.double(), torch.full_like(lse, math.log(333), dtype=torch.float64))


def test_a_nan_value_in_the_second_merge_group_reaches_the_output():
    q, k, v = make_qkv(1, 4, 1, 1, 333, 16)
    v[0, 0, 300, 3] = float("nan")                               # split 19: the second group of 16
    out, _ = run_and_check(q, k, v, cand=candidate(split_k=16), sm_count=132)
    assert out[..., 3].isnan().all() and out[..., :3].isfinite().all()   # P @ V: that value column only


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sequences_shorter_than_one_tile_beside_long_ones(dtype):
    q, k, v = make_qkv(3, 4, 2, 2, 200, 16, dtype=dtype)
    lengths = torch.tensor([3, 200, 15], dtype=torch.int32)      # tiles of 16: 3 and 15 keys are one tile
    run_and_check(q, k, v, cand=candidate(split_k=8), sm_count=132, cache_seqlens=lengths, causal="bottom_right")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_sequence_lengths_that_leave_splits_empty(dtype):
    # 8 splits of S_max 128 (8 tiles): length 1 has one live split, 40 three, 100 seven, 128 all eight
    q, k, v = make_qkv(4, 2, 1, 1, 128, 16, dtype=dtype)
    lengths = torch.tensor([1, 40, 100, 128], dtype=torch.int64)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=8), sm_count=132, cache_seqlens=lengths)
    assert plan[0].grid == (4, 8)
    run_and_check(q, k, v, cand=candidate(split_k=8), sm_count=132, cache_seqlens=lengths)


def test_every_launch_leaves_the_ticket_counters_at_zero():
    q, k, v = make_qkv(2, 4, 2, 1, 96, 16)
    lengths = torch.tensor([96, 20], dtype=torch.int32)
    plan, (out, lse) = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=4), sm_count=132,
                                           cache_seqlens=lengths)
    for _ in range(2):  # the second launch of the record (a graph replay) reuses the counters the first left
        launches.run(plan)
        assert int(plan[0].args[TICKETS_ARG].abs().sum()) == 0
    assert_matches(out, lse, *attention_reference(q, k, v, cache_seqlens=lengths), torch.float32, 96)


# --- the autotune bridge ---------------------------------------------------------------------------
def _routed(q, k, v):
    import rlx_triton as rt

    with rt.use_backend("triton"):
        return rt.explain(rt.sdpa_decode, q, k, v)


def test_a_routed_launch_goes_through_the_autotune_bridge_with_the_routes_candidate():
    q, k, v = make_qkv(1, 4, 2, 1, 50, 16, dtype=torch.float16)
    route = _routed(q, k, v)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=route.candidate, route=route, sm_count=SPLITTING_SMS)
    record = plan[0]
    assert record.route is route and route.candidate.tag() in record.kernel.tags
    assert record.meta["BLOCK_N"] == record.kernel.config_of(route.candidate).kwargs["BLOCK_N"]
    out, lse = tk.sdpa_decode(q, k, v, candidate=route.candidate, route=route, sm_count=SPLITTING_SMS)
    ref_out, ref_lse = attention_reference(q, k, v)
    assert_matches(out, lse, ref_out, ref_lse, torch.float16, 50)


def test_a_kv_length_growing_inside_its_bucket_keeps_one_autotune_key():
    from rlx_triton.backends.triton.autotune import autotune_key
    from rlx_triton.config import override_settings

    q = torch.randn(1, 4, 1, 16).half()
    tuned_kernels, keys = set(), set()
    with override_settings(tune=False):
        for seq_kv in (65, 100, 128):
            k, v = torch.randn(1, 2, seq_kv, 16).half(), torch.randn(1, 2, seq_kv, 16).half()
            route = _routed(q, k, v)
            plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=route.candidate, route=route, sm_count=SPLITTING_SMS)
            tuned = plan[0].kernel
            key = autotune_key(tuned.arg_names, tuned.key, plan[0].args, {})
            tk.sdpa_decode(q, k, v, candidate=route.candidate, route=route, sm_count=SPLITTING_SMS)
            assert tuned.winner(key) == route.candidate.tag()
            tuned_kernels.add(tuned)
            keys.add(key)
    assert len(tuned_kernels) == 1 and len(keys) == 1
    assert 128 in next(iter(keys))   # the KV bucket, not the length


# --- paged KV caches -----------------------------------------------------------------------------
def paged(k, v, page_size, spare_pages=1, seed=0):
    """k/v (B, Hkv, S, D) cut into pages of page_size (the last one padded) and shuffled into a pool of
    (num_pages, Hkv, page_size, D) with spare pages of noise, and the block table (B, pages) that reads them back."""
    gen = torch.Generator().manual_seed(seed)
    batch, kv_heads, seq_kv = k.shape[:3]
    pages = -(-seq_kv // page_size)
    num_pages = batch * pages + spare_pages
    order = torch.randperm(num_pages, generator=gen)
    table = order[:batch * pages].reshape(batch, pages).to(torch.int32)

    def pool(x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, pages * page_size - seq_kv))
        out = torch.randn(num_pages, kv_heads, page_size, x.shape[-1], generator=gen).to(x.dtype)
        out[table.long().flatten()] = padded.reshape(batch, kv_heads, pages, page_size, -1).transpose(1, 2) \
            .reshape(batch * pages, kv_heads, page_size, -1)
        return out

    return pool(k), pool(v), table


@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_cache_matches_the_contiguous_reference(page_size, dtype):
    q, k, v = make_qkv(2, 4, 2, 2, 37, 16, dtype=dtype)
    lengths = torch.tensor([37, 5], dtype=torch.int32)
    k_pages, v_pages, table = paged(k, v, page_size)
    out, lse = tk.sdpa_decode(q, k_pages, v_pages, causal="bottom_right", cache_seqlens=lengths, block_table=table,
                              candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    ref_out, ref_lse = attention_reference(q, k, v, causal="bottom_right", cache_seqlens=lengths)
    assert_matches(out, lse, ref_out, ref_lse, dtype, k.shape[2])


def test_paged_block_table_entries_past_a_sequences_length_are_never_read():
    q, k, v = make_qkv(2, 2, 1, 1, 32, 16)
    lengths = torch.tensor([3, 32], dtype=torch.int32)
    k_pages, v_pages, table = paged(k, v, 4)
    table[0, 1:] = 10**6  # sequence 0 reaches its first page only
    out, lse = tk.sdpa_decode(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
                              candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    ref_out, ref_lse = attention_reference(q, k, v, cache_seqlens=lengths)
    assert_matches(out, lse, ref_out, ref_lse, torch.float32, 32)


def test_paged_plan_counts_the_block_table_and_the_sequences_capacity():
    q, k, v = make_qkv(2, 4, 2, 1, 64, 16)
    k_pages, v_pages, table = paged(k, v, 16)
    plan, _ = tk.sdpa_decode_plan(q, k_pages, v_pages, block_table=table, candidate=candidate(),
                                  sm_count=SPLITTING_SMS)
    contiguous, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(), sm_count=SPLITTING_SMS)
    assert plan[0].grid == contiguous[0].grid
    assert plan[0].bytes_read == contiguous[0].bytes_read + table.numel() * table.element_size()


# --- FlashAttention's options: ALiBi, cache rows, left padding (with splits) ------------------------
def fa_reference(q, k, v, lengths, *, causal="none", window=(-1, -1), **options):
    """float64 (out, lse) of the kernel's FA options: FA2's kv-cache call on the (B, S, H, D) views (causal
    "bottom_right" is FA's causal=True), its +inf LSE of rows that see no key read as the kernel's -inf."""
    from tests.reference.flash_attn import naive_flash_attn_with_kvcache

    out, lse, _, _ = naive_flash_attn_with_kvcache(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   cache_seqlens=lengths, causal=causal == "bottom_right",
                                                   window_size=window, **options)
    return out.transpose(1, 2), torch.where(lse == math.inf, -math.inf, lse)


@pytest.mark.parametrize("causal, window, per_batch", [
    ("bottom_right", (-1, -1), False),    # the causal window alone: slope x key index
    ("none", (6, 2), True),               # a local window: -slope x |distance to the diagonal|
    ("none", (-1, -1), False),            # no window: -slope x |distance| on both sides of the diagonal
], ids=["key-index", "distance-local", "distance-both-sides"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_alibi_slopes_in_both_of_flash_attentions_forms_across_splits(causal, window, per_batch, dtype):
    q, k, v = make_qkv(2, 4, 2, 3, 70, 16, dtype=dtype)
    lengths = torch.tensor([70, 29], dtype=torch.int32)
    slopes = torch.rand(2, 4) * 0.3 if per_batch else torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out, lse = tk.sdpa_decode(q, k, v, causal=causal, window=window, cache_seqlens=lengths, alibi_slopes=slopes,
                              candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    ref_out, ref_lse = fa_reference(q, k, v, lengths, causal=causal, window=window, alibi_slopes=slopes)
    assert_matches(out, lse, ref_out, ref_lse, dtype, 70)


@pytest.mark.parametrize("paged_cache", [False, True], ids=["contiguous", "paged"])
def test_left_padding_shifts_positions_and_the_splits_share_the_valid_keys(paged_cache):
    q, k, v = make_qkv(3, 4, 2, 2, 80, 16)
    lengths = torch.tensor([80, 33, 9], dtype=torch.int32)
    leftpad = torch.tensor([21, 33, 0], dtype=torch.int32)     # sequence 1 keeps no key: 0 and -inf
    slopes = torch.rand(4) * 0.3
    kw = dict(causal="bottom_right", cache_seqlens=lengths, cache_leftpad=leftpad, alibi_slopes=slopes)
    if paged_cache:
        k_pages, v_pages, table = paged(k, v, 16)
        out, lse = tk.sdpa_decode(q, k_pages, v_pages, block_table=table, candidate=candidate(split_k=4),
                                  sm_count=SPLITTING_SMS, **kw)
    else:
        out, lse = tk.sdpa_decode(q, k, v, candidate=candidate(split_k=4), sm_count=SPLITTING_SMS, **kw)
    ref_out, ref_lse = fa_reference(q, k, v, lengths, causal="bottom_right", cache_leftpad=leftpad,
                                    alibi_slopes=slopes)
    assert bool((out[1] == 0).all()) and bool((lse[1] == -math.inf).all())
    assert_matches(out, lse, ref_out, ref_lse, torch.float32, 80)


def test_cache_batch_idx_reads_each_sequence_from_its_cache_row():
    q, k, v = make_qkv(2, 4, 1, 1, 50, 16)
    rows = torch.randn(4, 1, 50, 16), torch.randn(4, 1, 50, 16)
    batch_idx = torch.tensor([3, 1], dtype=torch.int32)
    rows[0][batch_idx.long()], rows[1][batch_idx.long()] = k, v
    lengths = torch.tensor([50, 17], dtype=torch.int32)
    out, lse = tk.sdpa_decode(q, *rows, cache_seqlens=lengths, cache_batch_idx=batch_idx,
                              candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    ref_out, ref_lse = attention_reference(q, k, v, cache_seqlens=lengths)
    assert_matches(out, lse, ref_out, ref_lse, torch.float32, 50)


# --- index values nobody checked (CUDA graphs, RLX_TRITON_CHECK_VALUES=0): clamped and masked ----------
def guarded(x, before: int, after: int, dim: int):
    """x as a view into a larger NaN-filled buffer, with `before` / `after` NaN rows around it along dim: any
    read outside x turns the output NaN."""
    shape = list(x.shape)
    shape[dim] += before + after
    buffer = torch.full(shape, float("nan"), dtype=x.dtype)
    inner = buffer.narrow(dim, before, x.shape[dim])
    inner.copy_(x)
    return inner


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_sequence_of_length_zero_gives_zero_and_minus_inf_in_every_split_mode(dtype):
    # [0, 37, 0] over 3 splits: the empty sequences have no live split, yet their rows are written
    q, k, v = make_qkv(3, 4, 2, 1, 40, 16, dtype=dtype)
    lengths = torch.tensor([0, 37, 0], dtype=torch.int32)
    for splits in (1, 4):
        out, lse = tk.sdpa_decode(q, k, v, cache_seqlens=lengths, candidate=candidate(split_k=splits),
                                  sm_count=SPLITTING_SMS)
        assert bool((out[0::2] == 0).all()) and bool((lse[0::2] == -math.inf).all())
        assert_matches(out, lse, *attention_reference(q, k, v, cache_seqlens=lengths), dtype, 40)


def test_lengths_outside_the_cache_are_clamped_and_read_nothing_outside_it():
    q, k, v = make_qkv(3, 2, 1, 1, 40, 16)
    k, v = guarded(k, 0, 16, dim=2), guarded(v, 0, 16, dim=2)
    lengths = torch.tensor([45, -3, 40], dtype=torch.int32)      # clamped to [40, 0, 40]
    out, lse = tk.sdpa_decode(q, k, v, cache_seqlens=lengths, causal="bottom_right",
                              candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    ref_out, ref_lse = attention_reference(q, k, v, cache_seqlens=lengths.clamp(0, 40), causal="bottom_right")
    assert_matches(out, lse, ref_out, ref_lse, torch.float32, 40)


def test_pages_outside_the_cache_are_dropped_and_never_read():
    page_size, num_pages = 4, 6
    q = torch.randn(2, 2, 1, 16)
    k_pages = guarded(torch.randn(num_pages, 1, page_size, 16), 1, 1, dim=0)
    v_pages = guarded(torch.randn(num_pages, 1, page_size, 16), 1, 1, dim=0)
    table = torch.tensor([[0, -1, 1], [2, num_pages, 3]], dtype=torch.int32)
    lengths = torch.tensor([12, 10], dtype=torch.int32)
    out, lse = tk.sdpa_decode(q, k_pages, v_pages, cache_seqlens=lengths, block_table=table,
                              candidate=candidate(split_k=2), sm_count=SPLITTING_SMS)
    # what is left: sequence 0 pages 0 and 1 (8 keys), sequence 1 page 2 and the first 2 slots of page 3
    def kept(pages):
        return torch.stack([torch.cat([pages[p] for p in row], dim=1)[:, :8] for row in ((0, 1), (2, 3))])
    ref_out, ref_lse = attention_reference(q, kept(k_pages), kept(v_pages), cache_seqlens=torch.tensor([8, 6]))
    assert_matches(out, lse, ref_out, ref_lse, torch.float32, 12)


def test_cache_rows_outside_the_cache_and_left_paddings_past_the_length_see_no_key():
    q, k, v = make_qkv(4, 2, 1, 1, 24, 16)
    k_rows, v_rows = guarded(k, 1, 1, dim=0), guarded(v, 1, 1, dim=0)
    batch_idx = torch.tensor([4, -1, 0, 3], dtype=torch.int32)    # rows 4 and -1 are outside the cache
    lengths = torch.tensor([24, 24, 20, 24], dtype=torch.int32)
    leftpad = torch.tensor([0, 0, 30, -5], dtype=torch.int32)     # clamped to [0, 0, 20, 0]
    out, lse = tk.sdpa_decode(q, k_rows, v_rows, cache_seqlens=lengths, cache_batch_idx=batch_idx,
                              cache_leftpad=leftpad, candidate=candidate(split_k=2), sm_count=SPLITTING_SMS)
    assert bool((out[:3] == 0).all()) and bool((lse[:3] == -math.inf).all())
    ref_out, ref_lse = attention_reference(q[3:], k[3:], v[3:])
    assert_matches(out[3:], lse[3:], ref_out, ref_lse, torch.float32, 24)


def test_a_launch_allocates_its_own_ticket_counters_and_keeps_none():
    import gc
    import weakref

    q, k, v = make_qkv(1, 2, 1, 1, 64, 16)
    small, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    big_q, big_k, big_v = make_qkv(4, 8, 2, 1, 64, 16)
    big, _ = tk.sdpa_decode_plan(big_q, big_k, big_v, candidate=candidate(split_k=4), sm_count=SPLITTING_SMS)
    first, second = small[0].args[TICKETS_ARG], big[0].args[TICKETS_ARG]
    assert first.data_ptr() != second.data_ptr() and int(first.abs().sum()) == 0
    # a larger launch leaves the first one's counters alone (a captured graph still holds them) ...
    first_ref, second_ref = weakref.ref(first), weakref.ref(second)
    del first, second, big
    gc.collect()
    assert first_ref() is not None and second_ref() is None
    # ... and once the launch that used them is gone, nothing keeps them
    del small
    gc.collect()
    assert first_ref() is None


def test_the_default_launch_compiles_none_of_the_options():
    q, k, v = make_qkv(1, 2, 1, 1, 16, 16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(), sm_count=SPLITTING_SMS)
    flags = plan[0].meta
    assert (flags["ALIBI"], flags["BATCH_IDX"], flags["LEFTPAD"], flags["SOFTCAP"], flags["WINDOW"]) == \
        (tk.ALIBI_NONE, False, False, False, False)


# --- draft trees: speculative decoding's verification (tree_mask) ----------------------------------
def draft_trees(tokens: int, batch: int = 0, seed: int = 0) -> torch.Tensor:
    """A random draft tree's mask (tokens, tokens), or one per sequence (batch, tokens, tokens)."""
    from rlx_triton.perf.cases import draft_tree

    gen = torch.Generator().manual_seed(seed)
    if batch == 0:
        return draft_tree(tokens, gen)
    return torch.stack([draft_tree(tokens, gen) for _ in range(batch)])


def run_tree(q, k, v, tree, *, cand=None, lengths=None, sm_count=SPLITTING_SMS, pages=None, **options):
    """The kernel under a tree mask against float64 (`tree_reference`); pages: (k_pages, v_pages, table) to read
    the same keys through a block table."""
    cache = (k, v) if pages is None else pages[:2]
    extra = {} if pages is None else {"block_table": pages[2]}
    window_left = options.pop("window_left", -1)
    if window_left >= 0:
        options["window"] = (window_left, -1)
    out, lse = tk.sdpa_decode(q, *cache, tree_mask=tree, cache_seqlens=lengths, candidate=cand or candidate(),
                              sm_count=sm_count, **extra, **options)
    ref_out, ref_lse = tree_reference(q, k, v, tree, cache_seqlens=lengths, window_left=window_left,
                                      softcap=options.get("softcap", 0.0), alibi_slopes=options.get("alibi_slopes"))
    assert_matches(out, lse, ref_out, ref_lse, q.dtype, k.shape[2])
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_draft_trees_over_ragged_lengths_match_float64(dtype):
    # per-sequence trees; lengths past the tree, equal to it (no prefix) and shorter than it (its first
    # tokens have no key of their own)
    q, k, v = make_qkv(4, 4, 2, 6, 40, 16, dtype=dtype)
    lengths = torch.tensor([40, 17, 6, 3], dtype=torch.int32)
    run_tree(q, k, v, draft_trees(6, batch=4), lengths=lengths)


def test_a_shared_tree_broadcasts_over_the_batch_in_one_split_and_many():
    q, k, v = make_qkv(2, 6, 3, 5, 70, 24)
    tree = draft_trees(5, seed=3)
    for cand, sms in ((candidate(split_k=1, partial_reduce=False, tile_n=32), 1), (candidate(split_k=4), 132)):
        run_tree(q, k, v, tree, cand=cand, sm_count=sms)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_chain_is_the_causal_mask_bit_for_bit(dtype):
    q, k, v = make_qkv(3, 4, 1, 7, 45, 16, dtype=dtype)
    lengths = torch.tensor([45, 20, 7], dtype=torch.int32)
    chain = torch.ones(7, 7, dtype=torch.bool).tril()
    tree_out, tree_lse = tk.sdpa_decode(q, k, v, tree_mask=chain, cache_seqlens=lengths, candidate=candidate(),
                                        sm_count=SPLITTING_SMS)
    causal_out, causal_lse = tk.sdpa_decode(q, k, v, causal="bottom_right", cache_seqlens=lengths,
                                            candidate=candidate(), sm_count=SPLITTING_SMS)
    assert torch.equal(tree_out, causal_out) and torch.equal(tree_lse, causal_lse)


def test_rows_the_tree_hides_everything_from_give_zero_and_minus_inf():
    # L_b == Q: no prefix, so a row of False sees no key; row 2 of the second sequence keeps its prefix
    q, k, v = make_qkv(2, 2, 1, 4, 24, 16)
    lengths = torch.tensor([4, 24], dtype=torch.int32)
    tree = draft_trees(4, batch=2)
    tree[:, 2] = False
    out, lse = run_tree(q, k, v, tree, lengths=lengths)
    assert bool((out[0, :, 2] == 0).all()) and bool((lse[0, :, 2] == -math.inf).all())
    assert bool(lse[1, :, 2].isfinite().all())


@pytest.mark.parametrize("page_size", [16, 5])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_trees_over_a_paged_cache(page_size, dtype):
    q, k, v = make_qkv(2, 4, 2, 5, 37, 16, dtype=dtype)
    lengths = torch.tensor([37, 9], dtype=torch.int32)
    run_tree(q, k, v, draft_trees(5, batch=2, seed=1), lengths=lengths, pages=paged(k, v, page_size))


def test_sixty_four_drafted_tokens_of_a_gqa_group_span_two_row_tiles():
    # 2 query heads per KV head x 64 tokens = 128 packed rows: two tiles of 64, the tree decided in both
    q, k, v = make_qkv(1, 2, 1, 64, 80, 16, dtype=torch.float16)
    plan, _ = tk.sdpa_decode_plan(q, k, v, tree_mask=draft_trees(64), candidate=candidate(), sm_count=SPLITTING_SMS)
    assert plan[0].meta["BLOCK_M"] == 64 and plan[0].grid[0] == 2
    run_tree(q, k, v, draft_trees(64), lengths=torch.tensor([77]))


@pytest.mark.parametrize("options", [
    dict(window_left=2),                                    # a window by absolute position cuts far ancestors
    dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),   # -slope x |position - key|, both sides
    dict(softcap=1.5, window_left=9, alibi_slopes=torch.rand(3, 4) * 0.3),
], ids=["window", "alibi", "softcap-window-alibi"])
def test_trees_with_flash_attentions_options(options):
    q, k, v = make_qkv(3, 4, 2, 6, 50, 16)
    lengths = torch.tensor([50, 13, 6], dtype=torch.int32)
    tree = draft_trees(6, batch=3, seed=2)
    tree[:, 4, 5] = True                                     # a key after the token's own position
    run_tree(q, k, v, tree, lengths=lengths, **options)


@pytest.mark.parametrize("options, finite", [({}, False), ({"softcap": 2.0}, True)], ids=["plain", "softcap"])
def test_a_nan_key_the_tree_hides_is_masked_as_causal_masking_masks_it(options, finite):
    # additive without FlashAttention's options (the row is NaN, as under the causal mask), dropped with them
    q, k, v = make_qkv(1, 2, 1, 3, 20, 16)
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    k[0, 0, 19, 0] = float("nan")                            # the newest key: token 0 does not see it
    out, _ = tk.sdpa_decode(q, k, v, tree_mask=tree, candidate=candidate(), sm_count=SPLITTING_SMS, **options)
    assert bool(out[:, :, 0].isfinite().all()) == finite and bool(out[:, :, 2].isnan().all())


def test_the_tree_plan_counts_the_mask_once_and_rejects_other_masking():
    q, k, v = make_qkv(2, 4, 2, 4, 64, 16)
    tree = draft_trees(4)
    plan, _ = tk.sdpa_decode_plan(q, k, v, tree_mask=tree, candidate=candidate(), sm_count=SPLITTING_SMS)
    plain, _ = tk.sdpa_decode_plan(q, k, v, candidate=candidate(), sm_count=SPLITTING_SMS)
    assert plan[0].meta["MASK_KIND"] == tk.MASK_TREE and plan[0].bytes_read == plain[0].bytes_read + tree.numel()
    with pytest.raises(ValueError, match="tree_mask"):
        tk.sdpa_decode_plan(q, k, v, tree_mask=tree, causal="bottom_right", candidate=candidate())


@pytest.mark.parametrize("tokens, block_m", [(8, 32), (16, 64), (64, 64)])
def test_tiles_of_a_draft_trees_rows_take_eight_warps_and_one_program_per_sm(tokens, block_m):
    # 4 query heads per KV head x the drafted tokens, D 128 in fp16: 64-key tiles on 8 warps, and the split rule
    # counts one such program per SM (ptxas gives them 170-255 registers a thread)
    from rlx_triton import devices
    from rlx_triton.router.device import routing_as

    meta = tk_launch._meta(candidate(tile_n=128, tg_size=128), rows=4 * tokens, head_dim=128, head_dim_v=128,
                           dtype=torch.float16)
    assert (meta["BLOCK_M"], meta["BLOCK_N"], meta["num_warps"]) == (block_m, 64, 8)
    tile = dict(block_m=block_m, block_n=64, block_d=128, block_dv=128, element_bytes=2, num_warps=8, lowp=True)
    with routing_as(devices.profile("h200")):
        assert tk.programs_per_sm(torch.device("meta"), **tile) == 1


def test_the_kernels_tree_bits_hold_every_query_token_the_coverage_routes():
    assert tk.MAX_SEQ_Q <= tk_kernels.MAX_TREE_TOKENS
    q, k, v = make_qkv(1, 1, 1, 65, 70, 16)
    with pytest.raises(ValueError, match="64 tokens"):
        tk.sdpa_decode_plan(q, k, v, tree_mask=torch.ones(65, 65, dtype=torch.bool), candidate=candidate())
