"""ROOT kinds that cannot be written safely are refused before anything is written (docs/spark.md,
"Where the data may live"): fsspec stores with neither locks nor an atomic create-only write (HDFS
through pyarrow, and any store kafkalog does not know), and an hdfs:// ROOT this machine cannot open.
"""

from __future__ import annotations

import json
import os

import fsspec
import pytest

from storage.errors import KafkaStorageError
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.topic_partition import TopicPartition


def test_a_store_without_locks_or_create_only_writes_is_read_only(tmp_path):
    """An fsspec filesystem with no known create-only write (here fsspec's own local one, seen as an
    unknown store): topic creation and writers are refused; a log written elsewhere still reads."""
    root = str(tmp_path / "logs")
    LogManager(root).create_topic("t", 1)  # written by a capable filesystem
    before = sorted(os.listdir(root))
    lm = LogManager(root, fs=ObjectStoreFileSystem(fsspec.filesystem("file")))
    with pytest.raises(KafkaStorageError, match="no atomic create-only write"):
        lm.create_topic("u", 1)
    with pytest.raises(KafkaStorageError, match="neither append with locks nor create-only writes"):
        lm.open_log(TopicPartition("t", 0), writable=True)
    assert sorted(os.listdir(root)) == before
    assert json.loads((tmp_path / "logs" / "t.kafkalog-topic.json").read_text())["partitions"] == 1
    with lm.open_log(TopicPartition("t", 0)) as log:
        assert log.log_end_offset == 0


def test_an_hdfs_root_that_cannot_be_opened_says_so():
    with pytest.raises(KafkaStorageError, match=r"hdfs://127\.0\.0\.1:1/logs.*'hdfs'"):
        LogManager("hdfs://127.0.0.1:1/logs").topics()
