import os
import uuid

import pytest

import storage.metadata.checkpoint as checkpoint_mod
from storage.errors import CorruptCheckpointError, KafkaLogError, KafkaStorageError
from storage.fs.local import LocalFileSystem
from storage.fs.memory import MemoryFileSystem
from storage.metadata.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    OffsetCheckpointFile,
    parse_checkpoint,
)
from storage.topic_partition import TopicPartition

# What a Kafka broker leaves in a log dir (hand-written in Kafka's CheckpointFile layout).
KAFKA_TEXT = b"0\n4\n__consumer_offsets 13 0\nmy-topic 0 100\nmy-topic 1 42\nevents.v2 7 9223372036854775807\n"
SORTED_TEXT = b"0\n4\n__consumer_offsets 13 0\nevents.v2 7 9223372036854775807\nmy-topic 0 100\nmy-topic 1 42\n"
KAFKA_ENTRIES = {("__consumer_offsets", 13): 0, ("my-topic", 0): 100, ("my-topic", 1): 42, ("events.v2", 7): 2**63 - 1}


@pytest.fixture(params=["local", "memory"])
def fs_dir(request, tmp_path):
    if request.param == "local":
        yield LocalFileSystem(), str(tmp_path)
        return
    fs = MemoryFileSystem()
    path = f"/ckpt-test-{uuid.uuid4().hex}"
    fs.mkdirs(path)
    yield fs, path
    fs.delete_dir(path)


def test_file_names_are_kafkas():
    assert RECOVERY_POINT_CHECKPOINT_FILE == "recovery-point-offset-checkpoint"
    assert LOG_START_OFFSET_CHECKPOINT_FILE == "log-start-offset-checkpoint"
    assert CLEANER_OFFSET_CHECKPOINT_FILE == "cleaner-offset-checkpoint"


def test_reads_kafka_text(fs_dir):
    fs, root = fs_dir
    path = fs.join(root, RECOVERY_POINT_CHECKPOINT_FILE)
    fs.write_atomic(path, KAFKA_TEXT)
    got = OffsetCheckpointFile(fs, path).read()
    assert got == KAFKA_ENTRIES
    assert all(isinstance(k, TopicPartition) for k in got)
    assert got[TopicPartition("my-topic", 1)] == 42


def test_round_trip_and_exact_bytes(fs_dir):
    fs, root = fs_dir
    path = fs.join(root, CLEANER_OFFSET_CHECKPOINT_FILE)
    ck = OffsetCheckpointFile(fs, path)
    ck.write(KAFKA_ENTRIES)
    assert fs.read(path) == SORTED_TEXT  # sorted by topic, then partition; newline-terminated lines
    assert ck.read() == KAFKA_ENTRIES
    ck.write({TopicPartition("t", 0): -1})
    assert ck.read() == {("t", 0): -1}
    ck.write({})
    assert fs.read(path) == b"0\n0\n" and ck.read() == {}
    names = sorted(f.name for f in fs.listdir(root))
    assert names == [CLEANER_OFFSET_CHECKPOINT_FILE]  # no temp files left behind


def test_missing_and_empty_files_read_as_empty(fs_dir):
    fs, root = fs_dir
    path = fs.join(root, LOG_START_OFFSET_CHECKPOINT_FILE)
    assert OffsetCheckpointFile(fs, path).read() == {}
    fs.write_atomic(path, b"")
    assert OffsetCheckpointFile(fs, path).read() == {}
    fs.write_atomic(path, b"0\n")  # version only: Kafka reads it as empty too
    assert OffsetCheckpointFile(fs, path).read() == {}


def test_write_goes_through_write_atomic():
    calls = []

    class Recording(MemoryFileSystem):
        def write_atomic(self, path, data, *, durable=True):
            calls.append((path, bytes(data), durable))
            super().write_atomic(path, data, durable=durable)

    fs = Recording()
    path = f"/ckpt-{uuid.uuid4().hex}/x"
    OffsetCheckpointFile(fs, path).write({("a", 1): 5}, durable=False)
    assert calls == [(path, b"0\n1\na 1 5\n", False)]
    fs.delete(path)


