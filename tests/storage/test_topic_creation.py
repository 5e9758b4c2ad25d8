"""A new topic's partitions hold their first, empty segment files, as Kafka's topic creation leaves them
(`00000000000000000000.log`, `.index`, `.timeindex`), on filesystems that append in place; on an object
store no segment object exists until an append creates it.

The reference is Kafka's on-disk layout for a just-created partition, and kafka-python reading the
files after records are appended behind the empty segment.
"""

from __future__ import annotations

import io
import os
import uuid

import fsspec
import pyarrow as pa
from kafka.record import MemoryRecords

from kafkalog_ds.cli import main
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition

FIRST = ("00000000000000000000.log", "00000000000000000000.index", "00000000000000000000.timeindex")


def files_of(lm, tp):
    return {f.name: f.size for f in lm.fs.listdir(lm.partition_dir(tp)) if not f.is_dir}


def test_every_partition_starts_with_empty_segment_files(any_root):
    lm = LogManager(any_root)
    lm.create_topic("events", 3, {"segment.bytes": "1048576"})
    for tp in lm.partitions("events"):
        files = files_of(lm, tp)
        assert {n: files.get(n) for n in FIRST} == {n: 0 for n in FIRST}, files
        with lm.open_log(tp) as log:  # readers take the empty segment as the (empty) active one
            assert (log.log_start_offset, log.log_end_offset, log.size) == (0, 0, 0)
            assert [s.base_offset for s in log.segments] == [0]
            assert list(log.read_records(0)) == [] and log.offset_for_timestamp(0) is None


def test_several_log_dirs_each_partition_where_it_was_placed(tmp_path):
    dirs = [str(tmp_path / f"d{i}") for i in range(2)]
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("t", 4)
    for tp in lm.partitions("t"):
        assert set(FIRST) <= set(files_of(lm, tp))


def test_appends_go_into_the_first_segment_and_kafka_python_reads_them(any_root):
    lm = LogManager(any_root)
    lm.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    table = pa.table({"key": [b"a", None], "value": [b"1", b"2"], "timestamp": [1_700_000_000_000] * 2})
    with lm.open_log(tp, writable=True) as log:
        log.append(build_records(table))
    files = files_of(lm, tp)
    assert sorted(n for n in files if n.endswith(".log")) == [FIRST[0]] and files[FIRST[0]] > 0
    data = lm.fs.read(lm.fs.join(lm.partition_dir(tp), FIRST[0]))
    records = MemoryRecords(data)
    values = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        values += [r.value for r in batch]
    assert values == [b"1", b"2"]


def test_object_store_topic_has_no_segment_objects_until_an_append():
    fs = ObjectStoreFileSystem(fsspec.filesystem("memory"))
    root = f"/obj-{uuid.uuid4().hex}"
    lm = LogManager(root, fs=fs)
    lm.create_topic("t", 2)
    tp = TopicPartition("t", 0)
    assert not fs.isdir(lm.partition_dir(tp)) or files_of(lm, tp) == {}
    with lm.open_log(tp) as log:
        assert (log.log_end_offset, log.size) == (0, 0)


def test_readme_dump_log_of_an_untouched_partition(tmp_path, capsys, monkeypatch):
    """The README's sequence: one record produced (it goes to events-2), then dump-log of events-0."""
    monkeypatch.chdir(tmp_path)
    assert main(["topics", "./logs", "--create", "--topic", "events", "--partitions", "3"]) == 0
    rec = b'{"key": "user-1", "value": "hello", "headers": [["source", "cli"]]}\n'
    assert main(["produce", "./logs", "--topic", "events"], stdin=io.BytesIO(rec)) == 0
    assert "to events-2 " in capsys.readouterr().out
    assert not os.path.getsize("logs/events-0/00000000000000000000.log")
    rc = main(["dump-log", "./logs/events-0/00000000000000000000.log", "--print-data-log"])
    out = capsys.readouterr().out
    assert rc == 0 and out == "Dumping ./logs/events-0/00000000000000000000.log\nLog starting offset: 0\n"


def test_creating_many_partitions_fsyncs_each_directory_once(root, monkeypatch):
    """One fsync per new partition directory (after its three empty files exist), one for the topic file
    and one for the log dir: the empty files hold no data to flush. It was four per partition, which made
    a 10,000-partition topic take about a minute."""
    import storage.fs.local as lfs

    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(os.path.basename(path) if os.path.isdir(path) else "file:" + os.path.basename(path))
        real_fsync(fd)

    monkeypatch.setattr(lfs.os, "fsync", fsync)
    LogManager(root).create_topic("many", 40)
    monkeypatch.undo()
    assert sorted(n for n in synced if n.startswith("many-")) == sorted(f"many-{p}" for p in range(40))
    files = [n for n in synced if n.startswith("file:")]  # the topic file's bytes, before link(2) publishes them
    assert len(files) == 1 and files[0].startswith("file:many.kafkalog-topic.json"), files
    assert len(synced) == 40 + 2
    for p in range(40):
        assert set(files_of(LogManager(root), TopicPartition("many", p))) >= set(FIRST)
