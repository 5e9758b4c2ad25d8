"""The sink's two-phase append without Spark: stage, commit, replay, crash, race."""

import multiprocessing as mp
import os

import pyarrow as pa
import pytest

from storage.common.time import MockTime
from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import STAGED_MARKER, commit_staged, read_staged
from storage.topic_partition import TopicPartition
from storage.transactions.producer_state_manager import ProducerStateManager
from tests.helpers.kafka_reference import kp_parse


def table(lo, hi, keyed=True):
    vals = [f"v{i}".encode() for i in range(lo, hi)]
    keys = [f"k{i % 7}".encode() if keyed else None for i in range(lo, hi)]
    return pa.table({"key": pa.array(keys, pa.binary()), "value": vals})


def stage(lm, writer_id, rows, task=0, **kw):
    st = RecordStager(lm, writer_id, topic="t", compression=CompressionType.NONE, task_index=task, **kw)
    st.add(rows)
    return st.finish()


def values_by_partition(root, partitions):
    out = {}
    for p in range(partitions):
        d = os.path.join(root, f"t-{p}")
        data = b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if f.endswith(".log"))
        out[p] = [r[3] for b in kp_parse(data) for r in b["records"]]
    return out


def test_replayed_batch_is_skipped_partition_by_partition(root):
    lm = LogManager(root)
    lm.create_topic("t", 3)
    files = [stage(lm, 42, table(0, 50), task=0), stage(lm, 42, table(50, 100), task=1)]
    r = commit_staged(lm, 42, 0, files)
    assert r.records == 100 and not r.skipped
    again = [stage(lm, 42, table(0, 50), task=0), stage(lm, 42, table(50, 100), task=1)]
    r2 = commit_staged(lm, 42, 0, again)
    assert sorted(r2.skipped) == sorted(r.appended) and not r2.appended
    got = values_by_partition(root, 3)
    assert sorted(v for vs in got.values() for v in vs) == sorted(f"v{i}".encode() for i in range(100))
    assert not [f for f in os.listdir(root) if f.startswith(".kafkalog-staged-")]


def test_crash_after_some_bytes_rolls_back_and_replay_appends_once(root):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    commit_staged(lm, 7, 0, [stage(lm, 7, table(0, 10))])
    # simulate a committer killed mid-append: pending marked, part of the bytes written
    f = stage(lm, 7, table(10, 400), max_batch_bytes=500)
    tp = TopicPartition("t", 0)
    with lm.open_log(tp, writable=True) as log:
        data = b"".join(read_staged(lm, f.partitions[0]))
        log.producer_state.begin(7, 1, log.log_end_offset, log.log_end_offset + 390)
        half = len(kp_parse(data)) // 2
        cut = sum(b["size"] for b in kp_parse(data)[:half])
        log.append(data[:cut])  # the committer dies here
    with lm.open_log(tp) as log:
        assert 10 < log.log_end_offset < 400
    r = commit_staged(lm, 7, 1, [f])  # Spark replays batch 1
    assert r.appended[tp] == (10, 399)
    assert values_by_partition(root, 1)[0] == [f"v{i}".encode() for i in range(400)]


def test_crash_after_all_bytes_before_marking_counts_as_committed(root):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    f = stage(lm, 9, table(0, 30))
    tp = TopicPartition("t", 0)
    with lm.open_log(tp, writable=True) as log:
        data = b"".join(read_staged(lm, f.partitions[0]))
        log.producer_state.begin(9, 0, 0, 30)
        log.append(data)  # dies before complete()
    r = commit_staged(lm, 9, 0, [stage(lm, 9, table(0, 30))])
    assert r.skipped == [tp]
    assert values_by_partition(root, 1)[0] == [f"v{i}".encode() for i in range(30)]
    state = ProducerStateManager(lm.fs, lm.partition_dir(tp))
    assert state.entry(9).committed_batch_id == 0 and state.entry(9).pending is None


