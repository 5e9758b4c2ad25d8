"""build_records / decode_batches: exact bytes, round trips, batch fields, splitting, corruption.

The independent references are kafka-python's pure-Python v2 reader/builder and brute-force models.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder
from kafka.record.memory_records import MemoryRecords as KpRecords

from storage.errors import CorruptRecordError, RecordTooLargeError
from storage.records.builder import build_batch, build_records
from storage.records.compression import compress
from storage.records.decoder import RECORD_SCHEMA, decode_batches
from storage.records.record_batch import (
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    SCAN_PARTIAL,
    TimestampType,
    compute_crc,
    scan_batches,
    validate_batches,
)
from storage.records.record_batch import (
    CompressionType as C,
)
from tests.helpers import REPO

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
NOW = 1_700_000_123_456


BINARY = pa.binary()


def table(keys, values, timestamps=None, headers=None, key_type=BINARY, value_type=BINARY):
    cols = {"key": pa.array(keys, key_type), "value": pa.array(values, value_type)}
    if timestamps is not None:
        cols["timestamp"] = pa.array(timestamps, pa.int64())
    if headers is not None:
        cols["headers"] = pa.array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers], HEADERS
        )
    return pa.table(cols)


def batches_of(buf: bytes):
    """Each batch's header (via record_batch) and bytes."""
    scan = scan_batches(buf)
    assert scan.end == len(buf)
    return [
        (scan.header(i), buf[int(p) : int(p) + int(s)])
        for i, (p, s) in enumerate(zip(scan.positions, scan.sizes, strict=False))
    ]


def kp_records(buf: bytes):
    """All records as kafka-python parses them, checking every CRC."""
    out = []
    recs = KpRecords(buf)
    while recs.has_next():
        batch = recs.next_batch()
        assert batch.validate_crc()
        for r in batch:
            out.append((r.offset, r.timestamp, r.timestamp_type, r.key, r.value, [tuple(h) for h in r.headers]))
    return out


def our_records(rb: pa.RecordBatch):
    return [
        (
            r["offset"],
            r["timestamp"],
            r["timestampType"],
            r["key"],
            r["value"],
            [(h["key"], h["value"]) for h in (r["headers"] or [])],
        )
        for r in rb.to_pylist()
    ]


# ------------------------------------------------------------------------------------ exact bytes


def test_seed_example_is_one_84_byte_batch():
    buf = build_records(table([b"DemoKey"], [b"DemoValue"]), now_ms=NOW)
    assert len(buf) == 84
    ((h, _),) = batches_of(buf)
    assert (h.record_count, h.last_offset_delta, h.magic, h.batch_length) == (1, 0, 2, 72)
    assert h.base_timestamp == h.max_timestamp == NOW
    assert compute_crc(buf) == h.crc


@pytest.mark.parametrize("with_producer", [False, True])
def test_uncompressed_bytes_equal_kafka_pythons(with_producer):
    keys = [b"k1", None, b"", b"key-%d" % 7]
    values = [b"v" * 300, b"tombstone-not", None, b""]
    ts = [1000, 999, 5000, -3]
    hdrs = [[("a", b"1")], None, [("b", None), ("c", b"")], [("x" * 70, b"y" * 200)] * 3]
    producer = dict(producer_id=4242, producer_epoch=7, base_sequence=99) if with_producer else {}
    ours = build_records(table(keys, values, ts, hdrs), partition_leader_epoch=0, **producer)
    kb = KpBuilder(
        2,
        0,
        0,
        producer.get("producer_id", -1),
        producer.get("producer_epoch", -1),
        producer.get("base_sequence", -1),
        1 << 20,
    )
    for i in range(len(keys)):
        kb.append(i, ts[i], keys[i], values[i], hdrs[i] or [])
    assert ours == bytes(kb.build())


# ------------------------------------------------------------------------------------ round trips


def sample_table():
    rng = np.random.default_rng(11)
    n = 500
    keys = [None if i % 17 == 0 else (b"" if i % 13 == 0 else b"key-%d" % i) for i in range(n)]
    values = [
        None if i % 19 == 0 else (b"" if i % 23 == 0 else b"value %d " % i * int(rng.integers(1, 40))) for i in range(n)
    ]
    ts = [int(NOW + rng.integers(-(10**6), 10**6)) for _ in range(n)]
    hdrs = []
    for i in range(n):
        k = i % 4
        hdrs.append(
            None
            if k == 0
            else []
            if k == 1
            else [(f"h{j}", None if (i + j) % 5 == 0 else b"hv" * j) for j in range(k * 2 - 1)]
        )
    return table(keys, values, ts, hdrs), keys, values, ts, hdrs


