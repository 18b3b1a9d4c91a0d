"""The case lists of the benchmarks: what bench/<name>.py measures and what `rlx-triton perf` analyses.

Shipped with the package so `rlx-triton perf` runs from an installed wheel; each bench module in bench/
imports its list from here. A list is a function `(quick, gpu) -> [dict]`: gpu=True gives the cases a
CUDA run measures, gpu=False the CPU's, gpu=None those of the device at hand.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

# the benchmarks of the source checkout, bench/<name>.py, in the order bench/run.py runs them
BENCH_NAMES = ("dispatch_overhead", "sdpa_decode", "attention_serving", "fbank", "sincnet", "lstm",
               "pyannote_segmentation", "embedding", "diarization")

KV_BYTES_LIMIT = 24 * 2**30  # decode cases whose K+V would not fit comfortably are left out
LLAMA3_8B = dict(heads=32, kv_heads=8, head_dim=128)
SERVING_CONTEXT = 4096


def _on_gpu(gpu: Optional[bool]) -> bool:
    return torch.cuda.is_available() if gpu is None else gpu


def draft_tree(tokens: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A random draft tree of `tokens` tokens as rt.sdpa_decode's tree_mask (tokens, tokens) bool: token 0 is the
    root, every later token's parent is a random earlier one, and row i is True at i and at its ancestors."""
    mask = torch.eye(tokens, dtype=torch.bool)
    for token in range(1, tokens):
        parent = int(torch.randint(token, (1,), generator=generator))
        mask[token] |= mask[parent]
    return mask


def sdpa_decode_cases(quick: bool, gpu: Optional[bool] = None) -> List[dict]:
    """Decode attention cases: batch, heads, kv_heads, head_dim, seq_kv, dtype, label (and page_size if paged,
    tree: the query tokens of a draft tree verified through rt.sdpa_decode's tree_mask, kv_dtype and kv_scale: an
    fp8 / int8 cache and its scales' layout)."""
    if not _on_gpu(gpu):
        return [dict(label="gqa", batch=1, heads=8, kv_heads=2, head_dim=64, seq_kv=256, dtype=torch.float32),
                dict(label="mha", batch=2, heads=4, kv_heads=4, head_dim=64, seq_kv=128, dtype=torch.float32),
                dict(label="gqa-paged16", batch=1, heads=8, kv_heads=2, head_dim=64, seq_kv=256, dtype=torch.float32,
                     page_size=16),
                dict(label="gqa-tree4", batch=1, heads=8, kv_heads=2, head_dim=64, seq_kv=256, dtype=torch.float32,
                     tree=4),
                dict(label="gqa-fp8e4m3-per-token-head", batch=1, heads=8, kv_heads=2, head_dim=64, seq_kv=256,
                     dtype=torch.float32, kv_dtype=torch.float8_e4m3fn, kv_scale="per_token_head")]
    out: List[dict] = []
    dtypes = (torch.float16,) if quick else (torch.float16, torch.bfloat16)
    batches = (1, 16) if quick else (1, 4, 16, 64)
    lengths = (4096, 65536) if quick else (512, 4096, 16384, 65536)
    for dtype in dtypes:
        for batch in batches:
            for seq_kv in lengths:
                out.append(dict(label="llama3-8b-gqa", batch=batch, heads=32, kv_heads=8, head_dim=128,
                                seq_kv=seq_kv, dtype=dtype))
        for batch, seq_kv in ((1, 16384), (16, 4096)) if not quick else ((16, 4096),):
            out.append(dict(label="mha", batch=batch, heads=32, kv_heads=32, head_dim=128, seq_kv=seq_kv, dtype=dtype))
        # small batches over long caches, where the split count decides how many SMs work
        for batch, seq_kv in ((1, 32768), (1, 131072), (2, 32768), (2, 131072)) if not quick else ((1, 131072),):
            out.append(dict(label="llama3-8b-gqa", batch=batch, heads=32, kv_heads=8, head_dim=128, seq_kv=seq_kv,
                            dtype=dtype))
        mqa = ((1, 32768), (1, 65536), (1, 131072), (2, 32768), (2, 131072), (16, 16384), (64, 4096))
        for batch, seq_kv in mqa if not quick else ((1, 131072), (16, 16384)):
            out.append(dict(label="mqa", batch=batch, heads=32, kv_heads=1, head_dim=128, seq_kv=seq_kv, dtype=dtype))
        for head_dim in (64, 96, 256) if not quick else (96,):
            for seq_kv in (4096, 16384) if not quick else (16384,):
                out.append(dict(label=f"gqa-d{head_dim}", batch=4, heads=32, kv_heads=8, head_dim=head_dim,
                                seq_kv=seq_kv, dtype=dtype))
        # paged caches beside the contiguous cases of the same shape
        for batch, seq_kv in ((16, 4096), (4, 16384)) if not quick else ((16, 4096),):
            for page_size in (16, 256):
                out.append(dict(label=f"llama3-8b-gqa-paged{page_size}", batch=batch, heads=32, kv_heads=8,
                                head_dim=128, seq_kv=seq_kv, dtype=dtype, page_size=page_size))
    # speculative decoding's verification: Q drafted tokens per sequence under a draft tree's mask (fp16)
    for batch in (1,) if quick else (1, 4):
        for seq_kv in (32768,) if quick else (4096, 32768):
            for tokens in (1, 8, 64) if quick else (1, 4, 8, 16, 64):
                out.append(dict(label=f"llama3-8b-tree{tokens}", batch=batch, heads=32, kv_heads=8, head_dim=128,
                                seq_kv=seq_kv, dtype=torch.float16, tree=tokens))
    # quantised caches (fp16 queries): kv_dtype the cache's storage, kv_scale "per_tensor" or "per_token_head"
    quantised = [(torch.float8_e4m3fn, "per_tensor"), (torch.float8_e4m3fn, "per_token_head"),
                 (torch.int8, "per_token_head")] + ([] if quick else [(torch.float8_e5m2, "per_tensor"),
                                                                      (torch.int8, "per_tensor")])
    shapes: List[Tuple[str, int, int, int, Optional[int]]] = [("llama3-8b-gqa", 1, 8, 65536, None)] + ([] if quick else [
        ("llama3-8b-gqa", 1, 8, 512, None), ("llama3-8b-gqa", 1, 8, 4096, None), ("llama3-8b-gqa", 16, 8, 4096, None),
        ("llama3-8b-gqa", 4, 8, 16384, None), ("mqa", 1, 1, 131072, None), ("llama3-8b-gqa-paged16", 16, 8, 4096, 16)])
    for kv_dtype, kv_scale in quantised:
        storage = {torch.float8_e4m3fn: "fp8e4m3", torch.float8_e5m2: "fp8e5m2", torch.int8: "int8"}[kv_dtype]
        for label, sequences, kv_heads, kv_length, paged in shapes:
            case = dict(label=f"{label}-{storage}-{kv_scale.replace('_', '-')}", batch=sequences, heads=32,
                        kv_heads=kv_heads, head_dim=128, seq_kv=kv_length, dtype=torch.float16, kv_dtype=kv_dtype,
                        kv_scale=kv_scale)
            if paged is not None:
                case["page_size"] = paged
            out.append(case)
    return [c for c in out if 2 * c["batch"] * c["kv_heads"] * c["seq_kv"] * c["head_dim"] *
            (1 if "kv_dtype" in c else 2) <= KV_BYTES_LIMIT]


