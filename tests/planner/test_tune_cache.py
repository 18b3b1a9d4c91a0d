"""The persisted winner table: format, legacy rows, robustness, eviction, settings, concurrency."""
import dataclasses
import logging
import multiprocessing
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_triton.config import settings_from
from rlx_triton.planner import (
    ConvVariant,
    KernelFamily,
    KernelPlanBuilder,
    LaunchBuilder,
    PrecisionProfileTag,
    SdpaDecodeVariant,
    ShapeBucket,
    TuneCache,
    TuneCacheEviction,
    TuneCacheKey,
    TunePolicy,
    tune_cache_key,
)
from rlx_triton.planner import tune_cache as tc

PARTIAL = SdpaDecodeVariant.PARTIAL_F16_KV.tag()
BASE = SdpaDecodeVariant.BASE_F32.tag()


def key(token_bucket=0, seq_kv_bucket=0, device="sm90", family=KernelFamily.SDPA_DECODE):
    return TuneCacheKey(
        schema_version=1,
        family=family,
        precision_profile=PrecisionProfileTag.BALANCED,
        token_bucket=token_bucket,
        shape_bucket=ShapeBucket.of(m_bucket=0, seq_kv_bucket=seq_kv_bucket),
        device_fingerprint=device,
        env_mask=0x10,
    )


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "cache" / "tune-v1.tsv")


def read_rows(path):
    with open(path, encoding="utf-8", newline="") as handle:
        lines = handle.read().rstrip("\n").split("\n")
    assert lines[0] == tc.HEADER
    return [tc.parse_row(line) for line in lines[1:]]


def test_record_persists_and_a_new_table_loads_it(path):
    table = TuneCache(path)
    assert table.lookup(key()) is None and len(table) == 0
    table.record(key(1), PARTIAL)
    table.record(key(2, device="weird\tdevice\nname%\r\x85\u2028\x0c"), BASE)
    assert table.lookup(key(1)) == PARTIAL
    fresh = TuneCache(path)
    assert len(fresh) == 2 and fresh.path == path
    assert fresh.lookup(key(2, device="weird\tdevice\nname%\r\x85\u2028\x0c")) == BASE
    assert [e.tag for e in fresh.entries()] == [PARTIAL, BASE]  # lowest buckets first
    assert all(row is not None for row in read_rows(path))


def test_real_keys_round_trip_through_the_file(path):
    plan = KernelPlanBuilder(KernelFamily.CONV).build_plan()
    launch = LaunchBuilder.from_plan(plan).fields(batch=2, c_in=1, c_out=80, length=16000, taps=251, stride=10,
                                                   tokens=1575).build()
    real = tune_cache_key(plan, launch, "NVIDIA H100 80GB HBM3", 2**63)
    TuneCache(path).record(real, ConvVariant.TF32X3_P64_CO64.tag())
    assert TuneCache(path).lookup(real) == ConvVariant.TF32X3_P64_CO64.tag()


def test_record_refuses_tags_of_another_family(path):
    table = TuneCache(path)
    with pytest.raises(ValueError, match="not a conv candidate tag"):
        table.record(key(family=KernelFamily.CONV), PARTIAL)
    with pytest.raises(TypeError):
        table.record("key", PARTIAL)


def test_row_text_round_trip_keeps_ticks():
    entry = tc.TuneCacheEntry(key(3, 7), PARTIAL, 42)
    row = tc.render_row(entry)
    assert row.split("\t") == ["1", "sdpa_decode", "balanced", "3", "m_bucket=0,seq_kv_bucket=7", "sm90", "0x10",
                               PARTIAL, "42", "-"]
    assert tc.parse_row(row) == entry


@given(device=st.text(), env_mask=st.integers(0, 2**64 - 1), tick=st.integers(0, 2**63))
def test_any_fingerprint_and_mask_round_trip(device, env_mask, tick):
    entry = tc.TuneCacheEntry(dataclasses.replace(key(2, 5, device=device), env_mask=env_mask), BASE, tick)
    text = tc.render_table({entry.key: entry})
    assert tc.parse_table(text).entries == {entry.key: entry}


def test_unencodable_fingerprint_is_kept_in_memory(path, caplog):
    table = TuneCache(path)
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        table.record(key(device="\udc80"), PARTIAL)
    assert table.lookup(key(device="\udc80")) == PARTIAL and len(caplog.records) == 1


def test_legacy_rows_without_tick_load_with_tick_zero(path):
    os.makedirs(os.path.dirname(path))
    legacy = "\t".join(tc.render_row(tc.TuneCacheEntry(key(4), PARTIAL, 9)).split("\t")[:-2])
    with open(path, "w") as handle:  # a file without the header, the tick and the time columns
        handle.write(legacy + "\n")
    table = TuneCache(path)
    assert [(e.tag, e.tick) for e in table.entries()] == [(PARTIAL, 0)]


