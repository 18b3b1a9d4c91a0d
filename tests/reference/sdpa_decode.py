"""Float64 reference for decode attention: softmax(q k^T * scale + mask) v, with LSE, on CPU.

Non-finite values follow torch's math SDPA, over the keys a call can reach: keys past a sequence's
valid length, and under top-left causal alignment keys past the last query token, are never read;
every other key takes part, and masking it (causal alignment, a False in a bool mask, -inf in a float
mask) adds -inf to its score. So a NaN or +inf in a query row, a reachable key or a mask gives a NaN
row, a NaN or Inf in a reachable value gives NaN (0 * NaN), and a row whose scores are all -inf gives
0 with lse = -inf. lse is NaN where the row's softmax is (a NaN or +inf score).
"""
from __future__ import annotations

import math
from typing import Optional

import torch


def attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                        attn_mask: Optional[torch.Tensor] = None, causal: str = "none",
                        scale: Optional[float] = None,
                        cache_seqlens: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64 for query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv).

    causal: "none", "top_left" (key j visible to token i iff j <= i) or "bottom_right" (iff
    j <= i + L_b - Lq, L_b the valid length of sequence b).
    """
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (query, key, value))
    batch, num_heads, seq_q, head_dim = q.shape
    num_kv_heads, seq_kv = k.shape[1], k.shape[2]
    group = num_heads // num_kv_heads
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale

    lengths = (torch.full((batch,), seq_kv) if cache_seqlens is None else cache_seqlens.cpu().long())
    reach = lengths.clamp(max=seq_q) if causal == "top_left" else lengths
    key_pos = torch.arange(seq_kv)
    in_reach = (key_pos[None, :] < reach[:, None])[:, None, :, None]  # (B, 1, S, 1)
    k = torch.where(in_reach, k, 0.0).repeat_interleave(group, dim=1)
    v = torch.where(in_reach, v, 0.0).repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale

    tok = torch.arange(seq_q)
    visible = torch.ones(batch, 1, seq_q, seq_kv, dtype=torch.bool)
    if causal == "top_left":
        visible &= (key_pos[None, :] <= tok[:, None])[None, None]
    elif causal == "bottom_right":
        limit = tok[None, :] + lengths[:, None] - seq_q  # (B, Lq)
        visible &= (key_pos[None, None, :] <= limit[:, :, None])[:, None]
    if attn_mask is not None:
        mask = attn_mask.detach().cpu()
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:
            scores = scores + mask.to(torch.float64)
    scores = torch.where(visible, scores, scores - math.inf)
    scores = torch.where(in_reach.transpose(-1, -2), scores, -math.inf)
    return softmax_rows(scores, v)


def softmax_rows(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(scores) @ v, lse) with the max taken NaN-propagating (amax); a row whose scores are all -inf gives
    0 and lse -inf."""
    row_max = scores.amax(dim=-1)
    row_max = torch.where(row_max == -math.inf, 0.0, row_max)
    probs = torch.exp(scores - row_max[..., None])
    total = probs.sum(dim=-1)
    no_keys = total == 0
    out = torch.matmul(probs, v) / torch.where(no_keys, 1.0, total)[..., None]
    lse = torch.where(no_keys, -math.inf, row_max + torch.log(total))
    return out, lse


# ------------------------------------------------------------------------------- degenerate inputs
# name -> what the case does to q (B=1, Hq=4, Lq=2, D=16), k and v (Hkv=2, S=37, Dv=16), and the
# launcher keywords (mask, causal alignment, lengths) it runs with. Heads 0, 1 read KV head 0 and
# heads 2, 3 KV head 1. Every case keeps its documented outcome in `expect` ("nan" somewhere, or "finite").
NAN, INF = float("nan"), float("inf")


def _zeros(q, k, v):
    q.zero_(), k.zero_(), v.zero_()
    return {}


def _constants(q, k, v):
    q.fill_(0.5), k.fill_(-0.25), v.fill_(0.75)
    return {}


def _set(tensor, index, value):
    tensor[index] = value
    return {}


def _bool_mask(false_at=None):
    mask = torch.ones(1, 4, 2, 37, dtype=torch.bool)
    if false_at is not None:
        mask[false_at] = False
    return mask


def _float_mask(value, at):
    mask = torch.zeros(1, 4, 2, 37)
    mask[at] = value
    return mask


