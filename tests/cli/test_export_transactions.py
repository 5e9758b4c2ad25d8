"""`kafkalog export-to-broker` carries the transactions of kafkalog's transactional sink (the Spark sink's default).

The log is written through the engine's transactional commit path (storage/staging/staged_commit.py), with small
segments so that transactions and their markers straddle segment rolls: writer A commits batch 0; A's batch 1
and then B's batch 0 die after their data in partition 0; A's restart aborts its own attempt while B's is still
open (so that entry's lastStableOffset is B's first offset, not the marker's + 1) and commits the replay; B's
restart does the same; A's batch 2 loses its decision to an abort (ABORT markers in both partitions); A's batch
3 commits. The export goes into a cleanly stopped broker's log dir; the broker is started and:

- loads every partition without recovery, from the producer snapshot the export wrote;
- Kafka's read_committed consumer returns exactly what a brute-force model over the source bytes gives
  (tests/helpers/kafka_reference.kp_committed), read_uncommitted every data record;
- ListOffsets latest at read_committed is the log end (the LSO: no transaction open);
- Kafka's DumpLogSegments prints the `.txnindex` entries the engine holds;
- a new transactional producer writes and commits on top.

Without a broker: a partition with a transaction still open is refused with nothing changed, the files are
the engine's (the same `.log` bytes, the engine's `.txnindex` entries, the engine's producer table), and a
transaction index that does not match the log is refused.
"""

from __future__ import annotations

import base64
import os
import re
import time

import numpy as np
import pyarrow as pa
import pytest

from storage.errors import TransactionAbortedError
from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.producer_snapshot import decode_snapshot
from storage.transactions.producer_table import ProducerTable
from storage.transactions.transaction_coordinator import ABORT, decide, marker_batch
from storage.transactions.transaction_index import ABORTED_TXN_DTYPE
from tests.cli.test_kafka_handoff import TOPIC_ID, _fake_broker_dir, _run_cli
from tests.helpers.broker_checks import BAD_SIGNS
from tests.helpers.kafka_reference import kp_committed, kp_parse

TOPIC = "xt"
PARTITIONS = 2
A, B = 4242, 777
SEGMENT_BYTES = 1500
LATEST_COMMITTED = {
    "op": "listOffsets",
    "topic": TOPIC,
    "partitions": list(range(PARTITIONS)),
    "spec": "latest",
    "isolation": "read_committed",
}


def _rows(tag: str, n: int = 30) -> pa.Table:
    return pa.table(
        {
            "value": pa.array([f"{tag}-{i}".encode() * 3 for i in range(n)], pa.binary()),
            "partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
        }
    )


def _stage(lm, writer: int, tag: str):
    st = RecordStager(lm, writer, topic=TOPIC, compression=CompressionType.NONE)
    st.add(_rows(tag))
    return st.finish()


class _Crash(BaseException):
    pass


def _dies_after_first_partition(root: str, writer: int, batch: int, tag: str) -> None:
    """A committer that dies once the first partition's data is in: its transaction stays open there."""
    real = sc._transaction_data

    def die(*a, **kw):
        real(*a, **kw)
        raise _Crash()

    sc._transaction_data = die
    try:
        with pytest.raises(_Crash):
            lm = LogManager(root)
            commit_staged(lm, writer, batch, [_stage(lm, writer, tag)], transactional=True)
    finally:
        sc._transaction_data = real


def _commit(root: str, writer: int, batch: int, tag: str) -> None:
    lm = LogManager(root)
    commit_staged(lm, writer, batch, [_stage(lm, writer, tag)], transactional=True)