def test_rows_without_a_time_column_load_with_no_time(path):
    os.makedirs(os.path.dirname(path))
    older = "\t".join(tc.render_row(tc.TuneCacheEntry(key(4), PARTIAL, 9, 12.5)).split("\t")[:-1])
    with open(path, "w") as handle:  # a row written before the table recorded winners' times
        handle.write(older + "\n")
    assert [(e.tag, e.tick, e.time_us) for e in TuneCache(path).entries()] == [(PARTIAL, 9, None)]


def test_the_library_op_can_be_the_winner_with_its_time(path):
    table = TuneCache(path)
    table.record(key(4), tc.LIBRARY_WINNER, time_us=7.25)
    assert table.lookup(key(4)) == tc.LIBRARY_WINNER
    reloaded = TuneCache(path).lookup_entry(key(4))
    assert (reloaded.tag, reloaded.time_us) == (tc.LIBRARY_WINNER, 7.25)


@pytest.mark.parametrize("time_us", [-1.0, float("nan"), float("inf")])
def test_a_winner_time_must_be_a_finite_time(path, time_us):
    with pytest.raises(ValueError, match="time_us"):
        TuneCache(path).record(key(4), PARTIAL, time_us=time_us)


def test_legacy_sdpa_tags_without_tile_fields_are_accepted(path):
    os.makedirs(os.path.dirname(path))
    row = tc.render_row(tc.TuneCacheEntry(key(4), "skp4_tg256_f16kv_partial", 3))
    with open(path, "w") as handle:
        handle.write(tc.HEADER + "\n" + row + "\n")
    assert TuneCache(path).lookup(key(4)) == "skp4_tg256_f16kv_partial"


GOOD = tc.render_row(tc.TuneCacheEntry(key(1), PARTIAL, 5))
CORRUPT_FILES = {
    "garbage rows": tc.HEADER + "\nnot a row\n1\t2\t3\n" + GOOD + "\n",
    "truncated last row": tc.HEADER + "\n" + GOOD + "\n" + GOOD.replace("\t1\t", "\t2\t")[:40],
    "unknown family": tc.HEADER + "\n" + GOOD.replace("sdpa_decode", "matmul") + "\n" + GOOD + "\n",
    "unparseable tag": tc.HEADER + "\n" + GOOD.replace("\t5", "\t6").replace(PARTIAL, "skp4") + "\n" + GOOD + "\n",
    "negative tick": tc.HEADER + "\n" + GOOD[:-1] + "-5\n" + GOOD + "\n",
    "bad shape": tc.HEADER + "\n" + GOOD.replace("m_bucket=0", "m_bucket") + "\n" + GOOD + "\n",
}


@pytest.mark.parametrize("text", list(CORRUPT_FILES.values()), ids=list(CORRUPT_FILES))
def test_corrupt_rows_are_skipped_with_one_warning(path, text, caplog):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write(text)
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        table = TuneCache(path)
        assert table.lookup(key(1)) == PARTIAL
        table.record(key(2), BASE)  # reading the file again while writing does not warn again
    assert len(caplog.records) == 1 and "unreadable row" in caplog.records[0].getMessage()
    assert all(row is not None for row in read_rows(path))


@pytest.mark.parametrize(
    "content", [b"\x00\xff\xfe binary \x89PNG\r\n\x1a\n", b"", b"\n\n", b"# some other tool\nname\tvalue\n"]
)
def test_foreign_files_never_raise(path, content):
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as handle:
        handle.write(content)
    table = TuneCache(path)
    assert len(table) == 0
    table.record(key(1), PARTIAL)
    assert TuneCache(path).lookup(key(1)) == PARTIAL


def test_a_directory_in_the_way_never_raises(tmp_path, caplog):
    blocked = tmp_path / "cache.tsv"
    blocked.mkdir()
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        table = TuneCache(str(blocked))
        table.record(key(1), PARTIAL)
        table.record(key(2), PARTIAL)
    assert table.lookup(key(1)) == PARTIAL  # kept in memory
    assert len(caplog.records) == 1


def test_another_table_version_ignores_every_row(path, caplog):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write(tc.HEADER.replace(" v1\t", " v2\t") + "\n" + GOOD + "\n")
    with caplog.at_level(logging.WARNING, logger=tc.__name__):
        assert len(TuneCache(path)) == 0
    assert "table version 2" in caplog.text