@pytest.mark.parametrize("codec", list(C))
def test_round_trip_all_codecs(codec):
    t, keys, values, ts, hdrs = sample_table()
    buf = build_records(t, compression=codec, base_offset=1000, max_batch_bytes=8192)
    infos = batches_of(buf)
    assert len(infos) > 1
    assert all(h.compression == codec for h, _ in infos)
    rb = decode_batches(buf)
    assert rb.schema == RECORD_SCHEMA
    expected = [(1000 + i, ts[i], 0, keys[i], values[i], list(hdrs[i] or [])) for i in range(len(keys))]
    assert our_records(rb) == expected
    assert kp_records(buf) == expected
    # no headers -> null (Spark's Kafka source); a null header value stays null, an empty one empty
    col = rb.column("headers")
    assert col.null_count == sum(1 for h in hdrs if not h)


def test_null_vs_empty_and_tombstones():
    t = table([None, b"", b"k", b"k2"], [b"", None, None, b"x"], [1, 2, 3, 4], [[("h", None)], [("h", b"")], None, []])
    rb = decode_batches(build_records(t))
    assert rb.column("key").to_pylist() == [None, b"", b"k", b"k2"]
    assert rb.column("value").to_pylist() == [b"", None, None, b"x"]
    assert rb.column("headers").to_pylist() == [[{"key": "h", "value": None}], [{"key": "h", "value": b""}], None, None]


def test_strings_large_types_chunked_and_sliced_input():
    base = table(
        [b"a", b"bb", None, b"dddd"],
        [b"1", None, b"333", b"4444"],
        [10, 20, 30, 40],
        [[("k", b"v")], None, [("k2", None)], []],
    )
    expected = our_records(decode_batches(build_records(base, now_ms=NOW)))
    as_str = base.cast(
        pa.schema(
            [
                ("key", pa.string()),
                ("value", pa.large_string()),
                ("timestamp", pa.int64()),
                ("headers", pa.large_list(pa.struct([("key", pa.large_string()), ("value", pa.large_binary())]))),
            ]
        )
    )
    assert our_records(decode_batches(build_records(as_str))) == expected
    chunked = pa.concat_tables([base.slice(0, 1), base.slice(1, 2), base.slice(3)])
    assert chunked.column("value").num_chunks == 3
    assert our_records(decode_batches(build_records(chunked))) == expected
    # a sliced RecordBatch (non-zero array offsets everywhere), offsets restart at base_offset
    rb = pa.concat_tables([base, base]).combine_chunks().to_batches()[0].slice(3, 3)
    got = our_records(decode_batches(build_records(rb)))
    assert [r[3:] for r in got] == [r[3:] for r in expected[3:] + expected[:2]]
    assert [r[0] for r in got] == [0, 1, 2]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_rows_encode_a_permutation_as_the_gathered_table_would(codec):
    """encode_records(rows=...) (the stager routes rows to partitions that way, with no gather of the data)
    gives the bytes of encoding table.take(rows), nulls, headers and a sliced input included."""
    from storage.records.builder import encode_records

    base = table(
        [b"a", b"bb", None, b"dddd", b"e"],
        [b"1", None, b"333", b"4444", b""],
        [10, 20, 30, 40, 50],
        [[("k", b"v")], None, [("k2", None)], [], [("a", b"b"), ("c", b"d")]],
    )
    sliced = pa.concat_tables([base, base]).combine_chunks().to_batches()[0].slice(2, 7)
    for t in (base, sliced):
        for rows in ([4, 0, 2], [1, 1, 3, 0], list(range(t.num_rows))[::-1], []):
            opts = dict(compression=codec, now_ms=NOW, producer_id=3, producer_epoch=0, max_batch_bytes=120)
            want = encode_records(pa.table(t).take(pa.array(rows, pa.int64())), **opts)[0].tobytes()
            assert encode_records(t, rows=np.array(rows, np.int64), **opts)[0].tobytes() == want, rows
    with pytest.raises(IndexError):
        encode_records(base, rows=np.array([5]))


