"""A producer snapshot's open transactions are checked against the log before a read_committed reader uses them:
each currentTxnFirstOffset must be the base offset of a transactional data batch of that producer below the
snapshot's offset. A snapshot whose CRC is right but whose open transaction is not the log's (found by the fuzz's
snapshot family, tests/fuzz/mutate_txn.py) is a hint gone bad: the reader scans the log from its start instead."""

from __future__ import annotations

import os

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions.control_records import ControlRecordType
from storage.transactions.producer_snapshot import read_snapshot, snapshot_file_name, write_snapshot
from tests.storage.transactions.test_transaction_state import data, marker

TP = TopicPartition("t", 0)


def committed_values(lm) -> tuple[int, list[bytes]]:
    with lm.open_log(TP) as log:
        values = [
            v for b in log.read_records(0, isolation_level="read_committed") for v in b.column("value").to_pylist()
        ]
        return log.last_stable_offset, values


def test_an_open_transaction_the_log_does_not_hold_is_not_trusted(tmp_path):
    root = str(tmp_path)
    lm = LogManager(root)
    lm.create_topic("t", 1, {})
    with lm.open_log(TP, writable=True) as log:
        log.append(data(1, [b"c0", b"c1"]))  # offsets 0-1, committed at 2
        log.append(marker(1, ControlRecordType.COMMIT))
        log.append(data(-1, [b"plain"], transactional=False))  # offset 3
    d = os.path.join(root, "t-0")
    # a snapshot at the log end whose CRC is right but which says producer 1 has a transaction open from offset 3,
    # where the log holds a non-transactional batch (trusted, it would put the LSO at 3 and hide `plain`)
    entry = (1, 0, 1, 1, 1, 1000, 0, 3)  # producerId, epoch, lastSeq, lastOffset, offsetDelta, ts, coordEpoch, first
    for name in os.listdir(d):
        if name.endswith(".snapshot"):
            os.remove(os.path.join(d, name))
    fs = _fs(lm)
    write_snapshot(fs, d, 4, [entry])
    assert int(read_snapshot(fs, os.path.join(d, snapshot_file_name(4)))["current_txn_first_offset"][0]) == 3
    assert committed_values(lm) == (4, [b"c0", b"c1", b"plain"])


def _fs(lm):
    with lm.open_log(TP) as log:
        return log.fs
