"""The bench cases as rlx_triton calls on meta tensors, for `rlx-triton perf`.

The case lists are rlx_triton.perf.cases (`<bench>_cases(quick, gpu=True)`: the cases a CUDA run
measures, what bench/<bench>.py runs); this module turns every case into the call that bench makes (the same module or op, the
same arguments, the same per-candidate rows a GPU run adds), on meta tensors, and into the case label
the bench writes to its results file (so measured times can be set next to the estimates). Modules are
built on the CPU (random weights) and moved to the meta device before the traced call. The stock pyannote
models of the sincnet, pyannote_segmentation and embedding benches are rlx_triton.perf.stock_models' (they need
pyannote.audio; without it those benches raise StockModelUnavailable).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from rlx_triton.perf import cases as case_lists
from rlx_triton.perf import stock_models
from rlx_triton.router.protocol import FamilyModule

META = torch.device("meta")


@dataclass
class PerfCase:
    bench: str
    case: str                      # the bench's label for the case (its results file's "shape")
    dtype: str
    call: Callable[[], Any]        # the rlx_triton call of the case, on meta tensors
    dims: Dict[str, int] = field(default_factory=dict)   # the case's dimensions where it spans several ops
    label: Optional[Callable[[Any], str]] = None          # the label from the call's output, where it names it
    pinned: Optional[str] = None   # the candidate a per-candidate row launches directly (no route)
    family: Optional[str] = None   # the family of a pinned row
    unless_routed: bool = False    # a pinned row the bench leaves out when its candidate is the routed one
    model: Optional[str] = None    # a whole-model forward: also reported per model (launches, host syncs)


def _meta(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, device=META, dtype=dtype)


def _taken_by_triton(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Optional[Tuple[FamilyModule, Any]]:
    """(family module, candidate) of the op call where the router gives it to Triton (the launches the bench
    times), else None."""
    from rlx_triton.router import explain

    route = explain(op, *args, **kwargs)
    if route.backend != "triton" or route.module is None:
        return None
    return route.module, route.candidate


def _on_meta(module: Callable[..., Any], *shape: int) -> Callable[[], Any]:
    """The call of `module` on a meta tensor of `shape`."""
    return lambda: module(_meta(*shape))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------------
# one function per bench: its cases as PerfCase rows
# ---------------------------------------------------------------------------------------------------
def _sdpa_decode(facts, quick: bool) -> List[PerfCase]:
    import rlx_triton as rt

    rows = []
    for spec in case_lists.sdpa_decode_cases(quick, gpu=True):
        batch, heads, kv_heads, dim, seq_kv, dtype = (spec[key] for key in
                                                      ("batch", "heads", "kv_heads", "head_dim", "seq_kv", "dtype"))

        def call(batch=batch, heads=heads, kv_heads=kv_heads, dim=dim, seq_kv=seq_kv, dtype=dtype,
                 page_size=spec.get("page_size"), tree=spec.get("tree"), kv_dtype=spec.get("kv_dtype"),
                 kv_scale=spec.get("kv_scale")):
            q = _meta(batch, heads, tree or 1, dim, dtype=dtype)
            if kv_dtype is not None:  # a quantised cache: rt.sdpa_decode with k_scale / v_scale, paged or not
                pages = None if page_size is None else -(-seq_kv // page_size)
                rows = (batch, kv_heads, seq_kv) if pages is None else (batch * pages, kv_heads, page_size)
                k, v = (_meta(*rows, dim, dtype=kv_dtype) for _ in range(2))
                scales = [_meta(*(rows if kv_scale == "per_token_head" else (1,)), dtype=torch.float32)
                          for _ in range(2)]
                paging = {} if pages is None else {"block_table": _meta(batch, pages, dtype=torch.int32)}
                taken = _taken_by_triton(rt.sdpa_decode, q, k, v, k_scale=scales[0], v_scale=scales[1], **paging)
                if taken is None:
                    return None
                module, candidate = taken
                return module.sdpa_decode(q, k, v, causal="bottom_right", k_scale=scales[0], v_scale=scales[1],
                                          candidate=candidate, **paging)
            if tree is not None:  # a draft tree's verification: rt.sdpa_decode with a (Q, Q) tree_mask
                k = _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)
                v = _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)
                mask = _meta(tree, tree, dtype=torch.bool)
                taken = _taken_by_triton(rt.sdpa_decode, q, k, v, tree_mask=mask)
                if taken is None:
                    return None
                module, candidate = taken
                return module.sdpa_decode(q, k, v, tree_mask=mask, candidate=candidate)
            if page_size is not None:  # a paged cache of the same shape: rt.sdpa_decode through a block table
                pages = -(-seq_kv // page_size)
                k_pages = _meta(batch * pages, kv_heads, page_size, dim, dtype=dtype)
                v_pages = _meta(batch * pages, kv_heads, page_size, dim, dtype=dtype)
                table = _meta(batch, pages, dtype=torch.int32)
                taken = _taken_by_triton(rt.sdpa_decode, q, k_pages, v_pages, block_table=table)
                if taken is None:
                    return None
                module, candidate = taken
                return module.sdpa_decode(q, k_pages, v_pages, causal="bottom_right", block_table=table,
                                          candidate=candidate)
            k = _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)
            v = _meta(batch, kv_heads, seq_kv, dim, dtype=dtype)
            gqa = kv_heads != heads
            taken = _taken_by_triton(rt.scaled_dot_product_attention, q, k, v, enable_gqa=gqa)
            if taken is None:
                return None
            module, candidate = taken
            # what the op's custom op runs (ops/sdpa_decode.py): meta tensors would only reach its fake
            return module.scaled_dot_product_attention(q, k, v, None, False, None, gqa, candidate=candidate)

        label = f"{spec['label']} b{batch} h{heads}/{kv_heads} d{dim} kv{seq_kv}"
        rows.append(PerfCase("sdpa_decode", label, _dtype_name(dtype), call))
    return rows


def _attention_serving(facts, quick: bool) -> List[PerfCase]:
    import rlx_triton as rt
    from rlx_triton.backends.triton import launches

    rows = []
    for spec in case_lists.attention_serving_cases(quick, gpu=True):
        def call(spec=spec):
            kw = case_lists.build_serving_inputs(spec, META, make=torch.empty)
            taken = _taken_by_triton(rt.flash_attn_varlen_func, **kw)
            if taken is None:
                return None
            module, candidate = taken
            # the routed launch, its counts from the case's lengths (the device holds them, the bench knows them)
            plan, outputs = module.varlen_attention_plan(
                kw["q"], kw["k"], kw["v"], kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["max_seqlen_q"],
                kw["max_seqlen_k"], scale=spec["head_dim"] ** -0.5, block_table=kw.get("block_table"),
                candidate=candidate, lengths=case_lists.case_lengths(spec),
                **module.kernel_options(True, (-1, -1), kw["max_seqlen_q"], kw["max_seqlen_k"], None))
            launches.run(plan)
            return outputs

        label = f"{spec['label']} h{spec['heads']}/{spec['kv_heads']} d{spec['head_dim']}"
        rows.append(PerfCase("attention_serving", label, _dtype_name(spec["dtype"]), call))
    return rows


def _waveform_case(bench: str, module, spec: dict, describe_output: Callable[[Any], str], **extra) -> PerfCase:
    """A bench case that runs `module` on (batch, 1, samples) waveforms; its label names the input and the output."""
    batch, samples = spec["batch"], spec["samples"]
    source = f"({batch}, 1, {samples})"
    return PerfCase(bench, f"{source} cuda", "float32", lambda: module(_meta(batch, 1, samples)),
                    label=lambda out: f"{source} -> {describe_output(out)} cuda", **extra)


def _fbank(facts, quick: bool) -> List[PerfCase]:
    import rlx_triton as rt

    return [_waveform_case("fbank", rt.nn.Fbank.wespeaker().to(META), spec,
                           lambda out: f"({out.shape[0]}, {out.shape[1]}, {out.shape[2]})")
            for spec in case_lists.fbank_cases(quick, gpu=True)]


def _sincnet(facts, quick: bool) -> List[PerfCase]:
    from rlx_triton.nn.conv import SincNet

    return [_waveform_case("sincnet", SincNet.from_pyannote(stock_models.pyannote_sincnet()).to(META), spec,
                           lambda out: f"({out.shape[0]}, {out.shape[1]}, {out.shape[-1]})")
            for spec in case_lists.sincnet_cases(quick, gpu=True)]


def _lstm(facts, quick: bool) -> List[PerfCase]:
    from rlx_triton.backends.triton import lstm as triton_lstm
    from rlx_triton.nn import LSTM
    from rlx_triton.planner import LstmVariant

    rows = []
    for spec in case_lists.lstm_cases(quick, gpu=True):
        batch, seq, features = spec["batch"], spec["seq"], spec["input_size"]
        module = torch.nn.LSTM(features, spec["hidden"], spec["layers"], bidirectional=True,
                               batch_first=True).eval().to(META)
        fast = LSTM.from_torch(module)
        label = f"({batch}, {seq}, 60) h128 x4 bi cuda"
        rows.append(PerfCase("lstm", label, "float32", _on_meta(fast, batch, seq, features)))
        kwargs = dict(has_biases=True, num_layers=spec["layers"], dropout=0.0, training=False, bidirectional=True,
                      batch_first=True)
        for variant in LstmVariant:  # the rows a GPU run adds: every other approved candidate, called directly
            candidate = variant.candidate()
            if candidate.tag() not in triton_lstm.APPROVALS:
                continue

            def direct(module=module, candidate=candidate, shape=(batch, seq, features)):
                return triton_lstm.lstm(_meta(*shape), None, module._flat_weights, candidate=candidate, **kwargs)

            rows.append(PerfCase("lstm", label, "float32", direct, pinned=candidate.tag(), family="lstm",
                                 unless_routed=True))
    return rows


def _pyannote_segmentation(facts, quick: bool) -> List[PerfCase]:
    from rlx_triton.integrations import pyannote

    return [_waveform_case("pyannote_segmentation", pyannote.optimize(stock_models.pyannet()).to(META),
                           spec, lambda out: f"{tuple(out.shape)}", dims=dict(spec), model="PyanNet segmentation")
            for spec in case_lists.pyannote_segmentation_cases(quick, gpu=True)]


def _embedding(facts, quick: bool) -> List[PerfCase]:
    from torch import nn

    from rlx_triton.backends.triton import conv2d as kernels
    from rlx_triton.integrations import pyannote
    from rlx_triton.nn.conv2d import Conv2d, Projection, StatsPool
    from rlx_triton.router import clear_route_cache

    specs = case_lists.embedding_cases(quick, gpu=True)
    approved = [c for c in kernels.all_candidates() if kernels.candidate_tag(c) in kernels.APPROVALS]
    rows = []
    for spec in specs:
        batch = spec["batch"]
        if spec["layer"] == "end to end":
            fast = pyannote.optimize(stock_models.wespeaker_resnet34()).to(META)
            waveforms = dict(batch=batch, samples=spec["samples"])
            whole = _waveform_case("embedding", fast, waveforms, lambda out: f"{tuple(out.shape)}", dims=waveforms,
                                   model="WeSpeaker ResNet34")
            rows.append(whole)
            for candidate in approved:  # the rows a GPU run adds: each approved conv candidate as the recipe
                tag = kernels.candidate_tag(candidate)

                def pinned(forward=whole.call, tag=tag):
                    saved = dict(kernels.RECIPES)
                    kernels.RECIPES[facts.device_class] = tag
                    clear_route_cache()
                    try:
                        return forward()
                    finally:
                        kernels.RECIPES.clear()
                        kernels.RECIPES.update(saved)
                        clear_route_cache()

                def labelled(out, label=whole.label, tag=tag) -> str:
                    return f"{label(out) if label is not None else whole.case}, conv recipe {tag}"

                rows.append(PerfCase("embedding", f"{whole.case}, conv recipe {tag}", "float32", pinned, dims=waveforms,
                                     label=labelled))
        elif "c_in" in spec:
            name, c_in, c_out, h, w = spec["layer"], spec["c_in"], spec["c_out"], spec["height"], spec["width"]
            k, s, p = spec["kernel"], spec["stride"], spec["padding"]
            conv = nn.Conv2d(c_in, c_out, k, stride=s, padding=p, bias=False)
            bn = nn.BatchNorm2d(c_out)
            stock_models.randomize(nn.Sequential(conv, bn))
            fused = Conv2d.from_torch(conv.to(META), bn=bn.to(META), relu=True)  # the bn is not its submodule
            out_h, out_w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
            residual = (batch, c_out, out_h, out_w) if spec["residual"] else None
            label = f"{name} ({batch}, {c_in}, {h}, {w}) -> {c_out} cuda"

            def layer(fused=fused, shape=(batch, c_in, h, w), residual=residual):
                return fused(_meta(*shape), residual=None if residual is None else _meta(*residual))

            rows.append(PerfCase("embedding", label, "float32", layer))
            for candidate in approved:
                def direct(fused=fused, candidate=candidate, shape=(batch, c_in, h, w), residual=residual, s=s, p=p):
                    return kernels.conv2d(_meta(*shape), *fused.folded(), stride=s, padding=p,
                                          residual=None if residual is None else _meta(*residual), relu=True,
                                          candidate=candidate)

                rows.append(PerfCase("embedding", label, "float32", direct, pinned=kernels.candidate_tag(candidate),
                                     family="conv", unless_routed=True))
        elif spec["layer"] == "pool":
            shape = (batch, spec["channels"], spec["height"], spec["width"])
            pool = StatsPool()
            rows.append(PerfCase("embedding", f"TSTP {shape} cuda", "float32", _on_meta(pool, *shape)))
        elif spec["layer"] == "seg_1":
            projection = Projection.from_torch(nn.Linear(spec["in_features"], spec["out_features"])).to(META)
            rows.append(PerfCase(
                "embedding", f"seg_1 ({batch}, {spec['in_features']}) -> {spec['out_features']} cuda", "float32",
                _on_meta(projection, batch, spec["in_features"])))
    return rows


_ADAPTERS = {"sdpa_decode": _sdpa_decode, "attention_serving": _attention_serving, "fbank": _fbank, "sincnet": _sincnet, "lstm": _lstm,
             "pyannote_segmentation": _pyannote_segmentation, "embedding": _embedding}


def perf_cases(name: str, facts, quick: bool = False) -> List[PerfCase]:
    """Every case of bench `name` (as a CUDA run measures it) as a PerfCase."""
    if name not in _ADAPTERS:
        raise ValueError(f"unknown bench {name!r}; choose from {', '.join(_ADAPTERS)}")
    return _ADAPTERS[name](facts, quick)
