"""A writer's producer snapshots on hand-built logs: written at each roll (as of the new segment's base offset) and
at a clean close (as of the log end) when the partition holds producer batches, never otherwise; deleted below the
log start by retention and delete-records and above the log end by truncation; and a reader starting from one gets
the LSO and aborted transactions a scan from the log start gets. Expected entries follow Kafka's
ProducerStateEntry/ProducerAppendInfo rules applied by hand to the batches (tests/storage/transactions/
test_kafka_producer_snapshots.py holds the table to a real broker's snapshot files)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from storage.errors import TooManyProducersError
from storage.log_manager import LogManager
from storage.transactions import producer_table
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker
from storage.transactions.producer_snapshot import ProducerStateEntry, entries_of, list_snapshots, read_snapshot
from storage.transactions.producer_table import last_sequences
from storage.transactions.transaction_index import AbortedTxn, TransactionIndex
from storage.transactions.transaction_state import TransactionState

from .test_transaction_state import BATCHES, TP, data

E = ProducerStateEntry
# Kafka's entries for BATCHES (p1 0-2, p2 3-4, ABORT p1 @5, p2 @6, COMMIT p2 @7, p3 8-9 open), as of offset 6:
# p1's marker (epoch unchanged) keeps its batch and sets the timestamp (the marker record's) and coordinator epoch
AT_6 = [E(1, 0, 2, 2, 2, 5000, 0, -1), E(2, 0, 1, 4, 1, 1001, -1, 3)]
# ... and as of the log end, 10
AT_10 = [E(1, 0, 2, 2, 2, 5000, 0, -1), E(2, 0, 0, 6, 0, 5000, 0, -1), E(3, 0, 1, 9, 1, 9001, -1, 8)]


def snapshot_path(lm, offset: int) -> str:
    return os.path.join(lm.root_dir, "t-0", f"{offset:020d}.snapshot")


def entries_at(lm, offset: int) -> list[ProducerStateEntry]:
    return entries_of(read_snapshot(lm.fs, snapshot_path(lm, offset)))


def offsets(lm) -> list[int]:
    return [s.offset for s in list_snapshots(lm.fs, os.path.join(lm.root_dir, "t-0"))]


def marker(pid: int, kind: ControlRecordType, *, epoch: int = 0, coordinator_epoch: int = 0) -> bytes:
    return EndTransactionMarker(kind, coordinator_epoch).to_batch(
        base_offset=0, timestamp=5000, producer_id=pid, producer_epoch=epoch
    )


def manager(root, config: dict) -> LogManager:
    lm = LogManager(root)
    lm.create_topic("t", 1, config)
    lm.root_dir = root  # type: ignore[attr-defined]
    return lm


@pytest.fixture
def lm(root):
    return manager(root, {})


def test_a_roll_and_a_clean_close_each_write_one(lm):
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:3]:
            log.append(b)
        assert offsets(lm) == []
        log.roll()
        assert offsets(lm) == [6]  # the new segment's base offset
        for b in BATCHES[3:]:
            log.append(b)
        assert offsets(lm) == [6]
    assert offsets(lm) == [6, 10]  # the log end, at close
    assert entries_at(lm, 6) == AT_6
    assert entries_at(lm, 10) == AT_10
    with lm.open_log(TP, writable=True):
        pass
    assert offsets(lm) == [6, 10]  # nothing new: no second file, and the old one untouched
    assert entries_at(lm, 10) == AT_10


def test_a_roll_inside_an_append_writes_one_at_each_new_segment(root):
    lm = manager(root, {"segment.bytes": "14"})  # one batch per segment
    with lm.open_log(TP, writable=True) as log:
        log.append(b"".join(BATCHES))
        assert [s.base_offset for s in log.segments] == [0, 3, 5, 6, 7, 8]
        assert offsets(lm) == [3, 5, 6, 7, 8]
    assert offsets(lm) == [3, 5, 6, 7, 8, 10]
    assert entries_at(lm, 6) == AT_6
    assert entries_at(lm, 10) == AT_10


def test_a_later_writer_continues_from_the_latest_snapshot(lm):
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:3]:
            log.append(b)
    assert offsets(lm) == [6]
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[3:]:
            log.append(b)
    assert entries_at(lm, 10) == AT_10
    with lm.open_log(TP, writable=True) as log:  # appends with no producer id: the partition still has producers
        log.append(data(-1, [b"plain"], transactional=False))
        log.roll()
    assert offsets(lm) == [10, 11]  # the close snapshot at 6 was superseded by the one at 10, in the same segment
    assert entries_at(lm, 11) == AT_10


def test_never_for_a_log_with_no_producer_batches(lm, monkeypatch):
    def no_scan(*a, **k):
        raise AssertionError("a log with no producer id was scanned for a snapshot")

    monkeypatch.setattr(producer_table.ProducerTable, "load", no_scan)
    with lm.open_log(TP, writable=True) as log:
        log.append(data(-1, [b"a", b"b"], transactional=False))
        log.roll()
        log.append(data(-1, [b"c"], transactional=False))
    assert offsets(lm) == []


def test_an_idempotent_producer_and_an_epoch_bump(lm):
    """An idempotent batch (no transaction) has an entry; a marker with a new epoch drops the retained batch; a
    sequence wraps past INT32_MAX as Kafka's lastSequence does."""
    with lm.open_log(TP, writable=True) as log:
        log.append(data(4, [b"i0", b"i1", b"i2"], transactional=False))
        log.append(data(1, [b"a0"]))
        log.append(marker(1, ControlRecordType.ABORT, epoch=1, coordinator_epoch=7))
        # p5 commits, then opens its next transaction: the marker's coordinator epoch stays, the batch is the new one
        log.append(data(5, [b"f0"], ts0=6000))
        log.append(marker(5, ControlRecordType.COMMIT, coordinator_epoch=3))
        log.append(data(5, [b"g0", b"g1"], ts0=7000))
    assert entries_at(lm, 9) == [
        E(1, 1, -1, -1, 0, 5000, 7, -1),
        E(4, 0, 2, 2, 2, 1002, -1, -1),
        E(5, 0, 1, 8, 1, 7001, 3, 7),
    ]
    assert last_sequences(np.array([2**31 - 2, -1, 5]), np.array([3, 4, 0])).tolist() == [1, -1, 5]