def test_minimal_table_value_only():
    t = pa.table({"value": pa.array([b"x", None])})
    rb = decode_batches(build_records(t, now_ms=NOW))
    assert rb.to_pylist() == [
        {"offset": 0, "timestamp": NOW, "timestampType": 0, "key": None, "value": b"x", "headers": None},
        {"offset": 1, "timestamp": NOW, "timestampType": 0, "key": None, "value": None, "headers": None},
    ]


def test_empty_table_gives_no_bytes():
    assert build_records(table([], [])) == b""
    assert build_batch(table([], [])) == b""
    assert decode_batches(b"").num_rows == 0
    assert decode_batches(b"").schema == RECORD_SCHEMA


def test_missing_value_column_is_an_error():
    with pytest.raises(ValueError, match="value"):
        build_records(pa.table({"key": [b"k"]}))


@pytest.mark.parametrize(
    "unit, values, expected",
    [
        ("s", [1, -1], [1000, -1000]),
        ("ms", [1234, -5], [1234, -5]),
        ("us", [1_234_567, -1], [1234, -1]),  # floor, like Instant.toEpochMilli
        ("ns", [1_234_567_890, -1_000_001], [1234, -2]),
    ],
)
def test_timestamp_units(unit, values, expected):
    t = pa.table({"value": [b"a", b"b"], "timestamp": pa.array(values, pa.timestamp(unit))})
    assert decode_batches(build_records(t)).column("timestamp").to_pylist() == expected


def test_null_timestamps_become_now():
    t = pa.table({"value": [b"a", b"b", b"c"], "timestamp": pa.array([5, None, 7], pa.int64())})
    assert decode_batches(build_records(t, now_ms=NOW)).column("timestamp").to_pylist() == [5, NOW, 7]


def test_header_keys_must_be_text():
    bad = pa.table(
        {
            "value": [b"v"],
            "headers": pa.array(
                [[{"key": b"\xff", "value": b"x"}]], pa.list_(pa.struct([("key", pa.binary()), ("value", pa.binary())]))
            ),
        }
    )
    with pytest.raises(ValueError, match="UTF-8"):
        build_records(bad)
    null_key = pa.table({"value": [b"v"], "headers": pa.array([[{"key": None, "value": b"x"}]], HEADERS)})
    with pytest.raises(ValueError, match="row 0"):
        build_records(null_key)


# ------------------------------------------------------------------------------------ batch fields


def test_negative_timestamp_deltas_and_base_timestamp():
    ts = [5000, 1000, 9000, 4000]
    buf = build_records(table([None] * 4, [b"v"] * 4, ts))
    ((h, _),) = batches_of(buf)
    assert h.base_timestamp == 5000  # the first record's, as Kafka's builder does
    assert h.max_timestamp == 9000
    assert decode_batches(buf).column("timestamp").to_pylist() == ts
    assert [r[1] for r in kp_records(buf)] == ts


def test_log_append_time():
    buf = build_records(
        table([b"k"] * 3, [b"v"] * 3, [1, 2, 3]), timestamp_type=TimestampType.LOG_APPEND_TIME, now_ms=NOW
    )
    ((h, _),) = batches_of(buf)
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.attributes & 0x08
    assert h.max_timestamp == NOW
    rb = decode_batches(buf)
    assert rb.column("timestamp").to_pylist() == [NOW] * 3
    assert rb.column("timestampType").to_pylist() == [1] * 3
    assert [(r[1], r[2]) for r in kp_records(buf)] == [(NOW, 1)] * 3


def test_producer_fields_and_sequence_advance_per_batch():
    n = 40
    t = table([b"k"] * n, [b"x" * 100] * n, list(range(n)))
    buf = build_records(
        t,
        base_offset=500,
        producer_id=77,
        producer_epoch=3,
        base_sequence=2**31 - 15,
        is_transactional=True,
        partition_leader_epoch=9,
        max_batch_bytes=1000,
    )
    infos = batches_of(buf)
    assert len(infos) > 3
    rows = 0
    for h, raw in infos:
        assert (h.producer_id, h.producer_epoch, h.partition_leader_epoch) == (77, 3, 9)
        assert h.is_transactional and h.attributes & 0x10
        assert h.base_offset == 500 + rows
        assert h.base_sequence == (2**31 - 15 + rows) % 2**31  # wraps to 0 past Int.MaxValue, as Kafka does
        kb = KpBatch(raw)
        assert (kb.producer_id, kb.producer_epoch, kb.base_sequence) == (77, 3, h.base_sequence)
        rows += h.record_count
    assert rows == n