def test_load_false_reads_nothing_but_persist_keeps_the_file_rows(path):
    TuneCache(path).record(key(1), PARTIAL)
    blind = TuneCache(path, load=False)
    assert blind.lookup(key(1)) is None
    blind.record(key(2), BASE)
    assert len(blind) == 1
    assert {e.key for e in TuneCache(path).entries()} == {key(1), key(2)}


def test_recording_the_same_winner_again_only_counts_as_a_use(path):
    table = TuneCache(path)
    table.record(key(1), PARTIAL)
    before = os.stat(path).st_mtime_ns, open(path).read()
    os.utime(path, ns=(0, 0))
    table.record(key(1), PARTIAL)
    assert os.stat(path).st_mtime_ns == 0 and open(path).read() == before[1]
    assert table.entries()[0].tick == 2
    table.record(key(1), BASE)
    assert TuneCache(path).lookup(key(1)) == BASE


def test_persist_false_writes_nothing(path):
    table = TuneCache(path, persist=False)
    table.record(key(1), PARTIAL)
    assert table.lookup(key(1)) == PARTIAL
    assert not os.path.exists(path)


def fill(path, eviction, max_entries=2):
    table = TuneCache(path, max_entries=max_entries, eviction=eviction)
    for bucket in (3, 0, 5):
        table.record(key(bucket), PARTIAL)
    return table


def test_keep_low_buckets_drops_the_highest(path):
    table = fill(path, TuneCacheEviction.KEEP_LOW_BUCKETS)
    assert [e.key.token_bucket for e in table.entries()] == [0, 3]
    assert [e.key.token_bucket for e in TuneCache(path).entries()] == [0, 3]


def test_keep_high_buckets_drops_the_lowest(path):
    table = fill(path, TuneCacheEviction.KEEP_HIGH_BUCKETS)
    assert [e.key.token_bucket for e in table.entries()] == [3, 5]


def test_keep_low_orders_by_token_then_shape_buckets(path):
    table = TuneCache(path, max_entries=2)
    for token_bucket, seq_kv_bucket in [(1, 9), (1, 2), (0, 30)]:
        table.record(key(token_bucket, seq_kv_bucket), PARTIAL)
    assert [(e.key.token_bucket, e.key.shape_bucket.seq_kv_bucket) for e in table.entries()] == [(0, 30), (1, 2)]


def test_lru_drops_the_least_recently_used(path):
    table = TuneCache(path, max_entries=2, eviction=TuneCacheEviction.LRU)
    table.record(key(1), PARTIAL)
    table.record(key(2), PARTIAL)
    assert table.lookup(key(1)) == PARTIAL  # a hit makes key 1 newer than key 2
    table.record(key(3), PARTIAL)
    assert {e.key.token_bucket for e in table.entries()} == {1, 3}
    assert {e.key.token_bucket for e in TuneCache(path).entries()} == {1, 3}


def test_trim_on_load_uses_the_ticks_in_the_file(path):
    os.makedirs(os.path.dirname(path))
    rows = [tc.render_row(tc.TuneCacheEntry(key(b), PARTIAL, tick)) for b, tick in [(1, 30), (2, 10), (3, 20)]]
    with open(path, "w") as handle:
        handle.write(tc.HEADER + "\n" + "\n".join(rows) + "\n")
    table = TuneCache(path, max_entries=2, eviction=TuneCacheEviction.LRU)
    assert {(e.key.token_bucket, e.tick) for e in table.entries()} == {(1, 30), (3, 20)}
    table.record(key(4), BASE)  # newer than anything in the file
    assert max(table.entries(), key=lambda e: e.tick).key == key(4)


def test_duplicate_keys_in_a_file_keep_the_newest_row():
    text = tc.HEADER + "\n" + tc.render_row(tc.TuneCacheEntry(key(1), BASE, 9)) + "\n" + GOOD + "\n"
    assert tc.parse_table(text).entries[key(1)].tag == BASE


def test_from_settings_combines_settings_and_plan(tmp_path):
    env = {"RLX_TRITON_TUNE_CACHE": str(tmp_path / "t.tsv"), "RLX_TRITON_TUNE_CACHE_MAX_ENTRIES": "64",
           "RLX_TRITON_TUNE_CACHE_EVICTION": "lru", "RLX_TRITON_TUNE_CACHE_PERSIST": "1"}
    policy = TunePolicy.balanced_defaults()
    table = TuneCache.from_settings(settings_from(env), policy)
    assert (table.path, table.load, table.persist, table.max_entries) == (str(tmp_path / "t.tsv"), True, True, 64)
    assert table.eviction is TuneCacheEviction.LRU  # the plan kept the default: the settings decide
    plan = KernelPlanBuilder(KernelFamily.SDPA_DECODE).autotune(policy).tune_cache(True, False, 8) \
        .tune_cache_eviction(TuneCacheEviction.KEEP_HIGH_BUCKETS).build_plan()
    table = TuneCache.from_settings(settings_from(env), plan.tune_policy)
    assert (table.persist, table.max_entries, table.eviction) == (False, 8, TuneCacheEviction.KEEP_HIGH_BUCKETS)
    off = settings_from({**env, "RLX_TRITON_TUNE_CACHE_LOAD": "0"})
    assert TuneCache.from_settings(off, policy).load is False