DEGENERATE_CASES = {
    # name: (edit(q, k, v) -> launcher keywords, expect)
    "zeros": (_zeros, "finite"),
    "constants": (_constants, "finite"),
    "nan_in_a_query_row": (lambda q, k, v: _set(q, (0, 1, 0, 3), NAN), "nan"),
    "inf_in_a_query_row": (lambda q, k, v: _set(q, (0, 1, 0, 3), INF), "nan"),
    "inf_in_a_key": (lambda q, k, v: _set(k, (0, 0, 5, 2), INF), "nan"),
    "nan_in_a_key": (lambda q, k, v: _set(k, (0, 1, 20, 2), NAN), "nan"),
    "nan_in_a_value": (lambda q, k, v: _set(v, (0, 1, 7, 3), NAN), "nan"),
    "inf_in_a_value": (lambda q, k, v: _set(v, (0, 0, 30, 1), INF), "inf"),
    "nan_in_a_float_mask": (lambda q, k, v: {"attn_mask": _float_mask(NAN, (0, 2, 1, 4))}, "nan"),
    "inf_in_a_float_mask": (lambda q, k, v: {"attn_mask": _float_mask(INF, (0, 0, 0, 9))}, "nan"),
    "neg_inf_float_mask_row": (lambda q, k, v: {"attn_mask": _float_mask(-INF, (0, 3, 1))}, "finite"),
    "fully_masked_row": (lambda q, k, v: {"attn_mask": _bool_mask(false_at=(0, 1, 0))}, "finite"),
    "nan_key_under_a_false_mask": (lambda q, k, v: {**_set(k, (0, 1, 12, 0), NAN),
                                                     "attn_mask": _bool_mask(false_at=(..., 12))}, "nan"),
    "nan_query_in_a_fully_masked_row": (lambda q, k, v: {**_set(q, (0, 0, 1, 5), NAN),
                                                          "attn_mask": _bool_mask(false_at=(0, 0, 1))}, "nan"),
    "nan_key_hidden_by_causal_alignment": (lambda q, k, v: {**_set(k, (0, 0, 36, 4), NAN),
                                                             "causal": "bottom_right"}, "nan"),
    "nan_past_the_valid_length": (lambda q, k, v: {**_set(k, (0, 0, 30, 4), NAN), **_set(v, (0, 1, 33, 0), NAN),
                                                    "causal": "bottom_right",
                                                    "cache_seqlens": torch.tensor([29])}, "finite"),
    "nan_past_the_last_token_top_left": (lambda q, k, v: {**_set(k, (0, 0, 2, 4), NAN), **_set(v, (0, 1, 9, 0), NAN),
                                                           "causal": "top_left"}, "finite"),
    "kv_length_one": (None, "finite"),
    # whole rows and whole caches: no score of the row is finite, and none of them is a mask's -inf
    "nan_query_row_everywhere": (lambda q, k, v: _set(q, (0, 1, 0), NAN), "nan"),
    "nan_query_row_under_causal": (lambda q, k, v: {**_set(q, (0, 2, 1), NAN), "causal": "bottom_right"}, "nan"),
    "nan_query_row_under_a_bool_mask": (lambda q, k, v: {**_set(q, (0, 3, 0), NAN),
                                                          "attn_mask": _bool_mask(false_at=(..., 5))}, "nan"),
    "every_key_inf": (lambda q, k, v: _set(k, (...,), INF), "nan"),
    "every_key_neg_inf": (lambda q, k, v: _set(k, (...,), -INF), "nan"),
    "every_key_inf_under_causal": (lambda q, k, v: {**_set(k, (...,), INF), "causal": "bottom_right"}, "nan"),
    "every_key_inf_under_a_float_mask": (lambda q, k, v: {**_set(k, (...,), INF),
                                                           "attn_mask": _float_mask(-2.0, (0, 1, 0, 3))}, "nan"),
    "every_value_nan": (lambda q, k, v: _set(v, (...,), NAN), "nan"),
}


