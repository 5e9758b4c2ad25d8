"""kafkalog-ds: Kafka-format logs without a broker.

The Python API (docs/python.md): write() and read() (kafkalog_ds.api), register(spark) for sessions where data
source discovery is off, and the errors they raise (storage.errors, loaded on first use). The `kafkalog` command
lives in kafkalog_ds.cli. Importing this package loads neither pyarrow nor the log engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .api import PartitionWrite, WriteResult, read, write

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from storage.errors import (
        CorruptRecordError,
        InvalidConfigError,
        InvalidTopicError,
        KafkaLogError,
        OffsetOutOfRangeError,
        UnknownTopicOrPartitionError,
    )

__all__ = [
    "CorruptRecordError",
    "InvalidConfigError",
    "InvalidTopicError",
    "KafkaLogError",
    "OffsetOutOfRangeError",
    "PartitionWrite",
    "UnknownTopicOrPartitionError",
    "WriteResult",
    "read",
    "register",
    "write",
]

_ERRORS = frozenset(
    {
        "CorruptRecordError",
        "InvalidConfigError",
        "InvalidTopicError",
        "KafkaLogError",
        "OffsetOutOfRangeError",
        "UnknownTopicOrPartitionError",
    }
)


def __getattr__(name: str) -> object:
    """The errors of storage.errors, imported when first asked for (keeps `import kafkalog_ds` light)."""
    if name in _ERRORS:
        from storage import errors

        return getattr(errors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark: SparkSession) -> None:
    """Register format("kafkalog") on a session where data source discovery is off."""
    from python_datasource.data_source import KafkaLogDataSource

    spark.dataSource.register(KafkaLogDataSource)
