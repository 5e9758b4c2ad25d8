"""How the data source's errors reach a Spark user: once, with one frame of ours in front of the message.

pyspark formats an exception raised in one of its Python processes (the driver's planner and commit
processes, the executors' workers) with its traceback, minus pyspark's own leading frames
(spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled, on by default), and Spark wraps that text in
its own error. For the errors below the message names what is wrong (the option, column, row, topic or
offsets), so `short_traceback` re-raises them from one frame: pyspark then shows three lines before the
message instead of a walk through the engine (docs/spark.md, "What Spark prints when a write fails").
Other errors (I/O, a bug) keep their whole traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from storage.errors import (
    DataLossError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
)

# Errors of the user's options, input or request, whose message says it all.
USER_ERRORS: tuple[type[Exception], ...] = (
    InvalidConfigError,
    InvalidRecordError,
    RecordTooLargeError,
    InvalidTopicError,
    UnknownTopicOrPartitionError,
    OffsetOutOfRangeError,
    DataLossError,
)

# What a write task may find in its rows (a partition the topic lacks, a null or illegal topic, a record
# over max.message.bytes): the same rows fail the same way on every attempt, so the task reports it to the
# driver instead of failing (writer.py). Each of these is built again from its message on the driver.
ROW_ERRORS: tuple[type[Exception], ...] = (
    InvalidConfigError,
    InvalidRecordError,
    RecordTooLargeError,
    InvalidTopicError,
)

F = TypeVar("F", bound=Callable)


def short_traceback(method: F) -> F:
    """Wrap a method pyspark calls: a USER_ERRORS exception leaves it with this one frame as its traceback."""

    @functools.wraps(method)
    def kafkalog_error(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except USER_ERRORS as error:
            raise error.with_traceback(None) from None

    return kafkalog_error  # type: ignore[return-value]


def row_error_type(error: Exception) -> type[Exception]:
    """The ROW_ERRORS class to rebuild `error` as on the driver: its own, or the listed class it derives from
    (a subclass may take other constructor arguments than the message)."""
    exact = [cls for cls in ROW_ERRORS if type(error) is cls]
    return exact[0] if exact else next(cls for cls in ROW_ERRORS if isinstance(error, cls))