def test_delete_horizon():
    ts = [1000, 2000, 500]
    buf = build_records(table([b"a", b"b", b"c"], [None, b"x", None], ts), delete_horizon_ms=NOW)
    ((h, _),) = batches_of(buf)
    assert h.attributes & 0x40
    assert h.delete_horizon_ms == NOW and h.base_timestamp == NOW
    assert h.max_timestamp == 2000
    assert decode_batches(buf).column("timestamp").to_pylist() == ts
    assert [r[1] for r in kp_records(buf)] == ts


def test_header_field_ranges_are_checked():
    with pytest.raises(ValueError, match="out of range"):
        build_records(table([b"k"], [b"v"]), producer_epoch=40000)


# ------------------------------------------------------------------------------------ splitting


@pytest.mark.parametrize("codec", [C.NONE, C.ZSTD])
def test_split_at_max_batch_bytes(codec):
    rng = np.random.default_rng(2)
    n = 300
    values = [bytes(rng.integers(97, 100, int(rng.integers(0, 400)), dtype=np.uint8)) for _ in range(n)]
    ts = [int(x) for x in NOW + rng.integers(-(10**9), 10**9, n)]
    t = table([b"key"] * n, values, ts, [[("h", b"v")]] * n)
    limit = 4000
    buf = build_records(t, compression=codec, max_batch_bytes=limit, base_offset=10)
    infos = batches_of(buf)
    assert len(infos) > 5
    first = 0
    for i, (h, raw) in enumerate(infos):
        assert h.base_offset == 10 + first
        last = first + h.record_count
        one = build_batch(t.slice(first, h.record_count))  # this batch uncompressed, same base timestamp
        assert len(one) <= limit
        if codec is C.NONE:
            assert one[12:] == raw[12:]
        if i + 1 < len(infos):  # greedy: one more row would not have fitted
            assert len(build_batch(t.slice(first, h.record_count + 1))) > limit
        first = last
    assert first == n
    assert our_records(decode_batches(buf)) == kp_records(buf)
    assert decode_batches(buf).column("value").to_pylist() == values


def test_split_limit_exact_and_single_record_too_large():
    t = table([b"k"] * 3, [b"x" * 1000] * 3, [1, 2, 3])
    one = len(build_batch(t.slice(0, 1)))
    two = len(build_batch(t.slice(0, 2)))
    assert len(batches_of(build_records(t, max_batch_bytes=two))) == 2
    assert len(batches_of(build_records(t, max_batch_bytes=two - 1))) == 3
    with pytest.raises(RecordTooLargeError, match="row 0"):
        build_records(t, max_batch_bytes=one - 1)
    big = table([b"k", b"k"], [b"small", b"x" * 5000], [1, 2])
    with pytest.raises(RecordTooLargeError, match="row 1"):
        build_records(big, max_batch_bytes=2000)


def test_build_batch_never_splits():
    t = table([b"k"] * 50, [b"x" * 100_000] * 50)
    infos = batches_of(build_batch(t, now_ms=NOW))
    assert len(infos) == 1 and infos[0][0].record_count == 50


# ------------------------------------------------------------------------------------ reading


def test_min_max_offset_filter_matches_brute_force():
    n = 60
    t = table(
        [b"k%d" % i for i in range(n)],
        [b"v%d" % i for i in range(n)],
        list(range(n)),
        [[("i", b"%d" % i)] if i % 2 else None for i in range(n)],
    )
    buf = build_records(t, base_offset=100, max_batch_bytes=300, compression=C.LZ4)
    full = our_records(decode_batches(buf))
    for lo, hi in [(None, None), (100, 160), (117, 133), (101, 102), (159, None), (None, 100), (130, 130), (0, 10**19)]:
        got = our_records(decode_batches(buf, min_offset=lo, max_offset=hi))
        want = [r for r in full if (lo is None or r[0] >= lo) and (hi is None or r[0] < hi)]
        assert got == want, (lo, hi)


