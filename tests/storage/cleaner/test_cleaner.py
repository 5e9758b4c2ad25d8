"""Log compaction checked against a brute-force model, kafka-python parsing the cleaned files, and
Kafka's index recovery rebuild; plus selection rules, the offset map, overflow, failures, throttling."""

from __future__ import annotations

import struct
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.cleaner.cleaner import Cleaner
from storage.cleaner.cleaner_config import CleanerConfig
from storage.cleaner.log_cleaner_manager import LogCleanerManager, log_to_clean
from storage.cleaner.offset_map import KeyCounter, SkimpyOffsetMap
from storage.cleaner.throttler import Throttler
from storage.common.time import MockTime
from storage.errors import InvalidConfigError
from storage.log_manager import LogManager
from storage.metadata.checkpoint import CLEANER_OFFSET_CHECKPOINT_FILE
from storage.records import record_batch as rb
from storage.records.record_batch import scan_batches
from storage.topic_partition import TopicPartition
from tests.helpers.compaction_model import Model
from tests.helpers.index_checks import check_indexes, live_files
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


# ---------------------------------------------------------------------------------------- helpers
def make(root, topic="t", partitions=1, **config):
    lm = LogManager(root)
    cfg = {"cleanup.policy": "compact", **{k.replace("_", "."): str(v) for k, v in config.items()}}
    lm.create_topic(topic, partitions, cfg)
    return lm


def append(lm, records, codec="none", tp=TP) -> int:
    """One kafka-python batch of (ts, key, value, headers) records; returns its base offset."""
    with lm.open_log(tp, writable=True) as log:
        return log.append(kp_batch(records, codec=codec)).first_offset


def roll(lm, tp=TP):
    with lm.open_log(tp, writable=True) as log:
        log.roll()


def parsed_records(lm, tp=TP) -> list[tuple]:
    """Every record of every live .log, as kafka-python reads the files: (offset, ts, key, value, headers)."""
    out = []
    for files in live_files(lm, tp).values():
        for b in kp_parse(files[".log"]):
            assert b["crc_ok"]
            out.extend((o, ts, k, v, [tuple(h) for h in hs]) for o, ts, k, v, hs in b["records"])
    return out


def check_max_timestamps(lm, tp=TP):
    """A CreateTime batch's maxTimestamp is its largest record timestamp (Kafka recomputes it on filtering)."""
    for files in live_files(lm, tp).values():
        for b in kp_parse(files[".log"]):
            if b["records"]:
                assert b["max_timestamp"] == max(r[1] for r in b["records"]), b["base_offset"]


def batch_headers(lm, tp=TP) -> list:
    out = []
    for files in live_files(lm, tp).values():
        data = files[".log"]
        scan = scan_batches(data)
        assert scan.end == len(data)
        out.extend(scan.header(i) for i in range(len(scan)))
    return out


