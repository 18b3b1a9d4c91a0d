"""The command-line side of `rlx-triton explain`: --field and --feature read against an op's request spec,
usage errors that say what is valid, the help text and the legend of a candidate's tag.

What an op sends the router is its request spec's (rlx_triton/ops/_request_spec.py), declared beside the
op: given fields, fields derived from them, features, checks and dtypes. Here a user's --field values
become the spec's given fields (the ones not given take the spec's defaults) and --feature values change a
plain call's features; the spec computes the derived fields, so explain builds the request the op builds
(tests/cli/test_explain.py checks it op by op). A derived field typed with --field is refused, naming what
it is computed from. The legend's meanings are the planner's: each candidate field says what it sets.

This module imports neither torch nor the ops at import time (`rlx-triton --help` stays quick): the specs
are looked up when a command needs them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from rlx_triton.ops._request_spec import Feature, RequestSpec


class UsageError(ValueError):
    """A command-line mistake; its message is one line that says what is valid."""


# the op modules that declare request specs, in the order explain lists their families; a family's first
# declared op is the one `explain FAMILY` means, its other ops follow by name
_OP_MODULES = ("sdpa_decode", "sdpa", "conv", "conv2d", "fbank", "lstm", "segdense")

_family_ops: Dict[str, Tuple["RequestSpec", ...]] = {}


def family_ops() -> Dict[str, Tuple["RequestSpec", ...]]:
    """family -> the request specs its ops declare, the family's default op first."""
    if not _family_ops:
        from rlx_triton.ops._request_spec import RequestSpec

        declared: Dict[str, List[RequestSpec]] = {}
        for name in _OP_MODULES:
            module = importlib.import_module(f"rlx_triton.ops.{name}")
            for value in vars(module).values():
                if isinstance(value, RequestSpec) and value not in declared.get(value.family, ()):
                    declared.setdefault(value.family, []).append(value)
        for family, specs in declared.items():
            _family_ops[family] = (specs[0], *sorted(specs[1:], key=lambda spec: spec.op))
    return _family_ops


def op_spec(family: str, op: Optional[str]) -> "RequestSpec":
    """The request spec of `op` of `family` (None: the family's default op)."""
    specs = family_ops().get(family)
    if specs is None:
        raise UsageError(f"unknown family {family!r}; choose from {', '.join(family_ops())}")
    if op is None:
        return specs[0]
    for spec in specs:
        if spec.op == op:
            return spec
    raise UsageError(f"{family} has no op {op!r}; choose from {', '.join(s.op for s in specs)}")


# ------------------------------------------------------------------------------------------ parsing

class Resolved(NamedTuple):
    """What the command line says about a call: the spec's given fields (typed, or their defaults), its
    features, and (name, value, why) of every field not typed (defaults, then derived fields)."""

    given: Dict[str, Any]
    features: Dict[str, Hashable]
    filled: List[Tuple[str, Any, str]]


def _pairs(pairs: Optional[Sequence[str]], flag: str) -> Dict[str, str]:
    parsed = {}
    for pair in pairs or ():
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"{flag} expects name=value, got {pair!r}")
        parsed[name] = raw
    return parsed


def _bool(raw: str, what: str) -> bool:
    value = {"true": True, "1": True, "false": False, "0": False}.get(raw.strip().lower())
    if value is None:
        raise UsageError(f"{what} must be true or false, got {raw!r}")
    return value


def _feature_value(name: str, raw: str, feature: "Feature") -> Hashable:
    default = feature.default
    text = raw.strip().lower()
    if isinstance(default, bool):
        value: Hashable = _bool(raw, f"--feature {name}")
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


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return str(value)


def _field_list(spec: "RequestSpec") -> str:
    given = ", ".join(g.name for g in spec.given)
    return f"{given} (derived: {', '.join(d.name for d in spec.derived)})" if spec.derived else given


def _refuse_derived(spec: "RequestSpec", name: str) -> UsageError:
    derived = spec.derived_field(name)
    assert derived is not None
    fields = [read for read in derived.reads if read not in spec.features]
    features = [read for read in derived.reads if read in spec.features]
    instead = " and ".join(part for part in (f"--field {', '.join(fields)}" if fields else "",
                                             f"--feature {', '.join(features)}" if features else "") if part)
    if not instead:
        return UsageError(f"{name} is derived: {derived.formula} for {spec.op}; leave it out")
    return UsageError(f"{name} is derived: {derived.formula}; give {instead} instead")


