"""FlashAttention 2's `flash_attn_varlen_func` in plain torch: the library path of rt.flash_attn_varlen_func,
rt.flash_attn_func and (off torch's own varlen op, `varlen_attn`) rt.varlen_attn.

One sequence at a time (the offsets are read on the host): q rows [cu_seqlens_q[s], cu_seqlens_q[s + 1])
attend to keys [cu_seqlens_k[s], cu_seqlens_k[s + 1]) of a contiguous k/v, or to the first
cu_seqlens_k[s + 1] - cu_seqlens_k[s] keys of sequence s's pages (block_table) of a paged cache, with
FA2's masking (bottom-right causal, local windows, `torch_ref.flash_attn.masking`), tanh softcap, ALiBi,
attention sinks (per-head logits joining the softmax's denominator, transformers' s_aux) and dropout on
the probabilities (scaled by 1 / (1 - p), FA's rule; torch's random numbers, not FA's). Scores are
computed in float32 (float64 inputs stay float64); every op is differentiable, so autograd calls run here.
Rows that see no key give 0 and LSE +inf (with sinks, the sink's logit). A quantised paged cache (fp8 e4m3 / e5m2
or int8 k/v with float32 k_scale / v_scale, per tensor or per key row and head) is dequantised page by page as
each sequence's keys are gathered (`kv_quant.dequantize`: x = q * scale in float32), then computed as a float
cache is.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import List, Optional, Tuple

import torch

from rlx_triton.backends.torch_ref.flash_attn import Masking, masking
from rlx_triton.backends.torch_ref.library_kernel import LibraryKernel
from rlx_triton.kv_quant import dequantize
from rlx_triton.router.coverage import Coverage

COVERAGE = Coverage.everything()
APPROVALS: dict = {}
RECIPES: dict = {}
SPEED_EVIDENCE: dict = {}


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def sequence_keys(cache: torch.Tensor, start: int, length: int, sequence: int,
                  block_table: Optional[torch.Tensor]) -> torch.Tensor:
    """Sequence `sequence`'s keys (length, Hkv, D): rows start.. of a contiguous buffer, or its pages in order."""
    if block_table is None:
        return cache[start:start + length]
    page_size = cache.shape[1]
    pages = block_table[sequence, :(length + page_size - 1) // page_size].to(torch.int64)
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def sequence_values(cache: torch.Tensor, scale: Optional[torch.Tensor], start: int, length: int, sequence: int,
                    block_table: Optional[torch.Tensor]) -> torch.Tensor:
    """`sequence_keys` of a cache, dequantised in float32 where it is quantised (`scale` not None: one element, or
    one per key row and head, gathered from the same rows)."""
    keys = sequence_keys(cache, start, length, sequence, block_table)
    if scale is None:
        return keys
    if scale.numel() != 1:
        scale = sequence_keys(scale, start, length, sequence, block_table)
    return dequantize(keys, scale)


def attend_one(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, mask: Masking,
               softcap: float, slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor], dropout_p: float
               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (Lq, H, Dv), lse (H, Lq), probabilities (H, Lq, Lk) with dropped ones negated) of one sequence."""
    seqlen_q, num_heads, _ = q.shape
    seqlen_k, num_kv_heads = keys.shape[0], keys.shape[1]
    group = num_heads // num_kv_heads
    compute = _compute_dtype(q.dtype)
    device = q.device
    keys = keys.to(compute).repeat_interleave(group, dim=1)
    values = values.to(compute).repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(compute), keys) * scale
    if softcap > 0.0:
        scores = softcap * torch.tanh(scores / softcap)
    key_pos = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q        # (Lq, 1)
    if slopes is not None:
        distance = key_pos.expand(seqlen_q, seqlen_k) if mask.is_causal else -(diagonal - key_pos).abs()
        scores = scores + slopes.to(compute)[:, None, None] * distance.to(compute)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if mask.left >= 0:
        visible = visible & (key_pos >= diagonal - mask.left)
    if mask.right >= 0:
        visible = visible & (key_pos <= diagonal + mask.right)
    scores = scores.masked_fill(~visible, -math.inf)
    if sinks is not None:
        scores = torch.cat((scores, sinks.to(compute)[:, None, None].expand(num_heads, seqlen_q, 1)), dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True) if scores.shape[-1] else scores.new_zeros(num_heads, seqlen_q, 1)
    row_max = torch.where(row_max == -math.inf, 0.0, row_max)
    exps = torch.exp(scores - row_max)
    total = exps.sum(dim=-1, keepdim=True)
    no_keys = total == 0
    probs = (exps / torch.where(no_keys, 1.0, total))[..., :seqlen_k]
    lse = torch.where(no_keys, math.inf, row_max + torch.log(total))[..., 0]
    shown = probs
    if dropout_p > 0.0:
        kept = torch.rand(probs.shape, device=device) >= dropout_p
        probs = probs * kept / (1.0 - dropout_p)
        shown = torch.where(kept, shown, -shown)
    out = torch.einsum("hqk,khd->qhd", probs, values)
    return out.to(q.dtype), lse.to(torch.float32), shown


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, block_table, s_aux, dropout_p=0.0, *,
                           seqused_k=None, k_scale=None, v_scale=None, return_probs: bool = False, candidate=None,
                           route=None):
    """(out (total_q, H, Dv), lse (H, total_q) float32, S_dmask or None) on validated arguments. S_dmask (when
    return_probs and dropout_p > 0, as in FA2): (num_seqs, H, max_seqlen_q, max_seqlen_k) probabilities,
    the dropped ones negated. seqused_k (num_seqs,): sequence s uses its first seqused_k[s] keys (from
    cu_seqlens_k[s], or its first page), its length otherwise; a paged call with it may pass cu_seqlens_k None.
    k_scale / v_scale: a quantised k/v's float32 scales (one element, or the cache's shape without its head dim):
    each sequence's keys and values are dequantised to float32 as they are gathered."""
    mask = masking(causal, tuple(window_size), max_seqlen_q, max_seqlen_k, alibi_slopes is not None)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    starts_q = cu_seqlens_q.tolist()
    num_seqs = len(starts_q) - 1
    starts_k = cu_seqlens_k.tolist() if cu_seqlens_k is not None else [0] * (num_seqs + 1)
    used = seqused_k.tolist() if seqused_k is not None else None
    outs: List[torch.Tensor] = []
    lses: List[torch.Tensor] = []
    s_dmask = None
    if return_probs and dropout_p > 0.0:
        s_dmask = q.new_zeros((num_seqs, q.shape[1], max_seqlen_q, max_seqlen_k), dtype=torch.float32)
    for s in range(num_seqs):
        length_q = starts_q[s + 1] - starts_q[s]
        length_k = used[s] if used is not None else starts_k[s + 1] - starts_k[s]
        keys = sequence_values(k, k_scale, starts_k[s], length_k, s, block_table)
        values = sequence_values(v, v_scale, starts_k[s], length_k, s, block_table)
        slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[s])
        out, lse, probs = attend_one(q[starts_q[s]:starts_q[s + 1]], keys, values, scale, mask, float(softcap),
                                     slopes, s_aux, float(dropout_p))
        outs.append(out)
        lses.append(lse)
        if s_dmask is not None:
            s_dmask[s, :, :length_q, :length_k] = probs.detach().float()
    # rows past cu_seqlens_q[-1] (a batch padded to a fixed token count) belong to no sequence: 0, LSE +inf
    spare = q.shape[0] - starts_q[-1]
    outs.append(q.new_zeros((spare, q.shape[1], v.shape[-1])))
    lses.append(torch.full((q.shape[1], spare), math.inf, device=q.device))
    return torch.cat(outs), torch.cat(lses, dim=1), s_dmask


