"""Serving attention: rt.flash_attn_varlen_func (one ragged Triton launch) against torch's SDPA, side by side.

    python bench/attention_serving.py [--quick]

On a GPU each case is one attention layer of a serving step at Llama-3-8B's shape (32 query / 8 KV heads,
D 128, causal, fp16 and bf16): a prefill of 4k tokens; a chunked prefill (512 new tokens over a 4k
context); a mixed batch (one prefill chunk of 512 over 4k plus 63 decodes at 4k) in one launch; and the
mixed batch over a paged cache of page size 16 and 256 (rt reads the pages through the block table). The
baseline is the fastest torch variant measured in the same run: per sequence, SDPA forced to each backend
(flash, efficient, cudnn, math) with enable_gqa and a bottom-right causal mask, on the keys gathered into
contiguous (1, Hkv, S, D) memory as transformers' sdpa path does (the gather not timed), looped over the
sequences; and flash_attn's flash_attn_varlen_func where flash_attn is installed (its paged form takes page
sizes that are multiples of 256 only). Times are CUDA-graph replays where the call can be captured. TFLOP/s
counts the causal work (2 x (D + Dv) per visible query-key pair per head).
On the CPU (--quick) tiny shapes report the route taken and the timing of the path that runs there.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, List

import torch

from rlx_triton.perf.cases import attention_serving_cases as cases
from rlx_triton.perf.cases import build_serving_inputs
from rlx_triton.perf.cases import case_lengths


def causal_flops(spec: dict) -> int:
    """2 x (D + Dv) per visible (query, key) pair per head under bottom-right causal masking."""
    pairs = sum(q * (k - q) + q * (q + 1) // 2 for q, k in case_lengths(spec))
    return 2 * 2 * spec["head_dim"] * spec["heads"] * pairs


def _gathered(kw: dict, spec: dict) -> List[tuple]:
    """Per sequence: (q (1, H, Lq, D), k, v (1, Hkv, Lk, D), bottom-right causal bool mask), KV gathered."""
    out = []
    cu_q, cu_k = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_k"].tolist()
    for s, (seqlen_q, seqlen_k) in enumerate(case_lengths(spec)):
        q = kw["q"][cu_q[s]:cu_q[s + 1]].transpose(0, 1)[None]
        if "block_table" in kw:
            page_size = kw["k"].shape[1]
            pages = kw["block_table"][s, :-(-seqlen_k // page_size)].long()
            k = kw["k"][pages].reshape(-1, *kw["k"].shape[2:])[:seqlen_k]
            v = kw["v"][pages].reshape(-1, *kw["v"].shape[2:])[:seqlen_k]
        else:
            k, v = kw["k"][cu_k[s]:cu_k[s + 1]], kw["v"][cu_k[s]:cu_k[s + 1]]
        mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=q.device).tril(diagonal=seqlen_k - seqlen_q)
        out.append((q, k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous(), mask))
    return out


def _torch_variants(kw: dict, spec: dict) -> Dict[str, Callable[[], object]]:
    """SDPA forced to each backend, looped over the sequences on their gathered KV."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    per_sequence = _gathered(kw, spec)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    variants = {}
    for name, backend in backends.items():
        def run(backend=backend):
            with sdpa_kernel(backend):
                return [torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                        for q, k, v, mask in per_sequence]
        variants[f"sdpa-{name} gathered"] = run
    return variants


def _flash_attn_variant(kw: dict) -> Dict[str, Callable[[], object]]:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return {}
    page_size = kw["k"].shape[1] if "block_table" in kw else None
    if page_size is not None and page_size % 256:
        return {}
    return {"flash_attn varlen": lambda: flash_attn_varlen_func(**kw)}


def run(quick: bool = False, progress=None) -> List[dict]:
    """One row per case; progress (optional) counts each case (bench.common.each_case)."""
    import rlx_triton as rt
    from bench.common import bench_device, case, each_case
    from bench.sdpa_decode import _time

    device = bench_device()
    results: List[dict] = []
    for spec in each_case("attention_serving", cases(quick), progress):
        kw = build_serving_inputs(spec, device)
        with rt.use_backend("auto"):
            chosen = rt.explain(rt.flash_attn_varlen_func, **kw)
            rlx_us = _time(lambda: rt.flash_attn_varlen_func(**kw), device, quick)
        variants = _torch_variants(kw, spec)
        variants.update(_flash_attn_variant(kw))
        baselines = {name: _time(fn, device, quick) for name, fn in variants.items()}
        measured = {name: us for name, us in baselines.items() if us is not None}
        best = min(measured, key=measured.get)
        flops = causal_flops(spec)
        results.append(case("attention_serving", f"{spec['label']} h{spec['heads']}/{spec['kv_heads']} "
                            f"d{spec['head_dim']}", spec["dtype"], rlx_us or float("nan"), best, measured[best],
                            backend=chosen.backend, candidate=chosen.candidate_tag,
                            tflops=round(flops / (rlx_us * 1e-6) / 1e12, 2) if rlx_us else None,
                            torch_us={name: (round(us, 3) if us else None) for name, us in baselines.items()}))
        del kw
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root: bench.*, tests.*
    quick = "--quick" in sys.argv[1:]
    for row in run(quick):
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] else "-"
        print(f"{row['shape']:<44} {row['dtype']:<9} route={row['backend']:<6} rlx {row['rlx_us']:>10.1f} us  "
              f"best torch {row['baseline']:<28} {row['baseline_us']:>10.1f} us  {speedup:>7}  "
              f"{row['tflops'] or '-'} TFLOP/s")