def _write(root: str) -> None:
    LogManager(root).create_topic(TOPIC, PARTITIONS, {"segment.bytes": str(SEGMENT_BYTES), "retention.ms": "-1"})
    _commit(root, A, 0, "a0")
    _dies_after_first_partition(root, A, 1, "a1-first")
    _dies_after_first_partition(root, B, 0, "b0-first")
    _commit(root, A, 1, "a1")  # aborts A's first attempt (B's still open), commits the replay
    _commit(root, B, 0, "b0")
    real = sc.decide

    def aborted_first(fs, path, outcome, detail):
        decide(fs, path, ABORT, {"reason": "test"})
        return real(fs, path, outcome, detail)

    sc.decide = aborted_first
    try:
        with pytest.raises(TransactionAbortedError):
            _commit(root, A, 2, "a2")
    finally:
        sc.decide = real
    _commit(root, A, 3, "a3")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("xt") / "logs")
    _write(root)
    return root


def _segment_files(d, suffix: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(suffix) and len(n) == 20 + len(suffix))


def _source_bytes(root: str, p: int) -> bytes:
    d = os.path.join(root, f"{TOPIC}-{p}")
    return b"".join(open(os.path.join(d, n), "rb").read() for n in _segment_files(d, ".log"))


def _epochs_zeroed(data: bytes) -> bytes:
    out = bytearray(data)
    for b in kp_parse(data):
        out[b["position"] + 12 : b["position"] + 16] = bytes(4)  # partitionLeaderEpoch, outside the CRC
    return bytes(out)


def _txnindex_rows(d) -> dict[str, list[tuple]]:
    return {
        n: np.frombuffer(open(os.path.join(d, n), "rb").read(), ABORTED_TXN_DTYPE).tolist()
        for n in _segment_files(d, ".txnindex")
    }


# ---------------------------------------------------------------- without a broker


def test_the_source_holds_what_the_tests_need(source):
    """Aborts whose marker lies in another segment than their data, one with an LSO below its marker."""
    lm = LogManager(source)
    with lm.open_log(TopicPartition(TOPIC, 0)) as log:
        assert len(log.segments) >= 3
        aborted = log.collect_aborted_txns(0, log.log_end_offset).tolist()
        bases = [s.base_offset for s in log.segments]
    assert len(aborted) == 3
    assert any(lso < last + 1 for _, _, _, last, lso in aborted)
    seg_of = lambda o: max(b for b in bases if b <= o)  # noqa: E731
    assert any(seg_of(first) != seg_of(last) for _, _, first, last, _ in aborted)


def test_the_exported_files_are_the_engines(source, tmp_path):
    staging = tmp_path / "staging"
    rc, out, err = _run_cli("export-to-broker", source, "--topic", TOPIC, "--topic-id", TOPIC_ID, "--to", str(staging))
    assert rc == 0, err
    assert "transactional batch(es) and marker(s) carried, 3 aborted transaction(s) in .txnindex" in out
    # the summary counts data records as a consumer does, and the markers apart (kafka-python's count)
    parsed = [
        b
        for p in range(PARTITIONS)
        for n in _segment_files(staging / f"{TOPIC}-{p}", ".log")
        for b in kp_parse((staging / f"{TOPIC}-{p}" / n).read_bytes())
    ]
    data = sum(len(b["records"]) for b in parsed if not b["is_control"])
    markers = sum(len(b["records"]) for b in parsed if b["is_control"])
    assert (
        markers
        and f"segment(s), {data} records (and {markers} transaction markers, one offset each)" in out.splitlines()[-1]
    )
    lm = LogManager(source)
    for p in range(PARTITIONS):
        d = staging / f"{TOPIC}-{p}"
        src = os.path.join(source, f"{TOPIC}-{p}")
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            end = log.log_end_offset
            assert _segment_files(d, ".log") == _segment_files(src, ".log")
            # the same bytes but for partitionLeaderEpoch (0; the sink's markers have -1): the sink's
            # transactional batches carry their producer id, epoch and sequence, so nothing is cleared
            for n in _segment_files(d, ".log"):
                assert (d / n).read_bytes() == _epochs_zeroed(open(os.path.join(src, n), "rb").read())
            assert _txnindex_rows(d) == _txnindex_rows(src)
            assert sum(map(len, _txnindex_rows(d).values())) == len(log.collect_aborted_txns(0, end))
            assert _segment_files(d, ".snapshot") == [f"{end:020d}.snapshot"]
            mine = decode_snapshot((d / f"{end:020d}.snapshot").read_bytes())
            engine = ProducerTable.load(log, end).to_array()
            assert mine.tolist() == engine.tolist() and sorted(mine["producer_id"].tolist()) == [B, A]
            assert (mine["current_txn_first_offset"] == -1).all()