def test_control_batches_skipped_unless_asked():
    data = build_records(table([b"k"], [b"data"]), base_offset=0)
    ctrl = bytearray(
        build_records(
            table([b"\x00\x00\x00\x01"], [b"\x00\x00\x00\x00\x00\x00"]),
            base_offset=1,
            producer_id=5,
            producer_epoch=0,
            is_transactional=True,
        )
    )
    attrs = struct.unpack_from(">h", ctrl, 21)[0] | CONTROL_FLAG_MASK
    struct.pack_into(">h", ctrl, 21, attrs)
    struct.pack_into(">I", ctrl, CRC_OFFSET, compute_crc(ctrl))
    buf = data + bytes(ctrl)
    assert decode_batches(buf).column("offset").to_pylist() == [0]
    assert decode_batches(buf, skip_control=False).column("offset").to_pylist() == [0, 1]


def test_mixed_codecs_and_given_scan_and_partial_tail():
    parts = [build_records(table([b"k%d" % i], [b"v" * 50]), compression=c, base_offset=i) for i, c in enumerate(C)]
    buf = b"".join(parts)
    whole = decode_batches(buf)
    assert whole.column("offset").to_pylist() == list(range(5))
    torn = buf + parts[0][:30]
    scan = scan_batches(torn)
    assert scan.reason == SCAN_PARTIAL
    assert decode_batches(torn, scan=scan).equals(whole)
    assert decode_batches(np.frombuffer(torn, np.uint8)).equals(whole)
    assert decode_batches(memoryview(torn)).equals(whole)


def test_log_append_time_batch_from_set_log_append_time():
    from storage.records.record_batch import set_log_append_time

    buf = bytearray(build_records(table([b"k", b"k"], [b"a", b"b"], [1, 2])))
    set_log_append_time(buf, 0, len(buf), NOW)
    rb = decode_batches(bytes(buf))
    assert rb.column("timestamp").to_pylist() == [NOW, NOW]


# ------------------------------------------------------------------------------------ corruption


def simple(n=3, codec=C.NONE, **kw):
    return bytearray(
        build_records(
            table(
                [b"key%d" % i for i in range(n)],
                [b"value%d" % i for i in range(n)],
                list(range(n)),
                [[("h", b"v")]] * n,
            ),
            compression=codec,
            **kw,
        )
    )


def recrc(buf: bytearray, pos: int = 0) -> bytearray:
    size = struct.unpack_from(">i", buf, pos + 8)[0] + 12
    struct.pack_into(">I", buf, pos + CRC_OFFSET, crc32c.crc32c(bytes(buf[pos + 21 : pos + size])))
    return buf


def test_flipped_byte_is_a_crc_error_naming_the_position():
    first = simple()
    second = simple(base_offset=3)
    buf = first + second
    buf[len(first) + 70] ^= 0x01
    with pytest.raises(
        CorruptRecordError, match=rf"CRC mismatch.*offset 3.*seg\.log, position {1000 + len(first)}"
    ) as e:
        decode_batches(bytes(buf), source="seg.log", base_position=1000)
    assert e.value.position == 1000 + len(first)
    assert e.value.source == "seg.log"


def test_corrupt_record_reports_exact_position_without_crc():
    buf = simple()
    rec0 = RECORD_BATCH_OVERHEAD
    buf[rec0 + 4] = 0x7F  # first record's keyLength varint: -64 -> invalid length
    with pytest.raises(CorruptRecordError, match="invalid key length") as e:
        decode_batches(bytes(recrc(buf)), source="f")
    assert e.value.position == rec0


def test_truncated_records_area():
    buf = simple()
    cut = bytearray(buf[:-5])
    struct.pack_into(">i", cut, 8, len(cut) - 12)
    with pytest.raises(CorruptRecordError, match="runs past"):
        decode_batches(bytes(recrc(cut)))


def test_torn_tail_is_not_decoded():
    buf = bytes(simple())
    scan = scan_batches(buf[:-1])
    assert len(scan) == 0 and scan.reason == SCAN_PARTIAL
    assert decode_batches(buf[:-1]).num_rows == 0