# ---------------------------------------------------------------------------------------- model test
KEYS = [b"a", b"b", b"c", b"d", b"e", None]
record_st = st.tuples(
    st.integers(0, 4000),
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=20, max_size=60)),
    st.lists(st.tuples(st.sampled_from(["h", "trace"]), st.binary(max_size=6)), max_size=2),
)
op_st = st.one_of(
    st.tuples(st.just("append"), st.lists(record_st, min_size=1, max_size=6), st.sampled_from(CODECS)),
    st.tuples(st.just("clean"), st.integers(0, 3000)),
    st.tuples(st.just("roll"), st.just(0)),
)


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op_st, min_size=2, max_size=24),
    segment_bytes=st.integers(150, 1500),
    interval=st.sampled_from([0, 64, 300, 4096]),
    retention=st.sampled_from([0, 700, 2500]),
)
def test_compaction_matches_brute_force_model(ops, segment_bytes, interval, retention):
    lm = make(
        f"memory://kl-{uuid.uuid4().hex}",
        segment_bytes=segment_bytes,
        index_interval_bytes=interval,
        delete_retention_ms=retention,
    )
    mgr = LogCleanerManager(lm)
    model = Model(retention)
    originals = {}  # batch base -> (codec, last offset, producer id)
    cleaned = set()  # base offsets of cleaner output
    now = 10_000
    for op in ops + [("clean", 1000), ("clean", 3000)]:
        if op[0] == "append":
            recs = [(now - 2000 + ts, k, v, hs) for ts, k, v, hs in op[1]]
            base = append(lm, recs, op[2])
            model.append(base, recs)
        elif op[0] == "roll":
            roll(lm)
        else:
            now += op[1]
            with lm.open_log(TP) as log:
                active = log.active_segment.base_offset
            res = mgr.clean_partition(TP, now, force=True)
            assert res.ok, res.error
            assert (res.first_dirty_offset, res.end_offset) == (model.checkpoint, active)
            model.clean(model.checkpoint, active, now)
            assert mgr.checkpoints()[TP] == active
            for new_base, sources in res.groups:  # a merged output stays within segment.bytes
                cleaned.add(new_base)
                if len(sources) > 1:
                    assert len(live_files(lm)[new_base][".log"]) <= segment_bytes
        for h in batch_headers(lm):
            originals.setdefault(h.base_offset, (h.compression, h.last_offset, h.producer_id))
        assert parsed_records(lm) == model.expected()
        for h in batch_headers(lm):
            assert (h.last_offset, h.producer_id) == originals[h.base_offset][1:]
            if h.record_count:  # (an empty batch, uncompressed, only marks where a replaced segment ended)
                assert h.compression == originals[h.base_offset][0]
                assert h.delete_horizon_ms == model.horizon.get(h.base_offset)
        check_indexes(lm, interval=interval, cleaned=cleaned)
        check_max_timestamps(lm)
    with lm.open_log(TP, writable=True) as log:  # recovery finds nothing to repair
        offsets = [o for b in log.read_records(0) for o in b.column("offset").to_pylist()]
    assert offsets == [r[0] for r in model.expected()]
    assert parsed_records(lm) == model.expected()


def test_latest_per_key_survives_with_offsets_timestamps_headers(any_root):
    lm = make(any_root, segment_bytes=300, delete_retention_ms=1000)
    written = []
    for i in range(60):
        key = b"k%d" % (i % 7)
        rec = (5000 + i * 3, key, None if i % 11 == 10 else b"value-%d" % i, [("n", b"%d" % i)])
        written.append((append(lm, [rec], CODECS[i % 5]), rec))
    roll(lm)
    res = LogCleanerManager(lm).clean_partition(TP, 10_000)
    assert res.ok and res.records_dropped > 0 and res.keys == 7
    latest = {}
    for off, rec in written:
        latest[rec[1]] = (off, *rec[:3], rec[3])
    expect = sorted((off, ts, k, v, hs) for off, ts, k, v, hs in latest.values())
    assert parsed_records(lm) == expect  # tombstones inside their horizon stay
    res = LogCleanerManager(lm).clean_partition(TP, 11_000, force=True)
    assert res.tombstones_dropped == sum(1 for r in expect if r[3] is None)
    assert parsed_records(lm) == [r for r in expect if r[3] is not None]


def test_keyless_records_are_kept(root):
    lm = make(root, segment_bytes=200)
    for i in range(20):
        append(lm, [(1000 + i, None if i % 3 == 0 else b"k", b"v%d" % i, [])])
    roll(lm)
    res = LogCleanerManager(lm).clean_partition(TP, 5000)
    assert res.keyless_kept == 7
    assert [r[0] for r in parsed_records(lm)] == [i for i in range(20) if i % 3 == 0 or i == 19]


def test_log_append_time_batches_keep_their_append_time(root):
    lm = make(root, message_timestamp_type="LogAppendTime", segment_bytes=200, delete_retention_ms=50)
    stamps = []
    for i in range(12):
        with lm.open_log(TP, writable=True) as log:
            log.append(kp_batch([(1, b"k%d" % (i % 3), None if i == 10 else b"v", [])]), now=7000 + i)
        stamps.append(7000 + i)
    roll(lm)
    assert LogCleanerManager(lm).clean_partition(TP, 9000).ok
    got = parsed_records(lm)
    assert [(r[0], r[1]) for r in got] == [(9, 7009), (10, 7010), (11, 7011)]
    heads = {h.base_offset: h for h in batch_headers(lm)}
    assert heads[10].delete_horizon_ms == 9050 and heads[10].timestamp_type == rb.TimestampType.LOG_APPEND_TIME
    assert heads[10].max_timestamp == 7010