def attention_serving_cases(quick: bool, gpu: Optional[bool] = None) -> List[dict]:
    """Serving attention cases: label, (new tokens, context before them) per sequence, page_size, dtype, head shape."""
    if not _on_gpu(gpu):
        return [dict(label="mixed", sequences=[(16, 48)] + [(1, 64)] * 3, page_size=None, dtype=torch.float32,
                     heads=4, kv_heads=2, head_dim=32),
                dict(label="mixed-paged16", sequences=[(16, 48)] + [(1, 64)] * 3, page_size=16, dtype=torch.float32,
                     heads=4, kv_heads=2, head_dim=32)]
    context = SERVING_CONTEXT
    mixed = [(512, context)] + [(1, context)] * 63
    shapes = [("prefill-4k", [(context, 0)], None), ("chunked-prefill-512-over-4k", [(512, context)], None),
              ("mixed-1x512+63x1-at-4k", mixed, None), ("mixed-paged16", mixed, 16), ("mixed-paged256", mixed, 256)]
    dtypes = (torch.float16,) if quick else (torch.float16, torch.bfloat16)
    return [dict(label=label, sequences=sequences, page_size=page_size, dtype=dtype, **LLAMA3_8B)
            for dtype in dtypes for label, sequences, page_size in shapes]


def case_lengths(spec: dict) -> List[tuple]:
    """(seqlen_q, seqlen_k) of each sequence of a serving case: its new tokens, attending to its context and themselves."""
    return [(new, context + new) for new, context in spec["sequences"]]


