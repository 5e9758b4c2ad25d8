"""Options, schemas and topic choice as Spark's Kafka connector has them (no SparkSession needed).

The connector's rules (apache/spark connector/kafka-0-10-sql, KafkaSourceProvider.scala): unknown
options are accepted and ignored; some kafka.* options are refused with its reasons; a topic pattern
matches where it is found in the name; min > max offsets per trigger is an error; streams refuse the
ending offsets and ignore endingTimestamp; batch reads ignore the per-trigger options with a warning.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from python_datasource.data_source import KafkaLogDataSource
from python_datasource.options import SinkOptions
from python_datasource.planning import OffsetRange, split, topic_partitions
from python_datasource.reader import FailedStreamReader, KafkaLogStreamReader, selected_columns
from python_datasource.source_options import SourceOptions
from storage.errors import InvalidConfigError
from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.topic_partition import TopicPartition


def source(**options):
    return {"path": "/nowhere", "subscribe": "t", **options}


@pytest.mark.parametrize(
    "name",
    [
        "checkpointLocation",
        "groupIdPrefix",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "spark.streaming.kafka.maxRatePerPartition",
        "kafka.bootstrap.servers",
        "someJobSpecificThing",
    ],
)
def test_options_the_connector_takes_and_ignores_are_ignored(name, caplog):
    with caplog.at_level(logging.WARNING):
        opts = SourceOptions.parse(source(**{name: "1"}), streaming=True)
    assert opts.subscribe == ("t",) and not [r for r in caplog.records if "did you mean" in r.getMessage()]


def test_a_near_miss_of_an_option_gets_a_warning_naming_ours_as_documented(caplog):
    with caplog.at_level(logging.WARNING):
        SourceOptions.parse(source(startingoffset="earliest"), streaming=False)
        SinkOptions.parse({"path": "/nowhere", "topic": "t", "segmentbytes": "3", "locktimeout": "5"})
    messages = [r.getMessage() for r in caplog.records]
    assert any("'startingoffset'" in m and "did you mean startingOffsets" in m for m in messages)
    assert any("did you mean segment.bytes" in m for m in messages)
    assert any("did you mean lockTimeoutMs" in m for m in messages)


@pytest.mark.parametrize(
    "name, words",
    [
        (
            "kafka.auto.offset.reset",
            "'auto.offset.reset' is not supported. Instead set the source option 'startingoffsets'",
        ),
        ("kafka.key.deserializer", "'key.deserializer' is not supported as keys are deserialized as byte arrays"),
        ("kafka.value.deserializer", "'value.deserializer' is not supported as values are deserialized"),
        ("kafka.enable.auto.commit", "Kafka option 'enable.auto.commit' is not supported"),
        ("kafka.interceptor.classes", "Kafka option 'interceptor.classes' is not supported"),
    ],
)
def test_kafka_options_the_source_refuses_are_refused_with_its_reasons(name, words):
    with pytest.raises(InvalidConfigError, match=words.replace("(", r"\(").replace(".", r"\.")):
        SourceOptions.parse(source(**{name: "x"}), streaming=False)


@pytest.mark.parametrize("name", ["kafka.key.serializer", "kafka.value.serializer"])
def test_kafka_options_the_sink_refuses_are_refused(name):
    with pytest.raises(InvalidConfigError, match="is not supported as .* serialized with ByteArraySerializer"):
        SinkOptions.parse({"path": "/nowhere", "topic": "t", name: "x"})
    SinkOptions.parse({"path": "/nowhere", "topic": "t", "kafka.bootstrap.servers": "x", "kafka.acks": "all"})


def test_stream_only_and_batch_only_options(caplog):
    with pytest.raises(InvalidConfigError, match="ending offset not valid in streaming queries"):
        SourceOptions.parse(source(endingOffsets="latest"), streaming=True)
    with pytest.raises(InvalidConfigError, match="ending timestamp not valid in streaming queries"):
        SourceOptions.parse(source(endingOffsetsByTimestamp='{"t":{"0":5}}'), streaming=True)
    with caplog.at_level(logging.WARNING):
        SourceOptions.parse(source(endingTimestamp="5"), streaming=True)  # not read by streams, as there
        batch = SourceOptions.parse(source(maxOffsetsPerTrigger="5", maxTriggerDelay="1m"), streaming=False)
    messages = [r.getMessage() for r in caplog.records]
    assert "maxOffsetsPerTrigger option ignored in batch queries" in messages
    assert "maxTriggerDelay option ignored in batch queries" in messages
    assert any("endingTimestamp" in m for m in messages)
    assert batch.ending.default == -1


@pytest.mark.parametrize("streaming", [True, False, None])
def test_min_offsets_above_max_is_an_error_for_streams_and_batches(streaming):
    with pytest.raises(
        InvalidConfigError,
        match=r"minOffsetsPerTrigger\(9\) is higher than the "
        r"maxOffsetsPerTrigger\(5\)",
    ):
        SourceOptions.parse(source(maxOffsetsPerTrigger="5", minOffsetsPerTrigger="9"), streaming=streaming)
    assert (
        SourceOptions.parse(
            source(maxOffsetsPerTrigger="5", minOffsetsPerTrigger="5"), streaming=streaming
        ).min_offsets_per_trigger
        == 5
    )


def test_a_topic_pattern_matches_where_it_is_found_and_internal_topics_are_never_read(tmp_path):
    lm = LogManager(str(tmp_path / "logs"))
    for t in ("events", "old-events-2023", "metrics", "__consumer_offsets"):
        lm.create_topic(t, 1)

    def topics(**o):
        opts = SourceOptions.parse({"path": lm.root, **o}, streaming=False)
        return sorted({tp.topic for tp in topic_partitions(lm, opts)})

    assert topics(subscribePattern="events") == ["events", "old-events-2023"]  # Regex.findFirstIn
    assert topics(subscribePattern="^events$") == ["events"]
    assert topics(subscribePattern=".*") == ["events", "metrics", "old-events-2023"]
    assert topics(subscribe="__consumer_offsets,metrics") == ["metrics"]
    assert topics(assign='{"__consumer_offsets":[0],"metrics":[0]}') == ["metrics"]
    with pytest.raises(InvalidConfigError, match="Pattern to subscribe is empty"):
        topics(subscribePattern="  ")


def test_max_records_per_partition_cuts_ranges():
    rs = split(None, [OffsetRange("t", 0, 10, 35), OffsetRange("t", 1, 0, 4)], None, 10)
    assert [(r.partition, r.start, r.end) for r in rs] == [(0, 10, 18), (0, 18, 26), (0, 26, 35), (1, 0, 4)]
    assert all(r.end - r.start <= 10 for r in rs)


def struct(*fields):
    """A StructType as Spark hands a user-specified schema to reader(schema)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {
        "binary": BinaryType(),
        "long": LongType(),
        "int": IntegerType(),
        "string": StringType(),
        "timestamp": TimestampType(),
        "headers": ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
    }
    return StructType([StructField(name, types[t]) for name, t in fields])


