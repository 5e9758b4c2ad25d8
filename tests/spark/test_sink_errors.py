"""How the sink's errors reach a Spark user (docs/spark.md, "What Spark prints when a write fails"), with no
SparkSession: what DataSource.writer() / streamWriter() refuse on the driver before any task runs, the one
frame of ours pyspark shows before a message, and a row a task cannot write handed to the driver's commit,
which raises it once, instead of failing (and retrying) the task."""

from __future__ import annotations

import os
import pickle
import traceback

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from python_datasource.data_source import KafkaLogDataSource
from python_datasource.writer import KafkaLogCommitMessage
from storage.errors import InvalidConfigError
from storage.log_manager import LogManager
from storage.staging.record_stager import COALESCE_ROWS
from storage.topic_partition import TopicPartition

SCHEMA = StructType([StructField("value", StringType()), StructField("partition", IntegerType())])


def sink(root, **options):
    return KafkaLogDataSource({"path": root, "topic": "events", "checkpointLocation": root + "-ckpt", **options})


def make_writer(source, streaming: bool):
    return source.streamWriter(SCHEMA, False) if streaming else source.writer(SCHEMA, False)


def our_frames(error: BaseException) -> list[tuple[str, str]]:
    """The frames of the error's traceback below the test's own (pyspark's worker drops its own frames above
    them: spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled)."""
    return [(os.path.basename(f.filename), f.name) for f in traceback.extract_tb(error.__traceback__)[1:]]


def staging_dirs(root) -> list[str]:
    return [n for n in os.listdir(root) if n.startswith(".kafkalog-staged-")] if os.path.isdir(root) else []


def test_overwrite_is_refused_naming_mode_append(root):
    """Spark's refusal of save() with no mode suggests "Append" or "Overwrite": ours of Overwrite says what works."""
    with pytest.raises(
        InvalidConfigError, match=r'^Save mode Overwrite not allowed for kafkalog: use \.mode\("append"\)'
    ):
        sink(root).writer(SCHEMA, True)
    assert not os.path.exists(root)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    "options, schema, words",
    [
        ({"compression.type": "brotli"}, SCHEMA, "option 'compression.type': unknown compression type 'brotli'"),
        (
            {},
            StructType([StructField("value", StringType()), StructField("partition", StringType())]),
            "column 'partition' has type string",
        ),
        ({"partitions": "8"}, SCHEMA, "option 'partitions' is 8 but topic 'events' exists with 1 partition"),
    ],
)
def test_what_needs_no_row_is_refused_on_the_driver_with_one_frame(root, streaming, options, schema, words):
    """DataSource.writer() / streamWriter() run on the driver before any task: options, column types and an
    explicit `partitions` that an existing topic does not have fail there, and the error leaves with one frame
    of ours (pyspark shows it above the message), no chained cause, and the message once."""
    LogManager(root).create_topic("events", 1)
    source = sink(root, **options)
    with pytest.raises(InvalidConfigError, match=words) as info:
        source.streamWriter(schema, False) if streaming else source.writer(schema, False)
    error = info.value
    assert our_frames(error) == [("errors.py", "kafkalog_error")]
    assert error.__cause__ is None and error.__suppress_context__
    assert "".join(traceback.format_exception(error)).count(words) == 1
    assert LogManager(root).topic("events").partitions == 1


def test_an_explicit_partitions_option_makes_a_new_topic_and_agrees_with_it(root):
    make_writer(sink(root, partitions="3"), False)
    assert LogManager(root).topic("events").partitions == 3
    make_writer(sink(root, partitions="3"), True)  # the same count again: no error
    make_writer(sink(root), False)  # no option: any count


def out_of_range(consumed: list):
    """A task's input whose first batch names partition 7, big enough to be routed at once (COALESCE_ROWS), then
    a good batch; `consumed` gets an entry once the task has read to the end."""
    yield pa.record_batch({"value": ["v"] * COALESCE_ROWS, "partition": pa.array([7] * COALESCE_ROWS, pa.int32())})
    yield pa.record_batch({"value": ["w"], "partition": pa.array([0], pa.int32())})
    consumed.append(True)


@pytest.mark.parametrize("streaming", [False, True])
def test_a_row_a_task_cannot_write_fails_the_commit_once_and_nothing_is_written(root, streaming):
    """A partition the topic lacks: the task stages nothing, reads the rest of its input (pyspark's worker
    expects it read) and returns the error in its commit message instead of failing, so Spark neither logs a
    task failure nor retries the task; the driver's commit raises it, once, with one frame of ours, saying
    how many other tasks refused rows and that nothing was committed; abort() then removes every staging."""
    writer = make_writer(sink(root), streaming)
    consumed: list = []
    bad = writer.write(out_of_range(consumed))
    assert consumed
    assert bad.staged is None and bad.refused is not None
    assert "partition 7 does not exist: topic 'events' has 1 partition(s)" in bad.refused
    assert staging_dirs(root) == []
    good = writer.write(iter([pa.record_batch({"value": ["ok"], "partition": pa.array([0], pa.int32())})]))
    assert good.staged is not None
    messages = [pickle.loads(pickle.dumps(m)) for m in (good, bad, bad)]  # as Spark hands them to the driver
    with pytest.raises(InvalidConfigError) as info:
        writer.commit(messages, 3) if streaming else writer.commit(messages)
    text = "".join(traceback.format_exception(info.value))
    assert text.count("partition 7 does not exist") == 1
    what = "micro-batch 3" if streaming else "this write"
    assert f"(task 0, and 1 other task(s) refused rows too; nothing of {what} was committed)" in text
    assert our_frames(info.value) == [("errors.py", "kafkalog_error")]
    writer.abort(messages, 3) if streaming else writer.abort(messages)
    assert staging_dirs(root) == []
    with LogManager(root).open_log(TopicPartition("events", 0)) as log:
        assert log.log_end_offset == 0


def test_other_task_errors_still_fail_the_task(root):
    """Only rows the sink refuses go to the commit: anything else (here the input itself failing) fails the
    task, for Spark to retry, and leaves no staging behind."""
    writer = make_writer(sink(root), False)

    def broken():
        yield pa.record_batch({"value": ["v"] * COALESCE_ROWS, "partition": pa.array([0] * COALESCE_ROWS, pa.int32())})
        raise OSError("the input broke")

    with pytest.raises(OSError, match="the input broke"):
        writer.write(broken())
    assert staging_dirs(root) == []
    assert KafkaLogCommitMessage(None).refused is None