def test_retention_and_delete_records_delete_those_below_the_log_start(root):
    lm = manager(root, {"retention.bytes": "1", "retention.ms": "-1"})  # retention keeps only the last segment
    with lm.open_log(TP, writable=True) as log:
        for k, b in enumerate(BATCHES):
            log.append(b)
            if k < len(BATCHES) - 1:
                log.roll()
    bases = offsets(lm)
    assert bases == [3, 5, 6, 7, 8, 10]
    lm.delete_records(TP, 6)
    assert offsets(lm) == [6, 7, 8, 10]  # delete-records: the log start moved to 6
    results = lm.retention_pass(["t"])
    assert results[0].log_start_offset == 8
    assert offsets(lm) == [8, 10]


def test_truncation_deletes_those_above_the_log_end(lm):
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:3]:
            log.append(b)
        log.roll()
        for b in BATCHES[3:]:
            log.append(b)
        log.roll()
        assert offsets(lm) == [6, 10]
        log.truncate_to(8)
        assert offsets(lm) == [6]
    assert offsets(lm) == [6, 8]  # the close writes the table as of the new log end
    assert entries_at(lm, 8) == [E(1, 0, 2, 2, 2, 5000, 0, -1), E(2, 0, 0, 6, 0, 5000, 0, -1)]