def test_filtered_batch_keeps_base_and_last_offset_and_producer_fields(root):
    lm = make(root)
    recs = [(1000 + i, b"k%d" % (i % 4), b"x" * 30, []) for i in range(10)]
    with lm.open_log(TP, writable=True) as log:
        log.append(kp_batch(recs, codec="zstd", producer_id=77, producer_epoch=3, base_sequence=100))
        log.append(kp_batch([(2000, b"k0", b"new", [])], producer_id=77, producer_epoch=3, base_sequence=110))
        log.roll()
    LogCleanerManager(lm).clean_partition(TP, 5000)
    h = batch_headers(lm)
    assert [
        (x.base_offset, x.last_offset, x.record_count, x.compression, x.producer_id, x.producer_epoch, x.base_sequence)
        for x in h
    ] == [(0, 9, 3, rb.CompressionType.ZSTD, 77, 3, 100), (10, 10, 1, rb.CompressionType.NONE, 77, 3, 110)]
    assert [r[0] for r in parsed_records(lm)] == [6, 7, 9, 10]
    assert h[0].max_timestamp == 1009  # the kept records' largest


def test_no_horizon_where_stamping_would_pass_max_message_bytes(root):
    recs = [(1000, b"key-%03d" % i, None, []) for i in range(50)]
    size = len(kp_batch(recs))
    lm = make(root, max_message_bytes=size + 20, delete_retention_ms=10**12)
    append(lm, recs)
    append(lm, [(1000, b"other", None, [])])
    roll(lm)
    assert LogCleanerManager(lm).clean_partition(TP, 5000).ok
    heads = batch_headers(lm)
    assert [(h.base_offset, h.delete_horizon_ms) for h in heads] == [(0, None), (50, 5000 + 10**12)]
    assert heads[0].size_in_bytes == size  # unchanged: a stamped copy would be about 200 bytes longer
    with lm.open_log(TP) as log:  # readers, which enforce max.message.bytes, still read it all
        assert sum(b.num_rows for b in log.read_records(0)) == 51


def test_control_batches_are_copied(root):
    lm = make(root)
    append(lm, [(1000, b"k", b"a", [])])
    marker = bytearray(
        kp_batch([(1001, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])], producer_id=5, producer_epoch=0)
    )
    struct.pack_into(">h", marker, rb.ATTRIBUTES_OFFSET, rb.CONTROL_FLAG_MASK | rb.TRANSACTIONAL_FLAG_MASK)
    struct.pack_into(">I", marker, rb.CRC_OFFSET, rb.compute_crc(marker))
    with lm.open_log(TP, writable=True) as log:
        log.append(marker)
    append(lm, [(1002, b"k", b"b", [])])
    roll(lm)
    LogCleanerManager(lm).clean_partition(TP, 5000)
    assert [(h.base_offset, h.is_control) for h in batch_headers(lm)] == [(1, True), (2, False)]


# ---------------------------------------------------------------------------------------- selection
def sizes_of(lm, tp=TP):
    return {b: len(f[".log"]) for b, f in live_files(lm, tp).items()}


def test_dirty_ratio_selection_and_order(root):
    lm = LogManager(root)
    for name, ratio in (("low", 0.9), ("mid", 0.1), ("high", 0.1), ("deleted", 0.0)):
        lm.create_topic(
            name,
            1,
            {
                "cleanup.policy": "delete" if name == "deleted" else "compact",
                "segment.bytes": "300",
                "min.cleanable.dirty.ratio": str(ratio),
            },
        )
    for name, n_clean, n_dirty in (("low", 10, 10), ("mid", 30, 10), ("high", 10, 20), ("deleted", 0, 20)):
        tp = TopicPartition(name, 0)
        for i in range(n_clean):
            append(lm, [(1000, b"k%d" % i, b"v" * 40, [])], tp=tp)
        roll(lm, tp)
        if n_clean:
            LogCleanerManager(lm).clean_partition(tp, 5000, force=True)
        for i in range(n_dirty):
            append(lm, [(1000, b"k%d" % i, b"w" * 40, [])], tp=tp)
    mgr = LogCleanerManager(lm)
    chosen = mgr.cleanable_logs(now_ms=6000)
    expect = {}
    for name in ("low", "mid", "high"):
        tp = TopicPartition(name, 0)
        sizes = sizes_of(lm, tp)
        bases = sorted(sizes)
        first_dirty = mgr.checkpoints().get(tp, 0)
        active = bases[-1]
        clean = sum(s for b, s in sizes.items() if b < first_dirty)
        dirty = sum(s for b, s in sizes.items() if first_dirty <= b < active)
        expect[name] = dirty / (clean + dirty)
    assert [c.tp.topic for c in chosen] == sorted(
        (n for n in expect if expect[n] > {"low": 0.9}.get(n, 0.1)), key=lambda n: -expect[n]
    )
    assert [c.tp.topic for c in chosen] == ["high", "mid"]
    for c in chosen:
        assert c.cleanable_ratio == pytest.approx(expect[c.tp.topic])
    results = mgr.run_once(now_ms=6000)
    assert [(r.topic, r.ok) for r in results] == [("high", True), ("mid", True)]
    with lm.fs.lock(lm.fs.join(root, ".lock")):
        text = lm.fs.read(lm.fs.join(root, CLEANER_OFFSET_CHECKPOINT_FILE)).decode()
    lines = text.splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2
    assert {ln for ln in lines[2:]} >= {f"high 0 {results[0].end_offset}", f"mid 0 {results[1].end_offset}"}


