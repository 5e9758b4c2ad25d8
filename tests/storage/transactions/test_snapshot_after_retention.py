"""A producer snapshot whose open transaction began in records retention (or delete-records) has since removed.

A transaction's COMMIT marker is stamped with the time it is written. When the transaction's data carry old
timestamps (a `rate-micro-batch` source starting in 1970), the marker rolls the segment (segment.ms), so the
roll's snapshot, at the marker's offset, correctly holds the transaction open from its first data offset (a
snapshot covers the offsets below its own). retention.ms then deletes the data's segment, and the log starts
at or after the transaction's first offset. This is Kafka's state, not damage. Kafka's loader drops a snapshot
at or below the log start (ProducerStateManager.truncateAndReload) and replays from the log start. A reader
here cannot check the claim against deleted records, so it scans from the log start. It must not log
"not trusting producer snapshot" (a warning kept for damaged snapshots) on every read.

Expected values come from kafka-python's parse of the partition's files and Kafka's rules stated here,
not from the engine.
"""

from __future__ import annotations

import logging
import os
import struct

import pyarrow as pa
import pytest
from kafka.record.memory_records import MemoryRecords

import storage.log
from storage.common.time import SYSTEM_TIME
from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.producer_snapshot import list_snapshots, read_snapshot

W = 3828920930305169659  # a sink writer id
TP = TopicPartition("t", 0)
DAY = 86_400_000


@pytest.fixture(autouse=True)
def _sink_close_threshold(monkeypatch):
    # the sink's writers close at every commit: keep the real close threshold (conftest sets 0), so that the
    # latest snapshot is the marker's roll's, as in a real run
    monkeypatch.setattr(storage.log, "CLOSE_SNAPSHOT_MIN_OFFSETS", 50_000)


def kp_batches(root: str, tp: TopicPartition = TP) -> list:
    """Every batch of the partition's live `.log` files, as kafka-python parses them, in offset order."""
    d = os.path.join(root, f"{tp.topic}-{tp.partition}")
    out = []
    for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
        with open(os.path.join(d, name), "rb") as f:
            recs = MemoryRecords(f.read())
        while recs.has_next():
            b = recs.next_batch()
            if b is None:
                break
            out.append(b)
    return out


def open_at(batches: list, offset: int) -> dict[int, int]:
    """Kafka's ongoing transactions after every batch below `offset`: producer -> the base offset of its first
    transactional data batch not yet followed by a control batch (a marker) of the same producer."""
    ongoing: dict[int, int] = {}
    for b in batches:
        if b.base_offset >= offset:
            break
        if b.is_control_batch:
            ongoing.pop(b.producer_id, None)
        elif b.is_transactional:
            ongoing.setdefault(b.producer_id, b.base_offset)
    return ongoing


def committed_values(batches: list, start: int) -> list[bytes]:
    """A read_committed consumer from `start` over batches holding only COMMITted transactions (checked)."""
    out = []
    for b in batches:
        if b.is_control_batch:
            (rec,) = list(b)
            assert struct.unpack(">hh", rec.key)[1] == 1, "a COMMIT marker"
            continue
        out += [r.value for r in b if r.offset >= start]
    return out


def snapshot_open(lm: LogManager, offset: int) -> dict[int, int]:
    e = read_snapshot(lm.fs, os.path.join(lm.partition_dir(TP), f"{offset:020d}.snapshot"))
    return {int(p): int(f) for p, f in zip(e["producer_id"], e["current_txn_first_offset"], strict=True) if f >= 0}


def sink_commit(lm: LogManager, n: int, batch_id: int = 0, **kw) -> None:
    """One micro-batch of the sink (a Kafka transaction) of n rows stamped 1970-01-01T00:00:00.000 + i ms."""
    st = RecordStager(lm, W, topic="t", compression=CompressionType.NONE, **kw)
    st.add(
        pa.table(
            {
                "key": pa.array([f"k{i % 50}".encode() for i in range(n)], pa.binary()),
                "value": pa.array([f"v{batch_id}-{i}".encode() for i in range(n)], pa.binary()),
                "timestamp": pa.array(list(range(n)), pa.timestamp("ms", "UTC")),
            }
        )
    )
    commit_staged(lm, W, batch_id, [st.finish()], transactional=True)


def read_committed(log, start: int) -> list[bytes]:
    return [v for b in log.read_records(start, isolation_level="read_committed") for v in b.column("value").to_pylist()]


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_retention_leaves_a_snapshot_at_the_log_start_holding_the_transaction_open(root, caplog):
    lm = LogManager(root)
    lm.create_topic("t", 1, {})
    n = 300
    sink_commit(lm, n)
    before = kp_batches(root)
    *data, commit = before
    assert commit.is_control_batch and commit.producer_id == W and commit.base_offset == n
    assert all(b.is_transactional and not b.is_control_batch and b.producer_id == W for b in data)
    # the marker (stamped now, after records from 1970) rolled the segment: the snapshot at the marker's offset
    # holds the transaction open from its first offset, as Kafka's would (it covers the offsets below n)
    assert [s.offset for s in list_snapshots(lm.fs, lm.partition_dir(TP))] == [n]
    assert snapshot_open(lm, n) == open_at(before, n) == {W: 0}

    r = LogManager(root).apply_retention(TP, now_ms=SYSTEM_TIME.milliseconds() + DAY)
    assert r.log_start_offset == n and r.segments_deleted == 1  # the 1970 segment: the log starts at the marker
    assert snapshot_open(lm, n) == open_at(before, n)  # the snapshot is left as it was

    caplog.set_level(logging.INFO)
    with LogManager(root).open_log(TP) as log:
        # Kafka: no transaction is open at the log end (the COMMIT marker ended it), so the LSO is the log end
        assert open_at(before, n + 1) == {}
        assert log.last_stable_offset == log.log_end_offset == n + 1
        assert read_committed(log, n) == []
    assert warnings_of(caplog) == []


def test_delete_records_into_a_transaction_spanning_segments(root, caplog):
    """Both snapshots the transaction left (at a size roll inside its data, and at its marker's time roll) hold
    it open from offset 0. After delete-records into its second segment, the latest one lies above the log
    start, and the part of the transaction at or above the log start is still read, committed, with no
    warning."""
    lm = LogManager(root)
    lm.create_topic("t", 1, {"segment.bytes": "8192"})
    n = 600
    sink_commit(lm, n, max_batch_bytes=1024)  # batches of about 60 records, segments of about 8 batches
    before = kp_batches(root)
    bases = sorted(s.offset for s in list_snapshots(lm.fs, lm.partition_dir(TP)))
    marker = before[-1].base_offset
    assert before[-1].is_control_batch and marker == n and len(bases) >= 2 and bases[-1] == marker
    for s in bases:
        assert snapshot_open(lm, s) == open_at(before, s) == {W: 0}

    start = bases[0]  # inside the transaction, which began at 0
    LogManager(root).delete_records(TP, start)

    caplog.set_level(logging.INFO)
    with LogManager(root).open_log(TP) as log:
        assert log.log_start_offset == start
        assert log.last_stable_offset == log.log_end_offset == n + 1  # Kafka: nothing open at the log end
        got = read_committed(log, start)
    assert got == committed_values(before, start) and len(got) == n - start
    assert warnings_of(caplog) == []
