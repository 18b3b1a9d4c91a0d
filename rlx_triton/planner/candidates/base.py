"""Shared machinery of the candidate families: tag encoding/parsing from a field spec, what each tag part
means (the legend `rlx-triton explain` prints), the named variants table, candidate and launch validation
helpers, the precision-based default rule and the `FamilySpec` record that `planner.plan` and
`planner.launch` read.

A family module (`sdpa_decode.py`, `conv.py`, ...) holds only data and its own rules; everything
that behaves the same for every family lives here, once.
"""
from __future__ import annotations

import dataclasses
import enum
import operator
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Mapping, Optional, Sequence, Tuple, Type, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_options):
        """Only type checkers read it: candidate classes are dataclasses made by `candidate_dataclass`."""
        return lambda function: function

from ..policy import (
    U32_MAX,
    HybridPrecisionSpec,
    KernelFamily,
    MemoryKind,
    MemoryPolicy,
    PrecisionProfile,
    ScalarType,
    ThreadPolicy,
)

C = TypeVar("C")

# an unsigned 32-bit number in a tag: optional '+', ASCII digits only (no spaces, no '_', no sign '-')
_U32_TEXT = re.compile(r"\+?[0-9]+\Z")


def parse_u32(text: str) -> Optional[int]:
    """The number `text` spells, or None unless it is an optional '+' and ASCII digits within [0, 2^32)."""
    if not _U32_TEXT.match(text):
        return None
    value = int(text)
    return value if value <= U32_MAX else None


def as_u32(value: Any) -> Optional[int]:
    """An integer in [0, 2^32) from an int-like value (numpy ints too), else None; bools are refused."""
    if isinstance(value, bool):
        return None
    try:
        number = operator.index(value)
    except TypeError:
        return None
    return number if 0 <= number <= U32_MAX else None


def is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


# ---------------------------------------------------------------- tag fields


# how a legend names a request dtype, with its article
_DTYPE_SHORT = {"float32": "an fp32", "float64": "an fp64", "float16": "an fp16", "bfloat16": "a bf16"}


@dataclass(frozen=True)
class WordMeaning:
    """What a flag or choice word of a tag sets. `dtypes`: the request dtypes the word acts on (empty: every
    dtype); on a request of another dtype it has no effect, and `otherwise` says what the kernel does then."""

    text: str
    dtypes: Tuple[str, ...] = ()
    otherwise: str = ""

    def on(self, dtype: str) -> str:
        """The word's meaning on a request of `dtype` ("float16", "float32", ...)."""
        if not self.dtypes or dtype in self.dtypes:
            return self.text
        return f"no effect on {_DTYPE_SHORT.get(dtype, f'a {dtype}')} request: {self.otherwise}"


WordMeanings = Tuple[Tuple[str, WordMeaning], ...]


def _word_meanings(words: Optional[Mapping[str, Any]]) -> WordMeanings:
    """word -> WordMeaning pairs from a mapping of words to a WordMeaning or its text."""
    return tuple((word, meaning if isinstance(meaning, WordMeaning) else WordMeaning(meaning))
                 for word, meaning in (words or {}).items())


def _word_meaning(words: WordMeanings, word: str, dtype: str) -> str:
    for known, meaning in words:
        if known == word:
            return meaning.on(dtype)
    return ""


@dataclass(frozen=True)
class IntField:
    """An integer written `<prefix><value>`; `legacy_default` fills a tag that lacks the field; `sets`: what
    the value sets in the kernel (the legend's text)."""

    name: str
    prefix: str
    legacy_default: Optional[int] = None
    sets: str = ""

    def encode(self, value: int) -> str:
        return f"{self.prefix}{value}"

    def meaning(self, value: int, dtype: str) -> str:
        """What this field's tag part means on a request of `dtype`."""
        return self.sets

    def match(self, part: str) -> Tuple[bool, Optional[int]]:
        if not part.startswith(self.prefix):
            return False, None
        # a matching prefix with an unparseable number clears the field (the tag then needs a later part)
        return True, parse_u32(part[len(self.prefix):])

    def type_error(self, value: Any) -> Optional[str]:
        return None if as_u32(value) is not None else f"{self.name} must be an integer in [0, 2^32)"