def _read(root: str, p: int, isolation: str, start: int | None = None) -> list[tuple]:
    with LogManager(root).open_log(TopicPartition(TOPIC, p)) as log:
        first = log.log_start_offset if start is None else start
        return [
            (o, v)
            for batch in log.read_records(first, isolation_level=isolation)
            for o, v in zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
        ]


def test_a_log_start_past_the_first_segment_keeps_the_aborts_that_reach_it(source, tmp_path):
    """delete-records into the second segment: the first is left out, and an abort whose data began there
    but whose marker lies above keeps its entry (in the segment of its marker); kafkalog reads the exported
    directory (from its snapshot and `.txnindex` files) as it reads the source, at both isolation levels."""
    import shutil

    root = str(tmp_path / "logs")
    shutil.copytree(source, root)
    with LogManager(root).open_log(TopicPartition(TOPIC, 0)) as log:
        second = log.segments[1].base_offset
        spanning = [t for t in log.collect_aborted_txns(0, log.log_end_offset).tolist() if t[2] < second <= t[3]]
    assert spanning  # the test's log has one
    rc, out, err = _run_cli("delete-records", root, "--topic", TOPIC, "--partition", "0", "--offset", str(second + 3))
    assert rc == 0, err
    staging = tmp_path / "staging"
    rc, out, err = _run_cli("export-to-broker", root, "--topic", TOPIC, "--topic-id", TOPIC_ID, "--to", str(staging))
    assert rc == 0, err
    d = staging / f"{TOPIC}-0"
    assert _segment_files(d, ".log")[0] == f"{second:020d}.log"
    assert set(spanning) <= set(_txnindex_rows(d)[f"{second:020d}.txnindex"])
    # (a staging directory keeps no log start: the delete-records JSON moves it on the broker)
    assert '"offset": ' + str(second + 3) in (staging / f"{TOPIC}.delete-records.json").read_text()
    for p in range(PARTITIONS):
        with LogManager(root).open_log(TopicPartition(TOPIC, p)) as log:
            start = log.log_start_offset
        for isolation in ("read_committed", "read_uncommitted"):
            assert _read(str(staging), p, isolation, start) == _read(root, p, isolation)
    assert _read(str(staging), 0, "read_committed", second + 3) != _read(
        str(staging), 0, "read_uncommitted", second + 3
    )


def _snapshot(path) -> dict:
    return {
        n: sorted(os.listdir(path / n)) if (path / n).is_dir() else (path / n).read_bytes() for n in os.listdir(path)
    }


@pytest.mark.parametrize("target", ["broker", "staging"])
def test_an_open_transaction_is_refused_and_nothing_changes(tmp_path, target):
    root = str(tmp_path / "logs")
    LogManager(root).create_topic(TOPIC, PARTITIONS, {"segment.bytes": str(SEGMENT_BYTES)})
    _commit(root, A, 0, "a0")
    _dies_after_first_partition(root, A, 1, "a1-first")
    with LogManager(root).open_log(TopicPartition(TOPIC, 0)) as log:
        open_at = log.last_stable_offset
        assert open_at < log.log_end_offset
    if target == "broker":
        to = _fake_broker_dir(tmp_path / "kafka", topic=TOPIC)
        argv = ["export-to-broker", root, "--topic", TOPIC, "--to", str(to)]
    else:
        to = tmp_path / "staging"
        to.mkdir()
        argv = ["export-to-broker", root, "--topic", TOPIC, "--topic-id", TOPIC_ID, "--to", str(to)]
    before = _snapshot(to)
    rc, out, err = _run_cli(*argv)
    assert rc == 1 and len(err.splitlines()) == 1, err
    assert f"{TOPIC}-0: the transaction of producer {A} from offset {open_at} is still open" in err
    assert "wait for its writer to commit it, or let `kafkalog maintain` abort it" in err
    assert "transaction.timeout.ms" in err
    after = _snapshot(to)
    assert after == before  # every name, dotfiles included: no `.lock` left in the broker's log dir either


