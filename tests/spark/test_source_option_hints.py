"""Reader option messages, without a SparkSession: a bad startingOffsets / endingOffsets word names the
accepted forms, and a read warns about a misspelled option once.

Spark parses a read's options in several Python processes (seen with pyspark 4.3): create_data_source.py
calls DataSource.schema() (unless the user gave a schema), then plan_data_source_read.py calls reader()
or streamReader(); a stream's python_streaming_source_runner.py calls streamReader() again and asks that
reader for offsets. Only reader(), or the stream reader asked for offsets, warns. The tests make these
calls in that order, as Spark does.
"""

from __future__ import annotations

import logging

import pytest

from python_datasource.data_source import KafkaLogDataSource
from python_datasource.reader import kafka_struct
from python_datasource.source_options import SourceOptions
from storage.errors import InvalidConfigError
from storage.log_manager import LogManager

FORM = 'a JSON object of offsets per partition like {"topicA":{"0":23,"1":-1}}'


def source(**options):
    return {"path": "/nowhere", "subscribe": "t", **options}


@pytest.mark.parametrize(
    ("key", "value", "streaming", "words"),
    [
        ("startingOffsets", "begin", False, "'earliest'"),
        ("startingOffsets", "beginning", True, "'earliest' or 'latest'"),
        ("startingOffsets", "EARLY", None, "'earliest' or 'latest'"),
        ("endingOffsets", "end", False, "'latest'"),
        ("startingOffsets", "[1]", False, "'earliest'"),
    ],
)
def test_a_bad_offsets_word_names_the_accepted_forms(key, value, streaming, words):
    with pytest.raises(InvalidConfigError) as e:
        SourceOptions.parse(source(**{key: value}), streaming=streaming)
    assert str(e.value) == f"option '{key}' is {value!r}: expected {words}, or {FORM}"
    assert "JSON: Expecting value" not in str(e.value)


def test_malformed_json_offsets_keep_the_json_error_and_name_the_forms():
    with pytest.raises(InvalidConfigError) as e:
        SourceOptions.parse(source(startingOffsets="{nope"), streaming=False)
    message = str(e.value)
    assert message.startswith("option 'startingOffsets' is not valid JSON: Expecting property name")
    assert message.endswith(f"(expected 'earliest', or {FORM})")


def test_the_accepted_words_still_parse():
    assert SourceOptions.parse(source(startingOffsets="Earliest"), streaming=False).starting.default == -2
    assert SourceOptions.parse(source(startingOffsets=" latest "), streaming=True).starting.default == -1
    assert SourceOptions.parse(source(endingOffsets="latest"), streaming=False).ending.default == -1


def _did_you_mean(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did you mean" in r.getMessage()]


MISSPELLED = (
    "option 'startingoffset' is not an option of format('kafkalog') source and is ignored; "
    "did you mean startingOffsets?"
)


def test_a_misspelled_option_warns_once_per_batch_read(caplog):
    ds = KafkaLogDataSource(options=source(startingOffset="earliest"))
    with caplog.at_level(logging.WARNING):
        ds.schema()  # pyspark's create_data_source.py; Spark passes its StructType on to planning:
        ds.reader(kafka_struct())  # plan_data_source_read.py
    assert _did_you_mean(caplog) == [MISSPELLED]


def test_a_misspelled_option_warns_once_per_stream(caplog, tmp_path):
    LogManager(str(tmp_path)).create_topic("t", 1)
    ds = KafkaLogDataSource(options={**source(startingOffset="earliest"), "path": str(tmp_path)})
    with caplog.at_level(logging.WARNING):
        ds.schema()  # create_data_source.py
        ds.streamReader(kafka_struct())  # plan_data_source_read.py: kept for its read(), asked no offsets
        runner = ds.streamReader(kafka_struct())  # python_streaming_source_runner.py: asked for offsets
        assert _did_you_mean(caplog) == []
        runner.initialOffset()
        runner.latestOffset()
        runner.latestOffset()
    assert _did_you_mean(caplog) == [MISSPELLED]


def test_schema_alone_checks_options_without_warning(caplog):
    with caplog.at_level(logging.WARNING):
        KafkaLogDataSource(options=source(startingOffset="earliest", **{"kafka.group.id": "g"})).schema()
    assert caplog.records == []
    with pytest.raises(InvalidConfigError, match="startingOffsets"):  # errors are still raised there
        KafkaLogDataSource(options=source(startingOffsets="begin")).schema()