def test_a_reader_from_the_snapshot_agrees_with_a_scan_from_the_log_start(lm):
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:2]:
            log.append(b)
        log.roll()  # p1 and p2 both open at 5
        for b in BATCHES[2:]:
            log.append(b)
        log.roll()  # an empty active segment at 10
    assert offsets(lm) == [5, 10]
    # the `.txnindex` Kafka writes with each ABORT: a writer with no snapshot to start from rebuilds it from the log
    saved = {o: open(snapshot_path(lm, o), "rb").read() for o in (5, 10)}
    for o in saved:
        os.remove(snapshot_path(lm, o))
    with lm.open_log(TP, writable=True) as log:
        assert log.last_stable_offset == 8
    for o, raw in saved.items():
        open(snapshot_path(lm, o), "wb").write(raw)
    with lm.open_log(TP) as log:
        for snap_offset in (5, 10):
            state = TransactionState.load(log, snap_offset)
            scanned = TransactionState.load(log, snap_offset, from_log_start=True)
            assert (state.scan_start, scanned.scan_start) == (snap_offset, 0)
            assert state.ongoing == scanned.ongoing
            assert not state.rebuilt and not scanned.rebuilt
        assert log.last_stable_offset == 8
        aborted = log.collect_aborted_txns(0, 10).tolist()
    assert aborted == [(0, 1, 0, 5, 3)]
    for o in saved:
        os.remove(snapshot_path(lm, o))
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8
        assert log.collect_aborted_txns(0, 10).tolist() == aborted


def test_more_producers_than_tracked_is_an_error_naming_the_partition(lm, monkeypatch, caplog):
    """The cap is logged as an error naming the partition; the roll, the data and the close go on, with no
    snapshot (a loader then scans the log, as with none)."""
    monkeypatch.setattr(producer_table, "MAX_PRODUCERS", 2)
    with lm.open_log(TP, writable=True) as log:
        for pid in (1, 2, 3):
            log.append(data(pid, [b"x"], transactional=False))
        log.roll()
        assert "partition t-0 has more than 2 producer ids" in caplog.text
    assert offsets(lm) == []
    with lm.open_log(TP) as log:
        assert log.log_end_offset == 3
    with pytest.raises(TooManyProducersError, match="partition t-0 has more than 2 producer ids at offset 0"):
        with lm.open_log(TP) as log:
            producer_table.ProducerTable.load(log, 3)


def test_an_abort_is_indexed_before_a_snapshot_above_it(lm):
    """A loader trusts the `.txnindex` below a snapshot (Kafka writes the entry with the ABORT marker): a marker
    appended without its entry gets it before the snapshot goes in, once."""
    path = os.path.join(lm.root_dir, "t-0", "00000000000000000000.txnindex")
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES:
            log.append(b)
        assert not os.path.exists(path)
    assert offsets(lm) == [10]
    assert TransactionIndex(lm.fs, path, 0).all_aborted_txns() == [AbortedTxn(1, 0, 5, 3)]
    with lm.open_log(TP, writable=True) as log:
        log.append(data(2, [b"e0"]))
        log.append(marker(2, ControlRecordType.ABORT))
        assert log.last_stable_offset == 8
    assert TransactionIndex(lm.fs, path, 0).all_aborted_txns() == [AbortedTxn(1, 0, 5, 3), AbortedTxn(2, 10, 11, 8)]
    with lm.open_log(TP) as log:
        assert [
            v for b in log.read_records(0, isolation_level="read_committed") for v in b.column("value").to_pylist()
        ] == [b"b0", b"b1", b"c0"]


def test_adopted_segments_of_a_transactional_commit_each_get_one(root):
    """The sink's big commits adopt staged segments: each is a roll, so each base offset gets a snapshot, the ones
    inside the transaction with it open from the commit's first offset; the marker's writer closes with it done."""
    import pyarrow as pa

    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged

    lm = manager(root, {"segment.bytes": "4000"})
    rows = pa.table({"value": pa.array([b"v" * 200] * 60, pa.binary()), "partition": pa.array([0] * 60, pa.int32())})
    for batch in (0, 1):
        st = RecordStager(lm, 42, topic="t", compression=CompressionType.NONE)
        st.add(rows)
        commit_staged(LogManager(root), 42, batch, [st.finish()], transactional=True)
    with lm.open_log(TP) as log:
        segments = [s.base_offset for s in log.segments]
        end = log.log_end_offset
        assert log.last_stable_offset == end
    assert len(segments) >= 4
    snaps = offsets(lm)
    assert set(segments[1:]) <= set(snaps) and snaps[-1] == end
    second = [b for b in segments if b > 61][0]  # inside batch 1's transaction (batch 0: offsets 0-59, COMMIT 60)
    (entry,) = entries_at(lm, second)
    assert (entry.producer_id, entry.current_txn_first_offset) == (42, 61)
    (entry,) = entries_at(lm, end)
    assert (entry.producer_id, entry.current_txn_first_offset, entry.coordinator_epoch) == (42, -1, 0)
    # an adopted segment is fed by its batch headers alone: every snapshot equals a scan of the records
    with lm.open_log(TP) as log:
        for offset in snaps:
            scan = producer_table.ProducerTable("t-0", 0)
            scan.advance(log, offset)
            assert entries_of(scan.to_array()) == entries_at(lm, offset), offset