def _record_area_batch(records: bytes, count: int, last_delta: int | None = None, codec=C.NONE) -> bytes:
    """A batch around hand-written record bytes, with a valid CRC."""
    body = compress(codec, records)
    head = struct.pack(
        ">qiibIhiqqqhii",
        0,
        49 + len(body),
        -1,
        2,
        0,
        int(codec),
        count - 1 if last_delta is None else last_delta,
        0,
        0,
        -1,
        -1,
        -1,
        count,
    )
    return bytes(recrc(bytearray(head + body)))


def zz(v: int) -> bytes:
    """Independent zigzag varint encoder (reference model)."""
    u = (v << 1) ^ (v >> 63)
    u &= (1 << 64) - 1
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def record(key: bytes | None, value: bytes | None, delta=0, headers=(), ts=0, raw_tail=b"") -> bytes:
    body = b"\x00" + zz(ts) + zz(delta)
    body += zz(-1) if key is None else zz(len(key)) + key
    body += zz(-1) if value is None else zz(len(value)) + value
    body += zz(len(headers)) + b"".join(zz(len(k)) + k + (zz(-1) if v is None else zz(len(v)) + v) for k, v in headers)
    body += raw_tail
    return zz(len(body)) + body


def test_hand_written_records_decode():
    recs = record(b"k", b"v") + record(None, None, 1, [(b"h", None)]) + record(b"", b"", 2, ts=-(2**40))
    rb = decode_batches(_record_area_batch(recs, 3))
    assert rb.to_pylist() == [
        {"offset": 0, "timestamp": 0, "timestampType": 0, "key": b"k", "value": b"v", "headers": None},
        {
            "offset": 1,
            "timestamp": 0,
            "timestampType": 0,
            "key": None,
            "value": None,
            "headers": [{"key": "h", "value": None}],
        },
        {"offset": 2, "timestamp": -(2**40), "timestampType": 0, "key": b"", "value": b"", "headers": None},
    ]


def framed(body: bytes) -> bytes:
    return zz(len(body)) + body


