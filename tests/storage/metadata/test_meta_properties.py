"""A task that sees another directory under ROOT's path than the driver (a local path on a cluster
whose nodes do not share it) stops before writing or reading anything.

The "other node" is simulated by replacing the directory's kafkalog.meta.properties after the driver
read it; the reference for what was written is a listing of the directory and kafka-python-free counts.
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from python_datasource.options import SinkOptions
from python_datasource.reader import KafkaLogInputPartition, read_range
from python_datasource.writer import KafkaLogStreamWriter
from storage.errors import KafkaStorageError
from storage.fs.local import LocalFileSystem
from storage.metadata.meta_properties import META_PROPERTIES_FILE, directory_id


def test_the_id_is_made_once_and_kept(root):
    """Racing creators (two queries starting at once) agree on one id, and no reader ever sees the file
    before its bytes (local create_exclusive publishes a whole temp file with link(2))."""
    fs = LocalFileSystem()
    assert directory_id(fs, root) is None
    for round_ in range(30):
        d = os.path.join(root, str(round_))
        ids, errors = [], []

        def make(ids=ids, d=d, errors=errors):
            try:
                ids.append(directory_id(fs, d, create=True))
            except Exception as e:  # noqa: BLE001 - a reader that saw the file before its bytes
                errors.append(e)

        threads = [threading.Thread(target=make) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(ids) == 8
        assert len(set(ids)) == 1 and len(ids[0]) == 32
        assert directory_id(fs, d, create=True) == ids[0]
    with open(os.path.join(root, "0", META_PROPERTIES_FILE), "w") as f:
        f.write("version=0\n" + "x" * 100_000)
    with pytest.raises(KafkaStorageError, match="directory.id"):
        directory_id(fs, os.path.join(root, "0"))


def other_node(root: str) -> None:
    """What a node that does not share the driver's filesystem sees at the same path: another directory."""
    os.remove(os.path.join(root, META_PROPERTIES_FILE))
    directory_id(LocalFileSystem(), root, create=True)


def test_a_sink_task_on_another_directory_writes_nothing(root):
    writer = KafkaLogStreamWriter(SinkOptions.parse({"path": root, "topic": "t"}), 5)
    LocalFileSystem().mkdirs(root)
    other_node(root)
    before = sorted(os.listdir(root))
    rows = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary())})
    with pytest.raises(KafkaStorageError, match=r"not the one the driver uses.*docs/spark.md"):
        writer.write(iter([rows]))
    assert sorted(os.listdir(root)) == before


def test_a_read_task_on_another_directory_reads_nothing(root):
    writer = KafkaLogStreamWriter(SinkOptions.parse({"path": root, "topic": "t"}), 5)
    rows = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary())})
    writer.commit([writer.write(iter([rows]))], 0)
    part = KafkaLogInputPartition("t", 0, 0, 2, directory_id=writer.directory_id)
    assert sum(b.num_rows for b in read_range(root, part, ("value",), True)) == 2
    other_node(root)
    with pytest.raises(KafkaStorageError, match="not the one the driver uses"):
        list(read_range(root, part, ("value",), True))