def _record_many(path, worker, count):
    table = TuneCache(path, max_entries=64, eviction=TuneCacheEviction.LRU)
    for index in range(count):
        table.record(key(index % 11, worker * 100 + index, device=f"worker{worker}"), PARTIAL)


def test_concurrent_processes_leave_a_parseable_bounded_file(path):
    context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    workers = [context.Process(target=_record_many, args=(path, w, 50)) for w in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    rows = read_rows(path)
    assert all(row is not None for row in rows)
    assert len(rows) == 64 == len({row.key for row in rows})
    # records were serialised: every row got its own tick, newer than all rows on disk at that time
    assert len({row.tick for row in rows}) == 64
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")]


def _record_distinct(path, worker, count, max_entries, eviction):
    table = TuneCache(path, max_entries=max_entries, eviction=eviction)
    for index in range(count):
        table.record(key(worker * count + index, index, device=f"worker{worker}"), BASE if index % 2 else PARTIAL)


def _read_until(path, done, report):
    """Reads the table until `done` exists; writes 'ok', or what it saw wrong, to `report`."""
    import time

    seen, problem = 0, None
    while problem is None:
        finished = os.path.exists(done)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            text = None
        if text is not None:
            parsed = tc.parse_table(text)
            if not text.startswith(tc.HEADER + "\n") or parsed.skipped_rows or parsed.foreign_version is not None:
                problem = f"torn table: {text!r}"
            elif len(parsed.entries) < seen:
                problem = f"{seen} winners, then {len(parsed.entries)}"
            seen = len(parsed.entries)
        if finished:
            break
        time.sleep(0.001)
    with open(report, "w") as handle:
        handle.write(problem or f"ok {seen}")


def _processes(target, argument_lists):
    context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    processes = [context.Process(target=target, args=args) for args in argument_lists]
    for process in processes:
        process.start()
    return processes


def _joined(processes):
    for process in processes:
        process.join(60)
    return [process.exitcode for process in processes]


def test_four_writers_lose_no_winner_and_a_reader_never_sees_a_torn_table(path, tmp_path):
    done, report = str(tmp_path / "done"), str(tmp_path / "report")
    reader = _processes(_read_until, [(path, done, report)])
    writers = _processes(_record_distinct, [(path, w, 30, 1000, TuneCacheEviction.KEEP_LOW_BUCKETS)
                                            for w in range(4)])
    assert _joined(writers) == [0, 0, 0, 0]
    open(done, "w").close()
    assert _joined(reader) == [0]
    assert open(report).read() == "ok 120"
    rows = {row.key: row.tag for row in read_rows(path)}
    assert rows == {key(w * 30 + i, i, device=f"worker{w}"): BASE if i % 2 else PARTIAL
                    for w in range(4) for i in range(30)}


def test_keep_low_eviction_holds_across_processes(path):
    writers = _processes(_record_distinct, [(path, w, 25, 32, TuneCacheEviction.KEEP_LOW_BUCKETS) for w in range(4)])
    assert _joined(writers) == [0, 0, 0, 0]
    # every writer merges the rows on disk before trimming, so the table is the 32 lowest of all 100
    assert sorted(row.key.token_bucket for row in read_rows(path)) == list(range(32))


def _hang_in_the_middle_of_a_write(path, ready):
    import time

    table = TuneCache(path)
    table.record(key(1), PARTIAL)
    real_fdopen = os.fdopen

    def half_then_hang(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        write = handle.write

        def write_half(text):
            write(text[:len(text) // 2])
            handle.flush()
            open(ready, "w").close()
            time.sleep(60)

        handle.write = write_half
        return handle

    os.fdopen = half_then_hang
    table.record(key(2), BASE)


def test_a_writer_killed_mid_write_leaves_the_table_intact_and_the_lock_free(path, tmp_path):
    import signal
    import time

    ready = str(tmp_path / "ready")
    (writer,) = _processes(_hang_in_the_middle_of_a_write, [(path, ready)])
    deadline = time.monotonic() + 30
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.exists(ready)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    assert [(row.key, row.tag) for row in read_rows(path)] == [(key(1), PARTIAL)]
    TuneCache(path).record(key(3), BASE)     # the dead writer's lock is gone: this does not wait
    assert {row.key for row in read_rows(path)} == {key(1), key(3)}
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp")]