HOSTILE = {  # record area bytes, recordCount, expected message
    "huge value length": (framed(b"\x00\x00\x00" + zz(0) + zz(2**31 - 1) + b"\x00"), 1, "invalid value length"),
    "key length below -1": (framed(b"\x00\x00\x00" + zz(-2) + zz(1) + b"v" + zz(0)), 1, "invalid key length"),
    "huge header count": (framed(b"\x00\x00\x00" + zz(-1) + zz(-1) + zz(2**31 - 1)), 1, "header count"),
    "negative header count": (framed(b"\x00\x00\x00" + zz(-1) + zz(-1) + zz(-5)), 1, "header count"),
    "null header key": (
        framed(b"\x00\x00\x00" + zz(-1) + zz(-1) + zz(1) + zz(-1) + zz(1) + b"x"),
        1,
        "invalid header key length",
    ),
    "header value past record": (
        framed(b"\x00\x00\x00" + zz(-1) + zz(-1) + zz(1) + zz(1) + b"k" + zz(90) + b"x"),
        1,
        "invalid header value length",
    ),
    "record length past area": (zz(500) + b"\x00" * 10, 1, "runs past"),
    "record length too small": (zz(3) + b"\x00" * 10, 1, "below the minimum"),
    "overlong varint": (framed(b"\x00" + b"\xff" * 11 + b"\x00" * 5), 1, "varint longer"),
    "offsetDelta above lastOffsetDelta": (record(b"k", b"v", delta=5), 1, "offsetDelta"),
    "offsetDelta repeated": (record(b"k", b"v", 0) + record(b"k", b"v", 0), 2, "offsetDelta"),
    "fields short of the record length": (record(b"k", b"v", raw_tail=b"\x00"), 1, "do not end"),
    "trailing bytes": (record(b"k", b"v") + b"\x00\x00", 1, "bytes left"),
    "fewer records than recordCount": (record(b"k" * 20, b"v", 0) + record(b"k" * 20, b"v", 1), 5, "runs past"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
@pytest.mark.parametrize("codec", [C.NONE, C.ZSTD])
def test_hostile_records(name, codec):
    recs, count, message = HOSTILE[name]
    buf = b"pad" + _record_area_batch(
        recs, count, last_delta=max(count - 1, 0) if "above" not in name else 0, codec=codec
    )
    scan = scan_batches(buf, start=3)
    with pytest.raises(CorruptRecordError, match=message) as e:
        decode_batches(buf, scan=scan, source="hostile", base_position=10)
    assert e.value.source == "hostile"
    if codec is C.NONE:  # exact byte position inside the file
        assert 10 + 3 + RECORD_BATCH_OVERHEAD <= e.value.position <= 10 + len(buf)
    else:  # the batch's position, plus the byte inside the decompressed records
        assert e.value.position == 13
        assert "decompressed records" in str(e.value)


def test_record_count_that_cannot_fit_is_refused_before_allocating():
    buf = _record_area_batch(record(b"k", b"v"), 1)
    bad = bytearray(buf)
    struct.pack_into(">i", bad, 57, 2**31 - 1)
    struct.pack_into(">i", bad, 23, 2**31 - 2)
    with pytest.raises(CorruptRecordError, match="cannot fit"):
        decode_batches(bytes(recrc(bad)))
    struct.pack_into(">i", bad, 23, 0)  # and more records than offsets
    with pytest.raises(CorruptRecordError, match="inconsistent batch"):
        decode_batches(bytes(recrc(bad)))


def test_magic_and_bad_batch_length():
    buf = simple()
    buf[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1"):
        decode_batches(bytes(buf))
    buf = simple()
    struct.pack_into(">i", buf, 8, 10)
    with pytest.raises(CorruptRecordError, match="batchLength 10") as e:
        decode_batches(bytes(buf), base_position=5)
    assert e.value.position == 5


def test_unknown_codec():
    buf = simple()
    struct.pack_into(">h", buf, 21, 6)
    with pytest.raises(CorruptRecordError, match="codec 6"):
        decode_batches(bytes(recrc(buf)))


def _break_magic(b: bytearray) -> None:
    b[16] = 1


def _break_codec(b: bytearray) -> None:
    struct.pack_into(">h", b, 21, 6)
    recrc(b)


def _break_count(b: bytearray) -> None:
    struct.pack_into(">i", b, 57, 9)  # recordCount above lastOffsetDelta + 1
    recrc(b)


def _break_order(b: bytearray) -> None:
    struct.pack_into(">q", b, 0, 1)  # baseOffset 1, inside the first batch's offsets


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_break_magic, "magic 1"),
        (_break_codec, "codec 6"),
        (_break_count, "inconsistent batch"),
        (_break_order, "offsets out of order"),
    ],
)
def test_a_bad_batch_header_names_the_batch_position_in_the_file(corrupt, message):
    """validate_batches (a segment's read and recovery checks) names the second batch's position in the file."""
    first = simple()
    second = simple(base_offset=3)
    corrupt(second)
    buf = bytes(first + second)
    with pytest.raises(CorruptRecordError, match=message) as e:
        validate_batches(buf, scan_batches(buf), source="seg.log", base_position=1000)
    assert e.value.position == 1000 + len(first)
    assert e.value.source == "seg.log"


def test_decompression_bomb_batch():
    zeros = b"\x00" * (8 << 20)
    buf = _record_area_batch(zeros, 1, codec=C.ZSTD)
    assert len(buf) < 2000
    with pytest.raises(RecordTooLargeError, match=r"bomb\.log, position 0"):
        decode_batches(buf, source="bomb.log")
    with pytest.raises(RecordTooLargeError):
        decode_batches(_record_area_batch(zeros, 1, codec=C.GZIP), max_message_bytes=1 << 20)


def zstd_zeros_batch(size: int) -> bytes:
    """A batch whose zstd records decompress to `size` zero bytes, built by streaming."""
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        block = b"\x00" * (1 << 20)
        for _ in range(size >> 20):
            out.write(block)
    body = sink.getvalue().to_pybytes()
    head = struct.pack(">qiibIhiqqqhii", 0, 49 + len(body), -1, 2, 0, int(C.ZSTD), 0, 0, 0, -1, -1, -1, 1)
    return bytes(recrc(bytearray(head + body)))


