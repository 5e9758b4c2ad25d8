"""A real Kafka 4.4 broker loads a log whose producer snapshots kafkalog wrote, and its read_committed view is ours.

kafkalog writes the same batches into two partitions, with small segments (a snapshot at each roll) and a clean
close (a snapshot at the log end): committed, aborted and idempotent batches, and a transaction left open before the
last roll, so the last stable offset comes only from the snapshots' currentTxnFirstOffset. Partition 0 keeps every
snapshot (the broker starts from the one at the log end and replays nothing); partition 1 loses the close snapshot
(the broker starts from the last roll's and replays the batches after it). The files replace those of an empty topic
of a cleanly stopped broker, checkpoints set to the log end. The broker must read our snapshots without complaint,
and its ListOffsets (latest, both isolation levels) and read_committed consumer must agree with kafkalog's.
"""

from __future__ import annotations

import base64
import os
import shutil
import time

import pytest

from storage.log_manager import LogManager
from storage.metadata.checkpoint import RECOVERY_POINT_CHECKPOINT_FILE, format_checkpoint, parse_checkpoint
from storage.topic_partition import TopicPartition
from storage.transactions.control_records import ControlRecordType
from storage.transactions.producer_snapshot import list_snapshots

from .test_transaction_state import data, marker

pytestmark = pytest.mark.kafka

TOPIC = "snap-load"
PARTITIONS = 2
HIGH_WATERMARK_FILE = "replication-offset-checkpoint"
COMMIT, ABORT = ControlRecordType.COMMIT, ControlRecordType.ABORT

BATCHES = [
    data(1, [b"p1-a", b"p1-b"]),
    data(2, [b"p2-a"]),
    data(1, [b"p1-c"]),
    marker(1, COMMIT),
    marker(2, ABORT),
    data(3, [b"idem-a", b"idem-b"], transactional=False),
    data(4, [b"p4-open"]),  # never completed: the LSO
    data(1, [b"p1-late"]),
    marker(1, COMMIT),
    data(3, [b"idem-c"], transactional=False),
]


def _write(root: str) -> dict[int, dict]:
    lm = LogManager(root)
    lm.create_topic(TOPIC, PARTITIONS, {"segment.bytes": "300"})
    out = {}
    for p in range(PARTITIONS):
        tp = TopicPartition(TOPIC, p)
        with lm.open_log(tp, writable=True) as log:
            for b in BATCHES:
                log.append(b)
        with lm.open_log(tp) as log:
            committed = [
                v for r in log.read_records(0, isolation_level="read_committed") for v in r.column("value").to_pylist()
            ]
            out[p] = {"end": log.log_end_offset, "lso": log.last_stable_offset, "committed": committed}
            out[p]["snapshots"] = [s.offset for s in list_snapshots(lm.fs, log.dir)]
            out[p]["segments"] = [s.base_offset for s in log.segments]
    return out


def test_the_broker_loads_our_snapshots_and_reads_committed_as_we_do(kafka_broker_session, tmp_path):
    root = str(tmp_path / "logs")
    ours = _write(root)
    for p in range(PARTITIONS):
        assert ours[p]["lso"] == 8 and ours[p]["end"] == 12  # p4 opened at 8
        assert ours[p]["committed"] == [b"p1-a", b"p1-b", b"p1-c", b"idem-a", b"idem-b"]
        assert ours[p]["snapshots"][-1] == 12 and len(ours[p]["snapshots"]) >= 3
        last_roll = ours[p]["snapshots"][-2]
        assert 8 < last_roll < 12, ours[p]  # the open transaction spans the last roll
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
            if name[:20].isdigit():
                os.unlink(dst / name)
        for name in os.listdir(src):
            if name.endswith((".log", ".index", ".timeindex", ".txnindex", ".snapshot")):
                shutil.copy(os.path.join(src, name), dst / name)
    os.unlink(log_dir / f"{TOPIC}-1" / f"{12:020d}.snapshot")  # partition 1: the broker starts from a roll's
    for name in (RECOVERY_POINT_CHECKPOINT_FILE, HIGH_WATERMARK_FILE):
        entries = parse_checkpoint((log_dir / name).read_bytes())
        entries.update({TopicPartition(TOPIC, p): ours[p]["end"] for p in range(PARTITIONS)})
        (log_dir / name).write_bytes(format_checkpoint(entries))
    b.start()
    for p in range(PARTITIONS):
        b.wait_for_log(f"Completed load of Log(dir={log_dir / f'{TOPIC}-{p}'}")
    parts = list(range(PARTITIONS))
    committed, latest_rc, latest_ru = b.tool(
        {"op": "consume", "topic": TOPIC, "isolation": "read_committed"},
        {"op": "listOffsets", "topic": TOPIC, "partitions": parts, "spec": "latest", "isolation": "read_committed"},
        {"op": "listOffsets", "topic": TOPIC, "partitions": parts, "spec": "latest", "isolation": "read_uncommitted"},
    )
    assert {int(p): v["offset"] for p, v in latest_rc.items()} == {p: ours[p]["lso"] for p in parts}
    assert {int(p): v["offset"] for p, v in latest_ru.items()} == {p: ours[p]["end"] for p in parts}
    for p in parts:
        got = [base64.b64decode(r["value"]) for r in committed if r["partition"] == p]
        assert got == ours[p]["committed"], p
    log = b.log_since_start()
    for p in parts:
        d = log_dir / f"{TOPIC}-{p}"
        want = 12 if p == 0 else ours[p]["snapshots"][-2]
        loading = [line for line in log.splitlines() if "Loading producer state from snapshot file" in line]
        assert any(str(d / f"{want:020d}.snapshot") in line for line in loading), (p, loading)
    assert "Failed to load producer snapshot" not in log
    assert "orrupt" not in log and "Found invalid messages" not in log
