"""The reader's transaction state on hand-built logs (batches built from the documented layout): isolation level
parsing, the bounded number of open transactions, a malformed marker, producer snapshots used and distrusted,
the keep-mask of iter_decoded, and that a read_uncommitted reader never builds the state.

The real broker's logs are held to Kafka's consumer in test_broker_read_committed.py; these cover what a broker
does not write.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from storage.errors import CorruptRecordError, InvalidConfigError, TooManyProducersError
from storage.log_manager import LogManager
from storage.records.builder import build_batch
from storage.records.decoder import decode_batches, iter_decoded
from storage.records.record_batch import CompressionType, scan_batches
from storage.topic_partition import TopicPartition
from storage.transactions import transaction_state
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED, parse_isolation_level
from storage.transactions.producer_snapshot import write_snapshot
from storage.transactions.transaction_index import AbortedTxn, entries_to_txns

TP = TopicPartition("t", 0)


def data(
    pid: int, values: list[bytes], *, transactional: bool = True, control: bool = False, key=None, ts0: int = 1000
) -> bytes:
    t = pa.table(
        {
            "key": pa.array([key] * len(values), pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array([ts0 + i for i in range(len(values))], pa.int64()),
        }
    )
    return build_batch(
        t,
        compression=CompressionType.NONE,
        base_offset=0,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=transactional,
        control=control,
        now_ms=1000,
    )


def marker(pid: int, kind: ControlRecordType) -> bytes:
    return EndTransactionMarker(kind, 0).to_batch(base_offset=0, timestamp=5000, producer_id=pid, producer_epoch=0)


def write(root, *batches: bytes) -> LogManager:
    lm = LogManager(root)
    lm.create_topic("t", 1, {})
    with lm.open_log(TP, writable=True) as log:
        for b in batches:
            log.append(b)
    return lm


def values(log, level: str, start: int = 0) -> list[bytes]:
    return [v for b in log.read_records(start, isolation_level=level) for v in b.column("value").to_pylist()]


# offsets: p1 a0-a2 (0-2), p2 b0-b1 (3-4), ABORT p1 (5), p2 c0 (6), COMMIT p2 (7), p3 d0-d1 (8-9, left open)
BATCHES = (
    data(1, [b"a0", b"a1", b"a2"]),
    data(2, [b"b0", b"b1"]),
    marker(1, ControlRecordType.ABORT),
    data(2, [b"c0"]),
    marker(2, ControlRecordType.COMMIT),
    data(3, [b"d0", b"d1"], ts0=9000),
)


def test_isolation_levels_are_kafkas_lowercase_names():
    assert parse_isolation_level("read_committed", "kafka.isolation.level") == READ_COMMITTED
    assert parse_isolation_level("read_uncommitted", "kafka.isolation.level") == READ_UNCOMMITTED
    for bad in ("READ_COMMITTED", "committed", "", None, 1):  # Kafka's ConfigDef.in is case-sensitive
        with pytest.raises(InvalidConfigError, match=r"kafka\.isolation\.level.*read_uncommitted, read_committed"):
            parse_isolation_level(bad, "kafka.isolation.level")


def test_read_committed_on_a_hand_built_log(root):
    lm = write(root, *BATCHES)
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8  # p3's transaction is open from 8
        assert values(log, READ_UNCOMMITTED) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"d0", b"d1"]
        assert values(log, READ_COMMITTED) == [b"b0", b"b1", b"c0"]
        assert values(log, READ_COMMITTED, start=2) == [b"b0", b"b1", b"c0"]
        # Kafka's lastStableOffset(completedTxn): p2's transaction (from 3) was open when p1's ABORT went in
        assert entries_to_txns(log.collect_aborted_txns(0, 10)) == [AbortedTxn(1, 0, 5, 3)]
        assert log.offset_for_timestamp(1001, isolation_level=READ_COMMITTED) == 1
        assert log.offset_for_timestamp(5001, isolation_level=READ_UNCOMMITTED) == 8
        assert log.offset_for_timestamp(5001, isolation_level=READ_COMMITTED) is None  # at or past the LSO
        with pytest.raises(InvalidConfigError):
            list(log.read_records(0, isolation_level="READ_COMMITTED"))


def test_a_read_uncommitted_reader_never_builds_the_transaction_state(root, monkeypatch):
    lm = write(root, *BATCHES)

    def refuse(*args, **kwargs):
        raise AssertionError("read_uncommitted must not load the transaction state")

    monkeypatch.setattr(transaction_state.TransactionState, "load", refuse)
    with lm.open_log(TP) as log:
        assert len(values(log, READ_UNCOMMITTED)) == 8
        assert log.offset_for_timestamp(1001) == 1
        with pytest.raises(AssertionError, match="must not load"):
            _ = log.last_stable_offset


def test_open_transactions_beyond_the_cap_are_refused_naming_the_partition(root, monkeypatch):
    lm = write(root, *(data(pid, [b"x"]) for pid in range(1, 6)))  # five producers, each with a transaction open
    monkeypatch.setattr(transaction_state, "MAX_OPEN_TRANSACTIONS", 5)
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 0
    monkeypatch.setattr(transaction_state, "MAX_OPEN_TRANSACTIONS", 4)
    with lm.open_log(TP) as log, pytest.raises(TooManyProducersError, match=r"partition t-0 has more than 4"):
        _ = log.last_stable_offset


def test_a_malformed_marker_key_is_a_corrupt_record_naming_file_and_position(root):
    bad = data(1, [b"\x00\x00"], control=True, key=b"\x00\x00")  # a 2-byte control key: needs 4
    lm = write(root, data(1, [b"a0"]), bad)
    position = len(data(1, [b"a0"]))
    with lm.open_log(TP) as log:
        with pytest.raises(CorruptRecordError) as e:
            _ = log.last_stable_offset
        assert e.value.position == position and e.value.source.endswith("00000000000000000000.log")
        assert "at least 4 bytes" in str(e.value)


def _snapshot_entry(pid: int, first: int) -> tuple:
    # producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch, currentTxnFirstOffset
    return (pid, 0, 0, first, 0, 1000, 0, first)


def test_the_latest_snapshot_is_used_and_a_corrupt_one_skipped(root, caplog):
    lm = write(root, *BATCHES)
    d = os.path.join(root, "t-0")
    # a snapshot at the log end that says producer 2 still holds its transaction open from offset 3 (its first
    # transactional batch) though the log holds p2's COMMIT at 7 below it: the reader checks the claim against
    # the log, distrusts the snapshot and scans from the log start (LSO 8: p3 opens at 8)
    path = write_snapshot(lm.fs, d, 10, [_snapshot_entry(2, 3)])
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8
    assert "has a marker at 7" in caplog.text
    caplog.clear()
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 0xFF  # the CRC no longer matches
    open(path, "wb").write(bytes(raw))
    write_snapshot(lm.fs, d, 4, [_snapshot_entry(2, 3)])  # an older good one: p2 open from 3 as of offset 4
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8  # from offset 4: p2 commits at 7, p3 opens at 8
    assert "CRC-32C mismatch" in caplog.text and "00000000000000000010.snapshot" in caplog.text
    write_snapshot(lm.fs, d, 11, [_snapshot_entry(7, 1)])  # past the log end: not used
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8


def test_iter_decoded_keep_mask_drops_batches_and_must_match_the_scan():
    buf = b"".join([data(1, [b"a"]), data(2, [b"b"]), data(3, [b"c"])])
    scan = scan_batches(buf)
    kept = decode_batches(buf, scan=scan, keep=np.array([True, False, True]))
    assert kept.column("value").to_pylist() == [b"a", b"c"]
    with pytest.raises(ValueError, match="keep has 2 entries for 3 batches"):
        list(iter_decoded(buf, scan=scan, keep=np.array([True, False])))


def test_a_writer_rewrites_a_missing_or_bad_txnindex_from_the_log(root):
    from storage.transactions.transaction_index import TransactionIndex

    lm = write(root, *BATCHES)
    path = os.path.join(root, "t-0", "00000000000000000000.txnindex")
    # the writer's close indexed p1's abort before its producer snapshot; take both away
    os.remove(path)
    for name in os.listdir(os.path.join(root, "t-0")):
        if name.endswith(".snapshot"):
            os.remove(os.path.join(root, "t-0", name))
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 8
    assert not os.path.exists(path)  # a reader only uses what it found
    for damage in (None, b"\x00\x01" + b"\x00" * 32):  # missing, then an entry of version 1
        if damage is not None:
            open(path, "wb").write(damage)
        with lm.open_log(TP, writable=True) as log:
            assert log.last_stable_offset == 8
        assert TransactionIndex(lm.fs, path, 0).all_aborted_txns() == [AbortedTxn(1, 0, 5, 3)]


def test_a_txnindex_the_writer_appends_at_a_snapshot_is_reread_by_its_own_log(root):
    """A marker appended by other means than the sink's coordinator gets its `.txnindex` entry when the writer
    snapshots (Log._index_aborted); the Log's cached copy of that index is dropped, so it reads the entry."""
    lm = write(root, data(1, [b"a0", b"a1", b"a2"]))
    with lm.open_log(TP, writable=True) as log:
        seg = log.active_segment
        assert not len(log.txn_index(seg).entries())  # no file yet: read (and cached) as empty
        log.append(marker(1, ControlRecordType.ABORT))
        log.roll()  # the snapshot at the new segment's base indexes the abort first
        assert entries_to_txns(log.txn_index(seg).entries()) == [AbortedTxn(1, 0, 3, 4)]


def _empty_control_batch(pid: int) -> bytes:
    """A marker batch emptied as Kafka's cleaner leaves the last batch of a producer whose transaction is gone
    (BatchRetention.RETAIN_EMPTY): the 61-byte header, recordCount 0, batchLength 49, the CRC recomputed."""
    import crc32c

    head = bytearray(marker(pid, ControlRecordType.COMMIT)[:61])
    head[8:12] = (49).to_bytes(4, "big")
    head[57:61] = (0).to_bytes(4, "big")
    head[17:21] = crc32c.crc32c(bytes(head[21:])).to_bytes(4, "big")
    return bytes(head)


def test_an_empty_control_batch_completes_nothing(root):
    # Kafka's ProducerAppendInfo skips an empty control batch: the transaction it ended was cleaned away
    lm = write(root, _empty_control_batch(4), *BATCHES)
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 9  # p3's transaction, open from 9 (the empty batch took offset 0)
        assert values(log, READ_COMMITTED) == [b"b0", b"b1", b"c0"]
        assert entries_to_txns(log.collect_aborted_txns(0, 11)) == [AbortedTxn(1, 1, 6, 4)]