def test_min_compaction_lag_makes_recent_segments_uncleanable(root):
    lm = make(root, segment_bytes=200, min_compaction_lag_ms=1000)
    for i in range(12):
        append(lm, [(1000 * i, b"k", b"v%d" % i, [])])
    roll(lm)
    with lm.open_log(TP) as log:
        segs = [(s.base_offset, s.largest_timestamp) for s in log.segments[:-1]]
        now = 7500
        ltc, _ = log_to_clean(log, None, now)
    expect = min(b for b, ts in segs if ts > now - 1000)
    assert ltc.first_uncleanable_offset == expect
    res = LogCleanerManager(lm).clean_partition(TP, now, force=True)
    assert res.end_offset == expect
    kept = [r[0] for r in parsed_records(lm)]
    assert kept == [expect - 1] + list(range(expect, 12))  # newer than the lag: untouched


def test_a_pending_sink_commit_is_not_cleaned_until_resolved(root):
    """Kafka's firstUnstableOffset: the batches from a pending commit's first offset on stay as they are
    (its resolution reads that first batch), below it the cleaner works as usual."""
    from storage.transactions.producer_state_manager import ProducerStateManager

    lm = make(root, segment_bytes=200)
    for i in range(12):
        append(lm, [(1000 * i, b"k", b"v%d" % i, [])])
    roll(lm)
    state = ProducerStateManager(lm.fs, lm.partition_dir(TP))
    state.begin(7, 0, 6, 12)  # a commit of offsets 6..11 that a crashed writer left pending
    res = LogCleanerManager(lm).clean_partition(TP, 20_000, force=True)
    assert res.end_offset <= 6
    assert [r[0] for r in parsed_records(lm)] == [res.end_offset - 1] + list(range(res.end_offset, 12))
    state.complete(7)
    res = LogCleanerManager(lm).clean_partition(TP, 21_000, force=True)
    assert res.end_offset > 6
    assert [r[0] for r in parsed_records(lm)][0] >= 6


def test_max_compaction_lag_forces_cleaning_below_the_ratio(root):
    lm = make(root, segment_bytes=200, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=10_000)
    for i in range(6):
        append(lm, [(50_000 + i, b"k%d" % i, b"v", [])])
    roll(lm)
    mgr = LogCleanerManager(lm)
    assert mgr.clean_partition(TP, 50_100, force=True).end_offset == 6
    for i in range(2):
        append(lm, [(52_000 + i, b"k%d" % i, b"w", [])])
    roll(lm)
    sizes = sizes_of(lm)
    dirty = sum(s for b, s in sizes.items() if 6 <= b < max(sizes))
    assert dirty / sum(s for b, s in sizes.items() if b < max(sizes)) < 0.99
    assert mgr.cleanable_logs(now_ms=61_000) == []  # dirty data from 52_000: overdue after 62_000
    chosen = mgr.cleanable_logs(now_ms=63_000)
    assert [c.tp for c in chosen] == [TP] and chosen[0].max_compaction_delay_ms == 63_000 - 10_000 - 52_000
    assert mgr.clean(chosen[0], 63_000).ok
    assert [r[0] for r in parsed_records(lm)] == [2, 3, 4, 5, 6, 7]


