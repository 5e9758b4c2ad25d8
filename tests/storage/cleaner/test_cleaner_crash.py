"""Crash the cleaner at every file operation of a cleaning (the Nth mutating call of the filesystem
raises, and so does every call after it), reload the partition as a writer would, and check that each
replaced group of segments is wholly old or wholly new, every record that must survive is readable,
no offset appears twice, and a later cleaning reaches what an uninterrupted one gives."""

from __future__ import annotations

import uuid

import pytest

from storage.cleaner.log_cleaner_manager import LogCleanerManager
from storage.fs.filesystem import Appender, LogFileSystem
from storage.fs.memory import MemoryFileSystem
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition, parse_segment_file
from tests.helpers.index_checks import check_indexes
from tests.helpers.kafka_reference import kp_batch

TP = TopicPartition("t", 0)
NOW = 100_000


class Crash(BaseException):
    """A simulated process death: not an Exception, so nothing on the way up handles it."""


class _CrashingAppender(Appender):
    def __init__(self, fs, inner):
        self._fs, self._inner = fs, inner

    def write(self, data):
        self._fs._tick("append.write")
        self._inner.write(data)

    def flush(self, fsync=True):
        self._fs._tick("append.flush")
        self._inner.flush(fsync)

    def truncate(self, size):
        self._fs._tick("append.truncate")
        self._inner.truncate(size)

    def close(self):
        self._inner.close()

    @property
    def size(self):
        return self._inner.size


class CrashingFS(LogFileSystem):
    """Delegates to `inner`, counting mutating calls; the `crash_at`-th one and all later ones raise Crash."""

    def __init__(self, inner: LogFileSystem, crash_at: int | None = None):
        self.inner = inner
        self.capabilities = inner.capabilities
        self.protocol = inner.protocol
        self.crash_at = crash_at
        self.ops: list[str] = []
        self.crashed = False

    def _tick(self, what: str) -> None:
        if self.crashed:
            raise Crash(f"already crashed; {what}")
        self.ops.append(what)
        if self.crash_at is not None and len(self.ops) >= self.crash_at:
            self.crashed = True
            raise Crash(f"crash at operation {len(self.ops)}: {what}")

    def url(self, path):
        return self.inner.url(path)

    # reads
    def exists(self, path):
        return self.inner.exists(path)

    def isdir(self, path):
        return self.inner.isdir(path)

    def listdir(self, path):
        return self.inner.listdir(path)

    def size(self, path):
        return self.inner.size(path)

    def read(self, path, start=0, end=None):
        return self.inner.read(path, start, end)

    def modified_ms(self, path):
        return self.inner.modified_ms(path)

    def lock(self, path, *, timeout=None):
        return self.inner.lock(path, timeout=timeout)

    # writes
    def write_atomic(self, path, data, *, durable=True):
        self._tick(f"write_atomic {self.basename(path)}")
        self.inner.write_atomic(path, data, durable=durable)

    def create_exclusive(self, path, data, *, durable=True):
        self._tick(f"create_exclusive {self.basename(path)}")
        return self.inner.create_exclusive(path, data, durable=durable)

    def open_appender(self, path, *, create=True, bulk=False):
        self._tick(f"open_appender {self.basename(path)}")
        return _CrashingAppender(self, self.inner.open_appender(path, create=create, bulk=bulk))

    def truncate(self, path, size):
        self._tick(f"truncate {self.basename(path)}")
        self.inner.truncate(path, size)

    def rename(self, src, dst):
        self._tick(f"rename {self.basename(src)} -> {self.basename(dst)}")
        self.inner.rename(src, dst)

    def delete(self, path, *, missing_ok=True):
        self._tick(f"delete {self.basename(path)}")
        self.inner.delete(path, missing_ok=missing_ok)

    def delete_dir(self, path):
        self._tick("delete_dir")
        self.inner.delete_dir(path)

    def mkdirs(self, path):
        self._tick("mkdirs")
        self.inner.mkdirs(path)

    def sync_dir(self, path):
        self._tick("sync_dir")
        self.inner.sync_dir(path)

    def touch(self, path):
        self._tick(f"touch {self.basename(path)}")
        self.inner.touch(path)

    def write_at(self, path, positions, data, *, durable=True):
        self._tick(f"write_at {self.basename(path)}")
        self.inner.write_at(path, positions, data, durable=durable)