@dataclass(frozen=True)
class FlagField:
    """A bool written as one of two words; `words`: what each word sets in the kernel."""

    name: str
    true_word: str
    false_word: str
    legacy_default: Optional[bool] = None
    words: WordMeanings = ()

    def encode(self, value: bool) -> str:
        return self.true_word if value else self.false_word

    def meaning(self, value: bool, dtype: str) -> str:
        """What this field's word means on a request of `dtype`."""
        return _word_meaning(self.words, self.encode(value), dtype)

    def match(self, part: str) -> Tuple[bool, Optional[bool]]:
        if part == self.true_word:
            return True, True
        if part == self.false_word:
            return True, False
        return False, None

    def type_error(self, value: Any) -> Optional[str]:
        return None if isinstance(value, bool) else f"{self.name} must be True or False"


@dataclass(frozen=True)
class ChoiceField:
    """A string field written as its own value, one of `choices`; `words`: what each choice sets in the kernel."""

    name: str
    choices: Tuple[str, ...]
    legacy_default: Optional[str] = None
    words: WordMeanings = ()

    def encode(self, value: str) -> str:
        return value

    def meaning(self, value: str, dtype: str) -> str:
        """What this field's word means on a request of `dtype`."""
        return _word_meaning(self.words, value, dtype)

    def match(self, part: str) -> Tuple[bool, Optional[str]]:
        return (True, part) if part in self.choices else (False, None)

    def type_error(self, value: Any) -> Optional[str]:
        return None if value in self.choices else f"{self.name} must be one of {', '.join(self.choices)}"


TagField = Any  # IntField | FlagField | ChoiceField


@dataclass(frozen=True)
class TagSpec:
    """The text form of a candidate: its fields joined by '_' in declared order.

    Parsing: parts are split on '_', each part is offered to the fields
    in declared order and the first that recognises it takes it (a later part overwrites an earlier
    one, an unparseable number clears the field), unknown parts are ignored, and a field still unset
    at the end takes its legacy default or makes the whole tag unparseable (None).
    """

    fields: Tuple[TagField, ...]

    def __post_init__(self) -> None:
        # A word that starts with an integer prefix would be read as that integer: refuse such a spec.
        prefixes = [f.prefix for f in self.fields if isinstance(f, IntField)]
        words = [w for f in self.fields for w in _words_of(f)]
        for word in words:
            for prefix in prefixes:
                if word.startswith(prefix):
                    raise ValueError(f"tag word {word!r} starts with the integer prefix {prefix!r}")
        if len(set(words)) != len(words):
            raise ValueError("tag words must be unique across fields")

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def encode(self, candidate: Any) -> str:
        return "_".join(f.encode(getattr(candidate, f.name)) for f in self.fields)

    def decode(self, cls: Type[C], tag: str) -> Optional[C]:
        if not isinstance(tag, str):
            return None
        values: Dict[str, Any] = {}
        for part in tag.split("_"):
            for f in self.fields:
                matched, value = f.match(part)
                if matched:
                    values[f.name] = value
                    break
        kwargs = {}
        for f in self.fields:
            value = values.get(f.name)
            if value is None:
                value = f.legacy_default
            if value is None:
                return None
            kwargs[f.name] = value
        return cls(**kwargs)

    def type_error(self, candidate: Any) -> Optional[str]:
        for f in self.fields:
            message = f.type_error(getattr(candidate, f.name))
            if message:
                return message
        return None


def _words_of(f: TagField) -> Tuple[str, ...]:
    if isinstance(f, FlagField):
        return (f.true_word, f.false_word)
    if isinstance(f, ChoiceField):
        return f.choices
    return ()


class Candidate:
    """Base of the candidate dataclasses: `tag()` / `from_tag()` driven by the class's `TAG`."""

    TAG: ClassVar[TagSpec]

    def tag(self) -> str:
        """Stable text form for persistence and logs."""
        return self.TAG.encode(self)

    @classmethod
    def from_tag(cls: Type[C], tag: str) -> Optional[C]:
        """Parse `tag()` text; None when the text is not a tag of this family."""
        return cls.TAG.decode(cls, tag)  # type: ignore[attr-defined]

    def __str__(self) -> str:
        return self.tag()


def int_field(prefix: str, legacy_default: Optional[int] = None, *, sets: str = "") -> Any:
    """A candidate field tagged `<prefix><value>`; `sets`: what the value sets in the kernel."""
    return dataclasses.field(metadata={"tag": IntField("", prefix, legacy_default, sets)})


def flag_field(true_word: str, false_word: str, *, words: Optional[Mapping[str, Any]] = None) -> Any:
    """A bool candidate field tagged by one of two words; `words`: each word -> what it sets (its text, or a
    WordMeaning for a word that acts on some request dtypes only)."""
    return dataclasses.field(metadata={"tag": FlagField("", true_word, false_word, words=_word_meanings(words))})