def test_writer_state_is_stamped_by_its_clock(root):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    clock = MockTime(1_000)
    state = ProducerStateManager(lm.fs, lm.partition_dir(TopicPartition("t", 0)), time=clock)
    state.begin(9, 0, 0, 30)
    assert state.entry(9).updated_ms == 1_000
    clock.sleep(500)
    state.complete(9)
    assert state.entry(9).updated_ms == 1_500
    assert ProducerStateManager(lm.fs, lm.partition_dir(TopicPartition("t", 0))).entry(9).updated_ms == 1_500


def _writer(root, writer_id, batches, q):
    lm = LogManager(root)
    for b in range(batches):
        f = stage(
            lm,
            writer_id,
            table(b * 20, b * 20 + 20, keyed=False)
            .append_column("tag", pa.array([writer_id] * 20))
            .select(["key", "value"]),
        )
        commit_staged(lm, writer_id, b, [f])
    q.put(writer_id)


def test_two_writers_on_one_partition_serialize_whole_batches(root):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    q = mp.get_context("fork").Queue()
    procs = [mp.get_context("fork").Process(target=_writer, args=(root, w, 15, q)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = b"".join(
        open(os.path.join(root, "t-0", f), "rb").read()
        for f in sorted(os.listdir(os.path.join(root, "t-0")))
        if f.endswith(".log")
    )
    batches = kp_parse(data)
    offsets = [r[0] for b in batches for r in b["records"]]
    assert offsets == list(range(600))  # dense, monotonic, nothing lost
    # each commit's records are contiguous: values of one 20-row batch never interleave with the other writer's
    import struct

    owners = [struct.unpack_from(">q", data, b["position"] + 43)[0] for b in batches]  # producerId per batch
    runs = [owners[0]] + [o for a, o in zip(owners, owners[1:], strict=False) if o != a]
    assert set(owners) == {1, 2} and len(runs) <= 30


def test_bad_partition_column_is_named(root):
    lm = LogManager(root)
    lm.create_topic("t", 2)
    st = RecordStager(lm, 1, topic="t", compression=CompressionType.NONE)
    with pytest.raises(Exception, match="row 1 of the task.s input: partition 5 does not exist"):
        st.add(pa.table({"value": [b"a", b"b"], "partition": pa.array([0, 5], pa.int32())}))
        st.finish()  # rows are routed in chunks (COALESCE_ROWS), at the latest here: before any commit
    st.abort()


def test_commit_removes_its_files_and_older_orphans_but_not_newer_staging(root):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    orphan = stage(lm, 3, table(0, 5))  # a killed attempt: never reported
    os.utime(os.path.join(root, orphan.name, STAGED_MARKER), (1, 1))
    used = stage(lm, 3, table(5, 10))
    newer = stage(lm, 3, table(10, 15))  # a restarted query staging its replay
    os.utime(os.path.join(root, newer.name, STAGED_MARKER), (4e9, 4e9))
    other = stage(lm, 4, table(0, 5))  # another writer's
    commit_staged(lm, 3, 0, [used])
    left = {f for f in os.listdir(root) if f.startswith(".kafkalog-staged-")}
    assert left == {newer.name, other.name}


def test_a_partition_commit_fsyncs_each_changed_file_once_after_the_pending_mark(root, monkeypatch):
    """Durability without waste: the pending mark (its file and the directory) is durable before the
    appended bytes, then the .log and its indexes are fsynced once each; nothing else is."""
    import storage.fs.local as lfs

    lm = LogManager(root)
    lm.create_topic("t", 1)
    commit_staged(lm, 7, 0, [stage(lm, 7, table(0, 10))])
    staged = stage(lm, 7, table(10, 2000))
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(lfs.os, "fsync", fsync)
    commit_staged(lm, 7, 1, [staged])
    names = [os.path.basename(p) for p in synced]
    d = os.path.join(root, "t-0")
    kinds = [
        "state"
        if n.startswith("kafkalog-producer-state.json")
        else n.split(".", 1)[-1]
        if "." in n
        else ("partition dir" if os.path.join(root, n) == d else "dir")
        for n in names
    ]
    assert kinds[:2] == ["state", "partition dir"], kinds  # the pending mark, durable first
    rest = kinds[2:]  # then each file that changed, once: the .log, and the indexes that got entries
    assert "log" in rest and len(rest) == len(set(rest)) and set(rest) <= {"log", "index", "timeindex"}, kinds
    with lm.open_log(TopicPartition("t", 0)) as log:
        assert log.log_end_offset == 2000


def _edit_state(lm, tp, edit):
    import json

    from storage.transactions.writer_state import STATE_FILE

    path = os.path.join(lm.partition_dir(tp), STATE_FILE)
    doc = json.load(open(path))
    edit(doc["writers"])
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _three_commits(root):
    """Writer 7 batch 0 (offsets 0-9), writer 8 batch 0 (10-19), writer 7 batch 1 (20-29)."""
    lm = LogManager(root)
    lm.create_topic("t", 1)
    commit_staged(lm, 7, 0, [stage(lm, 7, table(0, 10))])
    commit_staged(lm, 8, 0, [stage(lm, 8, table(10, 20))])
    commit_staged(lm, 7, 1, [stage(lm, 7, table(20, 30))])
    return lm, TopicPartition("t", 0)


@pytest.mark.parametrize(
    "damage, says",
    [
        # a pending commit pointing back into the writer's own committed records
        (lambda w: w["7"].update(pending={"batch_id": 2, "first_offset": 0, "next_offset": 1000}), "before its last"),
        # the same with the writer's committed end lost as well: another writer's batches are in the cut
        (
            lambda w: w["7"].update(
                committed_next_offset=-1, pending={"batch_id": 2, "first_offset": 0, "next_offset": 1000}
            ),
            "other writers",
        ),
    ],
)
def test_a_damaged_pending_mark_cannot_cut_committed_records(root, damage, says):
    from storage.errors import KafkaStorageError

    lm, tp = _three_commits(root)
    path = _edit_state(lm, tp, damage)
    with pytest.raises(KafkaStorageError, match=says) as e:
        with LogManager(root).open_log(tp, writable=True):
            pass
    assert path in str(e.value) and "t-0" in str(e.value)
    assert values_by_partition(root, 1)[0] == [f"v{i}".encode() for i in range(30)]  # kafka-python's view


@pytest.mark.parametrize(
    "pending",
    [
        {"batch_id": 2, "first_offset": "30", "next_offset": 40},
        {"batch_id": 2, "first_offset": 40, "next_offset": 30},
        {"batch_id": True, "first_offset": 30, "next_offset": 40},
    ],
)
def test_a_pending_mark_of_the_wrong_shape_is_refused(root, pending):
    from storage.errors import KafkaStorageError

    lm, tp = _three_commits(root)
    _edit_state(lm, tp, lambda w: w["7"].update(pending=pending))
    with pytest.raises(KafkaStorageError, match="writer state file .* is not valid"):
        LogManager(root).open_log(tp, writable=True)
    assert values_by_partition(root, 1)[0] == [f"v{i}".encode() for i in range(30)]


def test_a_rollback_after_unflushed_records_were_lost_still_happens(root):
    """A flush.ms topic may lose the end of a done commit in a power cut while its done mark survives; a
    later commit that dies mid-append must still be rolled back (its mark starts below the stale end)."""
    lm, tp = _three_commits(root)
    with lm.open_log(tp, writable=True) as log:
        log.truncate_to(20)  # the power cut took writer 7's batch 1 (offsets 20-29); its done mark survived
    f = stage(lm, 7, table(20, 400), max_batch_bytes=500)
    with lm.open_log(tp, writable=True) as log:
        assert log.producer_state.entry(7).committed_next_offset == 30
        data = b"".join(read_staged(lm, f.partitions[0]))
        log.producer_state.begin(7, 2, 20, 400)
        log.append(data[: sum(b["size"] for b in kp_parse(data)[:3])])  # dies here
    with lm.open_log(tp, writable=True) as log:
        assert log.log_end_offset == 20 and log.producer_state.entry(7).pending is None
    assert values_by_partition(root, 1)[0] == [f"v{i}".encode() for i in range(20)]
