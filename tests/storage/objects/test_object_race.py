"""The sink's commit on a real S3 endpoint (moto server): two writer processes racing on one partition,
and a committer killed between its segment object and its index objects. Checked by parsing every
segment object with kafka-python: offsets dense, each (writer, batch) exactly once, nothing lost."""

import multiprocessing
import os
import struct
import time
from collections import Counter

import pyarrow as pa
import pytest
from kafka.record import MemoryRecords

from storage.log_dirs import open_filesystem
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.writer_state import STATE_FILE
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_parse

TP = TopicPartition("t", 0)
COMMITS = int(os.environ.get("KAFKALOG_RACE_COMMITS", 30))  # per writer; 200 in the run
REPLAY_EVERY = 10  # Spark delivers a batch again now and then: the same batch id, staged afresh


def rows(writer, batch, n=5):
    return pa.table(
        {"key": pa.array([None] * n, pa.binary()), "value": [b"w%d-b%d-%d" % (writer, batch, i) for i in range(n)]}
    )


def stage(url, opts, writer, batch):
    lm = LogManager(url, opts)  # a task: its own process and LogManager in Spark
    st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE)
    st.add(rows(writer, batch))
    return st.finish()


def commit(url, opts, writer, batch, staged):
    return commit_staged(LogManager(url, opts), writer, batch, [staged])  # the driver's commit: a new LogManager


def _racer(url, opts, writer, barrier, out):
    barrier.wait()
    appended, skipped, seconds = 0, 0, []
    for b in range(COMMITS):
        for _ in range(2 if b % REPLAY_EVERY == REPLAY_EVERY - 1 else 1):
            t0 = time.perf_counter()
            r = commit(url, opts, writer, b, stage(url, opts, writer, b))
            seconds.append(time.perf_counter() - t0)
            appended += len(r.appended)
            skipped += len(r.skipped)
    out.put((writer, appended, skipped, seconds))


def segment_objects(url, opts):
    fs, root = open_filesystem(url, opts)
    d = fs.join(root, "t-0")
    names = sorted(f.name for f in fs.listdir(d))
    return fs, d, names, {int(n[:-4]): fs.read(fs.join(d, n)) for n in names if n.endswith(".log")}


def batch_identity(log_bytes):
    """{(producerId, producerEpoch, baseSequence)} over a segment's batches, as kafka-python reads them."""
    recs = MemoryRecords(bytes(log_bytes))
    out = set()
    while recs.has_next():
        b = recs.next_batch()
        out.add((b.producer_id, b.producer_epoch, b.base_sequence))
    return out


