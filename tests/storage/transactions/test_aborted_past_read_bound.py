"""An aborted transaction whose ABORT marker (and so its `.txnindex` entry) lands in a segment past a read's upper
bound still hides its data below the bound: Kafka's UnifiedLog.collectAbortedTransactions searches the segments after
the start until an entry's lastStableOffset reaches the bound, not only the segments below it. Found by the fuzz
corpus's `txn` partition (tests/fuzz/corpus.py), where the read_committed bound is a last stable offset held by a
transaction left open."""

from __future__ import annotations

import os

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions.control_records import ControlRecordType
from tests.storage.transactions.test_transaction_state import data, marker

TP = TopicPartition("t", 0)


def test_abort_marker_past_the_last_stable_offset_hides_its_data(tmp_path):
    root = str(tmp_path)
    lm = LogManager(root)
    lm.create_topic("t", 1, {"segment.bytes": "100"})  # one batch per segment
    with lm.open_log(TP, writable=True) as log:
        log.append(data(1, [b"aborted-0", b"aborted-1"]))  # offsets 0-1
        log.append(data(2, [b"open"]))  # offset 2: left open, the LSO
        log.append(data(-1, [b"plain"], transactional=False))  # offset 3
        log.append(marker(1, ControlRecordType.ABORT))  # offset 4: its .txnindex entry is in segment 4
    names = os.listdir(os.path.join(root, "t-0"))
    assert "00000000000000000004.txnindex" in names, sorted(names)
    with lm.open_log(TP) as log:
        assert log.last_stable_offset == 2
        served = [
            v for b in log.read_records(0, isolation_level="read_committed") for v in b.column("value").to_pylist()
        ]
        assert served == []
        assert len(log.collect_aborted_txns(0, 2)) == 1