def test_the_cleaner_reads_now_from_its_clock_when_given_no_now_ms(root):
    """The max-compaction-lag case above on a MockTime: the clock, not the machine's, decides."""
    lm = make(root, segment_bytes=200, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=10_000)
    for i in range(6):
        append(lm, [(50_000 + i, b"k%d" % i, b"v", [])])
    roll(lm)
    clock = MockTime(50_100)
    mgr = LogCleanerManager(lm, time=clock)
    assert mgr.clean_partition(TP, force=True).end_offset == 6
    for i in range(2):
        append(lm, [(52_000 + i, b"k%d" % i, b"w", [])])
    roll(lm)
    clock.set_current_time_ms(61_000)
    assert mgr.cleanable_logs() == []
    clock.set_current_time_ms(63_000)
    chosen = mgr.cleanable_logs()
    assert [c.tp for c in chosen] == [TP] and chosen[0].max_compaction_delay_ms == 63_000 - 10_000 - 52_000
    res = mgr.clean(chosen[0])
    assert res.ok and res.duration_s == 0.0  # the duration is on the same clock, which did not move
    assert [r[0] for r in parsed_records(lm)] == [2, 3, 4, 5, 6, 7]


def test_checkpoint_past_log_end_is_reset_to_log_start(root):
    lm = make(root, segment_bytes=200)
    for _ in range(5):
        append(lm, [(1000, b"k", b"v", [])])
    mgr = LogCleanerManager(lm)
    mgr.update_checkpoint(TP, 999)
    chosen = mgr.cleanable_logs(now_ms=5000)
    assert chosen[0].first_dirty_offset == 0 and mgr.checkpoints()[TP] == 0
    chosen[0].log.close()


# ---------------------------------------------------------------------------------------- offset map
def test_offset_map_matches_a_dict_and_grows():
    rng = np.random.default_rng(3)
    keys = [bytes(rng.integers(0, 256, rng.integers(0, 20), dtype=np.uint8)) for _ in range(200_000)]
    m = SkimpyOffsetMap(base_offset=500)
    m.put(keys, np.arange(500, 500 + len(keys)))
    ref = {k: 500 + i for i, k in enumerate(keys)}
    assert m.size == len(ref)
    assert np.array_equal(m.get(keys), np.array([ref[k] for k in keys]))
    assert (m.get([b"absent-%d" % i for i in range(5000)]) == -1).all()
    assert m.size <= m.max_size and m.memory_bytes == 12 * m.slots
    assert m.memory_bytes / m.size <= 12 / 0.45 + 1e-9


def test_offset_map_budget_and_config_errors():
    m = SkimpyOffsetMap(memory=12 * 256, load_factor=0.5)
    assert m.capacity == 128
    m.put([b"%d" % i for i in range(128)], range(128))
    with pytest.raises(OverflowError):
        m.put([b"x"], [1])
    with pytest.raises(InvalidConfigError):
        SkimpyOffsetMap(memory=1000)
    with pytest.raises(InvalidConfigError):
        CleanerConfig(io_buffer_load_factor=1.5)
    assert CleanerConfig.from_dict({"log.cleaner.dedupe.buffer.size": "1048576"}).dedupe_buffer_size == 1048576


def test_full_offset_map_cleans_a_prefix_and_leaves_the_rest_dirty(root):
    lm = make(root, segment_bytes=5000)
    written = []
    for rnd in range(2):
        for j in range(0, 600, 20):  # 600 keys twice, 20 records a batch
            recs = [(1000 + rnd, b"key-%04d" % k, b"r%d" % rnd, []) for k in range(j, j + 20)]
            base = append(lm, recs, "lz4" if j % 40 else "none")
            written.extend((base + i, r) for i, r in enumerate(recs))
    roll(lm)
    final_end = written[-1][0] + 1
    small = Cleaner(CleanerConfig(dedupe_buffer_size=12 * 256))  # 230 keys
    mgr = LogCleanerManager(lm, cleaner=small)
    ends = []
    while True:
        res = mgr.clean_partition(TP, 9000, force=True)
        assert res.ok, res.error
        ends.append(res.end_offset)
        got = parsed_records(lm)
        offsets = [r[0] for r in got]
        assert offsets == sorted(set(offsets))
        latest = {}
        for off, r in written:
            latest[r[1]] = off
        assert set(latest.values()) <= set(offsets)  # the latest of every key is always there
        if res.end_offset == final_end:
            assert not res.map_full
            break
        assert res.map_full and res.keys <= 230 and res.end_offset < final_end
        assert all(o in offsets for o, _ in written if o >= res.end_offset)  # not yet mapped: untouched
    assert ends == sorted(ends) and len(ends) > 3
    assert [r[0] for r in parsed_records(lm)] == sorted(latest.values())


