"""Control records and transaction markers: hand-built key/value bytes from Kafka's layout, and the marker batch
against the one kafka-python builds (tests/helpers/kafka_reference.py) and against our decoder."""

from __future__ import annotations

import struct

import pytest

from storage.errors import CorruptRecordError, InvalidRecordError
from storage.records.decoder import decode_batches
from storage.records.record_batch import RecordBatchHeader
from storage.transactions.control_records import (
    ControlRecordType,
    EndTransactionMarker,
    parse_control_type,
    parse_control_type_id,
)
from tests.helpers.kafka_reference import kp_control_batch, kp_parse

ABORT, COMMIT = ControlRecordType.ABORT, ControlRecordType.COMMIT


def test_type_ids_are_kafkas():
    assert [(t.name, int(t)) for t in ControlRecordType] == [
        ("ABORT", 0),
        ("COMMIT", 1),
        ("LEADER_CHANGE", 2),
        ("SNAPSHOT_HEADER", 3),
        ("SNAPSHOT_FOOTER", 4),
        ("KRAFT_VERSION", 5),
        ("KRAFT_VOTERS", 6),
        ("UNKNOWN", -1),
    ]
    assert ControlRecordType.from_type_id(7) is ControlRecordType.UNKNOWN
    assert ControlRecordType.from_type_id(-2) is ControlRecordType.UNKNOWN
    assert ControlRecordType.from_type_id(5) is ControlRecordType.KRAFT_VERSION


def test_key_and_value_bytes():
    assert EndTransactionMarker(ABORT, 0).key() == b"\x00\x00\x00\x00"
    assert EndTransactionMarker(COMMIT, 7).key() == b"\x00\x00\x00\x01"
    assert EndTransactionMarker(COMMIT, 7).value() == b"\x00\x00\x00\x00\x00\x07"
    assert EndTransactionMarker(ABORT, -1).value() == b"\x00\x00\xff\xff\xff\xff"
    assert ControlRecordType.LEADER_CHANGE.record_key() == struct.pack(">hh", 0, 2)
    with pytest.raises(InvalidRecordError):
        ControlRecordType.UNKNOWN.record_key()


def test_marker_types_only():
    with pytest.raises(InvalidRecordError, match="end transaction marker"):
        EndTransactionMarker(ControlRecordType.LEADER_CHANGE, 0)
    with pytest.raises(InvalidRecordError, match="int32"):
        EndTransactionMarker(ABORT, 2**31)


@pytest.mark.parametrize("marker", [EndTransactionMarker(ABORT, 0), EndTransactionMarker(COMMIT, 2**31 - 1)])
def test_round_trip(marker):
    assert EndTransactionMarker.deserialize(marker.key(), marker.value()) == marker


def test_parse_reads_higher_versions_and_longer_bytes_as_version_0():
    """Kafka logs a newer version at debug level and reads the fields of version 0; trailing bytes are ignored."""
    key = struct.pack(">hh", 3, 1) + b"extra"
    value = struct.pack(">hi", 2, 11) + b"more"
    assert parse_control_type_id(key) == 1
    assert EndTransactionMarker.deserialize(key, value) == EndTransactionMarker(COMMIT, 11)
    assert parse_control_type(struct.pack(">hh", 0, 9)) is ControlRecordType.UNKNOWN


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (None, "at least 4 bytes, but found a null key"),
        (b"\x00\x00\x00", "at least 4 bytes, but found only 3 bytes"),
        (struct.pack(">hh", -1, 0), "key version -1"),
    ],
)
def test_bad_keys(key, message):
    with pytest.raises(CorruptRecordError, match=message) as e:
        parse_control_type_id(key, source="seg.log", position=123)
    assert "(seg.log, position 123)" in str(e.value) and e.value.position == 123


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (struct.pack(">hh", 0, 0), b"\x00\x00\x00\x00\x00", "at least 6 bytes, but found only 5 bytes"),
        (struct.pack(">hh", 0, 1), None, "at least 6 bytes, but found a null value"),
        (struct.pack(">hh", 0, 0), struct.pack(">hi", -3, 0), "marker version -3"),
        (struct.pack(">hh", 0, 2), struct.pack(">hi", 0, 0), "LEADER_CHANGE is not a transaction marker"),
        (struct.pack(">hh", 0, 42), struct.pack(">hi", 0, 0), "UNKNOWN is not a transaction marker"),
        (b"\x00", struct.pack(">hi", 0, 0), "at least 4 bytes"),
    ],
)
def test_bad_markers(key, value, message):
    with pytest.raises(CorruptRecordError, match=message) as e:
        EndTransactionMarker.deserialize(key, value, source="seg.log", position=5)
    assert str(e.value).endswith("(seg.log, position 5)")


