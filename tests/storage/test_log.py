"""Log, LogSegment and index behaviour, checked with kafka-python parsing the files we write."""

import os
import struct

import pytest

from storage.errors import LogLockedError, OffsetOutOfRangeError, RecordTooLargeError
from storage.log_manager import LogManager
from storage.records import record_batch as rb
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_batch, kp_control_batch, kp_parse

TP = TopicPartition("t", 0)


def make(root, **config):
    lm = LogManager(root)
    lm.create_topic("t", 1, {k.replace("_", "."): str(v) for k, v in config.items()})
    return lm


def records(n, ts0=1_000, step=1, value_size=50, key=b"k"):
    return [(ts0 + i * step, key, b"v" * value_size, [("h", b"x")]) for i in range(n)]


def seg_files(root, base):
    d = os.path.join(root, "t-0")
    with open(os.path.join(d, f"{base:020d}.log"), "rb") as f:
        log = f.read()
    with open(os.path.join(d, f"{base:020d}.index"), "rb") as f:
        index = f.read()
    with open(os.path.join(d, f"{base:020d}.timeindex"), "rb") as f:
        timeindex = f.read()
    return log, index, timeindex


def all_records(root, bases):
    out = []
    for base in bases:
        log, _, _ = seg_files(root, base)
        for b in kp_parse(log):
            assert b["crc_ok"]
            out.extend(b["records"])
    return out


def test_append_assigns_dense_offsets_and_kafka_python_reads_every_segment(root):
    lm = make(root, segment_bytes=3000, index_interval_bytes=500)
    expected = []
    with lm.open_log(TP, writable=True) as log:
        for j in range(40):
            batch = records(5, ts0=1000 * j)
            info = log.append(kp_batch(batch))
            assert info.first_offset == 5 * j and info.last_offset == 5 * j + 4 and info.num_records == 5
            expected.extend(batch)
        bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    got = all_records(root, bases)
    assert [r[0] for r in got] == list(range(200))
    assert [(r[1], r[2], r[3], [(k, v) for k, v in r[4]]) for r in got] == [(ts, k, v, h) for ts, k, v, h in expected]
    for base in bases:  # every segment respects segment.bytes (a batch here is < 3000 bytes)
        assert os.path.getsize(os.path.join(root, "t-0", f"{base:020d}.log")) <= 3000


@pytest.mark.parametrize("interval", [0, 1, 100, 4096])
def test_indexes_equal_what_kafka_recovery_rebuilds(root, interval):
    lm = make(root, segment_bytes=50_000, index_interval_bytes=interval)
    with lm.open_log(TP, writable=True) as log:
        for j in range(120):  # timestamps go backwards now and then
            log.append(kp_batch(records(1 + j % 4, ts0=(j * 37) % 500, step=3)))
        bases = [s.base_offset for s in log.segments]
    for base in bases:
        data, index, timeindex = seg_files(root, base)
        ref_index, ref_time, (max_ts, max_off) = kafka_recovery_entries(kp_parse(data), interval, base)
        assert index == ref_index
        # a rolled or closed segment carries one more time entry: its max timestamp (Kafka does this on roll)
        final = struct.pack(">qi", max_ts, max_off - base)
        assert timeindex in (ref_time, ref_time + final)


def test_offset_index_survives_reopen_sessions_unchanged(root):
    """Appends across many open/close sessions give the index a single recovery would."""
    lm = make(root, index_interval_bytes=300)
    for session in range(15):
        with lm.open_log(TP, writable=True) as log:
            for j in range(3):
                log.append(kp_batch(records(2, ts0=session * 100 + j)))
    data, index, _ = seg_files(root, 0)
    assert index == kafka_recovery_entries(kp_parse(data), 300, 0)[0]
    assert len(index) > 0


def test_roll_on_segment_ms_counts_from_first_batch_timestamp(root):
    lm = make(root, segment_ms=1000)
    with lm.open_log(TP, writable=True) as log:
        for ts in (0, 500, 1000, 1001, 1500, 2002, 2003):
            log.append(kp_batch([(ts, b"k", b"v", [])]))
        assert [s.base_offset for s in log.segments] == [0, 3, 5]


def test_compacted_topic_rolls_on_max_compaction_lag_when_it_is_shorter(root):
    """Kafka's LogConfig.maxSegmentMs: a compacted topic rolls at min(segment.ms, max.compaction.lag.ms),
    so the active segment (never cleaned) cannot hold records past the compaction lag bound."""
    lm = make(root, segment_ms=1000, cleanup_policy="compact", max_compaction_lag_ms=400)
    plain = LogManager(root)
    plain.create_topic("d", 1, {"segment.ms": "1000", "max.compaction.lag.ms": "400"})  # delete policy: ignored
    for mgr, tp, want in ((lm, TP, [0, 2, 3, 5, 6]), (plain, TopicPartition("d", 0), [0, 4, 6])):
        with mgr.open_log(tp, writable=True) as log:
            for ts in (0, 300, 500, 1000, 1001, 1500, 2002):
                log.append(kp_batch([(ts, b"k", b"v", [])]))
            assert [s.base_offset for s in log.segments] == want


