"""The persisted winner table: tune-cache key -> winning candidate tag, with a last-used tick.

A text file, one header line then one tab-separated row per key; a row without the tick column
loads with tick 0. The table is read once, lazily, on first use; it is trimmed to `max_entries` by
the eviction policy on load and after every record. This module is the only planner module that touches files; it never reads the
environment (settings arrive as a `rlx_triton.config.Settings` or as arguments).

Robustness: a missing, corrupt, truncated or foreign file never raises; unreadable rows are skipped
with one logged warning per table. Writes go to a temp file renamed over the table (atomic), under
an exclusive `fcntl.flock` on `<path>.lock` where available, and merge the rows on disk at that
moment, so concurrent processes keep each other's winners except where the bound evicts them. A writer
killed mid-write leaves the table as it was (its temp file is never renamed) and the lock free (the
kernel drops a dead process's flock); the next writer deletes the temp file it left.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .candidates import FAMILIES
from .launch import FrozenFields, ShapeBucket, TuneCacheKey
from .policy import KernelFamily, PrecisionProfileTag, TuneCacheEviction, TunePolicy

try:  # POSIX only; elsewhere writes stay atomic but are not serialised between processes
    import fcntl
except ImportError:  # pragma: no cover - exercised on Windows only
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

TABLE_VERSION = 1
HEADER_PREFIX = "# rlx_triton tune cache v"
COLUMNS = (
    "schema", "family", "profile", "token_bucket", "shape_bucket", "device", "env_mask", "candidate", "last_used_tick",
    "time_us",
)
# the winner's name where the torch library op beat every kernel candidate at the bucket (`rlx-triton tune` times
# it beside them); the router then sends the bucket's calls to the library op
LIBRARY_WINNER = "library"
HEADER = f"{HEADER_PREFIX}{TABLE_VERSION}\t" + "\t".join(COLUMNS)
_HEADER_VERSION = re.compile(re.escape(HEADER_PREFIX) + r"(\d+)\b")
_BUCKET_ITEM = re.compile(r"([a-z_][a-z0-9_]*)=(\d+)\Z")


@dataclass(frozen=True)
class TuneCacheEntry:
    key: TuneCacheKey
    tag: str
    tick: int
    time_us: Optional[float] = None   # the winner's measured time, where the tuning run recorded it


def _valid_winner(family: KernelFamily, tag: object) -> bool:
    return isinstance(tag, str) and (tag == LIBRARY_WINNER or FAMILIES[family].candidate_type.from_tag(tag) is not None)


# ---------------------------------------------------------------- row text


def _escape(text: str) -> str:
    """Device fingerprints are free text: keep tabs and newlines out of the columns."""
    return text.replace("%", "%25").replace("\t", "%09").replace("\n", "%0A").replace("\r", "%0D")


def _unescape(text: str) -> str:
    return text.replace("%09", "\t").replace("%0A", "\n").replace("%0D", "\r").replace("%25", "%")


def render_row(entry: TuneCacheEntry) -> str:
    key = entry.key
    shape = ",".join(f"{name}={value}" for name, value in key.shape_bucket.buckets.items()) or "-"
    columns = (
        str(key.schema_version), key.family.value, key.precision_profile.value, str(key.token_bucket), shape,
        _escape(key.device_fingerprint), hex(key.env_mask), entry.tag, str(entry.tick),
        "-" if entry.time_us is None else repr(float(entry.time_us)),
    )
    return "\t".join(columns)


_DECIMAL = re.compile(r"[0-9]+\Z")
_HEX = re.compile(r"0x[0-9a-f]+\Z")


def _nonnegative(text: str) -> int:
    """A decimal count, digits only (int() alone would take spaces, signs and underscores)."""
    if not _DECIMAL.match(text):
        raise ValueError(text)
    return int(text)


def _hex(text: str) -> int:
    if not _HEX.match(text):
        raise ValueError(text)
    return int(text, 16)


def _time(text: str) -> Optional[float]:
    if text == "-":
        return None
    value = float(text)
    if not (value >= 0 and value != float("inf")):   # rejects NaN, negatives and infinity
        raise ValueError(text)
    return value


def parse_row(line: str) -> Optional[TuneCacheEntry]:
    """One row, or None when it is not a row of this table (older rows have no tick or time column)."""
    columns = line.split("\t")
    if len(columns) not in (len(COLUMNS), len(COLUMNS) - 1, len(COLUMNS) - 2):
        return None
    try:
        schema, family, profile, token_bucket, shape, device, env_mask, tag = columns[:8]
        tick = _nonnegative(columns[8]) if len(columns) > 8 else 0
        time_us = _time(columns[9]) if len(columns) > 9 else None
        family_value = KernelFamily(family)
        buckets: List[Tuple[str, int]] = []
        if shape != "-":
            for item in shape.split(","):
                match = _BUCKET_ITEM.match(item)
                if not match:
                    return None
                buckets.append((match.group(1), int(match.group(2))))
        key = TuneCacheKey(
            schema_version=_nonnegative(schema),
            family=family_value,
            precision_profile=PrecisionProfileTag(profile),
            token_bucket=_nonnegative(token_bucket),
            shape_bucket=ShapeBucket(FrozenFields(buckets)),
            device_fingerprint=_unescape(device),
            env_mask=_hex(env_mask),
        )
    except ValueError:
        return None
    if not _valid_winner(family_value, tag):
        return None
    return TuneCacheEntry(key, tag, tick, time_us)


@dataclass(frozen=True)
class ParsedTable:
    entries: Dict[TuneCacheKey, TuneCacheEntry]
    skipped_rows: int
    foreign_version: Optional[int]


def parse_table(text: str) -> ParsedTable:
    """Rows of a table text. A header of another table version discards every row (the schema
    changed); a file without a header is read row by row."""
    entries: Dict[TuneCacheKey, TuneCacheEntry] = {}
    skipped = 0
    # split on '\n' only: str.splitlines would also break rows at characters a fingerprint may hold
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("#"):
            version = _HEADER_VERSION.match(line)
            if version and int(version.group(1)) != TABLE_VERSION:
                return ParsedTable({}, 0, int(version.group(1)))
            continue
        entry = parse_row(line)
        if entry is None:
            skipped += 1
            continue
        previous = entries.get(entry.key)
        if previous is None or entry.tick >= previous.tick:
            entries[entry.key] = entry
    return ParsedTable(entries, skipped, None)


def render_table(entries: Dict[TuneCacheKey, TuneCacheEntry]) -> str:
    rows = sorted(entries.values(), key=lambda e: _bucket_order(e.key))
    return "\n".join([HEADER] + [render_row(e) for e in rows]) + "\n"


# ---------------------------------------------------------------- eviction


def _bucket_order(key: TuneCacheKey) -> Tuple[Any, ...]:
    """Buckets first (what keep-low / keep-high compare), then the rest of the key for a total order."""
    return (
        key.token_bucket, key.shape_bucket.values(), key.family.value, key.precision_profile.value,
        key.device_fingerprint, key.env_mask, key.schema_version, tuple(key.shape_bucket.buckets),
    )


def trim(entries: Dict[TuneCacheKey, TuneCacheEntry], max_entries: int, eviction: TuneCacheEviction) -> Dict[TuneCacheKey, TuneCacheEntry]:
    """Keeps at most `max_entries`: the lowest buckets, the highest buckets, or the most recently used."""
    if len(entries) <= max_entries:
        return entries
    if eviction is TuneCacheEviction.LRU:
        ranked = sorted(entries.values(), key=lambda e: (-e.tick, _bucket_order(e.key)))
    else:
        ranked = sorted(
            entries.values(),
            key=lambda e: _bucket_order(e.key),
            reverse=eviction is TuneCacheEviction.KEEP_HIGH_BUCKETS,
        )
    return {e.key: e for e in ranked[:max_entries]}


# ---------------------------------------------------------------- the table


class TuneCache:
    """Winners keyed by `TuneCacheKey`. `load`: read the file on first use (without it, lookups see
    only this process's records); `persist`: write each new winner to the file. Thread-safe within a
    process; cooperative between processes (see the module doc)."""

    def __init__(
        self,
        path: str,
        *,
        load: bool = True,
        persist: bool = True,
        max_entries: int = 256,
        eviction: TuneCacheEviction = TuneCacheEviction.KEEP_LOW_BUCKETS,
    ) -> None:
        self._path = os.fspath(path)
        self.load = bool(load)
        self.persist = bool(persist)
        self.max_entries = max(int(max_entries), 1)
        self.eviction = TuneCacheEviction(eviction)
        self._entries: Dict[TuneCacheKey, TuneCacheEntry] = {}
        self._tick = 0
        self._loaded = False
        self._warned = False
        self._lock = threading.RLock()

    @classmethod
    def from_settings(cls, settings: Any, policy: TunePolicy) -> "TuneCache":
        """The table a plan uses under `rlx_triton.config.Settings`, combined with the plan's policy: load and
        persist only when both the settings and the plan allow it, at most min(settings max, plan
        max) entries. Eviction: a plan that chose a policy keeps it; a plan on the default
        (keep-low) takes the settings' RLX_TRITON_TUNE_CACHE_EVICTION."""
        eviction = policy.cache_eviction
        if eviction is TunePolicy().cache_eviction:
            eviction = TuneCacheEviction(settings.tune_cache_eviction)
        return cls(
            settings.tune_cache_path,
            load=settings.tune_cache_load and policy.cache_load,
            persist=settings.tune_cache_persist and policy.persist_cache,
            max_entries=min(max(settings.tune_cache_max_entries, 1), max(policy.cache_max_entries, 1)),
            eviction=eviction,
        )

    @property
    def path(self) -> str:
        return self._path

    def lookup(self, key: TuneCacheKey) -> Optional[str]:
        """The winning candidate tag for `key` (LIBRARY_WINNER where the library op won), or None; a hit
        counts as a use for LRU (in memory, written with the next record)."""
        entry = self.lookup_entry(key)
        return None if entry is None else entry.tag

    def lookup_entry(self, key: TuneCacheKey) -> Optional[TuneCacheEntry]:
        """The winner's entry for `key` (its tag and, where recorded, its measured time), or None; a use for LRU."""
        with self._lock:
            self._ensure_loaded()
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._tick += 1
            self._entries[key] = TuneCacheEntry(key, entry.tag, self._tick, entry.time_us)
            return self._entries[key]

    def record(self, key: TuneCacheKey, tag: str, time_us: Optional[float] = None) -> None:
        """Stores `tag` (a candidate tag of the key's family, or LIBRARY_WINNER) as the winner of `key` with its
        measured time if given, trims, and persists when enabled and the winner changed."""
        if not isinstance(key, TuneCacheKey):
            raise TypeError(f"key must be a TuneCacheKey, got {type(key).__name__}")
        if not _valid_winner(key.family, tag):
            raise ValueError(f"tag {tag!r} is not a {key.family.value} candidate tag nor {LIBRARY_WINNER!r}")
        if time_us is not None:
            time_us = float(time_us)
            if not (time_us >= 0 and time_us != float("inf")):
                raise ValueError(f"time_us must be a finite time >= 0, got {time_us}")
        with self._lock:
            self._ensure_loaded()
            previous = self._entries.get(key)
            unchanged = previous is not None and previous.tag == tag and previous.time_us == time_us
            self._tick += 1
            self._entries[key] = TuneCacheEntry(key, tag, self._tick, time_us)
            # re-recording the same winner only counts as a use: no file write
            if self.persist and not unchanged:
                self._persist(key)
            self._entries = trim(self._entries, self.max_entries, self.eviction)

    def entries(self) -> List[TuneCacheEntry]:
        """A snapshot of the rows, lowest buckets first."""
        with self._lock:
            self._ensure_loaded()
            return sorted(self._entries.values(), key=lambda e: _bucket_order(e.key))

    def __len__(self) -> int:
        with self._lock:
            self._ensure_loaded()
            return len(self._entries)

    def __iter__(self) -> Iterator[TuneCacheEntry]:
        return iter(self.entries())

    def __repr__(self) -> str:
        return (
            f"TuneCache({self._path!r}, load={self.load}, persist={self.persist}, "
            f"max_entries={self.max_entries}, eviction={self.eviction.value!r})"
        )

    # ------------------------------------------------------------ file side

    def _warn_once(self, message: str, *args: Any) -> None:
        if not self._warned:
            self._warned = True
            log.warning(message, *args)

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if not self.load:
            return
        disk = self._read_disk()
        self._entries = trim(disk, self.max_entries, self.eviction)
        self._tick = max((e.tick for e in disk.values()), default=0)

    def _read_disk(self) -> Dict[TuneCacheKey, TuneCacheEntry]:
        try:
            with open(self._path, "rb") as handle:
                text = handle.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return {}
        except OSError as err:
            self._warn_once("tune cache %s is unreadable (%s); starting empty", self._path, err)
            return {}
        parsed = parse_table(text)
        if parsed.foreign_version is not None:
            self._warn_once(
                "tune cache %s was written by table version %d (this is %d); its rows are ignored",
                self._path, parsed.foreign_version, TABLE_VERSION,
            )
        elif parsed.skipped_rows:
            self._warn_once("tune cache %s: skipped %d unreadable row(s)", self._path, parsed.skipped_rows)
        return parsed.entries

    def _persist(self, recorded: TuneCacheKey) -> None:
        try:
            directory = os.path.dirname(os.path.abspath(self._path))
            os.makedirs(directory, exist_ok=True)
            with _exclusive_lock(self._path + ".lock"):
                _remove_dead_writers_files(self._path, directory)
                merged = self._read_disk()
                # the new winner must be the newest row, whatever other processes ticked meanwhile
                newest_on_disk = max((e.tick for e in merged.values()), default=0)
                if newest_on_disk >= self._tick:
                    self._tick = newest_on_disk + 1
                    mine = self._entries[recorded]
                    self._entries[recorded] = TuneCacheEntry(recorded, mine.tag, self._tick, mine.time_us)
                for key, entry in self._entries.items():
                    on_disk = merged.get(key)
                    if on_disk is None or entry.tick >= on_disk.tick:
                        merged[key] = entry
                merged = trim(merged, self.max_entries, self.eviction)
                _atomic_write(self._path, directory, render_table(merged))
        except (OSError, UnicodeError) as err:  # UnicodeError: a fingerprint with lone surrogates
            self._warn_once("tune cache %s could not be written (%s); winners stay in memory", self._path, err)
            return
        if self.load:
            self._entries = merged
        else:
            self._entries[recorded] = merged.get(recorded, self._entries[recorded])


@contextlib.contextmanager
def _exclusive_lock(lock_path: str) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    with open(lock_path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_dead_writers_files(path: str, directory: str) -> None:
    """Deletes the temp files of writers killed before their rename. Writers create temp files only while
    holding the exclusive lock, so under it every one left is a dead writer's (without fcntl nothing is
    removed: another process may be writing)."""
    if fcntl is None:
        return
    prefix = os.path.basename(path) + "."
    for name in os.listdir(directory):
        if name.startswith(prefix) and name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _atomic_write(path: str, directory: str, text: str) -> None:
    fd, temp_path = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_path)
        raise
