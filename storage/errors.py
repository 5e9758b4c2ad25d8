"""Errors of the log engine, named after Kafka's exceptions so their meaning carries over."""


class KafkaLogError(Exception):
    """Base of every error the engine raises on purpose."""


class CorruptRecordError(KafkaLogError):
    """Bytes that are not a valid record batch: bad CRC, length, magic or offsets.

    The message names the file (or source) and the byte position of the batch at fault.
    """

    def __init__(self, message: str, *, source: str | None = None, position: int | None = None):
        where = []
        if source is not None:
            where.append(str(source))
        if position is not None:
            where.append(f"position {position}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.source = source
        self.position = position


class RecordTooLargeError(KafkaLogError):
    """A batch (or its decompressed records) exceeds max.message.bytes."""


class InvalidConfigError(KafkaLogError, ValueError):
    """An unknown config key, or a value outside what Kafka accepts for it (also a ValueError)."""


class InvalidRecordError(KafkaLogError, ValueError):
    """A record the caller gave cannot be written (Kafka's InvalidRecordException; also a ValueError)."""


class InvalidTopicError(KafkaLogError):
    """A topic name Kafka would reject, or a topic that does not exist."""


class UnknownTopicOrPartitionError(KafkaLogError):
    """The topic or partition is not present under the log dir."""


class TopicExistsError(KafkaLogError):
    """`--create` for a topic that is already there."""


class OffsetOutOfRangeError(KafkaLogError):
    """A fetch offset below logStartOffset or above the log end offset."""


class InvalidTimestampError(KafkaLogError):
    """A CreateTime record timestamp outside message.timestamp.before/after.max.ms of the append time."""


class CorruptIndexError(KafkaLogError):
    """An index file that fails its sanity check; the loader rebuilds it from the log."""


class LogLockedError(KafkaLogError):
    """Another process holds the partition's write lock."""


class KafkaStorageError(KafkaLogError):
    """An I/O failure or an operation the filesystem cannot do."""


class ConcurrentAppendError(KafkaStorageError):
    """Another writer created the segment this append meant to create (object stores: a create-only
    write lost). Nothing of this append was written; reopen the log and retry."""

    def __init__(
        self, message: str, *, topic: str | None = None, partition: int | None = None, offset: int | None = None
    ):
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