def test_roll_when_index_is_full(root):
    lm = make(root, segment_index_bytes=32, index_interval_bytes=0)  # 4 offset entries, 2 time entries
    with lm.open_log(TP, writable=True) as log:
        for j in range(12):
            log.append(kp_batch(records(1, ts0=j)))
        segs = log.segments
    assert len(segs) > 2
    for s in segs:
        assert s.offset_index.entries <= 4


def test_roll_when_offsets_no_longer_fit_in_int32(root):
    lm = make(root)
    big = bytearray(kp_batch(records(1)))
    struct.pack_into(">i", big, rb.LAST_OFFSET_DELTA_OFFSET, 2**31 - 1)  # a sparse batch, as compaction makes
    struct.pack_into(">I", big, rb.CRC_OFFSET, rb.compute_crc(big))
    with lm.open_log(TP, writable=True) as log:
        log.append(kp_batch(records(1)))
        log.append(bytes(big))
        log.append(kp_batch(records(1)))
        # each batch whose last offset is 2**31 or more past the base starts a segment
        assert [s.base_offset for s in log.segments] == [0, 1, 2**31 + 1]
        assert log.log_end_offset == 2**31 + 2


def test_batch_over_max_message_bytes_is_rejected_and_nothing_written(root):
    lm = make(root, max_message_bytes=500)
    with lm.open_log(TP, writable=True) as log:
        log.append(kp_batch(records(1)))
        with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
            log.append(kp_batch(records(20, value_size=100)))
        assert log.log_end_offset == 1
    assert len(kp_parse(seg_files(root, 0)[0])) == 1


def test_read_from_offset_returns_batches_holding_it(root):
    lm = make(root, segment_bytes=2000, index_interval_bytes=200)
    with lm.open_log(TP, writable=True) as log:
        for j in range(50):
            log.append(kp_batch(records(3, ts0=j)))
    with lm.open_log(TP) as log:
        for start in (0, 1, 2, 3, 77, 148, 149):
            chunks = list(log.read(start, start + 5))
            offs = [r[0] for c in chunks for b in kp_parse(c.buf) for r in b["records"]]
            assert offs[0] <= start < offs[0] + 3  # starts at the batch holding `start`
            assert offs[-1] >= min(start + 4, 149) and offs == list(range(offs[0], offs[-1] + 1))
        assert list(log.read(150)) == []
        with pytest.raises(OffsetOutOfRangeError, match="log end offset 150"):
            list(log.read(151))


def test_truncate_and_log_start_offset(root):
    lm = make(root, segment_bytes=1000)
    with lm.open_log(TP, writable=True) as log:
        for j in range(30):
            log.append(kp_batch(records(2, ts0=j)))
        log.truncate_to(20)
        assert log.log_end_offset == 20
        assert log.maybe_increment_log_start_offset(7)
        with pytest.raises(ValueError, match="inside batch"):
            log.truncate_to(13)
    with lm.open_log(TP) as log:
        assert (log.log_start_offset, log.log_end_offset) == (7, 20)
        with pytest.raises(OffsetOutOfRangeError, match="log start offset 7"):
            list(log.read(6))
    with open(os.path.join(root, "log-start-offset-checkpoint")) as f:
        assert f.read().splitlines() == ["0", "1", "t 0 7"]


def test_second_writer_is_locked_out(root):
    lm = make(root)
    with lm.open_log(TP, writable=True):
        with pytest.raises(LogLockedError):
            lm.open_log(TP, writable=True, lock_timeout=0.1)
    with lm.open_log(TP, writable=True, lock_timeout=0.1) as log:  # released on close
        assert log.log_end_offset == 0


def test_memory_filesystem_round_trip():
    import uuid

    lm = make(f"memory://kl-{uuid.uuid4().hex}", segment_bytes=1500)
    with lm.open_log(TP, writable=True) as log:
        for j in range(20):
            log.append(kp_batch(records(2, ts0=j)))
    with lm.open_log(TP) as log:
        data = b"".join(c.buf for c in log.read(0))
        assert [r[0] for b in kp_parse(data) for r in b["records"]] == list(range(40))
        assert len(log.segments) > 1


def test_create_time_bounds_reject_the_whole_append(root):
    lm = make(root, message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=500)
    from storage.errors import InvalidTimestampError

    with lm.open_log(TP, writable=True) as log:
        now = 1_000_000
        log.append(kp_batch([(now - 1000, b"k", b"v", []), (now + 500, b"k", b"v", [])]), now=now)
        for bad in (now - 1001, now + 501):
            with pytest.raises(InvalidTimestampError, match=f"timestamp {bad} of record 1"):
                log.append(kp_batch([(now, b"k", b"v", []), (bad, b"k", b"v", [])]), now=now)
        assert log.log_end_offset == 2