def varlen_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
                softcap, alibi_slopes, block_table, s_aux, dropout_p=0.0, *, seqused_k=None, num_splits=None,
                return_probs: bool = False, candidate=None, route=None):
    """torch.nn.attention.varlen.varlen_attn's call (rt.varlen_attn) on torch: torch's own op (FlashAttention 2)
    where it takes the call (`torch_flash_takes`), else `flash_attn_varlen_func` above, whose float64-checked
    torch path runs anywhere (torch's op has no CPU kernel). (out, lse (H, total_q), None)."""
    if torch_flash_takes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table):
        from torch.nn.attention.varlen import AuxRequest
        from torch.nn.attention.varlen import varlen_attn as torch_varlen_attn

        out, lse = torch_varlen_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                     return_aux=AuxRequest(lse=True), scale=softmax_scale,
                                     window_size=tuple(window_size), enable_gqa=k.shape[-2] != q.shape[1],
                                     seqused_k=seqused_k, block_table=block_table, num_splits=num_splits)
        return out, lse, None
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, block_table, s_aux, dropout_p,
                                  seqused_k=seqused_k)


# FlashAttention 2's limits on the calls torch's varlen op takes (flash_api.cpp): 16-bit inputs, equal head dims
# of a multiple of 8 up to 256, int32 offsets and tables, pages of a multiple of 256 keys, sm_80 or newer
FA2_MAX_HEAD_DIM = 256
FA2_PAGE_MULTIPLE = 256


