"""Decode attention: rt.scaled_dot_product_attention (split-K Triton kernel) against torch's SDPA, side by side.

    python bench/sdpa_decode.py [--quick]

On a GPU every case runs one query token per sequence against a KV cache: Llama-3-8B-like GQA
(32 query / 8 KV heads, D 128) over batch {1, 4, 16, 64} x KV length {512, 4k, 16k, 64k} and batch {1, 2} x
{32k, 128k}, MHA, MQA (batch 1 and 2 at 32k-128k, 16, 64), and D in {64, 96, 256}, in fp16 and bf16. The baseline is the fastest torch variant measured in the same
run: SDPA forced to each backend (flash, efficient, cudnn, math) with enable_gqa, and on KV heads
repeated beforehand (repeat not timed); variants that refuse a case are skipped. Times are CUDA-graph
replays (the op routes once, at capture). GB/s counts K and V read plus q and out; `bw_case` marks
cases with batch x KV heads x KV length >= 2^20, where the target is >= 80% of the copy bandwidth;
`splits` is the number of KV splits the Triton launch used (its grid's second dimension, from the device's
split rule). Paged cases (`page_size` 16 and 256) run rt.sdpa_decode(block_table=...) on a shuffled page
pool beside the contiguous case of the same shape; their baselines are torch's SDPA variants on the cache
gathered back into (B, Hkv, S, D) (the gather not timed) and flash_attn's flash_attn_with_kvcache on the
same pages where flash_attn is installed (it takes page sizes that are multiples of 256 only).
Quantised cases (`kv_dtype` fp8 e4m3 / e5m2 or int8, scales per tensor or per token and head; fp16 queries)
run rt.sdpa_decode(k_scale=..., v_scale=...) against the library path: the cache dequantised to fp16 (timed,
every step pays it) and then each torch SDPA variant.
Tree cases (`tree` Q = 1, 4, 8, 16, 64 at 4k and 32k) verify a random draft tree of Q tokens per sequence:
rt.sdpa_decode(tree_mask=...) against torch's SDPA variants with the same visibility as a bool mask over the
cache (the mask built beforehand, not timed).
On the CPU (--quick) tiny shapes report the route taken and the timing of the path that runs there.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from rlx_triton.perf.cases import sdpa_decode_cases as cases


def _torch_variants(q, k, v, mask=None) -> Dict[str, Callable[[], torch.Tensor]]:
    """Every torch way to compute the case: each SDPA backend, with enable_gqa and on repeated KV heads (with
    `mask`, a bool attn_mask, where given)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch._C._nn.scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    k_rep = k.repeat_interleave(group, dim=1) if group > 1 else k
    v_rep = v.repeat_interleave(group, dim=1) if group > 1 else v
    variants: Dict[str, Callable[[], torch.Tensor]] = {}
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    for name, backend in backends.items():
        def gqa(backend=backend):
            with sdpa_kernel([backend]):
                return sdpa(q, k, v, attn_mask=mask, enable_gqa=group > 1)

        def repeated(backend=backend):
            with sdpa_kernel([backend]):
                return sdpa(q, k_rep, v_rep, attn_mask=mask)

        variants[f"sdpa[{name}]+enable_gqa" if group > 1 else f"sdpa[{name}]"] = gqa
        if group > 1:
            variants[f"sdpa[{name}] repeated kv"] = repeated
    return variants


def paged_pool(k: torch.Tensor, v: torch.Tensor, page_size: int, table: Optional[torch.Tensor] = None):
    """k/v (B, Hkv, S, D) as shuffled pages (num_pages, Hkv, page_size, D) and the block table (B, pages) int32
    (a new shuffle, or `table`'s)."""
    batch, kv_heads, seq_kv, _ = k.shape
    pages = -(-seq_kv // page_size)
    if table is None:
        table = torch.randperm(batch * pages, device=k.device).reshape(batch, pages).to(torch.int32)

    def pool(x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, pages * page_size - seq_kv))
        out = torch.empty(batch * pages, kv_heads, page_size, x.shape[-1], device=x.device, dtype=x.dtype)
        out[table.long().flatten()] = padded.reshape(batch, kv_heads, pages, page_size, -1).transpose(1, 2) \
            .reshape(batch * pages, kv_heads, page_size, -1)
        return out

    return pool(k), pool(v), table


