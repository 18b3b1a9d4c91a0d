"""Published rows of impl "triton", priced with this project's own kernel for the op (`rlx-triton perf --published`).

A row's shape becomes the rlx_triton call that runs that op (attention_prefill: rt.flash_attn_func; attention_decode
and paged_decode: rt.sdpa_decode; conv2d: rlx_triton.ops.conv2d; gemm: rlx_triton.ops.linear; lstm:
rlx_triton.ops.lstm) on meta tensors; it is routed to the Triton kernels as on the row's GPU (the backend forced:
the row is the kernel's, whatever the library would do) and its launches are planned, compiled for the GPU's
architecture and priced exactly as `rlx-triton perf` prices the bench cases.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch

from rlx_triton.perf.library import Unmodelled

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _call(row) -> Tuple[Callable[..., Any], tuple, Dict[str, Any]]:
    """(op, args, kwargs) of the rlx_triton call that runs the row's op at its shape, on meta tensors."""
    import rlx_triton as rt
    from rlx_triton.ops.conv2d import conv2d, linear
    from rlx_triton.ops.lstm import lstm

    dtype = _DTYPES.get(row.dtype)
    if dtype is None:
        raise Unmodelled(f"rlx_triton has no {row.dtype} kernel for {row.op}")
    shape = row.shape
    if row.op in ("attention_prefill", "attention_decode", "paged_decode"):
        batch, heads, kv_heads = shape["batch"], shape["heads"], shape["kv_heads"]
        seq_q, seq_kv, dim = shape["seq_q"], shape["seq_kv"], shape["head_dim"]
        if row.op == "attention_prefill":
            q = _meta(batch, seq_q, heads, dim, dtype=dtype)
            k = _meta(batch, seq_kv, kv_heads, dim, dtype=dtype)
            return rt.flash_attn_func, (q, k, _meta(batch, seq_kv, kv_heads, dim, dtype=dtype)), {
                "causal": bool(shape["causal"])}
        q = _meta(batch, heads, seq_q, dim, dtype=dtype)
        if row.op == "paged_decode":
            page = shape["page_size"]
            pages = -(-seq_kv // page)
            k = _meta(batch * pages, kv_heads, page, dim, dtype=dtype)
            v = _meta(batch * pages, kv_heads, page, dim, dtype=dtype)
            return rt.sdpa_decode, (q, k, v), {"block_table": _meta(batch, pages, dtype=torch.int32)}
        k = _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)
        return rt.sdpa_decode, (q, k, _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)), {}
    if dtype is not torch.float32:
        raise Unmodelled(f"rlx_triton's {row.op} kernels take fp32 inputs, not {row.dtype}")
    if row.op == "conv2d":
        x = _meta(shape["batch"], shape["c_in"], shape["h"], shape["w"], dtype=dtype)
        w = _meta(shape["c_out"], shape["c_in"], shape["kernel"], shape["kernel"], dtype=dtype)
        return conv2d, (x, w, _meta(shape["c_out"], dtype=dtype)), {"stride": shape["stride"],
                                                                    "padding": shape["padding"]}
    if row.op == "gemm":
        return linear, (_meta(shape["m"], shape["k"], dtype=dtype), _meta(shape["n"], shape["k"], dtype=dtype)), {}
    if row.op == "lstm":
        directions = 2 if shape["bidirectional"] else 1
        hidden = shape["hidden"]
        weights = []
        for layer in range(shape["layers"]):
            inputs = shape["input"] if layer == 0 else hidden * directions
            for _ in range(directions):
                weights += [_meta(4 * hidden, inputs, dtype=dtype), _meta(4 * hidden, hidden, dtype=dtype),
                            _meta(4 * hidden, dtype=dtype), _meta(4 * hidden, dtype=dtype)]
        x = _meta(shape["batch"], shape["seq"], shape["input"], dtype=dtype)
        return lstm, (x, None, weights), {"num_layers": shape["layers"], "bidirectional": bool(directions == 2),
                                          "batch_first": True}
    raise Unmodelled(f"rlx_triton has no kernel for {row.op}")


def triton_us(row, profile) -> float:
    """The estimated time of the project's kernel for the row on its GPU; Unmodelled where no kernel takes it."""
    from rlx_triton.perf.route_estimate import estimate_records, plan_call
    from rlx_triton.perf.trace import as_compiled
    from rlx_triton.router import explain, use_backend
    from rlx_triton.router.device import profile_facts, routing_as

    op, args, kwargs = _call(row)
    facts = profile_facts(profile)
    with as_compiled(), routing_as(facts), use_backend("triton"), torch.inference_mode():
        decided = explain(op, *args, **kwargs)
        if decided.backend != "triton":
            reasons = "; ".join(f"{name}: {refusal}" for name, refusal in decided.skipped)
            raise Unmodelled(f"no Triton kernel takes it ({reasons})")
        records = plan_call(lambda: (op, args, kwargs), decided, facts)
    if not records:
        raise Unmodelled("the kernel's launches could not be planned")
    estimate = estimate_records(records, profile)
    if estimate is None:
        raise Unmodelled("a launch did not compile for the GPU")
    return estimate
