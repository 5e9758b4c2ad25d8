"""`kafka.isolation.level` on the source, with no Spark session: parsed as Kafka's consumer parses isolation.level
(ConfigDef.ValidString.in(read_committed, read_uncommitted): exact spellings, default read_uncommitted), and an
explicit endingOffsets past what a read_committed reader may read is data loss naming the last stable offset.
Rows at each level are held to Kafka's own connector in test_kafka_connector_side_by_side.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from python_datasource.data_source import KafkaLogDataSource
from python_datasource.reader import KafkaLogBatchReader
from python_datasource.source_options import KAFKA_COLUMNS, SourceOptions
from storage.errors import DataLossError, InvalidConfigError
from storage.log_manager import LogManager
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition


def _opts(root, streaming=False, **extra):
    return SourceOptions.parse({"path": str(root), "subscribe": "t", **extra}, streaming=streaming)


def test_default_and_both_values(tmp_path):
    assert _opts(tmp_path).isolation_level == "read_uncommitted"
    for level in ("read_uncommitted", "read_committed"):
        for streaming in (False, True):
            assert _opts(tmp_path, streaming, **{"kafka.isolation.level": level}).isolation_level == level
    # Spark hands options over with lowercased keys: the value keeps its case
    assert _opts(tmp_path, **{"KAFKA.ISOLATION.LEVEL": "read_committed"}).isolation_level == "read_committed"


@pytest.mark.parametrize("value", ["READ_COMMITTED", "Read_Uncommitted", "committed", ""])
def test_other_spellings_are_refused_naming_the_option_and_values(tmp_path, value):
    with pytest.raises(InvalidConfigError) as e:
        _opts(tmp_path, **{"kafka.isolation.level": value})
    assert "kafka.isolation.level" in str(e.value)
    assert "read_committed" in str(e.value) and "read_uncommitted" in str(e.value)
    # schema() checks it too (where Spark reports an error as it is), and a stream fails from initialOffset()
    with pytest.raises(InvalidConfigError):
        KafkaLogDataSource({"path": str(tmp_path), "subscribe": "t", "kafka.isolation.level": value}).schema()


def test_an_end_past_the_last_stable_offset_is_data_loss(tmp_path):
    root = tmp_path / "logs"
    lm = LogManager(str(root))
    lm.get_or_create_topic("t", partitions=1)
    with lm.open_log(TopicPartition("t", 0), writable=True) as log:
        log.append(build_records(pa.table({"key": [b"a", b"b"], "value": [b"1", b"2"], "timestamp": [1, 2]})))
        lso = log.last_stable_offset
    ending = {"endingOffsets": json.dumps({"t": {"0": lso + 3}}), "kafka.isolation.level": "read_committed"}
    with pytest.raises(DataLossError, match=f"beyond its last stable offset {lso}"):
        KafkaLogBatchReader(_opts(root, **ending), KAFKA_COLUMNS[:-1]).partitions()
    kept = KafkaLogBatchReader(_opts(root, failOnDataLoss="false", **ending), KAFKA_COLUMNS[:-1]).partitions()
    assert [(p.start, p.end) for p in kept] == [(0, lso)]