def degenerate_inputs(name: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """(q, k, v, launcher keywords, expect) of one DEGENERATE_CASES entry, in `dtype`."""
    edit, expect = DEGENERATE_CASES[name]
    generator = torch.Generator().manual_seed(seed)
    seq_kv = 1 if name == "kv_length_one" else 37
    q = torch.randn(1, 4, 2, 16, generator=generator)
    k = torch.randn(1, 2, seq_kv, 16, generator=generator)
    v = torch.randn(1, 2, seq_kv, 16, generator=generator)
    kwargs = edit(q, k, v) if edit is not None else {}
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if kwargs.get("attn_mask") is not None and kwargs["attn_mask"].dtype != torch.bool:
        kwargs["attn_mask"] = kwargs["attn_mask"].to(dtype)
    return q, k, v, kwargs, expect


def assert_outcome(out: torch.Tensor, expect: str) -> None:
    """The case's documented outcome holds: NaN somewhere, Inf somewhere (and no NaN), or all finite."""
    if expect == "nan":
        assert out.isnan().any()
    elif expect == "inf":
        assert out.isinf().any() and not out.isnan().any()
    else:
        assert out.isfinite().all()


def check_degenerate_case(launch, case: str, *, rtol: float, dtype: torch.dtype = torch.float32):
    """Runs `launch(q, k, v, **keywords) -> (out, lse)` on one case and compares with the reference:
    NaN exactly where it has NaN, its values elsewhere (rtol, atol scaled by the KV length)."""
    q, k, v, kwargs, expect = degenerate_inputs(case, dtype)
    out, lse = launch(q, k, v, **kwargs)
    expected_out, expected_lse = attention_reference(q, k, v, **kwargs)
    for actual, expected in ((out, expected_out), (lse, expected_lse)):
        torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=rtol * math.sqrt(k.shape[2]),
                                   equal_nan=True)
    assert_outcome(out, expect)
    return out, lse


# ------------------------------------------------------------------------------- draft trees (tree_mask)
def tree_visible(tree_mask: torch.Tensor, lengths: torch.Tensor, seq_q: int, seq_kv: int) -> torch.Tensor:
    """(B, 1, Lq, S) bool, entry by entry from the contract: token i of sequence b sees key j < L_b iff
    j < L_b - Lq (the prefix) or tree_mask[b, i, j - (L_b - Lq)]."""
    batch = lengths.shape[0]
    tree = tree_mask.cpu().expand(batch, seq_q, seq_q)
    visible = torch.zeros(batch, 1, seq_q, seq_kv, dtype=torch.bool)
    for b in range(batch):
        length = int(lengths[b])
        start = length - seq_q
        for i in range(seq_q):
            for j in range(min(length, seq_kv)):
                visible[b, 0, i, j] = j < start or bool(tree[b, i, j - start])
    return visible


def tree_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree_mask: torch.Tensor, *,
                   cache_seqlens: Optional[torch.Tensor] = None, scale: Optional[float] = None, softcap: float = 0.0,
                   window_left: int = -1, alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (out, lse) of rt.sdpa_decode(tree_mask=...). Without FlashAttention's options a hidden key is masked
    as a bool mask masks (`attention_reference`); with a softcap, a left window or ALiBi, as FlashAttention masks:
    the score is softcap * tanh(s / softcap) - slope * |p_i - j| with p_i = L_b - Lq + i, and a key the tree or
    the window (j < p_i - window_left) hides is dropped."""
    batch, num_heads, seq_q, head_dim = query.shape
    seq_kv = key.shape[2]
    lengths = torch.full((batch,), seq_kv) if cache_seqlens is None else cache_seqlens.cpu().long()
    visible = tree_visible(tree_mask, lengths, seq_q, seq_kv)
    if softcap == 0.0 and window_left < 0 and alibi_slopes is None:
        return attention_reference(query, key, value, attn_mask=visible, scale=scale, cache_seqlens=lengths)
    q, k, v = (t.detach().to("cpu", torch.float64) for t in (query, key, value))
    group = num_heads // k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    in_reach = (torch.arange(seq_kv)[None, :] < lengths[:, None])[:, None, :, None]
    k = torch.where(in_reach, k, 0.0).repeat_interleave(group, dim=1)
    v = torch.where(in_reach, v, 0.0).repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    position = (lengths[:, None] - seq_q + torch.arange(seq_q)[None, :])[:, None, :, None]    # (B, 1, Lq, 1)
    keys = torch.arange(seq_kv)[None, None, None, :]
    if alibi_slopes is not None:
        slopes = alibi_slopes.cpu().double().expand(batch, num_heads)[:, :, None, None]
        scores = scores - slopes * (position - keys).abs()
    if window_left >= 0:
        visible = visible & (keys >= position - window_left)
    return softmax_rows(scores.masked_fill(~visible, -math.inf), v)
