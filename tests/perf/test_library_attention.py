"""The attention library models (rlx_triton.perf.library.attention) and the torch path's kernels per routed request,
read as specifications: FA2's split rule on worked examples, GQA decode packing its heads, causal work, growth with
the KV length, what is not modelled and why, torch's backend choice, and a library estimate for every bench case."""
import pytest
import torch

from rlx_triton.backends.torch_ref import sdpa_decode, varlen_attention
from rlx_triton.devices import profile
from rlx_triton.perf.library import Unmodelled, kernels_of
from rlx_triton.perf.library.attention import (Attention, fa2, fa2_num_splits, fa3, fa3_num_splits, flashinfer_decode,
                                               torch_sdpa_backend, visited_tiles)
from rlx_triton.perf.roofline import library_estimate
from rlx_triton.router import Request

H200, H100, A100 = profile("h200"), profile("h100-sxm"), profile("a100-80gb")


def _us(op, impl, gpu=H200, dtype="fp16", **shape):
    full = dict(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=32768, head_dim=128, causal=0)
    full.update(shape)
    return library_estimate(kernels_of(op, impl, full, dtype, gpu), gpu)["est_us"]


# FA2's num_splits_heuristic (flash_api.cpp), called with 2 x SMs: on an H200 264 CTA slots
@pytest.mark.parametrize("mblocks, n_blocks, splits", [
    (8, 256, 29),     # B=1, 8 KV heads (GQA swapped), 32k keys in 128-key blocks: the first split >= 85% of best
    (32, 128, 7),     # B=1, 32 heads (MHA decode), 16k keys: 7 splits fill 224 of 264 slots (0.85), within 85% of
                      # the best eligible count's 0.97 (33 is not eligible: 4 blocks per split, as with 32)
    (212, 100, 1),    # the grid already holds 80% of the slots: no split
    (8, 3, 3),        # no more splits than KV blocks
])
def test_fa2_splits_follow_the_published_heuristic(mblocks, n_blocks, splits):
    assert fa2_num_splits(mblocks, 2 * H200.sm_count, n_blocks) == splits


def test_fa2_skips_split_counts_that_give_the_same_blocks_per_split():
    # 64 KV blocks: 12 splits would be 11 splits of 6 blocks, the same as 11, so it is never chosen
    assert all(fa2_num_splits(m, 264, 64) != 12 for m in range(1, 200))


def test_fa3_never_splits_four_kv_blocks_or_a_full_grid():
    assert fa3_num_splits(8, 132, 4, 1, 10**6, False) == 1
    assert fa3_num_splits(200, 132, 1000, 200, 10**6, False) == 1


def test_gqa_decode_packs_the_group_into_the_rows_of_one_kv_head():
    gqa = Attention(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=32768, head_dim=128)
    packed, combine = fa2(gqa, "fp16", H200, api="kvcache")
    assert "ngroups_swapped" in packed.note and packed.ctas == 8 * 29 and "combine" in combine.name
    windowed = fa2(Attention(1, 32, 8, 1, 32768, 128, local=True), "fp16", H200, api="kvcache")[0]
    assert windowed.flops == 4 * packed.flops   # one 64-row tile per query head instead of per KV head
    assert "packed GQA" in fa3(gqa, "fp16", H200)[0].note


def test_a_causal_prefill_costs_about_half_a_full_one_at_long_sequences():
    for impl in ("fa2", "fa3", "cudnn"):
        full = _us("attention_prefill", impl, H100, batch=1, heads=16, kv_heads=16, seq_q=16384, seq_kv=16384)
        causal = _us("attention_prefill", impl, H100, batch=1, heads=16, kv_heads=16, seq_q=16384, seq_kv=16384,
                     causal=1)
        assert 0.45 < causal / full < 0.6, impl


def test_causal_tiles_are_left_of_the_diagonal_and_on_it():
    assert visited_tiles(256, 256, 128, 128, True) == (3, 2, 2)
    assert visited_tiles(1, 4096, 64, 128, True)[0] == 32     # one row at the bottom sees every key
    assert visited_tiles(1, 4096, 64, 128, True, top_left=True)[0] == 1