def build_serving_inputs(spec: dict, device: torch.device, make: Callable = torch.randn) -> dict:
    """Keyword arguments of a serving case's rt.flash_attn_varlen_func call (causal), contiguous or paged KV; with
    make=torch.empty on the meta device, the same call on meta tensors (what rlx-triton perf traces)."""
    lengths = case_lengths(spec)
    dtype, heads, kv_heads, dim = spec["dtype"], spec["heads"], spec["kv_heads"], spec["head_dim"]
    total_q, total_k = sum(q for q, _ in lengths), sum(k for _, k in lengths)
    cu_q = [0]
    cu_k = [0]
    for seqlen_q, seqlen_k in lengths:
        cu_q.append(cu_q[-1] + seqlen_q)
        cu_k.append(cu_k[-1] + seqlen_k)
    index: Dict = dict(device=device, dtype=torch.int32)
    kw = dict(q=make(total_q, heads, dim, device=device, dtype=dtype),
              cu_seqlens_q=torch.tensor(cu_q, **index) if device.type != "meta" else torch.empty(len(cu_q), **index),
              cu_seqlens_k=torch.tensor(cu_k, **index) if device.type != "meta" else torch.empty(len(cu_k), **index),
              max_seqlen_q=max(q for q, _ in lengths), max_seqlen_k=max(k for _, k in lengths), causal=True)
    page_size = spec["page_size"]
    if page_size is None:
        kw["k"] = make(total_k, kv_heads, dim, device=device, dtype=dtype)
        kw["v"] = make(total_k, kv_heads, dim, device=device, dtype=dtype)
    else:
        per_sequence = -(-kw["max_seqlen_k"] // page_size)
        pages = len(lengths) * per_sequence
        kw["k"] = make(pages, page_size, kv_heads, dim, device=device, dtype=dtype)
        kw["v"] = make(pages, page_size, kv_heads, dim, device=device, dtype=dtype)
        kw["block_table"] = (torch.randperm(pages, device=device).reshape(len(lengths), per_sequence).to(torch.int32)
                             if device.type != "meta" else torch.empty(len(lengths), per_sequence, **index))
    return kw


def fbank_cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """Fbank cases: batch (chunks) and samples per chunk."""
    gpu = _on_gpu(gpu)
    return [dict(batch=32 if gpu and not quick else (8 if gpu else 2), samples=160000)]


def sincnet_cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """SincNet cases: batch (chunks) and samples per chunk."""
    return [dict(batch=32 if _on_gpu(gpu) else 1, samples=160000)]


def lstm_cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """LSTM cases: batch, seq, input_size, hidden, layers (bidirectional, batch_first)."""
    batch, seq = (32, 589) if _on_gpu(gpu) else (2, 50)
    return [dict(batch=batch, seq=seq, input_size=60, hidden=128, layers=4)]


def pyannote_segmentation_cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """PyanNet segmentation cases: batch (chunks) and samples per chunk."""
    return [dict(batch=32, samples=160000) if _on_gpu(gpu) else dict(batch=1, samples=32000)]


def trunk_layers(batch: int, frames: int, m: int = 32, bins: int = 80):
    """(name, c_in, c_out, height, width, kernel, stride, padding, residual) of each distinct ResNet34 trunk conv,
    and the (channels, height, width) the trunk ends with."""
    rows = [("stem 3x3", 1, m, bins, frames, 3, 1, 1, False),
            ("layer1 3x3", m, m, bins, frames, 3, 1, 1, True)]
    h, w, c = bins, frames, m
    for i in (2, 3, 4):
        c2 = c * 2
        h2, w2 = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        rows += [(f"layer{i}.0 3x3/2", c, c2, h, w, 3, 2, 1, False),
                 (f"layer{i}.0 shortcut 1x1/2", c, c2, h, w, 1, 2, 0, False),
                 (f"layer{i} 3x3", c2, c2, h2, w2, 3, 1, 1, True)]
        h, w, c = h2, w2, c2
    return rows, (c, h, w)


TRUNK_LAYER_KEYS = ("c_in", "c_out", "height", "width", "kernel", "stride", "padding", "residual")


def embedding_cases(quick: bool = False, gpu: Optional[bool] = None) -> List[dict]:
    """WeSpeaker ResNet34 cases, by "layer": "end to end" (batch, samples), each distinct trunk conv (its name: batch,
    c_in, c_out, height, width, kernel, stride, padding, residual), "pool" (TSTP: batch, channels, height,
    width) and "seg_1" (batch, in_features, out_features)."""
    batch, samples = (32, 160000) if _on_gpu(gpu) else (1, 16000 if quick else 32000)
    frames = 1 + (samples - 400) // 160
    rows, (c_last, h_last, w_last) = trunk_layers(batch, frames)
    if quick:
        rows = rows[:2] + rows[-3:]
    return ([dict(layer="end to end", batch=batch, samples=samples)]
            + [dict(layer=row[0], batch=batch, **dict(zip(TRUNK_LAYER_KEYS, row[1:]))) for row in rows]
            + [dict(layer="pool", batch=batch, channels=c_last, height=h_last, width=w_last),
               dict(layer="seg_1", batch=batch, in_features=2 * c_last * h_last, out_features=256)])


CASES: Dict[str, Callable[..., List[dict]]] = {
    "sdpa_decode": sdpa_decode_cases, "attention_serving": attention_serving_cases, "fbank": fbank_cases,
    "sincnet": sincnet_cases, "lstm": lstm_cases, "pyannote_segmentation": pyannote_segmentation_cases,
    "embedding": embedding_cases}