def torch_flash_takes(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table) -> bool:
    """Whether torch's varlen op (FlashAttention 2 on CUDA) runs this call."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or cu_seqlens_k is None:
        return False
    head_dim = q.shape[-1]
    if v.shape[-1] != head_dim or head_dim % 8 or head_dim > FA2_MAX_HEAD_DIM:
        return False
    if any(t is not None and t.dtype != torch.int32 for t in (cu_seqlens_q, cu_seqlens_k, seqused_k, block_table)):
        return False
    if block_table is not None and k.shape[1] % FA2_PAGE_MULTIPLE:
        return False
    try:
        import torch.nn.attention.varlen  # noqa: F401  (torch >= 2.9)
    except ImportError:
        return False
    return torch.cuda.get_device_capability(q.device) >= (8, 0)


def _torch_flash_kernels(request, profile) -> Optional[list]:
    """FlashAttention 2's launches for a varlen_attn request torch's op takes (`torch_flash_takes`, read from the
    request: int32 offsets assumed), else None."""
    from rlx_triton.perf.library.attention import Attention, fa2
    from rlx_triton.perf.library.gemm import REQUEST_DTYPE

    f, features = request.field_map, request.feature_map
    dtype, page, head_dim = REQUEST_DTYPE.get(request.dtype), f.get("page_size"), f["head_dim"]
    if request.op != "varlen_attn" or dtype not in ("fp16", "bf16") or f["head_dim_v"] != head_dim \
            or head_dim % 8 or head_dim > FA2_MAX_HEAD_DIM or (page is not None and page % FA2_PAGE_MULTIPLE) \
            or profile.capability is None or profile.capability < (8, 0):
        return None
    sequences = max(1, f["batch"])
    shape = Attention(batch=sequences, heads=f["num_heads"], kv_heads=f["num_kv_heads"],
                      seq_q=max(1, -(-f["tokens"] // sequences)), seq_kv=f["seq_kv"], head_dim=head_dim,
                      causal=features.get("causal") == "bottom_right", page_size=page,
                      local=bool(features.get("window")))
    return fa2(shape, dtype, profile, api="fwd")


def library_kernels(request, profile) -> list:
    """The kernels `flash_attn_varlen_func` above launches on a GPU, as LibraryKernel records (the library side of a
    speed decision and of `rlx-triton perf`): it does not call torch's flash varlen kernel; it reads the offsets on
    the host (two device-to-host copies, each a host sync) and runs `attend_one` once per sequence, each step its own
    launch: a paged sequence's pages gathered, K and V converted and repeated over the group (repeat_interleave),
    einsum's operand copies and batched GEMMs (fp32, cuBLAS), every masking and softmax step a pass over the
    (H, Lq, Lk) scores; then the outputs concatenated. The request holds the totals only: every sequence is
    modelled with tokens / batch query rows and the longest key length (seq_kv), the launches repeated per
    sequence. A varlen_attn request that torch's own op takes (`varlen_attn` above) is FlashAttention 2's launches
    instead (rlx_triton.perf.library.attention.fa2)."""
    flash = _torch_flash_kernels(request, profile)
    if flash is not None:
        return flash
    from rlx_triton.backends.torch_ref.sdpa_decode import _sizes, _TorchLaunches

    f = request.field_map
    feats = request.feature_map
    size, compute = _sizes(request)
    sequences = max(1, f["batch"])
    hq, hkv, d, dv, s = f["num_heads"], f["num_kv_heads"], f["head_dim"], f["head_dim_v"], f["seq_kv"]
    lq = max(1, -(-f["tokens"] // sequences))
    scores = hq * lq * s
    host = [LibraryKernel("cu_seqlens_q.tolist() / cu_seqlens_k.tolist() (device-to-host copy, host sync)", 0, 0,
                          chain={"hbm": 1}, note="a synchronising copy: the GPU drains before the host goes on")
            for _ in range(2)]
    run = _TorchLaunches(profile, size, compute)
    quantised = feats.get("kv_dtype", "none") != "none"   # one byte a stored value, dequantised to float32
    cache_size = 1 if quantised else size
    if feats.get("paged"):
        run.small("block_table row .to(int64)", 2)
        for cache, width in (("K", d), ("V", dv)):
            run.big(f"gather {cache} pages", s * hkv * width, s * hkv * width, cache_size, cache_size)
            if quantised and feats.get("kv_scale") == "per_token_head":
                run.big(f"gather {cache} scale pages", s * hkv, s * hkv, 4, 4)
    for cache, width in (("K", d), ("V", dv)):
        if quantised:
            run.big(f"dequantize {cache}: .to(float32)", s * hkv * width, s * hkv * width, cache_size, 4)
            run.big(f"dequantize {cache}: * scale", s * hkv * width, s * hkv * width, 4, 4)
        if (4 if quantised else size) != compute:
            run.big(f"{cache}.to(compute)", s * hkv * width, s * hkv * width, read_size=4 if quantised else size)
        run.big(f"{cache}.repeat_interleave(group)", s * hkv * width, s * hq * width)
    run.small("q.to(compute), einsum's q permute copy", 2)
    run.big("einsum: K to (H, D, Lk)", s * hq * d, s * hq * d)
    run.bmm("Q.K^T (einsum)", hq, lq, s, d)
    run.big("scores * scale", scores, scores)
    if feats.get("softcap"):
        for step in ("/ softcap", "tanh", "* softcap"):
            run.big(f"softcap {step}", scores, scores)
    run.small("key_pos, diagonal (arange, arange + Lk - Lq)", 3)
    if feats.get("alibi", "none") != "none":
        run.big("ALiBi distance and bias", lq * s, scores)
        run.big("scores + bias", 2 * scores, scores)
    run.big("visible = ones(Lq, Lk)", 0, lq * s, write_size=1)
    bounds = (3 if feats.get("causal") == "bottom_right" else 0) + (3 if feats.get("window") else 0)
    for _ in range(bounds):
        run.big("visible bound (+, <=, &)", lq * s, lq * s, 1, 1)
    run.big("masked_fill(~visible, -inf)", scores, scores)
    if feats.get("sinks"):
        run.big("cat(scores, sinks)", scores, scores)
    run.big("amax over the keys", scores, hq * lq)
    run.small("row_max == -inf, where", 2)
    run.big("scores - row_max", scores, scores)
    run.big("exp", scores, scores)
    run.big("sum over the keys", scores, hq * lq)
    run.small("total == 0, where(no_keys, 1, total)", 2)
    run.big("exps / total", scores, scores)
    run.small("lse: log, +, where", 3)
    if feats.get("dropout"):
        for step in ("rand", ">= p", "* kept / (1 - p)", "where(kept, p, -p)"):
            run.big(f"dropout {step}", scores, scores)
    run.big("einsum: V to (H, Lk, Dv)", s * hq * dv, s * hq * dv)
    run.bmm("P.V (einsum)", hq, lq, dv, s)
    run.small("einsum: out to (Lq, H, Dv), out.to(dtype)", 2)
    per_sequence = [replace(kernel, repeat=sequences) for kernel in run.kernels]
    total_q = f["tokens"]
    tail = [LibraryKernel("new_zeros, full (rows past the last sequence)", 0, 0, repeat=2,
                          note="torch op on a few elements"),
            LibraryKernel("cat(outs)", total_q * hq * dv * size, total_q * hq * dv * size, note="torch cat"),
            LibraryKernel("cat(lses)", hq * total_q * 4, hq * total_q * 4, note="torch cat")]
    return host + per_sequence + tail