def _check_bounds(spec: "RequestSpec", name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        return
    low, high = spec.bounds(name)
    if not low <= value <= high:
        raise UsageError(f"--field {name}={value} is outside [{low}, {high}]")


def resolve(spec: "RequestSpec", field_args: Optional[Sequence[str]],
            feature_args: Optional[Sequence[str]]) -> Resolved:
    """The given fields and features that --field/--feature pairs describe. Unknown names, a derived field,
    missing fields, bad values and fields that break the spec's checks raise UsageError."""
    typed = _pairs(field_args, "--field")
    unknown = sorted(set(typed) - set(spec.field_names))
    if unknown:
        raise UsageError(f"{spec.op} has no field {', '.join(unknown)}; its fields are {_field_list(spec)}")
    for name in typed:
        if spec.derived_field(name) is not None:
            raise _refuse_derived(spec, name)
    given: Dict[str, Any] = {}
    for name, raw in typed.items():
        field = spec.given_field(name)
        if field is not None and isinstance(field.default, bool):
            given[name] = _bool(raw, f"--field {name}")
            continue
        try:
            given[name] = int(raw)
        except ValueError:
            raise UsageError(f"--field {name} must be an integer, got {raw!r}") from None
    missing = [name for name in spec.required if name not in given]
    if missing:
        raise UsageError(f"{spec.op} needs --field {', '.join(f'{name}=N' for name in missing)} "
                         f"(filled in when not given: {', '.join(g.name for g in spec.optional)})")

    typed_features = _pairs(feature_args, "--feature")
    unknown = sorted(set(typed_features) - set(spec.features))
    if unknown:
        raise UsageError(f"{spec.op} has no feature {', '.join(unknown)}; its features are "
                         f"{', '.join(spec.features)}")
    features: Dict[str, Hashable] = {name: feature.default for name, feature in spec.features.items()}
    for name, raw in typed_features.items():
        features[name] = _feature_value(name, raw, spec.features[name])

    values = spec.complete(given, features)
    for field in spec.given:
        _check_bounds(spec, field.name, values[field.name])
    problem = spec.problem(values, features)
    if problem:
        raise UsageError(problem)
    for derived in spec.derived:
        _check_bounds(spec, derived.name, values[derived.name])
    filled = [(g.name, values[g.name], g.why) for g in spec.optional if g.name not in given]
    filled += [(d.name, values[d.name], d.why) for d in spec.derived]
    return Resolved({g.name: values[g.name] for g in spec.given}, features, filled)


def check_dtype(spec: "RequestSpec", name: str) -> str:
    """`name` if the op takes that dtype; the message lists the ones it takes, narrowest first."""
    taken = [str(dtype).replace("torch.", "") for dtype in sorted(spec.dtypes, key=lambda dtype: dtype.itemsize)]
    if name not in taken:
        raise UsageError(f"--dtype must be one of {', '.join(taken)}, got {name!r}")
    return name


# ------------------------------------------------------------------------------------------ help and legend

EXAMPLES = (
    "rlx-triton explain sdpa_decode --device h200 --dtype float16 --field batch=1 --field num_heads=32 "
    "--field num_kv_heads=8 --field head_dim=128 --field seq_kv=4096",
    "rlx-triton explain fbank --field batch=1 --field samples=160000 --field bins=80 --feature window_type=hamming",
    "rlx-triton explain conv conv2d --field batch=4 --field c_in=32 --field c_out=32 --field height=80 "
    "--field width=200",
)


def field_meaning(spec: "RequestSpec", name: str) -> str:
    """What a field of the spec counts: the spec's words for a field the request does not carry, else the
    planner's launch field's."""
    from rlx_triton.ops._request_spec import launch_fields_of

    given = spec.given_field(name)
    if given is not None and given.meaning:
        return given.meaning
    for field in launch_fields_of(spec.family):
        if field.name == name:
            return field.meaning
    derived = spec.derived_field(name)
    return derived.meaning if derived is not None else ""


def help_text() -> str:
    """The families, their ops, fields and features, for `explain --help`."""
    lines = ["families and their ops (the first is the family's default), with their fields (--field NAME=VALUE) "
             "and features (--feature NAME=VALUE):"]
    for family, specs in family_ops().items():
        lines.append(f"  {family}")
        meanings: Dict[str, str] = {}
        for spec in specs:
            for name in spec.field_names:
                meanings.setdefault(name, field_meaning(spec, name))
        lines += [f"    {name:22} {meaning}".rstrip() for name, meaning in meanings.items()]
        for spec in specs:
            features = ", ".join(f"{name}={_show(f.default)}" for name, f in spec.features.items())
            lines.append(f"    {spec.op}: --field {', '.join(spec.required)}")
            if spec.optional:
                lines.append(f"      filled in when not given: {', '.join(g.name for g in spec.optional)}")
            lines.append(f"      derived, never given: {', '.join(d.name for d in spec.derived)}")
            lines.append(f"      features (a plain call's): {features}")
    lines.append("A route names its candidate by a tag (e.g. skp4_tg256_..._f16kv_partial); the output "
                 "ends with a legend of the tag's parts.")
    lines += ["", "examples:"] + [f"  {example}" for example in EXAMPLES]
    return "\n".join(lines)


def tag_legend(family: str, candidate: Any, dtype: str = "float16") -> List[Tuple[str, str]]:
    """(tag part, "field=value  meaning") for each part of the candidate's tag, in tag order. The meanings
    are the candidate fields' own (planner/candidates); dtype: the request's, since a word that acts on
    16-bit operands only says so on an fp32 request. `family`: the candidate's family (its value string)."""
    from rlx_triton.planner.candidates import FAMILIES

    candidate_type = next((spec.candidate_type for member, spec in FAMILIES.items() if member.value == family), None)
    if candidate_type is None or not isinstance(candidate, candidate_type):
        raise ValueError(f"{candidate!r} is not a candidate of the {family} family")
    legend = []
    for tag_field in candidate.TAG.fields:
        value = getattr(candidate, tag_field.name)
        meaning = tag_field.meaning(value, dtype)
        legend.append((tag_field.encode(value), f"{tag_field.name}={value}  {meaning}".rstrip()))
    return legend
