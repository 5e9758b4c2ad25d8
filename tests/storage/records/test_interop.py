"""Interop with kafka-python (pure Python) and aiokafka (C extension and pure Python), all codecs.

Both clients silently send uncompressed batches when compression does not shrink the data, so the
records here are compressible and the codec attribute of every batch is asserted.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from aiokafka.record import _crecords
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy, _DefaultRecordBatchPy
from aiokafka.record.memory_records import _MemoryRecordsPy
from kafka.record.default_records import DefaultRecordBatch as KpBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder
from kafka.record.memory_records import MemoryRecords as KpRecords

from storage.records.builder import build_records
from storage.records.decoder import decode_batches
from storage.records.record_batch import CompressionType as C
from storage.records.record_batch import scan_batches, set_base_offset

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
PRODUCER = dict(producer_id=123456789, producer_epoch=5, base_sequence=1000)
N = 400


def rows():
    """Compressible records with nulls, empty values, tombstones and 0..3 headers (one null value)."""
    out = []
    for i in range(N):
        key = None if i % 10 == 3 else b"user-%04d" % (i % 50)
        value = (
            None
            if i % 25 == 7
            else (b"" if i % 31 == 0 else b'{"event": "click", "n": %d, "pad": "%s"}' % (i, b"abc" * (i % 20)))
        )
        headers = [("trace", b"t-%d" % i), ("empty", b""), ("nothing", None)][: i % 4]
        out.append((1_700_000_000_000 + (i * 7919) % 100_000 - 50_000, key, value, headers))
    return out


def as_table(records) -> pa.Table:
    ts, keys, values, headers = zip(*records, strict=False)
    return pa.table(
        {
            "timestamp": pa.array(ts, pa.int64()),
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], HEADERS),
        }
    )


def expected(records, base_offset):
    return [(base_offset + i, ts, k, v, list(h)) for i, (ts, k, v, h) in enumerate(records)]


def read_all(memory_records_cls, buf, batch_check):
    got = []
    recs = memory_records_cls(buf)
    while recs.has_next():
        batch = recs.next_batch()
        batch_check(batch)
        for r in batch:
            got.append((r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]))
    return got


READERS = {
    "kafka-python": KpRecords,
    "aiokafka-c": _crecords.MemoryRecords,
    "aiokafka-py": _MemoryRecordsPy,
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("codec", list(C))
def test_clients_read_our_batches(reader, codec):
    records = rows()
    buf = build_records(as_table(records), compression=codec, base_offset=5000, max_batch_bytes=4096, **PRODUCER)
    batches = scan_batches(buf)
    assert len(batches) > 2
    seen = []

    def check(batch):
        assert batch.validate_crc()
        assert batch.compression_type == int(codec)
        assert (batch.producer_id, batch.producer_epoch) == (PRODUCER["producer_id"], PRODUCER["producer_epoch"])
        assert batch.base_sequence == PRODUCER["base_sequence"] + (batch.base_offset - 5000)
        seen.append(batch.base_offset)

    assert read_all(READERS[reader], buf, check) == expected(records, 5000)
    assert seen == batches.headers["base_offset"].tolist()


def test_aiokafka_c_reader_is_the_extension():
    assert type(_crecords.MemoryRecords(b"")).__module__.startswith("aiokafka.record._crecords")
    assert _crecords.DefaultRecordBatch is not _DefaultRecordBatchPy


BUILDERS = {
    "kafka-python": KpBuilder,
    "aiokafka-c": _crecords.DefaultRecordBatchBuilder,
    "aiokafka-py": _DefaultRecordBatchBuilderPy,
}


def build_with(builder_cls, codec, records, base_offset, batch_size=4096):
    """Batches from a client's builder, offsets assigned as a broker would (patching baseOffset)."""
    out = bytearray()
    pos = 0
    while pos < len(records):
        b = builder_cls(
            2,
            int(codec),
            0,
            PRODUCER["producer_id"],
            PRODUCER["producer_epoch"],
            PRODUCER["base_sequence"] + pos,
            batch_size,
        )
        start = pos
        while pos < len(records):
            ts, k, v, h = records[pos]
            if b.append(pos - start, ts, k, v, h) is None:
                break
            pos += 1
        batch = bytearray(b.build())
        set_base_offset(batch, 0, base_offset + start)
        out += batch
    return bytes(out)


@pytest.mark.parametrize("builder", sorted(BUILDERS))
@pytest.mark.parametrize("codec", list(C))
def test_we_read_client_batches(builder, codec):
    records = rows()
    buf = build_with(BUILDERS[builder], codec, records, base_offset=77)
    scan = scan_batches(buf)
    assert len(scan) > 2
    assert set((scan.headers["attributes"] & 7).tolist()) == {int(codec)}  # really compressed
    assert set(scan.headers["producer_id"].tolist()) == {PRODUCER["producer_id"]}
    rb = decode_batches(buf, source="client")
    got = [
        (r["offset"], r["timestamp"], r["key"], r["value"], [(h["key"], h["value"]) for h in (r["headers"] or [])])
        for r in rb.to_pylist()
    ]
    assert got == expected(records, 77)
    assert set(rb.column("timestampType").to_pylist()) == {0}


@pytest.mark.parametrize("builder, epoch", [("aiokafka-c", -1), ("aiokafka-py", -1), ("kafka-python", 0)])
def test_uncompressed_bytes_identical_to_client_builders(builder, epoch):
    """Same records, same batch boundaries: byte-for-byte the same batches."""
    records = rows()
    theirs = build_with(BUILDERS[builder], C.NONE, records, base_offset=0, batch_size=1 << 20)
    ours = build_records(as_table(records), partition_leader_epoch=epoch, **PRODUCER)
    assert ours == theirs


def test_kafka_python_single_batch_object_api():
    records = rows()[:50]
    buf = build_records(as_table(records), compression=C.SNAPPY, base_offset=9)
    batch = KpBatch(buf)
    assert batch.validate_crc()
    assert batch.base_offset == 9 and batch.last_offset_delta == 49 and batch.records_count == 50
    assert batch.first_timestamp == records[0][0]
    assert batch.max_timestamp == max(r[0] for r in records)