def test_log_append_time_stamps_batches_and_keeps_crc_valid(root):
    lm = make(root, message_timestamp_type="LogAppendTime")
    with lm.open_log(TP, writable=True) as log:
        info = log.append(kp_batch(records(3, ts0=5)), now=424242)
        assert info.log_append_time == 424242
    batches = kp_parse(seg_files(root, 0)[0])
    assert batches[0]["crc_ok"] and batches[0]["max_timestamp"] == 424242
    assert [r[1] for r in batches[0]["records"]] == [424242] * 3  # kafka-python applies LogAppendTime too


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_append_of_encoder_output_with_its_scan_writes_the_same_files(tmp_path, codec):
    """Log.append(buf, built=scan) skips re-checking what encode_records just wrote; the files must be
    byte-identical to the checked path's, and kafka-python must read them."""
    import pyarrow as pa

    from storage.records.builder import build_records, encode_records

    table = pa.table(
        {
            "key": [b"k%d" % i for i in range(3000)],
            "value": [b"v" * (i % 97) for i in range(3000)],
            "timestamp": pa.array(range(3000), pa.int64()),
        }
    )
    roots = [str(tmp_path / "checked"), str(tmp_path / "built")]
    for root, built in zip(roots, (False, True), strict=False):
        lm = make(root, segment_bytes=40_000 if codec == "none" else 1_500, index_interval_bytes=700)
        with lm.open_log(TP, writable=True) as log:
            for a in range(0, 3000, 700):
                part = table.slice(a, 700)
                if built:
                    buf, scan = encode_records(part, compression=codec, max_batch_bytes=9000, now_ms=5)
                    log.append(buf, built=scan, now=10)
                else:
                    log.append(build_records(part, compression=codec, max_batch_bytes=9000, now_ms=5), now=10)
    names = sorted(os.listdir(os.path.join(roots[0], "t-0")))
    assert names == sorted(os.listdir(os.path.join(roots[1], "t-0"))) and len(names) > 6
    for name in names:
        with (
            open(os.path.join(roots[0], "t-0", name), "rb") as f1,
            open(os.path.join(roots[1], "t-0", name), "rb") as f2,
        ):
            assert f1.read() == f2.read(), name
    bases = sorted(int(n[:20]) for n in names if n.endswith(".log"))
    got = all_records(roots[1], bases)
    assert [r[0] for r in got] == list(range(3000))


def test_append_with_a_scan_that_does_not_cover_the_bytes_is_refused(root):
    import pyarrow as pa

    from storage.errors import CorruptRecordError
    from storage.records.builder import encode_records

    lm = make(root, max_message_bytes=2000)
    table = pa.table({"value": [b"x" * 100] * 40})
    with lm.open_log(TP, writable=True) as log:
        buf, scan = encode_records(table, max_batch_bytes=1500)
        with pytest.raises(CorruptRecordError, match="covers"):
            log.append(buf[:-1].copy(), built=scan)
        big, big_scan = encode_records(table, max_batch_bytes=100_000)
        with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
            log.append(big, built=big_scan)
        assert log.log_end_offset == 0
        assert log.append(buf, built=scan).num_records == 40


def test_timestamp_lookup_counts_transaction_markers_as_kafka_does(root):
    """Kafka's ListOffsets by time walks every batch, markers included (FileRecords.searchForTimestamp), and
    a marker carries the broker's clock: data ts=1000 @0, COMMIT ts=5000 @1, data ts=2000 @2 answer 1 for
    1500 and for 3000 (as a real broker did, tests/storage/test_kafka_broker_logs.py)."""

    def data(offset, ts):
        b = bytearray(kp_batch([(ts, None, b"v", [])], producer_id=7, producer_epoch=0, base_sequence=offset))
        b[21:23] = struct.pack(">h", struct.unpack_from(">h", b, 21)[0] | 0x10)  # transactional
        struct.pack_into(">q", b, 0, offset)
        struct.pack_into(">I", b, 17, rb.compute_crc(b))
        return bytes(b)

    os.makedirs(os.path.join(root, "t-0"))
    with open(os.path.join(root, "t-0", f"{0:020d}.log"), "wb") as f:
        f.write(data(0, 1000) + kp_control_batch(1, 5000, 7) + data(2, 2000))
    with LogManager(root).open_log(TP) as log:
        assert [log.offset_for_timestamp(t) for t in (500, 1000, 1500, 3000, 5000, 6000)] == [0, 0, 1, 1, 1, None]
        assert [r["offset"] for b in log.read_records(1) for r in b.to_pylist()] == [2]  # the marker is not served
