"""The ragged attention kernel in the Triton interpreter, against a naive float64 reading of FA2: FlashAttention's
test_flash_attn_varlen_output matrix (head dims 32..256 incl. 59 and 111, MHA/MQA/GQA, causal, local, softcap,
ALiBi, plus sinks and Dv != D) and test_flash_attn_varlen_causal with paged KV (page sizes 1, 16, 256), scaled
down to interpreter sizes; every dtype; NaN; rows that see no key; every candidate; the launch record."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import pytest
import torch

import rlx_triton as rt
from rlx_triton.backends.candidates import plan_candidates
from rlx_triton.backends.triton import varlen_attention as tk
from rlx_triton.planner import VarlenAttentionCandidate
from tests.reference.varlen_attention import assert_out_and_lse_match, make_varlen_inputs, naive_flash_attn_varlen

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass(frozen=True)
class Case:
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    heads: Tuple[int, int] = (6, 6)
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: Optional[str] = None
    sinks: bool = False
    head_dim_v: Optional[int] = None
    page_size: Optional[int] = None

    def inputs(self, dtype=torch.float32, seed=0) -> dict:
        return make_varlen_inputs(self.seqlen_q, self.seqlen_k, self.head_dim, self.heads, dtype=dtype,
                                  head_dim_v=self.head_dim_v, page_size=self.page_size, causal=self.causal,
                                  window=self.window, softcap=self.softcap, alibi=self.alibi, sinks=self.sinks,
                                  seed=seed)


def run_kernel(kw: dict):
    with rt.use_backend("triton", strict=True):
        assert rt.explain(rt.flash_attn_varlen_func, **kw).backend == "triton"
        out, lse, s_dmask = rt.flash_attn_varlen_func(**kw, return_attn_probs=True)
    assert s_dmask is None
    return out, lse


def assert_matches_fa(kw: dict, dtype=torch.float32):
    out, lse = run_kernel(kw)
    ref_out, ref_lse = naive_flash_attn_varlen(**kw)
    assert_out_and_lse_match(out, lse, ref_out, ref_lse, dtype, TOL[dtype])


# FA2's test_flash_attn_varlen_output matrix, sampled so every option meets several others; seqlen pairs
# scaled down from (1, 147), (113, 203), (256, 512), (512, 256), (1023, 1024), ...
VARLEN_OUTPUT = [
    Case(1, 15, 32),
    Case(11, 20, 59, heads=(6, 2), causal=True),
    Case(13, 21, 111, heads=(6, 1), window=(4, 2)),
    Case(10, 25, 40, heads=(6, 2), causal=True, alibi="head"),
    Case(25, 12, 64, causal=True, softcap=3.0),
    Case(17, 17, 80, heads=(6, 1), alibi="batch_head"),
    Case(20, 30, 96, heads=(6, 2), window=(5, 0), softcap=2.0, alibi="head"),
    Case(8, 40, 128, heads=(4, 1), causal=True, sinks=True),
    Case(12, 20, 160, heads=(4, 2), head_dim_v=48, window=(3, 3)),
    Case(6, 9, 256, heads=(2, 1), causal=True, softcap=1.5, sinks=True),
    Case(9, 14, 224, heads=(2, 2), window=(-1, 3)),
    Case(1, 33, 192, heads=(6, 2), causal=True, alibi="head"),
]


@pytest.mark.parametrize("case", VARLEN_OUTPUT, ids=lambda c: f"q{c.seqlen_q}k{c.seqlen_k}d{c.head_dim}h{c.heads}")
def test_varlen_output_matrix_matches_the_float64_reading_of_fa2(case):
    assert_matches_fa(case.inputs())


# FA2's test_flash_attn_varlen_causal with paged KV (its block sizes 256 and 512; any size here), local too,
# and swapped seqlen pairs (more query tokens than keys)
VARLEN_CAUSAL_PAGED = [
    Case(9, 30, 32, heads=(4, 2), causal=True, page_size=1),
    Case(14, 40, 59, heads=(6, 2), causal=True, page_size=16),
    Case(30, 14, 64, heads=(4, 1), causal=True, page_size=16),
    Case(7, 37, 111, heads=(3, 3), causal=True, window=(6, 0), page_size=5),
    Case(16, 24, 32, heads=(4, 4), causal=True, page_size=256),
]


@pytest.mark.parametrize("case", VARLEN_CAUSAL_PAGED,
                         ids=lambda c: f"q{c.seqlen_q}k{c.seqlen_k}d{c.head_dim}p{c.page_size}")
def test_varlen_causal_with_paged_kv_matches_the_float64_reading_of_fa2(case):
    assert_matches_fa(case.inputs())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", [VARLEN_OUTPUT[1], VARLEN_CAUSAL_PAGED[1]], ids=["gqa-causal-d59", "paged16"])
def test_low_precision_inputs_on_the_kernel(dtype, case):
    assert_matches_fa(case.inputs(dtype=dtype), dtype)


def test_rows_that_see_no_key_give_zero_and_lse_plus_inf():
    # sequence 0 has no key at all; under bottom-right causal masking the first 3 rows of sequence 1 see none
    kw = make_varlen_inputs(0, 0, 16, (4, 2), lengths_q=[4, 5], lengths_k=[0, 2], causal=True)
    out, lse = run_kernel(kw)
    assert bool((out[:4] == 0).all()) and bool((lse[:, :4] == math.inf).all())
    assert bool((out[4:7] == 0).all()) and bool((lse[:, 4:7] == math.inf).all())
    assert bool(torch.isfinite(lse[:, 7:]).all())
    assert_matches_fa(kw)


def test_sequences_without_query_tokens_are_skipped():
    kw = make_varlen_inputs(0, 0, 32, (4, 2), lengths_q=[0, 3, 0, 1], lengths_k=[5, 7, 0, 9])
    assert_matches_fa(kw)


@pytest.mark.parametrize("where", ["query", "visible_key", "value"])
def test_a_nan_reaches_the_rows_that_see_it_as_in_torch(where):
    kw = make_varlen_inputs(0, 0, 16, (2, 1), lengths_q=[3, 2], lengths_k=[6, 4], causal=True)
    if where == "query":
        kw["q"][1, 0, 0] = float("nan")           # sequence 0, token 1, head 0
    elif where == "visible_key":
        kw["k"][3, 0, 0] = float("nan")           # sequence 0, key 3: seen by every row of it
    else:
        kw["v"][7, 0, 0] = float("nan")           # sequence 1, key 1: seen by both of its rows
    out, _ = run_kernel(kw)
    with rt.use_backend("torch"):
        expected = rt.flash_attn_varlen_func(**kw)
    assert torch.equal(out.isnan(), expected.isnan()) and bool(out.isnan().any())


def test_a_nan_key_outside_every_window_stays_out():
    # causal: key 5 of sequence 0 (6 keys, 3 tokens) is right of tokens 0 and 1's diagonals
    kw = make_varlen_inputs(0, 0, 16, (2, 1), lengths_q=[3], lengths_k=[6], causal=True)
    kw["k"][5] = float("nan")
    out, _ = run_kernel(kw)
    assert bool(out[:2].isfinite().all()) and bool(out[2].isnan().all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_constant_values_give_that_constant_under_inference_mode(dtype):
    kw = make_varlen_inputs(12, 20, 32, (4, 2), dtype=dtype, causal=True)
    kw["v"] = torch.full_like(kw["v"], 0.75)
    with torch.inference_mode():
        out, lse = run_kernel(kw)
    seen = torch.isfinite(lse).T   # (total_q, H): rows that see a key
    torch.testing.assert_close(out[seen].float(), torch.full_like(out[seen], 0.75).float(), rtol=TOL[dtype], atol=0)
    assert bool((out[~seen] == 0).all())


def _relative_error(out, ref) -> float:
    return float((out.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_approved_candidates_hold_their_error_bound(dtype):
    """Every candidate of the plan is approved: this runs each one at the bound its approval states for the
    dtype (an f16-dot candidate keeps fp32 operands on fp32 inputs, and holds the fp32 bound there)."""
    assert sorted(tk.APPROVALS) == sorted(c.tag() for c in plan_candidates("varlen_attention"))
    for tag, approval in tk.APPROVALS.items():
        candidate = VarlenAttentionCandidate.from_tag(tag)
        if dtype == torch.float16 and not candidate.use_f16_dot:
            continue
        kw = VARLEN_OUTPUT[1].inputs(dtype=dtype, seed=3)
        ref, _ = naive_flash_attn_varlen(**kw)
        out, _, _ = tk.flash_attn_varlen_func(kw["q"], kw["k"], kw["v"], kw["cu_seqlens_q"], kw["cu_seqlens_k"],
                                              kw["max_seqlen_q"], kw["max_seqlen_k"], None, True, (-1, -1), 0.0,
                                              None, None, None, candidate=candidate)
        assert _relative_error(out, ref) <= approval.error_bound(str(dtype).replace("torch.", "")), tag


def test_the_grid_is_bounded_from_shapes_and_the_plan_reads_no_tensor_data():
    # meta tensors hold no data: the plan is built from shapes and strides alone (no host sync)
    meta = torch.device("meta")
    q, k, v = (torch.empty(575, 32, 128, device=meta, dtype=torch.float16),
               torch.empty(64 * 300, 16, 8, 128, device=meta, dtype=torch.float16),
               torch.empty(64 * 300, 16, 8, 128, device=meta, dtype=torch.float16))
    cu = torch.empty(65, device=meta, dtype=torch.int32)
    table = torch.empty(64, 300, device=meta, dtype=torch.int32)
    candidate = VarlenAttentionCandidate(64, 64, 128, 3, True)
    plan, (out, lse) = tk.varlen_attention_plan(q, k, v, cu, cu, 512, 4608, scale=0.1, window=(-1, 0),
                                                block_table=table, candidate=candidate)
    (record,) = plan
    block_q = record.meta["BLOCK_Q"]
    assert record.meta["BLOCK_M"] == 64 and block_q == 16          # 4 query heads per KV head x 16 tokens
    assert record.grid == (575 // block_q + 64, 8)
    assert out.shape == (575, 32, 128) and lse.shape == (32, 575) and record.unit == "fp16_mma"


def test_the_flop_count_follows_the_loop_over_the_causal_triangle():
    # one 64-token sequence, causal, BLOCK_Q 16: blocks visit 16, 32, 48, 64 keys
    assert tk.launch.visited_keys(64, 64, 16, -1, 0) == 16 + 32 + 48 + 64
    assert tk.launch.visited_keys(64, 64, 16, -1, -1) == 4 * 64
    assert tk.launch.visited_keys(1, 4096, 1, -1, 0) == 4096


def test_a_routed_call_is_one_launch():
    from rlx_triton.backends.triton import launches

    kw = VARLEN_OUTPUT[1].inputs()
    with launches.recording() as log, rt.use_backend("triton", strict=True):
        rt.flash_attn_varlen_func(**kw)
    assert log.kernels == ["_varlen_attention_kernel"]



@pytest.mark.parametrize("window", [(-1, 0), (40, 0), (17, 9), (-1, 33), (70, -1)], ids=str)
def test_key_tiles_every_row_sees_skip_the_mask_and_give_fa2s_values(window):
    """Long sequences under causal and sliding windows: the tiles inside every row's window run unmasked, the
    tiles at the window's edges masked, and together they give FA2's output and lse."""
    kw = make_varlen_inputs(0, 0, 32, (4, 2), lengths_q=[130, 1, 77], lengths_k=[300, 64, 77],
                            causal=window[1] == 0, window=window)
    assert_matches_fa(kw)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [(-1, 0), (40, 0), (17, 9)], ids=str)
def test_on_cuda_unmasked_and_edge_tiles_give_fa2s_values(window):
    """fp16 on a GPU, the compiled kernel's two passes over the key tiles (every row's tiles unmasked, the window's
    edges masked) against the float64 reading of FA2."""
    kw = make_varlen_inputs(0, 0, 64, (8, 2), dtype=torch.float16, lengths_q=[130, 1, 77], lengths_k=[300, 64, 77],
                            causal=window[1] == 0, window=window)
    ref_out, ref_lse = naive_flash_attn_varlen(**kw)
    out, lse = run_kernel({name: value.cuda() if isinstance(value, torch.Tensor) else value
                           for name, value in kw.items()})
    assert_out_and_lse_match(out.cpu(), lse.cpu(), ref_out, ref_lse, torch.float16, TOL[torch.float16])


def test_on_long_windows_a_nan_key_reaches_only_the_rows_that_see_it_under_inference_mode():
    """130 tokens over 300 keys, window (40, 0): row i sees keys i + 130 .. i + 170. A NaN at key 200 of KV head 1
    (inside tiles every row of later blocks sees whole, so unmasked there) reaches rows 30..70 of its query heads
    only; a NaN at key 135 of KV head 0 (in the first block's left edge tile, masked) reaches rows 0..5 only; the
    other rows average constant values to that constant."""
    kw = make_varlen_inputs(0, 0, 32, (4, 2), lengths_q=[130], lengths_k=[300], causal=True, window=(40, 0))
    kw["v"] = torch.full_like(kw["v"], 0.75)
    kw["k"][200, 1, 3] = float("nan")
    kw["k"][135, 0, 0] = float("nan")
    with torch.inference_mode():
        out, _ = run_kernel(kw)
    expected_nan = torch.zeros(130, 4, dtype=torch.bool)
    expected_nan[30:71, 2:] = True     # query heads 2 and 3 share KV head 1
    expected_nan[0:6, :2] = True
    assert torch.equal(out.isnan().any(-1), expected_nan)
    seen = ~expected_nan
    torch.testing.assert_close(out[seen].double(), torch.full_like(out[seen], 0.75).double(), rtol=1e-6, atol=1e-6)