def _flash_attn_variant(q, k_pages, v_pages, table) -> Dict[str, Callable[[], torch.Tensor]]:
    """flash_attn's own flash_attn_with_kvcache on the same pages, where installed and the page size fits it."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return {}
    if k_pages.shape[2] % 256 != 0 or not q.is_cuda:
        return {}
    q_fa, k_fa, v_fa = q.transpose(1, 2), k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    return {"flash_attn paged": lambda: flash_attn_with_kvcache(q_fa, k_fa, v_fa, block_table=table)}


def quantised_cache(x: torch.Tensor, dtype: torch.dtype, kind: str):
    """(cache, float32 scale) of x in an fp8 / int8 storage: one scale, or one per token and head."""
    from rlx_triton.kv_quant import quantize, token_head_scales

    scale = token_head_scales(x.reshape(1, -1) if kind == "per_tensor" else x, dtype)
    return quantize(x, scale, dtype), scale.reshape(1) if kind == "per_tensor" else scale


def _dequantized_variants(q, k_cache, v_cache, k_scale, v_scale) -> Dict[str, Callable[[], torch.Tensor]]:
    """The library path of a quantised cache: each step dequantises it to q's dtype (timed), then torch's SDPA
    variants on the result."""
    def dequantized(variant):
        def run():
            from rlx_triton.backends.torch_ref.sdpa_decode import dequantized as to_query_dtype

            k, v = to_query_dtype(q, k_cache, v_cache, k_scale, v_scale)
            return variant(k, v)
        return run

    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch._C._nn.scaled_dot_product_attention
    gqa = q.shape[1] != k_cache.shape[1]
    variants: Dict[str, Callable[[], torch.Tensor]] = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        def attend(k, v, backend=backend):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=gqa)
        variants[f"dequantize + sdpa {backend.name.lower()}"] = dequantized(attend)
    return variants


def split_count(route, q, k, v, block_table=None, tree_mask=None, **scales) -> Optional[int]:
    """KV splits of the Triton launch a route makes for these inputs (its plan, built on meta tensors), or None."""
    if route.backend != "triton":
        return None
    from rlx_triton.router.device import device_facts

    meta = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (q, k, v)]
    options = {name: torch.empty(t.shape, dtype=t.dtype, device="meta")
               for name, t in (("block_table", block_table), ("tree_mask", tree_mask), *scales.items())
               if t is not None}
    plan, _ = route.module.sdpa_decode_plan(*meta, candidate=route.candidate, **options,
                                           sm_count=device_facts(q.device).sm_count or 1)
    return plan[0].grid[1]


def _time(fn, device, quick) -> Optional[float]:
    from bench.common import time_us

    try:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
            try:
                return time_us(fn, device, quick, graph=True)
            except Exception:
                return time_us(fn, device, quick, graph=False)
        return time_us(fn, device, quick)
    except Exception:
        return None


def run(quick: bool = False, progress=None) -> List[dict]:
    """One row per case; progress (optional) counts each case (bench.common.each_case)."""
    import rlx_triton as rt
    from bench.common import bench_device, case, each_case
    from rlx_triton.backends.torch_ref.sdpa_decode import tree_visibility
    from rlx_triton.perf.cases import draft_tree

    device = bench_device()
    results: List[dict] = []
    for spec in each_case("sdpa_decode", cases(quick), progress):
        batch, heads, kv_heads, dim, seq_kv, dtype = (spec[key] for key in
                                                      ("batch", "heads", "kv_heads", "head_dim", "seq_kv", "dtype"))
        tokens = spec.get("tree")
        q = torch.randn(batch, heads, tokens or 1, dim, device=device, dtype=dtype)
        k = torch.randn(batch, kv_heads, seq_kv, dim, device=device, dtype=dtype)
        v = torch.randn(batch, kv_heads, seq_kv, dim, device=device, dtype=dtype)
        gqa = kv_heads != heads
        page_size = spec.get("page_size")
        tree = None if tokens is None else draft_tree(tokens, torch.Generator().manual_seed(0)).to(device)
        mask = None if tree is None else tree_visibility(tree, torch.full((batch,), seq_kv, device=device), tokens,
                                                         seq_kv)[:, None]
        kv_dtype = spec.get("kv_dtype")
        if kv_dtype is not None:   # an fp8 / int8 cache: the library dequantises it to q's dtype each step
            k_cache, k_scale = quantised_cache(k, kv_dtype, spec["kv_scale"])
            v_cache, v_scale = quantised_cache(v, kv_dtype, spec["kv_scale"])
            variants = _dequantized_variants(q, k_cache, v_cache, k_scale, v_scale)
        else:
            variants = _torch_variants(q, k, v, mask)
        with rt.use_backend("auto"):
            if kv_dtype is not None:
                cache = (k_cache, v_cache)
                paging = {}
                if page_size is not None:
                    pool_k, pool_v, table = paged_pool(k_cache.view(torch.uint8), v_cache.view(torch.uint8), page_size)
                    cache, paging = (pool_k.view(kv_dtype), pool_v.view(kv_dtype)), {"block_table": table}
                    if k_scale.numel() > 1:   # per-token-head scales: the same pages, (num_pages, Hkv, page_size)
                        k_scale, v_scale, _ = paged_pool(k_scale[..., None], v_scale[..., None], page_size, table)
                        k_scale, v_scale = k_scale[..., 0], v_scale[..., 0]
                quant = dict(k_scale=k_scale, v_scale=v_scale, **paging)
                chosen = rt.explain(rt.sdpa_decode, q, *cache, **quant)
                splits = split_count(chosen, q, *cache, paging.get("block_table"), k_scale=k_scale, v_scale=v_scale)
                rlx_us = _time(lambda: rt.sdpa_decode(q, *cache, **quant), device, quick)
            elif tree is not None:
                chosen = rt.explain(rt.sdpa_decode, q, k, v, tree_mask=tree)
                splits = split_count(chosen, q, k, v, tree_mask=tree)
                rlx_us = _time(lambda: rt.sdpa_decode(q, k, v, tree_mask=tree), device, quick)
            elif page_size is None:
                chosen = rt.explain(rt.scaled_dot_product_attention, q, k, v, enable_gqa=gqa)
                splits = split_count(chosen, q, k, v)
                rlx_us = _time(lambda: rt.scaled_dot_product_attention(q, k, v, enable_gqa=gqa), device, quick)
            else:
                k_pages, v_pages, table = paged_pool(k, v, page_size)
                chosen = rt.explain(rt.sdpa_decode, q, k_pages, v_pages, block_table=table)
                splits = split_count(chosen, q, k_pages, v_pages, table)
                rlx_us = _time(lambda: rt.sdpa_decode(q, k_pages, v_pages, block_table=table), device, quick)
                variants.update(_flash_attn_variant(q, k_pages, v_pages, table))
        baselines = {name: _time(fn, device, quick) for name, fn in variants.items()}
        measured = {name: us for name, us in baselines.items() if us is not None}
        best = min(measured, key=measured.get)
        moved = (k.numel() + v.numel()) * (1 if kv_dtype is not None else q.element_size()) \
            + 2 * q.numel() * q.element_size()
        shape = f"{spec['label']} b{batch} h{heads}/{kv_heads} d{dim} kv{seq_kv}"
        del mask
        if page_size is not None and kv_dtype is None:
            del k_pages, v_pages
        results.append(case("sdpa_decode", shape, dtype, rlx_us or float("nan"), best, measured[best],
                            bytes_moved=moved, backend=chosen.backend, candidate=chosen.candidate_tag, splits=splits,
                            bw_case=batch * kv_heads * seq_kv >= 2**20,
                            torch_us={name: (round(us, 3) if us else None) for name, us in baselines.items()}))
        del q, k, v
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    quick = "--quick" in sys.argv[1:]
    for row in run(quick):
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        print(f"{row['shape']:<40} {row['dtype']:<9} route={row['backend']:<6} splits={row.get('splits') or '-':<3} "
              f"rlx {row['rlx_us']:>9.1f} us  "
              f"best torch {row['baseline']:<32} {row['baseline_us']:>9.1f} us  {speedup:>7}  "
              f"{row['gbps'] or '-'} GB/s")