@pytest.mark.parametrize("commit", [True, False])
def test_marker_batch_is_kafka_pythons_byte_for_byte(commit):
    """kafka-python's builder (control bit added, CRC recomputed) writes partitionLeaderEpoch 0: the same bytes."""
    marker = EndTransactionMarker(COMMIT if commit else ABORT, 0)
    ours = marker.to_batch(
        base_offset=1234, timestamp=1_700_000_000_123, producer_id=42, producer_epoch=3, partition_leader_epoch=0
    )
    assert ours == kp_control_batch(1234, 1_700_000_000_123, 42, commit=commit, producer_epoch=3)
    (parsed,) = kp_parse(ours)
    assert parsed["crc_ok"] and parsed["records"] == [(1234, 1_700_000_000_123, marker.key(), marker.value(), [])]


def test_marker_batch_header_and_decoder():
    marker = EndTransactionMarker(ABORT, 9)
    data = marker.to_batch(base_offset=77, timestamp=1_600_000_000_000, producer_id=5, producer_epoch=1)
    h = RecordBatchHeader.read(data)
    assert (h.attributes, h.is_transactional, h.is_control, h.compression) == (0x30, True, True, 0)
    assert (h.base_offset, h.last_offset_delta, h.record_count) == (77, 0, 1)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.partition_leader_epoch) == (5, 1, -1, -1)
    assert (h.base_timestamp, h.max_timestamp) == (1_600_000_000_000, 1_600_000_000_000)
    assert len(data) == 61 + 17  # Kafka's RECORD_BATCH_OVERHEAD + CURRENT_END_TXN_SCHEMA_RECORD_SIZE
    assert decode_batches(data).num_rows == 0  # control records are never handed out by default
    (row,) = decode_batches(data, skip_control=False).to_pylist()
    assert (row["offset"], row["timestamp"], row["headers"]) == (77, 1_600_000_000_000, None)
    assert EndTransactionMarker.deserialize(row["key"], row["value"]) == marker


def test_marker_batch_needs_a_producer():
    with pytest.raises(InvalidRecordError, match="producer id"):
        EndTransactionMarker(COMMIT, 0).to_batch(base_offset=0, timestamp=0, producer_id=-1, producer_epoch=0)


@pytest.mark.parametrize(
    "kind, epoch, base, ts, pid, pepoch, ple",
    [
        (COMMIT, 0, 0, 0, 0, 0, -1),
        (ABORT, 2**31 - 1, 2**63 - 1, 2**63 - 1, 2**63 - 1, 32767, 2**31 - 1),
        (COMMIT, 7, 123_456, 1_700_000_000_123, 42, 3, 5),
    ],
)
def test_marker_batch_equals_the_general_encoders(kind, epoch, base, ts, pid, pepoch, ple):
    """to_batch writes the marker's fixed layout by hand (no numba in a commit): the Arrow encoder, given the
    same record, must build the same bytes."""
    import pyarrow as pa

    from storage.records.builder import build_batch
    from storage.records.record_batch import CompressionType, TimestampType

    marker = EndTransactionMarker(kind, epoch)
    table = pa.table(
        {
            "key": pa.array([marker.key()], pa.binary()),
            "value": pa.array([marker.value()], pa.binary()),
            "timestamp": pa.array([ts], pa.int64()),
        }
    )
    general = build_batch(
        table,
        compression=CompressionType.NONE,
        base_offset=base,
        timestamp_type=TimestampType.CREATE_TIME,
        producer_id=pid,
        producer_epoch=pepoch,
        base_sequence=-1,
        partition_leader_epoch=ple,
        is_transactional=True,
        control=True,
        now_ms=ts,
    )
    ours = marker.to_batch(
        base_offset=base, timestamp=ts, producer_id=pid, producer_epoch=pepoch, partition_leader_epoch=ple
    )
    assert ours == general


def test_marker_batch_refuses_out_of_range_fields():
    with pytest.raises(InvalidRecordError, match="out of range"):
        EndTransactionMarker(COMMIT, 0).to_batch(base_offset=2**63, timestamp=0, producer_id=1, producer_epoch=0)