def choice_field(*choices: str, words: Optional[Mapping[str, Any]] = None) -> Any:
    """A string candidate field tagged by its value, one of `choices`; `words`: each choice -> what it sets (a
    shared table may hold more words than the field's choices)."""
    said = {word: meaning for word, meaning in (words or {}).items() if word in choices}
    return dataclasses.field(metadata={"tag": ChoiceField("", tuple(choices), words=_word_meanings(said))})


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def candidate_dataclass(cls: Type[C]) -> Type[C]:
    """Makes `cls` a frozen dataclass and builds its `TAG` from the fields' tag spellings, in
    declaration order, so each field is declared once."""
    made: Any = dataclass(frozen=True)(cls)
    made.TAG = TagSpec(tuple(dataclasses.replace(f.metadata["tag"], name=f.name) for f in dataclasses.fields(made)))
    return made


# ---------------------------------------------------------------- variants


class CandidateVariant(enum.Enum):
    """A named candidate of a family (the family's table of variants)."""

    def candidate(self) -> Any:
        return self.value

    def tag(self) -> str:
        return self.value.tag()


def define_variants(candidate_type: type, table: Sequence[Tuple[str, Any]], *, fp32: str, default: str) -> Any:
    """Builds the variants enum of a family (`XCandidate` -> `XVariant`, in the candidate's module).
    `ALL` keeps the table order, which is the plan order; `FP32` (the accuracy-safe candidate) and
    `DEFAULT` (the default plan's choice) are enum aliases of two table entries, so iteration and
    `ALL` list each candidate once. Typed `Any`: a type checker cannot see the members of an enum
    made at run time."""
    name = candidate_type.__name__.replace("Candidate", "Variant")
    module = candidate_type.__module__
    by_name = dict(table)
    members = list(table) + [("FP32", by_name[fp32]), ("DEFAULT", by_name[default])]
    variants: Any = CandidateVariant(name, members, module=module, qualname=name)  # type: ignore[call-arg]
    if len(variants) != len(table):
        raise ValueError(f"{name}: two variants share the same candidate")
    variants.ALL = tuple(variants)
    return variants


# ---------------------------------------------------------------- candidate validation helpers

TG_SIZES = (64, 128, 256, 512)


def check_tg_set(tg_size: int) -> Optional[str]:
    if tg_size not in TG_SIZES:
        return "tg_size must be one of 64, 128, 256, 512"
    return None


def check_tg_limit(tg_size: int, thread_policy: ThreadPolicy) -> Optional[str]:
    if tg_size > thread_policy.max_threads_per_tg:
        return "tg_size exceeds thread policy max_threads_per_tg"
    return None


def check_tg_size(tg_size: int, thread_policy: ThreadPolicy) -> Optional[str]:
    """The two thread-group rules shared by every family: a size from the allowed set, within the policy's limit."""
    return check_tg_set(tg_size) or check_tg_limit(tg_size, thread_policy)


def check_pow2_range(name: str, value: int, low: int, high: int) -> Optional[str]:
    if not (low <= value <= high and is_pow2(value)):
        return f"{name} must be a power-of-two in [{low}, {high}]"
    return None


def check_stages(stages: int) -> Optional[str]:
    if not 1 <= stages <= 4:
        return "stages must be in [1, 4]"
    return None


def check_staging(
    staging_bytes: int, memory_policy: MemoryPolicy, needs_shared: bool, needs_shared_reason: str
) -> Optional[str]:
    """The memory rules: arena-only refuses shared staging, shared-if-fits bounds its size."""
    if memory_policy.kind is MemoryKind.ARENA_ONLY and needs_shared:
        return needs_shared_reason
    if memory_policy.kind is MemoryKind.SHARED_IF_FITS and staging_bytes > memory_policy.max_tg_bytes:
        return "candidate staging bytes exceed memory policy limit"
    return None


def tiled_rules(
    tile_bounds: Mapping[str, Tuple[int, int]],
    staging_bytes: Callable[[Any], int],
    needs_shared: Callable[[Any], bool],
    needs_shared_reason: str,
) -> Callable[[Any, ThreadPolicy, MemoryPolicy], Optional[str]]:
    """Candidate rules of a tiled family, in this order: power-of-two tiles within bounds (tl.dot
    needs every tile dim >= 16), thread-group size, pipeline stages, then the memory policy against
    the family's estimate of one stage of fp32 operand staging."""

    def validate(c: Any, thread_policy: ThreadPolicy, memory_policy: MemoryPolicy) -> Optional[str]:
        for name, (low, high) in tile_bounds.items():
            message = check_pow2_range(name, getattr(c, name), low, high)
            if message:
                return message
        return (
            check_tg_size(c.tg_size, thread_policy)
            or check_stages(c.stages)
            or check_staging(staging_bytes(c), memory_policy, needs_shared(c), needs_shared_reason)
        )

    return validate


