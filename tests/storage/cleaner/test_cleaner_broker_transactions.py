"""The cleaner against the real thing: a Kafka 4.4 broker compacts a topic a transactional producer wrote
(committed and aborted transactions, a non-transactional writer in between), and kafkalog's cleaner compacts a
copy of the same files taken before the broker's cleaner ran. Both must keep the same records and markers and
the same `.txnindex` entries.

The broker's cleaner is held off by min.compaction.lag.ms (the records carry the current time) until the copy is
taken, then let go by lowering it; the test waits for its cleaner-offset-checkpoint to reach the active segment
(a condition, never a sleep). One cleaning each: every transaction still has data then, so no marker is stamped
with a delete horizon on either side (the horizon's value is `now` + delete.retention.ms: the two clocks differ by
design, so a later round would compare only which markers carry one)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from storage.cleaner.log_cleaner_manager import LogCleanerManager
from storage.log_manager import LogManager
from storage.records import record_batch as rb
from storage.records.record_batch import scan_batches
from storage.topic_partition import TopicPartition
from tests.helpers import kafka_scenarios as S
from tests.helpers.kafka_reference import kp_parse

pytestmark = pytest.mark.kafka

TOPIC = "cl-txn"
TP = TopicPartition(TOPIC, 0)
FROZEN = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "3600000",  # nothing is cleanable until the copy is taken
    "delete.retention.ms": "86400000",
    "internal.segment.bytes": "700",  # a roll every few batches
    "index.interval.bytes": "1",
}
TXNS = (  # (outcome, keys and values); each flush ends one batch
    ("commit", [(b"k0", b"c1"), (b"k1", b"c1"), (b"k2", b"c1")]),
    ("abort", [(b"k0", b"a2"), (b"x1", b"a2")]),
    ("commit", [(b"k1", b"c3"), (b"k3", b"c3")]),
    ("abort", [(b"x2", b"a4")]),
    ("commit", [(b"k2", None)]),
    ("abort", [(b"k3", b"a6")]),
)


def _produce() -> list[dict]:
    steps: list[dict] = []
    for outcome, recs in TXNS:
        steps += [{"begin": 1}, *({"send": S._rec(v, key=k, partition=0)} for k, v in recs), {"flush": 1}]
        steps.append({outcome: 1})
    plain = [S._rec(b"plain", key=b"k0", partition=0), S._rec(b"plain", key=b"x1", partition=0)]
    filler = [S._rec(b"filler" * 20, key=b"f%d" % i, partition=0) for i in range(6)]
    return [
        {
            "op": "produce",
            "topic": TOPIC,
            "config": {"transactional.id": "cl-txn-producer", "compression.type": "none", **S.NO_AUTOSEND},
            "steps": steps,
        },
        {
            "op": "produce",
            "topic": TOPIC,
            "config": {"enable.idempotence": "false", "acks": "1", **S.NO_AUTOSEND},
            "steps": S._groups(plain, (2,)) + S._groups(filler, (2, 2, 2)),
        },
    ]


def _live_logs(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.name.endswith(".log"))


def _markers(d: Path) -> int:
    n = 0
    for p in _live_logs(d):
        data = p.read_bytes()
        scan = scan_batches(data)
        n += int(((scan.headers["attributes"].astype(np.int64) & rb.CONTROL_FLAG_MASK) != 0).sum())
    return n


def _state(d: Path) -> tuple[list, list, set]:
    """(records with offset, key, value; (base offset, control, delete horizon) per batch with records; the
    `.txnindex` entries) of a partition dir, as kafka-python and numpy read its files."""
    records, batches, txns = [], [], set()
    for p in _live_logs(d):
        data = p.read_bytes()
        for b in kp_parse(data):
            assert b["crc_ok"]
            records += [(o, k, v) for o, _, k, v, _ in b["records"]]
        scan = scan_batches(data)
        for i in range(len(scan)):
            h = scan.header(i)
            if h.record_count:
                batches.append((h.base_offset, h.is_control, h.delete_horizon_ms))
        idx = p.with_suffix(".txnindex")
        if idx.exists():
            rows = np.frombuffer(
                idx.read_bytes(), [("v", ">i2"), ("pid", ">i8"), ("f", ">i8"), ("l", ">i8"), ("s", ">i8")]
            )
            txns |= {tuple(int(x) for x in r) for r in rows}
    return records, batches, txns


def test_kafkalog_cleans_a_transactional_topic_as_the_broker_does(kafka_broker_session, tmp_path):
    broker = kafka_broker_session.ensure_running()
    broker.tool({"op": "createTopic", "topic": TOPIC, "partitions": 1, "configs": FROZEN})
    for res in broker.tool(*_produce()):
        assert not [r for r in res if "error" in r], res
    pdir = broker.log_dir / f"{TOPIC}-0"
    S.wait_until(broker, lambda: _markers(pdir) == len(TXNS), "the coordinator to write every marker")
    before = _state(pdir)
    assert len(before[2]) == 3  # the broker wrote one .txnindex entry per abort

    root = tmp_path / "logs"
    shutil.copytree(pdir, root / f"{TOPIC}-0")
    broker.tool({"op": "alterConfigs", "topic": TOPIC, "set": {"min.compaction.lag.ms": "0"}})

    def cleaned() -> bool:
        done = S.read_checkpoint(broker.log_dir / "cleaner-offset-checkpoint").get((TOPIC, 0), -1)
        return done >= S.live_bases(pdir)[-1]

    S.wait_until(broker, cleaned, f"the broker's cleaner to reach the active segment of {TOPIC}-0")
    kafka = _state(pdir)

    lm = LogManager(str(root))
    ours_config = {k: v for k, v in FROZEN.items() if k != "internal.segment.bytes"}  # (Kafka's test-only name)
    lm.alter_topic_config(TOPIC, {**ours_config, "segment.bytes": "700", "min.compaction.lag.ms": "0"})
    res = LogCleanerManager(lm).clean_partition(TP, int(time.time() * 1000), force=True)
    assert res.ok, res.error
    ours = _state(root / f"{TOPIC}-0")

    assert before[0] != kafka[0]  # the broker did clean
    assert ours[0] == kafka[0]  # the same records and markers, at the same offsets
    assert [(b, c) for b, c, _ in ours[1]] == [(b, c) for b, c, _ in kafka[1]]
    assert all(h is None for _, c, h in kafka[1] if c) and all(h is None for _, c, h in ours[1] if c)
    assert ours[2] == kafka[2]  # the cleaned .txnindex: the aborts whose markers stay for their data


def test_markers_whose_data_is_gone_get_a_delete_horizon_as_on_the_broker(kafka_broker_session, tmp_path):
    """Round 2: the broker cleans its round-1 output plus new data; kafkalog cleans a copy of the same files.
    Every marker whose transaction's data went in round 1 (the aborts, and the commit whose keys were all
    superseded) is stamped with a delete horizon by both, and the `.txnindex` entries go; the horizon values
    differ by design (each side's clock: now + delete.retention.ms)."""
    broker = kafka_broker_session.ensure_running()
    topic = TOPIC + "-2"
    tp = TopicPartition(topic, 0)
    pdir = broker.log_dir / f"{topic}-0"
    broker.tool({"op": "createTopic", "topic": topic, "partitions": 1, "configs": FROZEN})
    for res in broker.tool(*[{**cmd, "topic": topic} for cmd in _produce()]):
        assert not [r for r in res if "error" in r], res
    S.wait_until(broker, lambda: _markers(pdir) == len(TXNS), "the coordinator to write every marker")

    def cleaned() -> bool:
        done = S.read_checkpoint(broker.log_dir / "cleaner-offset-checkpoint").get((topic, 0), -1)
        return done >= S.live_bases(pdir)[-1]

    broker.tool({"op": "alterConfigs", "topic": topic, "set": {"min.compaction.lag.ms": "0"}})
    S.wait_until(broker, cleaned, f"the broker's cleaner to reach the active segment of {topic}-0 (round 1)")
    broker.tool({"op": "alterConfigs", "topic": topic, "set": {"min.compaction.lag.ms": "3600000"}})
    more = [S._rec(b"round 2", key=b"k3", partition=0)] + [
        S._rec(b"filler" * 20, key=b"g%d" % i, partition=0) for i in range(6)
    ]
    plain = {"enable.idempotence": "false", "acks": "1", **S.NO_AUTOSEND}
    broker.tool({"op": "produce", "topic": topic, "config": plain, "steps": S._groups(more, (1, 2, 2, 2))})
    root = tmp_path / "logs"
    shutil.copytree(pdir, root / f"{topic}-0")
    before = _state(pdir)
    broker.tool({"op": "alterConfigs", "topic": topic, "set": {"min.compaction.lag.ms": "0"}})
    S.wait_until(broker, cleaned, f"the broker's cleaner to reach the active segment of {topic}-0 (round 2)")
    kafka = _state(pdir)

    lm = LogManager(str(root))
    ours_config = {k: v for k, v in FROZEN.items() if k != "internal.segment.bytes"}
    lm.alter_topic_config(topic, {**ours_config, "segment.bytes": "700", "min.compaction.lag.ms": "0"})
    res = LogCleanerManager(lm).clean_partition(tp, int(time.time() * 1000), force=True)
    assert res.ok, res.error
    ours = _state(root / f"{topic}-0")

    assert before[0] != kafka[0]
    assert ours[0] == kafka[0]
    stamped = {
        side: {b for b, c, h in state[1] if c and h is not None} for side, state in (("kafka", kafka), ("ours", ours))
    }
    stamped = {side: [b for b, c, h in state[1] if c and h is not None] for side, state in (("k", kafka), ("o", ours))}
    # Kafka 4 stamps 4 markers here, 3.9 three (the broker is the reference: kafkalog stamps what it stamps)
    assert len(stamped["k"]) == (4 if broker.major >= 4 else 3) and stamped["o"] == stamped["k"]
    # round 1 kept the entries; round 2 drops them (3.9 keeps the one of the marker it did not stamp)
    assert len(before[2]) == 3 and kafka[2] == ours[2] and len(kafka[2]) == (0 if broker.major >= 4 else 1)