@pytest.mark.parametrize(
    "schema, columns",
    [
        (None, ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")),
        (struct(("value", "binary"), ("offset", "long")), ("value", "offset")),
        (struct(("headers", "headers"), ("key", "binary")), ("headers", "key")),
        (struct(("timestamp", "timestamp")), ("timestamp",)),
    ],
)
def test_a_user_schema_selects_kafka_columns(schema, columns):
    assert selected_columns(schema, False) == columns


@pytest.mark.parametrize(
    "schema, shown",
    [
        (struct(("value", "string")), "value string"),
        (struct(("value", "binary"), ("foo", "int")), "foo int"),
        (struct(("offset", "int")), "offset int"),
    ],
)
def test_a_user_schema_of_other_names_or_types_is_refused_listing_the_allowed_ones(schema, shown):
    with pytest.raises(InvalidConfigError, match=f"with their Kafka types: key binary, value binary, .*got {shown}"):
        selected_columns(schema, False)


def test_an_invalid_stream_option_fails_from_initial_offset_not_from_stream_reader():
    """pyspark 4.3's stream runner hides an exception from streamReader() behind UnboundLocalError."""
    ds = KafkaLogDataSource({"path": "/nowhere", "subscribe": "t", "endingOffsets": "latest"})
    reader = ds.streamReader(None)
    assert isinstance(reader, FailedStreamReader)
    with pytest.raises(InvalidConfigError, match="ending offset not valid in streaming queries"):
        reader.initialOffset()
    assert isinstance(
        KafkaLogDataSource({"path": "/nowhere", "subscribe": "t"}).streamReader(None), KafkaLogStreamReader
    )
    with pytest.raises(InvalidConfigError, match="minOffsetsPerTrigger"):  # and schema() reports it as it is
        KafkaLogDataSource(
            {"path": "/p", "subscribe": "t", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "1"}
        ).schema()


def test_the_topic_option_overrides_the_topic_column(tmp_path):
    lm = LogManager(str(tmp_path / "logs"))
    stager = RecordStager(lm, 7, topic="chosen", compression=CompressionType.NONE)
    stager.add(pa.table({"value": [b"a", b"b"], "topic": ["elsewhere", None]}))
    from storage.staging.staged_commit import commit_staged

    commit_staged(lm, 7, 0, [stager.finish()], ephemeral=True)
    assert lm.topics() == ["chosen"]
    with lm.open_log(TopicPartition("chosen", 0)) as log:
        assert [v for b in log.read_records(0) for v in b.column("value").to_pylist()] == [b"a", b"b"]


def test_a_missing_topic_fails_and_an_empty_read_says_why(tmp_path, caplog):
    """As Spark's Kafka source (tests/spark/test_kafka_connector_side_by_side.py runs both): a subscribed or
    assigned topic that is not there fails the read, batch or stream, naming the topics that are; an
    assigned partition the topic lacks is not read, and a pattern matching nothing reads nothing, each
    with a warning saying so; a batch read of a ROOT that does not exist fails."""
    from storage.errors import UnknownTopicOrPartitionError

    lm = LogManager(str(tmp_path / "logs"))
    lm.create_topic("events", 2)

    def tps(streaming, **o):
        return topic_partitions(
            lm, SourceOptions.parse({"path": lm.root, **o}, streaming=streaming), batch=not streaming
        )

    for streaming in (False, True):
        with pytest.raises(
            UnknownTopicOrPartitionError, match="nosuch do not exist .*topics there: events.*subscribePattern"
        ):
            tps(streaming, subscribe="events,nosuch")
        with pytest.raises(UnknownTopicOrPartitionError, match="nosuch do not exist"):
            tps(streaming, assign='{"nosuch":[0]}')
    with caplog.at_level(logging.WARNING):
        assert tps(False, assign='{"events":[1,7]}') == [TopicPartition("events", 1)]
        assert tps(False, subscribePattern="^x") == []
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "events-7 do not exist" in messages
    assert "no topic in" in messages and "'^x'" in messages
    nowhere = LogManager(str(tmp_path / "typo"))
    with pytest.raises(UnknownTopicOrPartitionError, match="typo does not exist"):
        topic_partitions(
            nowhere, SourceOptions.parse({"path": nowhere.root, "subscribe": "t"}, streaming=False), batch=True
        )
    assert (
        topic_partitions(
            nowhere, SourceOptions.parse({"path": nowhere.root, "subscribePattern": "^t$"}, streaming=True)
        )
        == []
    )


def test_the_zstd_level_is_the_producers_or_else_the_topics(tmp_path):
    """compression.zstd.level (Kafka's producer and topic config, KIP-390) decides how hard the sink
    compresses: the option when given, else the topic's setting, else Kafka's 3. Checked by the stored
    sizes against pyarrow's zstd at those levels, and by reading the records back."""
    import numpy as np

    from storage.staging.staged_commit import commit_staged

    assert SinkOptions.parse({"path": "/p", "compression.type": "zstd"}).compression_level is None
    assert (
        SinkOptions.parse({"path": "/p", "compression.type": "zstd", "compression.zstd.level": "1"}).compression_level
        == 1
    )
    with pytest.raises(InvalidConfigError, match="compression.zstd.level"):
        SinkOptions.parse({"path": "/p", "compression.type": "zstd", "compression.zstd.level": "99"})
    rng = np.random.default_rng(5)
    values = [bytes(rng.integers(0, 4, 300, dtype=np.uint8)) + b"0" * 200 for _ in range(3000)]

    def stored(topic, config, level):
        lm = LogManager(str(tmp_path / topic))
        lm.create_topic(topic, 1, config)
        st = RecordStager(lm, 7, topic=topic, compression=CompressionType.ZSTD, compression_level=level)
        st.add(pa.table({"value": values}))
        commit_staged(lm, 7, 0, [st.finish()], ephemeral=True)
        with lm.open_log(TopicPartition(topic, 0)) as log:
            assert [v for b in log.read_records(0) for v in b.column("value").to_pylist()] == values
            return log.size

    fast, slow = stored("a", {}, 1), stored("b", {}, 19)
    by_topic, default = stored("c", {"compression.zstd.level": "19"}, None), stored("d", {}, None)
    assert slow < fast and by_topic == slow  # the topic's level applies when the producer sets none
    assert default == stored("e", {}, 3) and default not in (fast, slow)
