"""A real Kafka 4.4 broker loads a log kafkalog's transactional sink wrote and reads it as the model says.

The sink writes three micro-batches into two partitions: batch 0 commits; batch 1's committer dies after the
data of its first partition and the restarted query replays it (the first attempt is aborted in that
partition, the replay commits in both); batch 2 loses its decision to an opener that aborted it (ABORT markers
in both, never replayed). The partitions' files (`.log`, indexes, `.txnindex`) replace those of an empty
topic of a cleanly stopped broker, whose checkpoints are set to the log end. Kafka's consumer then returns, at
read_committed, batches 0 and 1 once each, and at read_uncommitted every data record, aborted ones included;
Kafka's DumpLogSegments prints the markers and the aborted transactions as kafkalog wrote them.
"""

from __future__ import annotations

import base64
import os
import shutil
import time

import pyarrow as pa
import pytest

from storage.errors import TransactionAbortedError
from storage.log_manager import LogManager
from storage.metadata.checkpoint import RECOVERY_POINT_CHECKPOINT_FILE, format_checkpoint, parse_checkpoint
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.transaction_coordinator import ABORT, decide

TOPIC = "txn-sink"
PARTITIONS = 2
W = 4242
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"


def _rows(batch: int) -> pa.Table:
    n = 20
    return pa.table(
        {
            "value": pa.array([f"b{batch}-{i}".encode() for i in range(n)], pa.binary()),
            "partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
        }
    )


def _stage(lm, batch):
    st = RecordStager(lm, W, topic=TOPIC, compression=CompressionType.NONE)
    st.add(_rows(batch))
    return st.finish()


class _Crash(BaseException):
    pass


def _write(root: str) -> None:
    lm = LogManager(root)
    lm.create_topic(TOPIC, PARTITIONS)
    commit_staged(lm, W, 0, [_stage(lm, 0)], transactional=True)
    real_data = sc._transaction_data

    def die_after_first(*a, **kw):
        real_data(*a, **kw)
        raise _Crash()

    sc._transaction_data = die_after_first
    try:
        with pytest.raises(_Crash):
            commit_staged(LogManager(root), W, 1, [_stage(lm, 1)], transactional=True)
    finally:
        sc._transaction_data = real_data
    commit_staged(LogManager(root), W, 1, [_stage(lm, 1)], transactional=True)  # the restarted query's replay
    real_decide = sc.decide

    def aborted_first(fs, path, outcome, detail):
        decide(fs, path, ABORT, {"reason": "test"})
        return real_decide(fs, path, outcome, detail)

    sc.decide = aborted_first
    try:
        with pytest.raises(TransactionAbortedError):
            commit_staged(LogManager(root), W, 2, [_stage(lm, 2)], transactional=True)
    finally:
        sc.decide = real_decide


def _values(records) -> list[bytes]:
    return sorted(base64.b64decode(r["value"]) for r in records)


def _expected(batches) -> list[bytes]:
    return sorted(v for b in batches for v in _rows(b).column("value").to_pylist())


@pytest.mark.kafka
def test_the_broker_loads_the_sinks_transactions_and_reads_committed_as_the_model(kafka_broker_session, tmp_path):
    root = str(tmp_path / "logs")
    _write(root)
    ends = {}
    for p in range(PARTITIONS):
        with LogManager(root).open_log(TopicPartition(TOPIC, p)) as log:
            ends[p] = log.log_end_offset
            assert len(log.segments) == 1
    b = kafka_broker_session.ensure_running()
    b.tool({"op": "createTopic", "topic": TOPIC, "partitions": PARTITIONS, "configs": {"retention.ms": "-1"}})
    log_dir = b.log_dir
    deadline = time.monotonic() + 120
    while not all((log_dir / f"{TOPIC}-{p}" / "partition.metadata").exists() for p in range(PARTITIONS)):
        assert time.monotonic() < deadline, "the broker made no partition directories\n" + b.log_tail()
        time.sleep(0.1)
    b.stop()
    for p in range(PARTITIONS):
        src, dst = os.path.join(root, f"{TOPIC}-{p}"), log_dir / f"{TOPIC}-{p}"
        for name in os.listdir(dst):
            if name.startswith("0" * 20):
                os.unlink(dst / name)
        for name in os.listdir(src):
            if name.endswith((".log", ".index", ".timeindex", ".txnindex")):
                shutil.copy(os.path.join(src, name), dst / name)
    for name in (RECOVERY_POINT_CHECKPOINT_FILE, HIGH_WATERMARK_FILE):
        entries = parse_checkpoint((log_dir / name).read_bytes())
        entries.update({TopicPartition(TOPIC, p): ends[p] for p in range(PARTITIONS)})
        (log_dir / name).write_bytes(format_checkpoint(entries))
    files = sorted(str(log_dir / f"{TOPIC}-{p}" / n) for p in range(PARTITIONS) for n in ["0" * 20 + ".txnindex"])
    stdout = b.dump_log(files + [f.replace(".txnindex", ".log") for f in files], "--print-data-log")  # its version's
    # per partition: the first attempt of batch 1 (partition 0 only) and batch 2 aborted; 2 COMMITs, 2 or 1 ABORTs
    assert stdout.count("endTxnMarker: ABORT coordinatorEpoch: 0") == 3, stdout[-3000:]
    assert stdout.count("endTxnMarker: COMMIT coordinatorEpoch: 0") == 4
    assert stdout.count(f"version: 0 producerId: {W} firstOffset: ") == 3  # the .txnindex entries
    assert "isTransactional: true" in stdout
    b.start()
    for p in range(PARTITIONS):
        b.wait_for_log(f"Completed load of Log(dir={log_dir / f'{TOPIC}-{p}'}")
    committed, everything = b.tool(
        {"op": "consume", "topic": TOPIC, "isolation": "read_committed"},
        {"op": "consume", "topic": TOPIC, "isolation": "read_uncommitted"},
    )
    assert _values(committed) == _expected([0, 1])
    first_attempt = [v for v in _rows(1).column("value").to_pylist() if int(v.split(b"-")[1]) % PARTITIONS == 0]
    assert _values(everything) == sorted(_expected([0, 1, 2]) + first_attempt)
    log = b.log_since_start()
    assert "Corruption" not in log and "Found invalid messages" not in log