def test_key_counter_estimates_distinct_keys():
    rng = np.random.default_rng(5)
    for n in (0, 1, 50, 3000, 40_000, 300_000):
        keys = [b"k%d" % i for i in rng.integers(0, 2**40, n)]
        counter = KeyCounter()
        counter.add_keys(keys + keys[: n // 2])  # repeats do not count
        exact = len(set(keys))
        assert abs(counter.estimate() - exact) <= max(1, 0.04 * exact), (n, counter.estimate(), exact)


def _keyed_log(root, keys: int, records: int):
    """A rolled log of `records` records over exactly `keys` distinct keys (built with our encoder)."""
    import pyarrow as pa

    from storage.records.builder import build_records

    lm = make(root, segment_bytes=8 * 1024 * 1024)
    rng = np.random.default_rng(keys)
    ids = np.concatenate([np.arange(keys), rng.integers(0, keys, records - keys)])
    rng.shuffle(ids)
    with lm.open_log(TP, writable=True) as log:
        for i in range(0, records, 200_000):
            part = ids[i : i + 200_000]
            table = pa.table(
                {
                    "key": pa.array([b"key-%09d" % k for k in part.tolist()]),
                    "value": pa.array([b"v"] * len(part)),
                    "timestamp": pa.array(np.full(len(part), 1000), pa.int64()),
                }
            )
            log.append(build_records(table))
        log.roll()
    return lm


@pytest.mark.parametrize("keys", [2_000, 10_000, 100_000, 1_000_000])
def test_offset_map_takes_at_most_16_bytes_per_key(root, keys):
    lm = _keyed_log(root, keys, keys + keys // 4)
    res = LogCleanerManager(lm).clean_partition(TP, 9000, force=True)
    assert res.ok, res.error
    assert not res.map_full and res.keys == keys
    assert res.records_dropped == keys // 4  # every key kept once: the map held them all, apart
    assert res.map_bytes <= res.map_peak_bytes
    assert res.map_bytes / keys <= 16 and res.map_peak_bytes / keys <= 16, (res.map_bytes, res.map_peak_bytes)


@pytest.mark.parametrize("estimate", [0, 400])
def test_a_low_key_estimate_cleans_a_prefix_and_stays_correct(root, monkeypatch, estimate):
    """The map is sized from the estimate alone; far too low, it fills and each run cleans a prefix
    (a first batch larger than the table reallocates it within the budget)."""
    monkeypatch.setattr(Cleaner, "_estimate_keys", lambda self, *a: estimate)
    lm = make(root, segment_bytes=20_000)
    written = []
    for rnd in range(2):
        for j in range(0, 900, 300):  # 900 keys twice, 300 a batch: more than the smallest table holds
            recs = [(1000 + rnd, b"key-%04d" % k, b"r%d" % rnd, []) for k in range(j, j + 300)]
            base = append(lm, recs, "zstd" if j % 600 else "none")
            written.extend((base + i, r) for i, r in enumerate(recs))
    roll(lm)
    latest = {r[1]: off for off, r in written}
    final_end = written[-1][0] + 1
    mgr = LogCleanerManager(lm)
    runs = 0
    while True:
        res = mgr.clean_partition(TP, 9000, force=True)
        assert res.ok, res.error
        runs += 1
        offsets = [r[0] for r in parsed_records(lm)]
        assert set(latest.values()) <= set(offsets)
        assert all(o in offsets for o, _ in written if o >= res.end_offset)
        if res.end_offset == final_end:
            break
        assert res.map_full and res.keys < 900
    assert runs > 1
    got = parsed_records(lm)
    assert [(r[0], r[2], r[3]) for r in got] == sorted((o, r[1], r[2]) for o, r in written if latest[r[1]] == o)


def test_a_failing_partition_is_reported_and_retried_while_others_are_cleaned(root):
    lm = make(root, partitions=2, segment_bytes=300)
    for p in (0, 1):
        for i in range(10):
            append(lm, [(1000, b"k%d" % (i % 2), b"value-%d" % i, [])], tp=TopicPartition("t", p))
        roll(lm, TopicPartition("t", p))
    path = lm.fs.join(lm.partition_dir(TopicPartition("t", 1)), "00000000000000000000.log")
    data = bytearray(lm.fs.read(path))
    data[-3] ^= 0xFF  # a value byte: the CRC no longer matches
    lm.fs.write_atomic(path, bytes(data))
    mgr = LogCleanerManager(lm)
    for _ in range(2):
        results = {r.partition: r for r in mgr.run_once(now_ms=5000)}
        assert results[1].topic == "t" and "CRC" in results[1].error and "00000000000000000000.log" in results[1].error
        assert TopicPartition("t", 1) not in mgr.checkpoints()
        if _ == 0:
            assert results[0].ok and results[0].records_dropped == 8
        else:
            assert 0 not in results  # cleaned: nothing dirty left
    assert mgr.checkpoints()[TopicPartition("t", 0)] > 0


# ---------------------------------------------------------------------------------------- swap safety
def test_cleaning_gives_up_when_a_segment_changes_underneath(root):
    lm = make(root, segment_bytes=200)
    for i in range(10):
        append(lm, [(1000, b"k", b"v%d" % i, [])])
    roll(lm)
    before = parsed_records(lm)

    class Meddling(Cleaner):
        def _clean_group(self, log, group, *args):
            if group[0].base_offset == 0:  # another process rewrites a segment while we build
                path = group[-1].log_path
                lm.fs.write_atomic(path, lm.fs.read(path) + b"")
                lm.fs.truncate(path, group[-1].size - 1)
            return super()._clean_group(log, group, *args)

    res = LogCleanerManager(lm, cleaner=Meddling()).clean_partition(TP, 5000)
    assert not res.ok and "changed or disappeared" in res.error
    assert TP not in LogCleanerManager(lm).checkpoints()
    assert not any(f.name.endswith(".cleaned") for f in lm.fs.listdir(lm.partition_dir(TP)))
    assert len(parsed_records(lm)) <= len(before)


def test_cleaning_gives_up_when_a_writer_holds_the_lock(root):
    lm = make(root, segment_bytes=200)
    for i in range(10):
        append(lm, [(1000, b"k", b"v%d" % i, [])])
    roll(lm)
    mgr = LogCleanerManager(lm, cleaner=Cleaner(CleanerConfig(lock_timeout_ms=50)))
    with lm.open_log(TP, writable=True):
        res = mgr.clean_partition(TP, 5000)
    assert not res.ok and "locked" in res.error
    assert len(parsed_records(lm)) == 10
    assert mgr.clean_partition(TP, 5000).ok and [r[0] for r in parsed_records(lm)] == [9]


def test_writable_log_is_cleaned_without_taking_the_lock_again(root):
    lm = make(root, segment_bytes=200)
    for i in range(10):
        append(lm, [(1000, b"k", b"v%d" % i, [])])
    with lm.open_log(TP, writable=True) as log:
        log.roll()
        res = Cleaner(CleanerConfig(lock_timeout_ms=0)).clean(log, 0, log.active_segment.base_offset, now_ms=5000)
        assert res.ok and [b.num_rows for b in log.read_records(0)] == [1]
    assert [r[0] for r in parsed_records(lm)] == [9]


# ---------------------------------------------------------------------------------------- throttling
def test_throttler_sleeps_to_the_desired_rate_with_an_injected_clock():
    clock = [0]
    slept = []

    def sleep(s):
        slept.append(s)
        clock[0] += int(s * 1e9)

    t = Throttler(1000, check_interval_ms=300, clock_ns=lambda: clock[0], sleep=sleep)
    assert t.maybe_throttle(1000) == 0.0  # within the first interval
    clock[0] += 400_000_000
    assert t.maybe_throttle(1000) == pytest.approx(1.6)  # 2000 bytes should take 2 s; 0.4 s passed
    clock[0] += 1_000_000_000
    assert t.maybe_throttle(500) == 0.0  # 500 B/s: below the limit
    assert slept == [pytest.approx(1.6)]
    assert Throttler(clock_ns=lambda: 1 / 0).maybe_throttle(10**12) == 0.0  # unlimited: no clock read


def test_cleaner_reports_every_byte_to_the_throttler(root):
    lm = make(root, segment_bytes=300)
    for i in range(30):
        append(lm, [(1000, b"k%d" % (i % 3), b"v" * 50, [])])
    roll(lm)
    seen = []

    class Recording(Throttler):
        def maybe_throttle(self, observed):
            seen.append(observed)
            return 0.0

    res = LogCleanerManager(lm, cleaner=Cleaner(throttler=Recording())).clean_partition(TP, 5000)
    assert res.ok and sum(seen) == res.bytes_read + res.bytes_written > 0
