"""What `rlx-triton explain` knows about each op: its fields, what a plain call of it sends, what
follows from what, and a legend for candidate tags.

The router decides from a Request (family, op, launch fields, dtype, device, features), which each op
builds from its tensors. Here the same Request is built from the command line: the fields given with
--field, the features of a plain call of the op (each can be changed with --feature), and the fields
that follow from those (a decode call's `m` and `tokens`, an fbank call's frames and FFT window, ...).
tests/cli/test_explain.py checks that each op's spec builds the request the op itself builds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class UsageError(ValueError):
    """A command-line mistake; its message is one line that says what is valid."""


Fields = Dict[str, int]
Features = Dict[str, Hashable]


@dataclass(frozen=True)
class Fill:
    """A field filled in when not given: computed from the fields and features before it."""

    name: str
    compute: Callable[[Fields, Features], int]
    why: str


@dataclass(frozen=True)
class Feature:
    default: Hashable
    choices: Tuple[Hashable, ...] = ()  # empty: any value of the default's type


@dataclass(frozen=True)
class OpSpec:
    family: str
    op: str
    required: Tuple[str, ...]
    fills: Tuple[Fill, ...]
    features: Mapping[str, Feature]
    check: Callable[[Fields, Features], Optional[str]] = lambda fields, features: None

    @property
    def field_names(self) -> Tuple[str, ...]:
        return self.required + tuple(f.name for f in self.fills)


def _bool(default: bool) -> Feature:
    return Feature(default, (False, True))


NO_GRAD = {"requires_grad": _bool(False)}


# ------------------------------------------------------------------------------------------ sdpa_decode

def _attention_fills() -> Tuple[Fill, ...]:
    return (
        Fill("seq_q", lambda f, o: 1, "one query token: a decode step"),
        Fill("num_kv_heads", lambda f, o: f["num_heads"], "= num_heads (no grouped-query heads)"),
        Fill("head_dim_v", lambda f, o: f["head_dim"], "= head_dim"),
        Fill("m", lambda f, o: f["seq_q"] * (f["num_heads"] // f["num_kv_heads"]),
             "seq_q x num_heads / num_kv_heads: query rows per KV head"),
        Fill("tokens", lambda f, o: f["seq_q"], "= seq_q"),
    )


def _check_heads(fields: Fields, features: Features) -> Optional[str]:
    if fields["num_heads"] % fields["num_kv_heads"]:
        return (f"num_heads={fields['num_heads']} must be a multiple of num_kv_heads={fields['num_kv_heads']} "
                f"(grouped-query attention)")
    return None


_ATTENTION_REQUIRED = ("batch", "num_heads", "head_dim", "seq_kv")

SDPA_DECODE = OpSpec(
    "sdpa_decode", "sdpa_decode", _ATTENTION_REQUIRED, _attention_fills(),
    {"mask": Feature("none", ("none",)), "causal": Feature("bottom_right", ("bottom_right",)),
     "dropout": Feature(False, (False,)), "layout": Feature("batched", ("batched",)), **NO_GRAD},
    _check_heads)

SDPA = OpSpec(
    "sdpa_decode", "scaled_dot_product_attention", _ATTENTION_REQUIRED, _attention_fills(),
    {"mask": Feature("none", ("none", "bool", "float")),
     "causal": Feature("none", ("none", "top_left", "top_left_with_mask")),
     "dropout": _bool(False), "layout": Feature("batched", ("batched", "broadcast", "unbatched")), **NO_GRAD},
    _check_heads)


# ------------------------------------------------------------------------------------------ conv

def _conv_len(length: int, taps: int, stride: int) -> int:
    return (length - taps) // stride + 1


def _sincnet_tokens(fields: Fields, features: Features) -> int:
    # pyannote's SincNet: the sinc conv, then two convolutions of 5 taps, each block max-pooled by `pool`
    pool = int(features["pool"])
    length = _conv_len(fields["length"], fields["taps"], fields["stride"]) // pool
    for _ in range(2):
        length = _conv_len(length, 5, 1) // pool
    return max(length, 1)


_CONV_FEATURES = {"groups": Feature(1, (1,)), "padding_mode": Feature("zeros", ("zeros", "same_asymmetric"))}

CONV1D = OpSpec(
    "conv", "conv1d", ("batch", "c_in", "c_out", "length", "taps"),
    (Fill("stride", lambda f, o: 1, "default"),
     Fill("tokens", lambda f, o: max(_conv_len(f["length"], f["taps"], f["stride"]) // int(o["pool"]), 1),
          "output length with padding 0, after the pool")),
    {**_CONV_FEATURES, "pool": Feature(1), "abs": _bool(False), "leaky": _bool(False), **NO_GRAD})

SINCNET = OpSpec(
    "conv", "sincnet", ("batch", "length"),
    (Fill("c_in", lambda f, o: 1, "mono waveforms"),
     Fill("c_out", lambda f, o: 80, "pyannote's 80 sinc filters"),
     Fill("taps", lambda f, o: 251, "pyannote's sinc filter length"),
     Fill("stride", lambda f, o: 10, "pyannote's sinc stride"),
     Fill("tokens", _sincnet_tokens, "frames after pyannote's three pooled blocks (convolutions of 5 taps)")),
    {**_CONV_FEATURES, "pool": Feature(3), "blocks": Feature(2), "streaming": _bool(False), "sample_rate": Feature(16000),
     **NO_GRAD})

CONV2D = OpSpec(
    "conv", "conv2d", ("batch", "c_in", "c_out", "length"),
    (Fill("taps", lambda f, o: o["kernel"][0] * o["kernel"][1], "kernel height x width"),
     Fill("stride", lambda f, o: 1, "default"),
     Fill("tokens", lambda f, o: max(f["length"] // (f["stride"] * f["stride"]), 1),
          "output pixels, for padding that keeps the size (length is height x width)")),
    {"kernel": Feature((3, 3)), "padding": Feature(1), "residual": _bool(False), "relu": _bool(False), **NO_GRAD})

STATS_POOL = OpSpec(
    "conv", "stats_pool", ("batch", "c_in", "length"),
    (Fill("c_out", lambda f, o: 2 * f["c_in"], "mean and standard deviation of each channel"),
     Fill("taps", lambda f, o: 1, "pooling"), Fill("stride", lambda f, o: 1, "pooling"),
     Fill("tokens", lambda f, o: 1, "one statistics row per sequence")),
    {"weighted": _bool(False), **NO_GRAD})


# ------------------------------------------------------------------------------------------ fbank

def _fbank_options(features: Features):
    from rlx_triton.backends.torch_ref.fbank import FbankOptions

    return FbankOptions(snip_edges=bool(features["snip_edges"]))


FBANK = OpSpec(
    "fbank", "fbank", ("batch", "samples"),
    (Fill("bins", lambda f, o: 23, "torchaudio's default num_mel_bins"),
     Fill("window", lambda f, o: _fbank_options(o).padded_window_size,
          "FFT size of a 25 ms frame at 16 kHz, rounded to a power of two"),
     Fill("frames", lambda f, o: _fbank_options(o).num_frames(f["samples"]), "10 ms frame shift"),
     Fill("tokens", lambda f, o: f["frames"], "= frames")),
    {"window_type": Feature("povey", ("hamming", "hanning", "povey", "rectangular", "blackman")),
     "snip_edges": _bool(True), "dither": _bool(False), "use_power": _bool(True), "use_log_fbank": _bool(True),
     "use_energy": _bool(False), "raw_energy": _bool(True), "htk_compat": _bool(False),
     "subtract_mean": _bool(False), "remove_dc_offset": _bool(True), "vtln": _bool(False), **NO_GRAD},
    lambda f, o: (f"samples={f['samples']} is shorter than one 25 ms frame (400 samples at 16 kHz)"
                  if f["samples"] < 400 else None))


# ------------------------------------------------------------------------------------------ lstm, segdense

LSTM = OpSpec(
    "lstm", "lstm", ("batch", "seq", "input_size", "hidden"),
    (Fill("layers", lambda f, o: 1, "default"), Fill("directions", lambda f, o: 1, "default (2: bidirectional)"),
     Fill("tokens", lambda f, o: f["seq"], "= seq")),
    {"dropout_active": _bool(False), "proj_size": Feature(0), "packed": _bool(False), "has_biases": _bool(True),
     "batch_first": _bool(False), **NO_GRAD})

SEGDENSE = OpSpec(
    "segdense", "segdense", ("rows", "in_features", "hidden", "classes"),
    (Fill("tokens", lambda f, o: f["rows"], "= rows"),),
    {"activation": Feature("log_softmax", ("none", "sigmoid", "log_softmax")), "linear_layers": Feature(2),
     **NO_GRAD})


# family -> its ops, the first one the default
FAMILY_OPS: Dict[str, Tuple[OpSpec, ...]] = {
    "sdpa_decode": (SDPA_DECODE, SDPA),
    "conv": (CONV1D, CONV2D, SINCNET, STATS_POOL),
    "fbank": (FBANK,),
    "lstm": (LSTM,),
    "segdense": (SEGDENSE,),
}


def op_spec(family: str, op: Optional[str]) -> OpSpec:
    specs = FAMILY_OPS.get(family)
    if specs is None:
        raise UsageError(f"unknown family {family!r}; choose from {', '.join(FAMILY_OPS)}")
    if op is None:
        return specs[0]
    for spec in specs:
        if spec.op == op:
            return spec
    raise UsageError(f"{family} has no op {op!r}; choose from {', '.join(s.op for s in specs)}")


# ------------------------------------------------------------------------------------------ parsing

def _pairs(pairs: Optional[Sequence[str]], flag: str) -> Dict[str, str]:
    parsed = {}
    for pair in pairs or ():
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} expects name=value, got {pair!r}")
        parsed[name] = raw
    return parsed


def _feature_value(name: str, raw: str, feature: Feature) -> Hashable:
    default = feature.default
    text = raw.strip().lower()
    if isinstance(default, bool):
        value: Hashable = {"true": True, "1": True, "false": False, "0": False}.get(text)
        if value is None:
            raise UsageError(f"--feature {name} must be true or false, got {raw!r}")
    elif isinstance(default, int):
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"--feature {name} must be an integer, got {raw!r}") from None
    elif isinstance(default, tuple):
        try:
            value = tuple(int(part) for part in text.replace("x", ",").split(","))
        except ValueError:
            value = ()
        if len(value) != len(default):
            raise UsageError(f"--feature {name} must be {len(default)} integers like "
                             f"{'x'.join(map(str, default))}, got {raw!r}")
    else:
        value = raw
    if len(feature.choices) == 1 and value not in feature.choices:
        raise UsageError(f"--feature {name} has one value for this op ({_show(feature.choices[0])}), got {raw!r}")
    if feature.choices and value not in feature.choices:
        raise UsageError(f"--feature {name} must be one of {', '.join(map(_show, feature.choices))}, got {raw!r}")
    return value


def _show(value: Hashable) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


def resolve(spec: OpSpec, field_args: Optional[Sequence[str]], feature_args: Optional[Sequence[str]]
            ) -> Tuple[Fields, Features, List[Tuple[str, int, str]]]:
    """(fields, features, filled) from --field/--feature pairs; `filled` lists (name, value, why) of
    every field that was not given. Unknown names, missing fields and bad values raise UsageError."""
    from rlx_triton.planner.candidates import FAMILIES
    from rlx_triton.planner.policy import KernelFamily

    bounds = {f.name: (f.low, f.high) for f in FAMILIES[KernelFamily(spec.family)].launch_fields}
    given = _pairs(field_args, "--field")
    unknown = sorted(set(given) - set(spec.field_names))
    if unknown:
        raise UsageError(f"{spec.op} has no field {', '.join(unknown)}; its fields are "
                         f"{', '.join(spec.field_names)}")
    fields: Fields = {}
    for name, raw in given.items():
        try:
            fields[name] = int(raw)
        except ValueError:
            raise UsageError(f"--field {name} must be an integer, got {raw!r}") from None
    missing = [name for name in spec.required if name not in fields]
    if missing:
        filled_names = ", ".join(f.name for f in spec.fills)
        raise UsageError(f"{spec.op} needs --field {', '.join(f'{name}=N' for name in missing)} "
                         f"(filled in when not given: {filled_names})")

    given_features = _pairs(feature_args, "--feature")
    unknown = sorted(set(given_features) - set(spec.features))
    if unknown:
        raise UsageError(f"{spec.op} has no feature {', '.join(unknown)}; its features are "
                         f"{', '.join(spec.features)}")
    features: Features = {name: feature.default for name, feature in spec.features.items()}
    for name, raw in given_features.items():
        features[name] = _feature_value(name, raw, spec.features[name])

    filled = []
    for fill in spec.fills:
        if fill.name not in fields:
            fields[fill.name] = fill.compute(fields, features)
            filled.append((fill.name, fields[fill.name], fill.why))
    for name, value in fields.items():
        low, high = bounds[name]
        if not low <= value <= high:
            raise UsageError(f"--field {name}={value} is outside [{low}, {high}]")
    problem = spec.check(fields, features)
    if problem:
        raise UsageError(problem)
    # the order the op sends them in: the planner's launch fields
    ordered = {name: fields[name] for name in bounds if name in fields}
    return ordered, features, filled


def check_dtype(name: str) -> str:
    if name not in FLOAT_DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(FLOAT_DTYPES)}, got {name!r}")
    return name


# ------------------------------------------------------------------------------------------ help and legend

# launch field -> what it counts, for `explain --help`
FIELD_MEANINGS: Dict[str, str] = {
    "batch": "sequences (or waveforms) in the call",
    "num_heads": "query heads", "num_kv_heads": "key/value heads (fewer than num_heads: grouped-query attention)",
    "head_dim": "size of one head of q and k", "head_dim_v": "size of one head of v",
    "seq_q": "query tokens (1: a decode step)", "seq_kv": "tokens in the KV cache",
    "m": "query rows per KV head", "tokens": "the length the planner buckets on",
    "c_in": "input channels", "c_out": "output channels", "length": "input samples or frames (conv2d: pixels)",
    "taps": "kernel size", "stride": "kernel stride",
    "samples": "samples per waveform", "bins": "mel bins", "window": "FFT size", "frames": "output frames",
    "seq": "timesteps", "input_size": "features per timestep", "hidden": "hidden units",
    "layers": "stacked layers", "directions": "1, or 2 for a bidirectional LSTM",
    "rows": "frames x batch", "in_features": "input features", "classes": "output classes",
}

EXAMPLES = (
    "rlx-triton explain sdpa_decode --device h200 --dtype float16 --field batch=1 --field num_heads=32 "
    "--field num_kv_heads=8 --field head_dim=128 --field seq_kv=4096",
    "rlx-triton explain fbank --field batch=1 --field samples=160000 --field bins=80 --feature window_type=hamming",
)


def help_text() -> str:
    """The families, ops, fields and features for `explain --help`."""
    names = dict.fromkeys(name for specs in FAMILY_OPS.values() for spec in specs for name in spec.field_names)
    lines = ["fields (--field NAME=INT):"]
    lines += [f"  {name:13} {FIELD_MEANINGS.get(name, '')}".rstrip() for name in names]
    lines += ["", "families and their ops (the first is the default), fields and features:"]
    for family, specs in FAMILY_OPS.items():
        lines.append(f"  {family}")
        for spec in specs:
            fills = ", ".join(f.name for f in spec.fills)
            features = ", ".join(f"{name}={_show(f.default)}" for name, f in spec.features.items())
            lines.append(f"    {spec.op}: --field {', '.join(spec.required)}")
            lines.append(f"      filled in when not given: {fills}")
            lines.append(f"      features (a plain call's): {features}")
    lines.append("A route names its candidate by a tag (e.g. skp4_tg256_..._f16kv_partial); the output "
                 "ends with a legend of the tag's parts.")
    lines += ["", "examples:"] + [f"  {example}" for example in EXAMPLES]
    return "\n".join(lines)


# candidate field -> what it sets; a dict maps each tag word of a flag or choice field to its meaning
TAG_MEANINGS: Dict[str, object] = {
    "split_k": ("most KV splits per sequence where that many fill the GPU (grid dim 1; the count comes from the "
                "device), merged by log-sum-exp"),
    "tg_size": "threads per program, num_warps = tg / 32 (Metal: threads per threadgroup)",
    "tile_m": "query rows per program (GQA group x query tokens; at least 16 for tl.dot)",
    "tile_n": "KV rows loaded per loop iteration (BLOCK_N)",
    "sdpa_decode.tile_k": "bound on the head-dim block (BLOCK_D; head_dim is padded to a power of two)",
    "pad_q": "query length padded to a multiple of this",
    "pad_kv": "KV length padded to a multiple of this",
    "use_f16_kv": {"f16kv": "QK^T and PV dots on fp16/bf16 operands (tensor cores)",
                   "f32kv": "operands upcast to fp32, ieee dots"},
    "partial_reduce": {"partial": "per-split partial results (Triton: merged by the last split, same launch; Metal: a combine pass)",
                       "full": "one pass (when split_k is 1)"},
    "tile_pos": "output positions (conv2d: pixels) per program (BLOCK_P)",
    "tile_co": "output channels per program (BLOCK_CO)",
    "conv.tile_k": "reduction chunk over c_in x taps per tl.dot (BLOCK_K)",
    "stages": "software-pipelining depth (num_stages)",
    "precision": {"ieee": "true fp32 dots", "tf32x3": "three-pass TF32 dots (about fp32 accuracy, tensor cores)",
                  "tf32": "one-pass TF32 dots (about 1e-3 relative)"},
    "fuse_epilogue": {"fused": "bias, abs, pooling, norm and residual in the same kernel",
                      "unfused": "the epilogue runs as a separate pass"},
    "tile_frames": "frames per program (BLOCK_F)",
    "tile_freq": "DFT frequency bins per tl.dot chunk (BLOCK_K)",
    "batch_tile": "sequences per program (BLOCK_B)",
    "hidden_tile": "hidden units per program (BLOCK_H)",
    "mode": {"persistent": "one program loops over all timesteps with h and c on chip",
             "stepwise": "one launch per timestep",
             "onchip": "hidden units split across programs that hold W_hh on chip and meet at a barrier each step"},
    "row_tile": "rows (frames x batch) per program (BLOCK_R)",
    "fused_activation": {"fusedact": "the final log-softmax or sigmoid in the same kernel",
                         "splitact": "the final activation as a separate pass"},
    "block_m": "packed query rows per program (query tokens x GQA group; at least 16 for tl.dot)",
    "block_n": "keys loaded per loop iteration (BLOCK_N)",
    "use_f16_dot": {"f16dot": "QK^T and PV dots on fp16/bf16 operands (tensor cores)",
                    "f32dot": "operands upcast to fp32, ieee dots"},
}


# tag words that act on 16-bit operands only: on an fp32 request the kernel keeps fp32 and ignores them
SIXTEEN_BIT_WORDS: Dict[str, str] = {
    "f16kv": "no effect on an fp32 request: the kernel keeps fp32 operands (fp16/bf16 requests only)"}


def tag_legend(family: str, candidate, dtype: str = "float16") -> List[Tuple[str, str]]:
    """(tag part, "field=value  meaning") for each part of the candidate's tag, in tag order; dtype: the request's
    (the meaning of a 16-bit-operand word depends on it)."""
    legend = []
    for tag_field in candidate.TAG.fields:
        value = getattr(candidate, tag_field.name)
        part = tag_field.encode(value)
        meaning = TAG_MEANINGS.get(f"{family}.{tag_field.name}", TAG_MEANINGS.get(tag_field.name))
        if isinstance(meaning, dict):
            meaning = meaning.get(part)
        if dtype == "float32" and part in SIXTEEN_BIT_WORDS:
            meaning = SIXTEEN_BIT_WORDS[part]
        legend.append((part, f"{tag_field.name}={value}  {meaning or ''}".rstrip()))
    return legend