def copy_tree(fs: MemoryFileSystem, src: str, dst: str) -> None:
    for f in fs.listdir(src):
        if f.is_dir:
            copy_tree(fs, fs.join(src, f.name), fs.join(dst, f.name))
        else:
            fs.write_atomic(fs.join(dst, f.name), fs.read(fs.join(src, f.name)))


def live_logs(fs, root) -> dict[int, bytes]:
    d = fs.join(root, "t-0")
    out = {}
    for f in fs.listdir(d):
        p = parse_segment_file(f.name)
        if p is not None and not p.extra and p.suffix == ".log":
            out[p.base_offset] = fs.read(fs.join(d, f.name))
    return out


def read_all(lm, writable=True) -> list[tuple]:
    with lm.open_log(TP, writable=writable) as log:
        return [
            (
                r["offset"],
                r["timestamp"],
                r["key"],
                r["value"],
                tuple((h["key"], h["value"]) for h in r["headers"] or ()),
            )
            for b in log.read_records(0)
            for r in b.to_pylist()
        ]


def merged_groups(lm):
    """Many small segments, a cleaned section with stamped tombstones, then a dirty section."""
    for i in range(40):
        key = b"k%d" % (i % 6)
        append(
            lm,
            [(90_000 + i, key, None if i % 9 == 4 else b"v%d" % i * 8, [("h", b"%d" % i)])],
            ["none", "gzip", "lz4"][i % 3],
        )
    LogCleanerManager(lm).clean_partition(TP, 95_000, force=True)
    for i in range(25):
        append(lm, [(96_000 + i, b"k%d" % (i % 4), None if i == 7 else b"w%d" % i, [])], "zstd")
    roll(lm)


def overflowing_group(lm):
    """One-batch segments of tombstones: three fit one output by their size, but stamping the delete
    horizon makes every record's timestampDelta longer, so the third no longer fits."""
    for seg in range(9):
        append(lm, [(99_000, b"key-%d-%02d" % (seg, j), None, []) for j in range(6)])
        roll(lm)


def append(lm, recs, codec="none"):
    with lm.open_log(TP, writable=True) as log:
        log.append(kp_batch(recs, codec=codec))


def roll(lm):
    with lm.open_log(TP, writable=True) as log:
        log.roll()


@pytest.mark.parametrize(
    "workload,config",
    [
        (merged_groups, {"segment.bytes": "400", "delete.retention.ms": "2000", "index.interval.bytes": "100"}),
        (overflowing_group, {"segment.bytes": "520", "delete.retention.ms": "5000000000"}),
    ],
)
def test_crash_at_every_file_operation_recovers_old_or_new_per_group(workload, config):
    fs = MemoryFileSystem()
    base = f"/kl-crash-{uuid.uuid4().hex}"
    lm = LogManager(base, fs=fs)
    lm.create_topic("t", 1, {"cleanup.policy": "compact", **config})
    workload(lm)
    old = live_logs(fs, base)
    old_records = read_all(lm)

    ref_root = f"/kl-crash-{uuid.uuid4().hex}"
    copy_tree(fs, base, ref_root)
    counting = CrashingFS(fs)
    res = LogCleanerManager(LogManager(ref_root, fs=counting)).clean_partition(TP, NOW, force=True)
    assert res.ok, res.error
    assert len(res.groups) >= 2 and any(len(src) > 1 for _, src in res.groups)
    new = live_logs(fs, ref_root)
    if workload is overflowing_group:  # planned groups of three were cut where they would pass segment.bytes
        assert [len(src) for _, src in res.groups] == [2, 1] * 3
        assert all(len(data) <= 520 for data in new.values())
    survivors = read_all(LogManager(ref_root, fs=fs))
    assert set(survivors) <= set(old_records)
    assert len(survivors) < len(old_records) or workload is overflowing_group  # (that one only stamps)
    total = len(counting.ops)
    assert any(op.startswith("rename") for op in counting.ops) and total > 20

    for n in range(1, total + 1):
        root = f"/kl-crash-{uuid.uuid4().hex}"
        copy_tree(fs, base, root)
        with pytest.raises(Crash):
            LogCleanerManager(LogManager(root, fs=CrashingFS(fs, crash_at=n))).clean_partition(TP, NOW, force=True)
        lm2 = LogManager(root, fs=fs)
        seen = read_all(lm2, writable=False)  # a reader listing now (mid-swap) sees whole groups, old or new
        offsets = [r[0] for r in seen]
        assert offsets == sorted(set(offsets)), f"op {n}: a reader saw duplicate or unordered offsets"
        assert set(survivors) <= set(seen) <= set(old_records), f"op {n} ({counting.ops[n - 1]}): reader view"
        got = read_all(lm2)  # a writer's open completes or drops the interrupted swap
        live = live_logs(fs, root)
        grouped = set()
        for new_base, sources in res.groups:
            grouped.update(sources)
            if live.get(new_base) == new[new_base] and new[new_base] != old.get(new_base):
                assert not set(sources[1:]) & set(live), f"op {n} ({counting.ops[n - 1]}): mixed group {sources}"
            else:
                assert all(live.get(s) == old[s] for s in sources), (
                    f"op {n} ({counting.ops[n - 1]}): group {sources} is neither old nor new"
                )
        assert {b: live[b] for b in live if b not in grouped} == {b: old[b] for b in old if b not in grouped}
        offsets = [r[0] for r in got]
        assert offsets == sorted(set(offsets)), f"op {n}: duplicate or unordered offsets"
        assert set(survivors) <= set(got) <= set(old_records), f"op {n} ({counting.ops[n - 1]})"
        assert not [f.name for f in fs.listdir(fs.join(root, "t-0")) if f.name.endswith((".cleaned", ".swap"))]
        check_indexes(lm2, interval=int(config.get("index.interval.bytes", 4096)), cleaned=set())
        again = LogCleanerManager(lm2).clean_partition(TP, NOW, force=True)
        assert again.ok, again.error
        assert read_all(lm2) == survivors, f"op {n}: a later cleaning does not converge"
        fs.delete_dir(root)  # fsspec's memory store scans every file on exists(): keep it small
    fs.delete_dir(base)
    fs.delete_dir(ref_root)