def test_hostile_inputs_do_not_allocate():
    """Hostile counts and lengths, in a fresh process: peak RSS must not follow the claimed sizes."""
    script = textwrap.dedent(f"""
        import resource, struct, sys
        sys.path.insert(0, {REPO!r}); sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_records_codec import _record_area_batch, record, zz, recrc, zstd_zeros_batch
        from storage.records.decoder import decode_batches
        from storage.records.record_batch import CompressionType as C
        from storage.errors import KafkaLogError
        decode_batches(_record_area_batch(record(b"k", b"v"), 1))  # warm up
        cases = [
            _record_area_batch(b"\\x0c\\x00\\x00\\x00\\x00" + zz(2**31 - 1) + b"\\x00", 1),
            _record_area_batch(b"\\x0c\\x00\\x00\\x00\\x00\\x00" + zz(2**31 - 1), 1),
            zstd_zeros_batch(1 << 30),
        ]
        many = bytearray(_record_area_batch(record(b"k", b"v"), 1))
        struct.pack_into(">i", many, 57, 2**31 - 1)
        struct.pack_into(">i", many, 23, 2**31 - 2)
        cases.append(bytes(recrc(many)))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        raised = 0
        for buf in cases:
            try:
                decode_batches(buf)
            except KafkaLogError:
                raised += 1
        print(raised, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    raised, grown_mb = map(int, out.stdout.split())
    assert raised == 4
    assert grown_mb < 64


def test_invalid_utf8_header_key_is_reported():
    recs = record(b"k", b"v", headers=[(b"\xff\xfe", b"x")])
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        decode_batches(_record_area_batch(recs, 1), source="s")


# ------------------------------------------------------------------------------------ property

binary = st.one_of(st.none(), st.binary(max_size=300))
header = st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=40)))
row = st.tuples(binary, binary, st.integers(-(2**45), 2**45), st.one_of(st.none(), st.lists(header, max_size=4)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(row, max_size=40),
    codec=st.sampled_from(list(C)),
    limit=st.sampled_from([400, 2000, 1 << 20]),
    base_offset=st.integers(0, 2**40),
    ts_type=st.sampled_from(list(TimestampType)),
)
def test_property_round_trip_and_kafka_python_agrees(rows, codec, limit, base_offset, ts_type):
    keys, values, ts, hdrs = (list(x) for x in zip(*rows, strict=False)) if rows else ([], [], [], [])
    t = table(keys, values, ts, hdrs)
    try:
        buf = build_records(
            t, compression=codec, base_offset=base_offset, max_batch_bytes=limit, timestamp_type=ts_type, now_ms=NOW
        )
    except RecordTooLargeError:
        assert limit < 1 << 20
        return
    if not rows:
        assert buf == b""
        return
    log_append = ts_type is TimestampType.LOG_APPEND_TIME
    expected = [
        (base_offset + i, NOW if log_append else ts[i], int(ts_type), keys[i], values[i], list(hdrs[i] or []))
        for i in range(len(rows))
    ]
    assert our_records(decode_batches(buf)) == expected
    assert kp_records(buf) == expected
    for h, _ in batches_of(buf):
        assert h.size_in_bytes <= limit or h.compression is not C.NONE
        assert h.compression == codec


@pytest.mark.parametrize("codec", [c for c in C if c is not C.NONE])
def test_parallel_compression_matches_serial(codec):
    """Enough batches and bytes to use the codec thread pool: same records as one thread, all readable."""
    from storage.records import compression

    rng = np.random.default_rng(4)
    n = 6000
    t = table(
        [b"key-%d" % (i % 97) for i in range(n)],
        [rng.bytes(100).hex().encode() for _ in range(n)],
        list(range(n)),
        [[("h", b"%d" % i)] for i in range(n)],
    )
    before = compression._threads
    compression.set_threads(2)
    try:
        parallel = build_records(t, compression=codec, max_batch_bytes=64 * 1024)
        assert compression._pool is not None  # the pool really ran
        parallel_read = decode_batches(parallel)
        compression.set_threads(1)
        serial = build_records(t, compression=codec, max_batch_bytes=64 * 1024)
        serial_read = decode_batches(parallel)
    finally:
        compression.set_threads(before)
    assert len(parallel) > compression._MIN_PARALLEL_BYTES
    assert parallel == serial
    assert parallel_read.equals(serial_read)
    assert our_records(serial_read) == kp_records(parallel)