@pytest.mark.parametrize("op, impl", [("attention_decode", impl) for impl in ("fa2", "fa3", "flashinfer", "cudnn",
                                                                              "torch")]
                         + [("paged_decode", "fa2"), ("paged_decode", "flashinfer")])
def test_decode_estimates_grow_with_the_kv_length(op, impl):
    page = {"page_size": 256} if op == "paged_decode" else {}
    times = [_us(op, impl, seq_kv=seq_kv, **page) for seq_kv in (1024, 8192, 65536)]
    assert times == sorted(times) and times[-1] > 2 * times[0]


def test_long_gqa_decode_is_near_the_bandwidth_floor_for_the_split_kernels():
    floor = 2 * 8 * 65536 * 128 * 2 / H200.achievable_bw * 1e6
    for impl in ("fa2", "fa3", "flashinfer", "cudnn"):
        assert floor < _us("attention_decode", impl, seq_kv=65536) < 1.5 * floor, impl


@pytest.mark.parametrize("op, impl, gpu, dtype, shape, why", [
    ("paged_decode", "fa2", H200, "fp16", {"page_size": 16}, "multiple of 256"),
    ("attention_prefill", "fa3", A100, "fp16", {}, "sm_90"),
    ("attention_decode", "fa2", H200, "fp8", {}, "fp8"),
    ("attention_decode", "fa2", H200, "fp32", {}, "fp16, bf16"),
    ("attention_prefill", "flashinfer", H200, "fp16", {}, "no model"),
    ("attention_decode", "flashinfer", H200, "fp16", {"seq_q": 4}, "one query token"),
])
def test_unmodelled_cases_say_why(op, impl, gpu, dtype, shape, why):
    full = dict(batch=1, heads=32, kv_heads=8, seq_q=1, seq_kv=4096, head_dim=128, causal=0)
    full.update(shape)
    with pytest.raises(Unmodelled, match=why):
        kernels_of(op, impl, full, dtype, gpu)


@pytest.mark.parametrize("gpu, dtype, shape, backend", [
    (H200, "fp16", Attention(1, 32, 8, 1, 4096, 128), "cudnn"),             # cuDNN first on sm90
    (H200, "fp16", Attention(1, 32, 8, 1, 4096, 256), "flash"),             # past the bundled cuDNN's head dim
    (A100, "fp16", Attention(1, 32, 8, 1, 4096, 128), "flash"),             # flash first off sm90
    (A100, "fp16", Attention(1, 32, 8, 1, 4096, 128, mask="bool"), "efficient"),
    (H200, "fp32", Attention(1, 32, 8, 1, 4096, 128), "efficient"),
    (A100, "fp16", Attention(1, 32, 8, 4, 4096, 128, causal=True, top_left=True), "efficient"),  # Lq != S causal
    (A100, "fp32", Attention(1, 32, 8, 1, 4096, 126), "math"),              # 126 is no multiple of 4
])
def test_torch_sdpa_picks_its_backend_by_sdp_utils_rules(gpu, dtype, shape, backend):
    assert torch_sdpa_backend(shape, dtype, gpu)[0] == backend


def _decode_request(op, features, dtype=torch.float16, **fields):
    base = dict(m=4, tokens=1, batch=4, num_heads=32, head_dim=128, seq_q=1, seq_kv=16384, num_kv_heads=8,
                head_dim_v=128)
    base.update(fields)
    return Request.make("sdpa_decode", op, device="cpu", dtype=dtype, fields=base, features=features)


def test_the_sdpa_drop_in_runs_torchs_own_sdpa_backend():
    request = _decode_request("scaled_dot_product_attention", {"mask": "none", "causal": "none", "layout": "batched"})
    kernel, combine = sdpa_decode.library_kernels(request, H200)
    assert kernel.name.startswith("cuDNN") and "torch SDPA -> cuDNN" in kernel.note and "combine" in combine.name
    (kernel, *combine) = sdpa_decode.library_kernels(request, A100)
    assert kernel.name.startswith("FA2")
    lower_right = _decode_request("scaled_dot_product_attention", {"mask": "none", "causal": "bottom_right",
                                                                   "layout": "batched"}, seq_q=4, m=16)
    names = [k.name for k in sdpa_decode.library_kernels(lower_right, A100)]
    assert names[:2] == ["lower_right_mask ones", "lower_right_mask tril"] and "memory-efficient" in names[-1]