def test_two_writer_processes_race_for_one_partition(s3_server, s3_root):
    url, opts = s3_root
    LogManager(url, opts).create_topic("t", 1)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    writers = (101, 202)
    mark = s3_server.log.mark()
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_racer, args=(url, opts, w, barrier, out)) for w in writers]
    for p in procs:
        p.start()
    results = {r[0]: r[1:] for r in (out.get(timeout=1800) for _ in procs)}
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    wall = time.perf_counter() - t0
    requests = s3_server.log.since(mark)

    fs, d, names, segs = segment_objects(url, opts)
    commits, offsets, values = [], [], {w: [] for w in writers}
    for base, data in sorted(segs.items()):
        batches = kp_parse(data)
        assert batches and all(b["crc_ok"] for b in batches) and batches[0]["base_offset"] == base
        ident = batch_identity(data)
        assert len(ident) == 1  # one commit per object, every batch stamped with it
        ((writer, epoch, batch),) = ident
        assert epoch == 0
        commits.append((writer, batch))
        offsets += [r[0] for b in batches for r in b["records"]]
        values[writer] += [r[3] for b in batches for r in b["records"]]
        if base == max(segs):
            continue
        assert f"{base:020d}.index" in names and f"{base:020d}.timeindex" in names
        index, _, _ = kafka_recovery_entries(batches, 4096, base)
        assert fs.read(fs.join(d, f"{base:020d}.index")) == index
    assert offsets == list(range(len(offsets)))  # dense: no gap, no overlap
    for w in writers:
        mine = [b for cw, b in commits if cw == w]
        assert mine == list(range(COMMITS))  # every batch once, in order: nothing lost, nothing twice
        assert values[w] == [r for b in range(COMMITS) for r in rows(w, b).column("value").to_pylist()]
        appended, skipped, _ = results[w]
        assert (appended, skipped) == (COMMITS, COMMITS // REPLAY_EVERY)

    lost = [r for r in requests if r.method == "PUT" and r.path.endswith(".log") and r.status == 412]
    by_method = Counter(r.method for r in requests)
    n_commits = sum(len(results[w][2]) for w in writers)
    seconds = sorted(s for w in writers for s in results[w][2])
    figures = (
        f"race: {len(writers)} writers x {COMMITS} commits (+{COMMITS // REPLAY_EVERY} replays each) in "
        f"{wall:.1f}s; {len(requests) / n_commits:.1f} requests per commit incl. staging "
        f"({dict(by_method)}); lost create races {len(lost)}; commit+stage seconds p50 "
        f"{seconds[len(seconds) // 2]:.3f} p95 {seconds[int(len(seconds) * 0.95)]:.3f} max {seconds[-1]:.3f}"
    )
    print(figures)
    if os.environ.get("KAFKALOG_FIGURES"):
        with open(os.environ["KAFKALOG_FIGURES"], "a") as f:
            f.write(figures + "\n")


def test_requests_of_one_commit(s3_server, s3_root):
    """What one uncontended commit costs on S3 (printed; the assertions pin the protocol's own requests)."""
    url, opts = s3_root
    LogManager(url, opts).create_topic("t", 1)
    for b in range(3):
        commit(url, opts, 1, b, stage(url, opts, 1, b))
    staged = stage(url, opts, 1, 3)
    mark = s3_server.log.mark()
    commit(url, opts, 1, 3, staged)
    reqs = s3_server.log.since(mark)
    puts = [r.path.rsplit("/", 1)[-1] for r in reqs if r.method == "PUT"]
    assert puts == [f"{15:020d}.log", f"{15:020d}.index", f"{15:020d}.timeindex", STATE_FILE]
    ranged = [r for r in reqs if r.method == "GET" and r.range and r.path.endswith(".log")]
    assert all(r.range.startswith("bytes=") for r in ranged)
    figures = f"one commit: {len(reqs)} requests ({dict(Counter(r.method for r in reqs))})"
    print(figures)
    if os.environ.get("KAFKALOG_FIGURES"):
        with open(os.environ["KAFKALOG_FIGURES"], "a") as f:
            f.write(figures + "\n")


# ------------------------------------------------------------------ a committer killed mid-commit

KILL_POINTS = {
    "before the segment": lambda path: path.endswith(".log") and "/t-0/" in path and "-staged-" not in path,
    "after the segment, before its indexes": lambda path: path.endswith(".index") and "/t-0/" in path,
    "after the indexes, before the hint": lambda path: path.endswith(STATE_FILE),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_commit_killed_mid_way_then_replayed_is_in_exactly_once(s3_root, point):
    url, opts = s3_root
    LogManager(url, opts).create_topic("t", 1)
    commit(url, opts, 9, 0, stage(url, opts, 9, 0))
    staged = stage(url, opts, 9, 1)
    pid = os.fork()
    if pid == 0:  # the committer: dies (os._exit, no cleanup) at its first write matching the kill point
        try:
            hit = KILL_POINTS[point]
            for name in ("write_atomic", "create_exclusive"):
                real = getattr(ObjectStoreFileSystem, name)

                def dying(self, path, data, *a, _real=real, **kw):
                    if hit(path):
                        os._exit(17)
                    return _real(self, path, data, *a, **kw)

                setattr(ObjectStoreFileSystem, name, dying)
            commit(url, opts, 9, 1, staged)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 17

    fs, d, names, segs = segment_objects(url, opts)
    committed = point != "before the segment"
    assert sorted(segs) == ([0, 5] if committed else [0])
    if point == "after the segment, before its indexes":
        assert f"{5:020d}.index" not in names and f"{5:020d}.timeindex" not in names

    r = commit(url, opts, 9, 1, stage(url, opts, 9, 1))  # Spark replays batch 1
    assert (r.skipped, list(r.appended)) == (([TP], []) if committed else ([], [TP]))
    r = commit(url, opts, 9, 2, stage(url, opts, 9, 2))
    assert r.appended == {TP: (10, 14)}

    fs, d, names, segs = segment_objects(url, opts)
    assert sorted(segs) == [0, 5, 10]
    got = [(r[0], r[3]) for base in sorted(segs) for b in kp_parse(segs[base]) for r in b["records"]]
    assert got == list(enumerate(v for b in range(3) for v in rows(9, b).column("value").to_pylist()))
    assert [batch_identity(segs[b]) for b in sorted(segs)] == [{(9, 0, 0)}, {(9, 0, 1)}, {(9, 0, 2)}]
    for base, data in segs.items():  # the replay's writer rebuilt the missing indexes, as an append writes them
        index, timeindex, (max_ts, max_off) = kafka_recovery_entries(kp_parse(data), 4096, base)
        last_ts = struct.unpack_from(">q", timeindex, len(timeindex) - 12)[0] if timeindex else -1
        if max_ts > last_ts:
            timeindex += struct.pack(">qi", max_ts, max_off - base)
        assert fs.read(fs.join(d, f"{base:020d}.index")) == index
        assert fs.read(fs.join(d, f"{base:020d}.timeindex")) == timeindex