def test_crash_during_swap_completion_at_load_recovers_old_or_new():
    """Kill the cleaning where it leaves a `.swap`, then kill the writer's load that completes it at each
    of its file operations; the next load still gives each group old or new, every record once."""
    fs = MemoryFileSystem()
    base = f"/kl-crash-{uuid.uuid4().hex}"
    lm = LogManager(base, fs=fs)
    lm.create_topic(
        "t",
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "400",
            "delete.retention.ms": "2000",
            "index.interval.bytes": "100",
        },
    )
    merged_groups(lm)
    old_records = read_all(lm)
    counting = CrashingFS(fs)
    ref_root = f"/kl-crash-{uuid.uuid4().hex}"
    copy_tree(fs, base, ref_root)
    LogCleanerManager(LogManager(ref_root, fs=counting)).clean_partition(TP, NOW, force=True)
    survivors = read_all(LogManager(ref_root, fs=fs))
    swap_points = [n for n, op in enumerate(counting.ops, 1) if op.startswith("rename") and ".swap" in op]
    assert swap_points
    loads = 0
    for n in swap_points:  # crash just after a swap step: a `.swap` and maybe `.deleted` originals are left
        root = f"/kl-crash-{uuid.uuid4().hex}"
        copy_tree(fs, base, root)
        with pytest.raises(Crash):
            LogCleanerManager(LogManager(root, fs=CrashingFS(fs, crash_at=n + 1))).clean_partition(TP, NOW, force=True)
        if not any(f.name.endswith(".log.swap") for f in fs.listdir(fs.join(root, "t-0"))):
            continue
        probe = CrashingFS(fs)
        snapshot = f"/kl-crash-{uuid.uuid4().hex}"
        copy_tree(fs, root, snapshot)
        read_all(LogManager(snapshot, fs=probe))
        fs.delete_dir(snapshot)
        for m in range(1, len(probe.ops) + 1):
            again = f"/kl-crash-{uuid.uuid4().hex}"
            copy_tree(fs, root, again)
            with pytest.raises(Crash):
                read_all(LogManager(again, fs=CrashingFS(fs, crash_at=m)))
            got = read_all(LogManager(again, fs=fs))
            loads += 1
            offsets = [r[0] for r in got]
            assert offsets == sorted(set(offsets)), f"cleaning op {n}, load op {m}: duplicate or unordered offsets"
            assert set(survivors) <= set(got) <= set(old_records), f"cleaning op {n}, load op {m} ({probe.ops[m - 1]})"
            assert not [f.name for f in fs.listdir(fs.join(again, "t-0")) if f.name.endswith(".swap")]
            fs.delete_dir(again)
        fs.delete_dir(root)
    assert loads >= 5
    fs.delete_dir(base)
    fs.delete_dir(ref_root)