def test_rt_sdpa_decode_on_torch_gathers_the_pages_then_runs_the_decomposed_fallback():
    request = _decode_request("sdpa_decode", {"causal": "bottom_right", "paged": True})
    kernels = sdpa_decode.library_kernels(request, H200)
    names = [k.name for k in kernels]
    assert names.index("gather K pages") < names.index("Q.K^T") < names.index("P.V")
    assert "K.to(fp32)" in names and len(kernels) > 20
    contiguous = sdpa_decode.library_kernels(_decode_request("sdpa_decode", {"causal": "bottom_right"}), H200)
    assert library_estimate(contiguous, H200)["est_us"] < library_estimate(kernels, H200)["est_us"]
    softcap = sdpa_decode.library_kernels(_decode_request("sdpa_decode", {"causal": "bottom_right", "softcap": True}),
                                          H200)
    assert "softcap tanh" in [k.name for k in softcap]


def test_rt_sdpa_decode_with_a_tree_mask_on_torch_builds_its_mask_then_runs_torchs_own_sdpa():
    # the library of a draft tree's verification: the pages gathered, the tree's visibility built, torch's SDPA
    # with it as a bool mask (cuDNN on an H200, its bias conversion first)
    tree = dict(m=32, tokens=8, seq_q=8)
    request = _decode_request("sdpa_decode", {"causal": "bottom_right", "mask": "tree", "paged": True}, **tree)
    names = [k.name for k in sdpa_decode.library_kernels(request, H200)]
    assert names.index("gather K pages") < names.index("gather the tree's rows") < names.index("prefix | tree")
    assert names.index("prefix | tree") < names.index("SDPA bool mask -> additive bias") < names.index(
        "cuDNN SDPA forward")
    assert "Q.K^T" not in names and "exp" not in names
    # with FlashAttention's options the torch path is the decomposed attention step, after the same visibility
    capped = _decode_request("sdpa_decode", {"causal": "bottom_right", "mask": "tree", "softcap": True}, **tree)
    names = [k.name for k in sdpa_decode.library_kernels(capped, H200)]
    assert names.index("prefix | tree") < names.index("softcap tanh")


def test_flash_attn_with_kvcache_on_torch_gathers_then_attends():
    request = _decode_request("flash_attn_with_kvcache", {"causal": "none", "paged": True})
    names = [k.name for k in sdpa_decode.library_kernels(request, H200)]
    assert names.index("gather K pages/rows") < names.index("Q.K^T (einsum)")


def test_the_varlen_fallback_launches_per_sequence_after_two_host_syncs():
    fields = dict(tokens=575, batch=64, num_heads=32, head_dim=128, seq_q=512, seq_kv=4608, num_kv_heads=8,
                  head_dim_v=128)
    request = Request.make("varlen_attention", "flash_attn_varlen_func", device="cpu", dtype=torch.float16,
                           fields=fields, features={"causal": "bottom_right", "layout": "packed", "dropout": False})
    kernels = varlen_attention.library_kernels(request, H200)
    assert [k.chain for k in kernels[:2]] == [{"hbm": 1}, {"hbm": 1}]
    assert {k.repeat for k in kernels[2:-3]} == {64}
    assert library_estimate(kernels, H200)["launches"] > 64 * 20


@pytest.mark.parametrize("bench", ["sdpa_decode", "attention_serving"])
def test_every_bench_case_gets_a_library_estimate(bench):
    from rlx_triton.perf import library_path
    from rlx_triton.perf.benches import perf_cases
    from rlx_triton.perf.trace import as_compiled, trace
    from rlx_triton.router.device import profile_facts

    facts = profile_facts(H200)
    with as_compiled():
        cases = perf_cases(bench, facts)
        picked = cases[:: max(1, len(cases) // 6)]
        for case in picked:
            result = trace(case.call, facts)
            assert not result.error, result.error
            estimate = library_path(result.routes, H200)
            assert estimate is not None and estimate["est_us"] > 0, case.case