def pipelined(c: Any) -> bool:
    """Software pipelining (num_stages > 1) keeps operand stages in shared memory."""
    return c.stages > 1


PIPELINE_NEEDS_SHARED = "software pipelining (stages > 1) requires shared memory staging"


def first_error(*checks: Callable[[], Optional[str]]) -> Optional[str]:
    """Runs rule checks in order and returns the first message (a candidate reports one error, the first)."""
    for check in checks:
        message = check()
        if message:
            return message
    return None


# ---------------------------------------------------------------- precision helpers

FLOAT_STORAGE = frozenset({ScalarType.F32, ScalarType.F16, ScalarType.BF16})
WIDE_ACCUM = frozenset({ScalarType.F32, ScalarType.F64})


def check_float_pipeline(family: KernelFamily, hybrid: HybridPrecisionSpec) -> Optional[str]:
    """Rule shared by the diarization families: float storage and an F32/F64 accumulator."""
    if hybrid.accum.compute not in WIDE_ACCUM:
        return f"{family.value} requires accumulator compute in F32/F64"
    if hybrid.activations.storage not in FLOAT_STORAGE or hybrid.weights.storage not in FLOAT_STORAGE:
        return f"{family.value} requires activation and weight storage in F32/F16/BF16"
    return None


# what the tag words of the diarization families' shared fields set
TG_SIZE_SETS = "threads per program, num_warps = tg / 32 (Metal: threads per threadgroup)"
STAGES_SETS = "software-pipelining depth (num_stages)"
PRECISION_WORDS = {"ieee": "true fp32 dots",
                   "tf32x3": "three-pass TF32 dots (about fp32 accuracy, tensor cores)",
                   "tf32": "one-pass TF32 dots (about 1e-3 relative)"}

# profile -> dot precisions it accepts, most preferred first (diarization families)
PRECISION_PREFERENCE: Mapping[PrecisionProfile, Tuple[str, ...]] = {
    PrecisionProfile.ULTRA_LOW_LATENCY: ("tf32", "tf32x3", "ieee"),
    PrecisionProfile.BALANCED: ("ieee", "tf32x3"),
    PrecisionProfile.HIGH_FIDELITY: ("ieee",),
    PrecisionProfile.DETERMINISTIC: ("ieee",),
}


def choose_by_precision(profile: PrecisionProfile, thread_policy: ThreadPolicy, candidates: Sequence[Any]) -> Any:
    """Default candidate of the families with a `precision` field (conv, fbank, lstm, segdense).

    The rule: among candidates within the thread policy, the first whose dot
    precision is the profile's most preferred one (so BALANCED, HIGH_FIDELITY and DETERMINISTIC pick
    the first true-fp32 `ieee` candidate, ULTRA_LOW_LATENCY the first `tf32` one); else, ignoring the
    thread policy, the first with an accepted precision; else the first.
    """
    preference = PRECISION_PREFERENCE[profile]
    fitting = [c for c in candidates if c.tg_size <= thread_policy.max_threads_per_tg]
    for precision in preference:
        for c in fitting:
            if c.precision == precision:
                return c
    for c in candidates:
        if c.precision in preference:
            return c
    return candidates[0]


def float_pipeline_rule(family: KernelFamily) -> Callable[[HybridPrecisionSpec], Optional[str]]:
    return lambda hybrid: check_float_pipeline(family, hybrid)


def launch_default(plan: Any, fields: Mapping[str, int]) -> Any:
    """Launch rule of families without a shape heuristic: the plan's default candidate."""
    return plan.default_candidate


# ---------------------------------------------------------------- launch fields


@dataclass(frozen=True)
class LaunchField:
    """One launch field: `label` prefixes its value in kernel names, `bucket` names its shape bucket
    (None: not part of the shape bucket), values outside [low, high] raise InvalidField(`error_name`);
    `meaning`: what the value counts (`rlx-triton explain --help` shows it)."""

    name: str
    label: str = ""
    low: int = 1
    high: int = U32_MAX
    bucket: Optional[str] = None
    required: bool = True
    error_name: str = ""
    meaning: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)
        if not self.error_name:
            object.__setattr__(self, "error_name", self.name)


TOKENS_MEANING = "the length the planner buckets on"