def test_a_transaction_index_that_does_not_match_the_log_is_refused(source, tmp_path):
    """An entry whose lastStableOffset is above what the log gives would let a broker's read_committed fetch
    stop looking for aborted transactions too early."""
    import shutil

    root = str(tmp_path / "logs")
    shutil.copytree(source, root)
    d = os.path.join(root, f"{TOPIC}-0")
    name = _segment_files(d, ".txnindex")[0]
    rows = np.frombuffer(open(os.path.join(d, name), "rb").read(), ABORTED_TXN_DTYPE).copy()
    rows["last_stable_offset"][0] = rows["last_offset"][0] + 1  # above the open transaction's first offset
    with open(os.path.join(d, name), "wb") as f:
        f.write(rows.tobytes())
    rc, out, err = _run_cli(
        "export-to-broker", root, "--topic", TOPIC, "--topic-id", TOPIC_ID, "--to", str(tmp_path / "staging")
    )
    assert rc == 1 and "does not match the log" in err and f"lastStableOffset {int(rows['last_offset'][0]) + 1}" in err
    assert not (tmp_path / "staging").exists()  # the export made it, and removed it again on refusal


def test_a_transactional_batch_without_a_sequence_is_refused(tmp_path):
    from kafka.record.default_records import DefaultRecordBatchBuilder

    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic("t", 1)
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True, producer_id=9, producer_epoch=0, base_sequence=-1,
        batch_size=2**20,
    )  # fmt: skip
    b.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"v", headers=[])
    with lm.open_log(TopicPartition("t", 0), writable=True) as log:
        log.append(bytes(b.build()))
        log.append(bytes(marker_batch(1, base_offset=1, timestamp=1_700_000_000_001, producer_id=9, producer_epoch=0)))
    rc, out, err = _run_cli(
        "export-to-broker", root, "--topic", "t", "--topic-id", TOPIC_ID, "--to", str(tmp_path / "staging")
    )
    assert rc == 1 and "transactional batch at offset 0" in err and "baseSequence -1" in err, err
    assert not (tmp_path / "staging").exists()  # the export made it, and removed it again on refusal


# ---------------------------------------------------------------- the broker


def _values(records) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for r in records:
        out[r["partition"]].append(base64.b64decode(r["value"]))
    return out


@pytest.fixture(scope="module")
def exported(source, kafka_broker_session):
    b = kafka_broker_session.ensure_running()
    topic_id = b.tool(
        {"op": "createTopic", "topic": TOPIC, "partitions": PARTITIONS, "configs": {"retention.ms": "-1"}}
    )[0]["topicId"]
    log_dir = b.log_dir
    deadline = time.monotonic() + 120
    while not all((log_dir / f"{TOPIC}-{p}" / "partition.metadata").exists() for p in range(PARTITIONS)):
        assert time.monotonic() < deadline, "the broker made no partition directories\n" + b.log_tail()
        time.sleep(0.1)
    b.stop()
    rc, out, err = _run_cli("export-to-broker", source, "--topic", TOPIC, "--to", str(log_dir))
    assert rc == 0, err
    txnindexes = [
        str(log_dir / f"{TOPIC}-{p}" / n)
        for p in range(PARTITIONS)
        for n in _segment_files(log_dir / f"{TOPIC}-{p}", ".txnindex")
    ]
    dump = b.dump_log(txnindexes)  # the broker's version of DumpLogSegments
    b.start()
    for p in range(PARTITIONS):
        b.wait_for_log(f"Completed load of Log(dir={log_dir / f'{TOPIC}-{p}'}")
    ends = {}
    for p in range(PARTITIONS):
        with LogManager(source).open_log(TopicPartition(TOPIC, p)) as log:
            ends[p] = log.log_end_offset
    return dict(broker=b, log_dir=log_dir, topic_id=topic_id, dump=dump, ends=ends, broker_log=b.log_since_start())