def test_local_write_replaces_atomically(tmp_path):
    fs = LocalFileSystem()
    path = str(tmp_path / RECOVERY_POINT_CHECKPOINT_FILE)
    ck = OffsetCheckpointFile(fs, path)
    ck.write({("a", 0): 1})
    inode = os.stat(path).st_ino
    ck.write({("a", 0): 2})
    assert os.stat(path).st_ino != inode  # a new file renamed over the old, not rewritten in place
    assert ck.read() == {("a", 0): 2}


def test_crlf_and_extra_spaces_are_tolerated():
    assert parse_checkpoint(b"0\r\n1\r\nt  3\t7\r\n") == {("t", 3): 7}


@pytest.mark.parametrize(
    "text,line,what",
    [
        (b"1\n0\n", 1, "version"),
        (b"x\n0\n", 1, "version"),
        (b" 0\n0\n", 1, "version"),
        (b"0\n-1\n", 2, "count"),
        (b"0\nabc\n", 2, "count"),
        (b"0\n1\nt 0\n", 3, "topic partition offset"),
        (b"0\n1\nt 0 1 2\n", 3, "topic partition offset"),
        (b"0\n2\nt 0 1\nt x 1\n", 4, "partition"),
        (b"0\n1\nt -1 1\n", 3, "partition"),
        (b"0\n1\nt 2147483648 1\n", 3, "partition"),
        (b"0\n1\nt 0 1.5\n", 3, "offset"),
        (b"0\n1\nt 0 9223372036854775808\n", 3, "offset"),
        (b"0\n1\nbad/topic 0 1\n", 3, "topic"),
        (b"0\n2\nt 0 1\nt 0 2\n", 4, "duplicate"),
        (b"0\n2\nt 0 1\n\n", 4, "topic partition offset"),
    ],
)
def test_malformed_lines_name_file_and_line(text, line, what):
    with pytest.raises(CorruptCheckpointError) as ei:
        parse_checkpoint(text, source="/logs/recovery-point-offset-checkpoint")
    msg = str(ei.value)
    assert "/logs/recovery-point-offset-checkpoint" in msg and f"line {line}" in msg and what in msg
    assert ei.value.line == line
    assert isinstance(ei.value, KafkaStorageError) and isinstance(ei.value, KafkaLogError)


@pytest.mark.parametrize(
    "text,expected,found",
    [
        (b"0\n3\nt 0 1\nt 1 1\n", 3, 2),
        (b"0\n1\nt 0 1\nt 1 1\n", 1, 2),
        (b"0\n1\n", 1, 0),
    ],
)
def test_entry_count_mismatch(text, expected, found):
    with pytest.raises(CorruptCheckpointError, match=f"expected {expected} entries but found {found}"):
        parse_checkpoint(text, source="f")


def test_not_utf8(fs_dir):
    fs, root = fs_dir
    path = fs.join(root, "cp")
    fs.write_atomic(path, b"0\n1\n\xff 0 1\n")
    with pytest.raises(CorruptCheckpointError, match="not UTF-8") as ei:
        OffsetCheckpointFile(fs, path).read()
    assert fs.url(path) in str(ei.value)


def test_oversized_file_refused_before_reading(fs_dir, monkeypatch):
    fs, root = fs_dir
    path = fs.join(root, "cp")
    fs.write_atomic(path, KAFKA_TEXT)
    monkeypatch.setattr(checkpoint_mod, "MAX_CHECKPOINT_BYTES", 10)
    with pytest.raises(CorruptCheckpointError, match="exceeds"):
        OffsetCheckpointFile(fs, path).read()


@pytest.mark.parametrize(
    "entries",
    [
        {("bad topic", 0): 1},
        {("", 0): 1},
        {("t", -1): 1},
        {("t", 2**31): 1},
        {("t", 0): 2**63},
        {("t", 0): 1.0},
        {("t", True): 1},
    ],
)
def test_write_rejects_bad_entries(entries, tmp_path):
    ck = OffsetCheckpointFile(LocalFileSystem(), str(tmp_path / "cp"))
    with pytest.raises(ValueError):
        ck.write(entries)
    assert not (tmp_path / "cp").exists()


def test_many_entries_round_trip(tmp_path):
    entries = {(f"topic-{i % 17}", i): i * 1000 + 7 for i in range(2000)}
    ck = OffsetCheckpointFile(LocalFileSystem(), str(tmp_path / "cp"))
    ck.write(entries)
    assert ck.read() == entries
    lines = (tmp_path / "cp").read_text().splitlines()
    assert lines[:2] == ["0", "2000"] and len(lines) == 2002