def diarization_launch_fields(*names: str, high: Optional[Mapping[str, int]] = None,
                              meanings: Optional[Mapping[str, str]] = None) -> Tuple[LaunchField, ...]:
    """Launch fields of a diarization family: each positive and pow2-bucketed as `<name>_bucket`,
    then `tokens` (bucketed by the plan's token buckets, not in the shape bucket); `meanings`: name -> what
    the field counts."""
    bounds, said = dict(high or {}), dict(meanings or {})
    fields = tuple(LaunchField(n, bucket=f"{n}_bucket", high=bounds.get(n, U32_MAX), meaning=said.get(n, ""))
                   for n in names)
    return fields + (LaunchField("tokens", meaning=said.get("tokens", TOKENS_MEANING)),)


def no_cross_field_rule(fields: Mapping[str, int]) -> Optional[str]:
    return None


# ---------------------------------------------------------------- family record


@dataclass(frozen=True)
class FamilySpec:
    """Everything the plan and launch builders need to know about one family.

    - `validate_candidate(c, thread_policy, memory_policy)` -> the first rule's message or None.
    - `validate_precision(hybrid)` -> family precision rule message or None.
    - `choose_default(profile, thread_policy, candidates)` -> the plan's default candidate.
    - `choose_launch(plan, fields)` -> the candidate a launch uses when none is given.
    - `check_launch(fields)` -> name of a field breaking a cross-field rule, or None.
    - `tile_fields` / `padding_fields`: candidate fields set by the builder's `tile_sizes` / `padding`.
    """

    family: KernelFamily
    variants: Type[CandidateVariant]
    launch_fields: Tuple[LaunchField, ...]
    validate_candidate: Callable[[Any, ThreadPolicy, MemoryPolicy], Optional[str]]
    validate_precision: Callable[[HybridPrecisionSpec], Optional[str]]
    choose_default: Callable[[PrecisionProfile, ThreadPolicy, Sequence[Any]], Any]
    choose_launch: Callable[[Any, Mapping[str, int]], Any] = launch_default
    check_launch: Callable[[Mapping[str, int]], Optional[str]] = no_cross_field_rule
    tile_fields: Tuple[str, ...] = ()
    padding_fields: Tuple[str, ...] = ()
    token_field: str = "tokens"

    def __post_init__(self) -> None:
        names = tuple(f.name for f in dataclasses.fields(self.candidate_type))
        if names != self.candidate_type.TAG.names:
            raise ValueError(f"{self.candidate_type.__name__}: TAG fields {self.candidate_type.TAG.names} != {names}")
        missing = set(self.tile_fields + self.padding_fields) - set(names)
        if missing:
            raise ValueError(f"{self.family.value}: unknown candidate fields {sorted(missing)}")
        if self.token_field not in {f.name for f in self.launch_fields}:
            raise ValueError(f"{self.family.value}: token field {self.token_field!r} is not a launch field")

    @classmethod
    def diarization(
        cls,
        family: KernelFamily,
        variants: Type[CandidateVariant],
        launch_fields: Tuple[LaunchField, ...],
        validate_candidate: Callable[[Any, ThreadPolicy, MemoryPolicy], Optional[str]],
        **rules: Any,
    ) -> "FamilySpec":
        """A family with a `precision` field: float pipeline rule, precision-preference default."""
        return cls(
            family, variants, launch_fields, validate_candidate, float_pipeline_rule(family), choose_by_precision,
            **rules,
        )

    @property
    def candidate_type(self) -> Any:
        """The family's candidate class (a `candidate_dataclass`, with its `TAG`)."""
        return type(self.variants.ALL[0].value)  # type: ignore[attr-defined]

    @property
    def fp32_variant(self) -> CandidateVariant:
        return self.variants.FP32  # type: ignore[attr-defined]

    @property
    def default_variant(self) -> CandidateVariant:
        return self.variants.DEFAULT  # type: ignore[attr-defined]

    @property
    def default_candidates(self) -> Tuple[Any, ...]:
        return tuple(v.candidate() for v in self.variants.ALL)  # type: ignore[attr-defined]

    def candidate_error(self, candidate: Any, thread_policy: ThreadPolicy, memory_policy: MemoryPolicy) -> Optional[str]:
        """Type check from the tag spec, then the family's own rules."""
        if not isinstance(candidate, self.candidate_type):
            return f"{self.family.value} plans take {self.candidate_type.__name__} candidates"
        return self.candidate_type.TAG.type_error(candidate) or self.validate_candidate(
            candidate, thread_policy, memory_policy
        )