@pytest.mark.kafka
def test_the_broker_loads_the_partitions_from_the_snapshot_without_recovery(exported):
    bad = [
        line
        for line in exported["broker_log"].splitlines()
        if (any(s in line for s in BAD_SIGNS) and "__cluster_metadata" not in line)
        or (re.search(r"\] (WARN|ERROR) ", line) and f"{TOPIC}-" in line)
    ]
    assert bad == []
    for p in range(PARTITIONS):
        snapshot = exported["log_dir"] / f"{TOPIC}-{p}" / f"{exported['ends'][p]:020d}.snapshot"
        assert (
            f"Loading producer state from snapshot file 'SnapshotFile(offset={exported['ends'][p]}, file={snapshot}"
            in (exported["broker_log"])
        )


@pytest.mark.kafka
def test_dump_log_segments_prints_the_txnindex_entries_the_engine_holds(exported, source):
    expected = []
    lm = LogManager(source)
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            for _, pid, first, last, lso in log.collect_aborted_txns(0, log.log_end_offset).tolist():
                expected.append(
                    f"version: 0 producerId: {pid} firstOffset: {first} lastOffset: {last} lastStableOffset: {lso}"
                )
    printed = [line for line in exported["dump"].splitlines() if line.startswith("version: ")]
    assert printed == expected and len(expected) == 4


@pytest.mark.kafka
def test_read_committed_gives_exactly_the_committed_records(exported, source):
    b = exported["broker"]
    committed, everything, latest = b.tool(
        {"op": "consume", "topic": TOPIC, "isolation": "read_committed"},
        {"op": "consume", "topic": TOPIC, "isolation": "read_uncommitted"},
        LATEST_COMMITTED,
    )
    for p in range(PARTITIONS):
        batches = kp_parse(_source_bytes(source, p))
        given, still_open = kp_committed(batches)
        assert still_open == []
        assert _values(committed)[p] == [r[3] for r in sorted(given)]
        assert _values(everything)[p] == [r[3] for bt in batches if not bt["is_control"] for r in bt["records"]]
        assert len(given) < len(_values(everything)[p])  # some were aborted
        assert latest[str(p)]["offset"] == exported["ends"][p]


@pytest.mark.kafka
def test_a_new_transactional_producer_writes_and_commits_on_top(exported):
    b = exported["broker"]
    steps = [{"begin": 1}]
    steps += [
        {"sendMany": {"count": 5, "partition": p, "key": None, "value": f"new-{p}-%d"}} for p in range(PARTITIONS)
    ]
    steps += [{"commit": 1}]
    sent = b.tool(
        {
            "op": "produce",
            "topic": TOPIC,
            "config": {"transactional.id": "after-export", "linger.ms": "0"},
            "steps": steps,
        }
    )[0]
    assert sorted((s["partition"], s["offset"]) for s in sent) == [
        (p, exported["ends"][p] + i) for p in range(PARTITIONS) for i in range(5)
    ]
    committed, latest = b.tool(
        {"op": "consume", "topic": TOPIC, "isolation": "read_committed"},
        LATEST_COMMITTED,
    )
    for p in range(PARTITIONS):
        assert _values(committed)[p][-5:] == [f"new-{p}-{i}".encode() for i in range(5)]
        assert latest[str(p)]["offset"] == exported["ends"][p] + 6  # 5 records and the COMMIT marker
