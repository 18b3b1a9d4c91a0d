"""A naive float64 reading of FlashAttention 2's flash_attn_varlen_func, one sequence, head and query row at a
time, written from FA2's documented semantics independently of the library's torch path: keys gathered
page by page, the window normalized as FA2's mha_varlen_fwd normalizes it, masks from explicit comparisons,
attention sinks (transformers' s_aux) as one more logit in each row's softmax."""
from __future__ import annotations

import math

import torch


def naive_flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, block_table=None,
                            s_aux=None, seqused_k=None):
    """(out (total_q, H, Dv), lse (H, total_q)) in float64; rows that see no key: 0 and +inf. seqused_k (FA's, and
    torch's varlen_attn's): sequence s reads its first seqused_k[s] keys, from cu_seqlens_k[s] (which a paged call
    may leave None: its keys start at its first page)."""
    total_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[-2]
    group = num_heads // num_kv_heads
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    # mha_varlen_fwd: one query token without ALiBi is never causal; causal is right = 0; a side reaching
    # max_seqlen_k is unbounded; the causal kernel is the window (-1, 0)
    if causal and not (max_seqlen_q == 1 and alibi_slopes is None):
        right = 0
    left = -1 if left >= max_seqlen_k else left
    right = -1 if right >= max_seqlen_k else right
    is_causal = left < 0 and right == 0

    out = torch.zeros(total_q, num_heads, v.shape[-1], dtype=torch.float64)
    lse = torch.full((num_heads, total_q), math.inf, dtype=torch.float64)
    for s in range(cu_seqlens_q.shape[0] - 1):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        k0 = 0 if cu_seqlens_k is None else int(cu_seqlens_k[s])
        seqlen_k = int(seqused_k[s]) if seqused_k is not None else int(cu_seqlens_k[s + 1]) - k0
        seqlen_q, k1 = q1 - q0, k0 + seqlen_k
        if block_table is None:
            keys, values = k[k0:k1].double(), v[k0:k1].double()
        else:
            page = k.shape[1]
            slots = [(int(block_table[s, j // page]), j % page) for j in range(seqlen_k)]
            keys = torch.stack([k[p, o] for p, o in slots]).double() if slots else k.new_zeros(0, *k.shape[2:])
            values = torch.stack([v[p, o] for p, o in slots]).double() if slots else v.new_zeros(0, *v.shape[2:])
        for h in range(num_heads):
            slope = None
            if alibi_slopes is not None:
                slope = float(alibi_slopes[h] if alibi_slopes.dim() == 1 else alibi_slopes[s, h])
            logits_all = (keys[:, h // group] @ q[q0:q1, h].double().T).T * scale if seqlen_k else None
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                logits, kept = [], []
                for j in range(seqlen_k):
                    if (left >= 0 and j < diagonal - left) or (right >= 0 and j > diagonal + right):
                        continue
                    score = float(logits_all[i, j])
                    if softcap > 0:
                        score = softcap * math.tanh(score / softcap)
                    if slope is not None:
                        score += slope * j if is_causal else -slope * abs(diagonal - j)
                    logits.append(score)
                    kept.append(j)
                if s_aux is not None:
                    logits.append(float(s_aux[h]))
                if not logits:
                    continue
                weights = torch.tensor(logits, dtype=torch.float64)
                top = weights.max()
                probs = torch.exp(weights - top)
                total = probs.sum()
                if kept:
                    out[q0 + i, h] = (probs[:len(kept), None] * values[kept, h // group]).sum(0) / total
                lse[h, q0 + i] = top + torch.log(total)
    return out, lse


def random_lengths(batch: int, max_len: int, gen: torch.Generator, *, full: bool = False) -> list:
    """Per-sequence lengths in [max_len // 3, max_len] (FA's random padding masks), or all max_len."""
    if full:
        return [max_len] * batch
    return torch.randint(max(0, max_len // 3), max_len + 1, (batch,), generator=gen).tolist()


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()), dtype=torch.int32)


def make_varlen_inputs(seqlen_q: int, seqlen_k: int, head_dim: int, heads=(6, 2), *, batch: int = 3, dtype=torch.float32,
                       head_dim_v=None, page_size=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
                       sinks=False, seed=0, lengths_q=None, lengths_k=None) -> dict:
    """Keyword arguments of a flash_attn_varlen_func call: random lengths up to seqlen_q / seqlen_k per sequence,
    contiguous k/v, or paged ones (page_size) reached through a shuffled block table."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    num_heads, num_kv_heads = heads
    dim_v = head_dim_v or head_dim
    lengths_q = lengths_q if lengths_q is not None else random_lengths(batch, seqlen_q, gen)
    lengths_k = lengths_k if lengths_k is not None else random_lengths(batch, seqlen_k, gen)
    batch = len(lengths_q)
    kw = {"q": randn(sum(lengths_q), num_heads, head_dim), "cu_seqlens_q": offsets(lengths_q),
          "cu_seqlens_k": offsets(lengths_k), "max_seqlen_q": max(lengths_q), "max_seqlen_k": max(lengths_k)}
    if page_size is None:
        kw["k"], kw["v"] = randn(sum(lengths_k), num_kv_heads, head_dim), randn(sum(lengths_k), num_kv_heads, dim_v)
    else:
        per_sequence = max(1, -(-max(lengths_k) // page_size))
        num_pages = batch * per_sequence + 1
        kw["k"] = randn(num_pages, page_size, num_kv_heads, head_dim)
        kw["v"] = randn(num_pages, page_size, num_kv_heads, dim_v)
        kw["block_table"] = torch.randperm(num_pages, generator=gen)[:batch * per_sequence] \
            .reshape(batch, per_sequence).to(torch.int32)
    if alibi is not None:
        kw["alibi_slopes"] = torch.rand(*((num_heads,) if alibi == "head" else (batch, num_heads)), generator=gen) * 0.3
    if sinks:
        kw["s_aux"] = torch.randn(num_heads, generator=gen)
    kw.update(causal=causal, window_size=window, softcap=softcap)
    return kw


def assert_out_and_lse_match(out: torch.Tensor, lse: torch.Tensor, ref_out: torch.Tensor, ref_lse: torch.Tensor,
                             dtype: torch.dtype, tol: float) -> None:
    """FlashAttention's outputs against the float64 reference: out in `dtype` within tol (atol 4 x tol), the LSE
    float32 and finite where the reference's is, +inf (a row that sees no key) where it is not."""
    assert out.dtype == dtype and out.shape == ref_out.shape and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol * 4)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite) and bool((lse[~finite] == math.inf).all())
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=tol, atol=tol * 4)
