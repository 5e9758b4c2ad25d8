"""Dead writers' transaction files on object stores: a streaming writer that never comes back leaves
`kafkalog-txn-<writer>.json` in every partition it wrote; the maintenance job removes it once the writer holds
no open transaction there and its last transaction is older than the abort decisions' retention. A live
writer's file, and the file of a writer whose transaction is still open, stay. The clock is injected (MockTime
for the writers, the pass's now_ms), never raced."""

from __future__ import annotations

import uuid

import fsspec
import pyarrow as pa
import pytest

from storage.common.time import SYSTEM_TIME, MockTime
from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.objects.object_producer_state import TXN_FILE_RETENTION_MS, txn_file_name
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.transaction_coordinator import ABORT_DECISION_RETENTION_MS

PARTITIONS = 2
DEAD, LIVE, OPEN = 11, 12, 13
# the store stamps objects with the wall clock: the writers' MockTime starts there
T0 = SYSTEM_TIME.milliseconds()


@pytest.fixture(params=["memory", "s3"])
def lm(request):
    if request.param == "s3":
        root, opts = request.getfixturevalue("s3_root")
        m = LogManager(root, opts)
    else:
        m = LogManager(f"/obj-{uuid.uuid4().hex}", fs=ObjectStoreFileSystem(fsspec.filesystem("memory")))
    m.create_topic("t", PARTITIONS, {"retention.ms": "-1"})
    return m


def commit(lm, writer: int, batch: int, clock) -> None:
    staged = []
    for p in range(PARTITIONS):
        st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE, task_index=p)
        st.add(
            pa.table(
                {
                    "key": pa.array([b"k%d" % p], pa.binary()),
                    "value": pa.array([b"w%d-b%d-p%d" % (writer, batch, p)], pa.binary()),
                    "partition": pa.array([p], pa.int32()),
                }
            )
        )
        staged.append(st.finish())
    commit_staged(lm, writer, batch, staged, transactional=True, time=clock)


def txn_files(lm, p) -> set[str]:
    d = lm.partition_dir(TopicPartition("t", p))
    lm.fs.invalidate_listings(d)
    return {f.name for f in lm.fs.listdir(d) if f.name.startswith("kafkalog-txn-")}


def committed_values(lm) -> dict[int, list[bytes]]:
    out = {}
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition("t", p)) as log:
            out[p] = [
                v for b in log.read_records(0, isolation_level="read_committed") for v in b.column("value").to_pylist()
            ]
    return out


def run(lm, now):
    reps = run_once(lm.root, fs=lm.fs, now_ms=now, clock=lambda: now)
    assert all(not r.errors for r in reps), [r.errors for r in reps]
    return reps


def test_a_dead_writers_files_go_after_the_retention_a_live_writers_stay(lm):
    assert TXN_FILE_RETENTION_MS >= ABORT_DECISION_RETENTION_MS
    commit(lm, DEAD, 0, MockTime(T0))  # then never comes back
    commit(lm, LIVE, 0, MockTime(T0))
    late = T0 + TXN_FILE_RETENTION_MS + 1
    commit(lm, LIVE, 1, MockTime(late - 1))  # still writing: its file names a fresh transaction
    before = committed_values(lm)
    every = {txn_file_name(DEAD), txn_file_name(LIVE)}
    assert all(txn_files(lm, p) == every for p in range(PARTITIONS))
    reps = run(lm, T0 + TXN_FILE_RETENTION_MS - 1)  # not yet past the retention: nothing goes
    assert sum(r.txn_files_removed for r in reps) == 0
    assert all(txn_files(lm, p) == every for p in range(PARTITIONS))
    reps = run(lm, late)
    assert sum(r.txn_files_removed for r in reps) == PARTITIONS
    assert all("1 dead writer transaction file(s) removed" in r.line() for r in reps)
    assert all(txn_files(lm, p) == {txn_file_name(LIVE)} for p in range(PARTITIONS))
    assert committed_values(lm) == before
    commit(lm, DEAD, 1, MockTime(late))  # a writer that does come back writes its file again
    assert all(txn_files(lm, p) == every for p in range(PARTITIONS))
    assert {p: v[len(before[p]) :] for p, v in committed_values(lm).items()} == {
        p: [b"w%d-b1-p%d" % (DEAD, p)] for p in range(PARTITIONS)
    }


def test_the_file_of_a_writer_whose_transaction_is_still_open_stays(lm, monkeypatch):
    """A transaction still open holds its file, however old; once ended, the file goes."""
    with monkeypatch.context() as m:  # the writer dies once its data is in, before its decision
        m.setattr(sc, "decide", _die)
        with pytest.raises(RuntimeError):
            commit(lm, OPEN, 0, MockTime(T0))
    late = T0 + TXN_FILE_RETENTION_MS + 1
    tp = TopicPartition("t", 0)
    with lm.open_log(tp, writable=True) as log:
        state = log.producer_state
        assert state.first_unstable_offset() == 0
        assert state.expire_transaction_files(late) == []  # open: kept
        assert state.resolve_pending(log, now_ms=late)  # past its timeout: aborted
        assert [lm.fs.basename(f) for f in state.expire_transaction_files(late)] == [txn_file_name(OPEN)]
    assert txn_files(lm, 0) == set()


def _die(*a, **kw):
    raise RuntimeError("injected: the writer dies here")