def test_feed_headers_takes_only_the_next_data_batches(lm):
    """What an adopted segment's headers may advance: data batches starting at as_of; else nothing is fed."""
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES:
            log.append(b)
        headers = np.concatenate([c.scan.headers for c in log.read(0, log.log_end_offset)])
        first_control = int(np.flatnonzero((headers["attributes"] & 0x20) != 0)[0])
        stop = int(headers["base_offset"][first_control])
        by_records = producer_table.ProducerTable("t-0", 0)
        by_records.advance(log, stop)
    table = producer_table.ProducerTable("t-0", 0)
    assert not table.feed_headers(headers[1:], "x")  # not at as_of
    assert not table.feed_headers(headers, "x")  # a marker's records are needed
    assert table.as_of == 0 and not table.entries
    assert table.feed_headers(headers[:first_control], "x")
    assert table.as_of == stop and table.entries == by_records.entries and table.entries


def test_a_corrupt_latest_snapshot_is_passed_over_for_an_older_one(lm, caplog):
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:3]:
            log.append(b)
        log.roll()
        for b in BATCHES[3:5]:
            log.append(b)
    assert offsets(lm) == [6, 8]
    raw = bytearray(open(snapshot_path(lm, 8), "rb").read())
    raw[-1] ^= 0xFF
    open(snapshot_path(lm, 8), "wb").write(bytes(raw))
    with lm.open_log(TP, writable=True) as log:
        log.append(BATCHES[5])
    assert "CRC-32C mismatch" in caplog.text and "00000000000000000008.snapshot" in caplog.text
    assert entries_at(lm, 10) == AT_10  # from the snapshot at 6, over the batches after it


def test_writers_closing_in_one_segment_leave_its_base_snapshot_and_the_latest(lm):
    """A writer per commit closes once per commit: each close snapshot inside the active segment replaces the
    previous one there, so the directory does not fill with snapshots between rolls."""
    for k, b in enumerate(BATCHES):
        with lm.open_log(TP, writable=True) as log:
            log.append(b)
            if k == 2:
                log.roll()
    # segment 0: its last close's (3 went when 5 came); segment 6: its base's (the roll) and the latest
    assert offsets(lm) == [5, 6, 10]
    assert entries_at(lm, 6) == AT_6
    assert entries_at(lm, 10) == AT_10


def test_a_close_snapshots_only_the_first_time_or_after_enough_offsets(lm, monkeypatch):
    """A sink closes its writer at every commit: a close writes a snapshot when the partition has none, then
    only once CLOSE_SNAPSHOT_MIN_OFFSETS offsets came after the latest (rolls always do)."""
    import storage.log

    monkeypatch.setattr(storage.log, "CLOSE_SNAPSHOT_MIN_OFFSETS", 5)
    with lm.open_log(TP, writable=True) as log:
        for b in BATCHES[:3]:  # offsets 0-5
            log.append(b)
    assert offsets(lm) == [6]  # the first
    with lm.open_log(TP, writable=True) as log:
        log.append(BATCHES[3])  # the log end 7: 1 offset after the snapshot
    assert offsets(lm) == [6]
    with lm.open_log(TP, writable=True) as log:
        log.append(BATCHES[4])  # the log end 8: 2 after it
    assert offsets(lm) == [6]
    monkeypatch.setattr(storage.log, "CLOSE_SNAPSHOT_MIN_OFFSETS", 4)
    with lm.open_log(TP, writable=True) as log:
        log.append(BATCHES[5])  # the log end 10: 4 after it
    assert offsets(lm)[-1] == 10
    assert entries_at(lm, 10) == AT_10
