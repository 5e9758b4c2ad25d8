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
    """A batch (or its decompressed records) exceeds max.message.bytes.

    `row` is the input row at fault when the error comes from building batches (None otherwise); the
    message then starts with "row N: " and `reason` is the rest, for callers that name the row their way.
    """

    def __init__(self, message: str, *, row: int | None = None):
        super().__init__(f"row {row}: {message}" if row is not None else message)
        self.row = row
        self.reason = message


class InvalidConfigError(KafkaLogError, ValueError):
    """An unknown config key, or a value outside what Kafka accepts for it (also a ValueError)."""


class InvalidRecordError(KafkaLogError, ValueError):
    """A record the caller gave cannot be written (Kafka's InvalidRecordException; also a ValueError)."""


class InvalidTopicError(KafkaLogError):
    """A topic name Kafka would reject: illegal characters or length, or one that collides with an existing
    topic's name once '.' and '_' are taken as equal (Kafka's InvalidTopicException). A name that is legal
    but not there is UnknownTopicOrPartitionError."""


class UnknownTopicOrPartitionError(KafkaLogError):
    """A legal topic or partition that is not present under the log dir (Kafka's
    UnknownTopicOrPartitionException)."""


class TopicExistsError(KafkaLogError):
    """`--create` for a topic that is already there."""


class OffsetOutOfRangeError(KafkaLogError):
    """A fetch offset below logStartOffset or above the log end offset."""


class InvalidTimestampError(KafkaLogError):
    """A CreateTime record timestamp outside message.timestamp.before/after.max.ms of the append time."""


class InvalidOffsetError(KafkaLogError, ValueError):
    """An append to an index with an offset that does not keep its entries in order: a caller's mistake,
    not damage to the file (Kafka's InvalidOffsetException; also a ValueError)."""


class CorruptIndexError(KafkaLogError):
    """An index file that fails its sanity check or cannot be read; readers scan the log instead and the
    loader rebuilds the index from it. Only damage found in the file raises it, never a caller's append."""


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


class CorruptCheckpointError(KafkaStorageError):
    """A checkpoint file that does not parse; names the file and the 1-based line."""

    def __init__(self, message: str, *, path: str, line: int | None = None):
        where = f"{path} line {line}" if line is not None else path
        super().__init__(f"corrupt checkpoint file {where}: {message}")
        self.path = path
        self.line = line


class CorruptSnapshotError(KafkaStorageError):
    """A producer state snapshot that fails its checks (size, version, entry count, CRC-32C); names the
    file and the byte position at fault (Kafka's CorruptSnapshotException)."""

    def __init__(self, message: str, *, path: str, position: int):
        super().__init__(f"corrupt producer snapshot {path} at position {position}: {message}")
        self.path = path
        self.position = position


class TransactionStateError(KafkaStorageError):
    """A read_committed read met an open transaction that the partition's producer snapshot hid, after it had
    served records at or past that transaction's first offset: the read is not retried, the next one is right."""


class CleaningAbortedError(KafkaStorageError):
    """The segments being replaced changed (retention, a writer's recovery) or the lock was busy."""


class SwapAbortedError(KafkaStorageError):
    """A swap was not made (another job's swap is in the partition, or the sources changed)."""


class MaintenanceLeaseError(KafkaStorageError):
    """Another maintenance job holds the log dir's lease (or took it over from this one)."""


class DataLossError(KafkaLogError):
    """Data the query asked for is gone (retention, a deleted partition) and failOnDataLoss is true."""


class InvalidInputError(KafkaLogError):
    """A producer input line that is not a valid record; names the line."""


class DumpError(KafkaLogError):
    """A file dump-log cannot go on reading (bad name, impossible batch length, old message format)."""


class ExportError(KafkaStorageError):
    """The export cannot go ahead; nothing in the target was changed unless the message says so."""


class TooManyProducersError(KafkaStorageError):
    """A partition holds more open transactions than a reader tracks (transaction_state.MAX_OPEN_TRANSACTIONS)."""


class TooManyAbortedTransactionsError(KafkaStorageError):
    """A cleaning's range holds more aborted transactions than the cleaner keeps in memory
    (transaction_metadata.MAX_CLEANER_ABORTED_TXNS); names the partition and the range."""


class TransactionAbortedError(KafkaStorageError):
    """A sink transaction lost its decision: another opener aborted it first (Kafka's
    TransactionAbortedException); its data is kept behind ABORT markers and the batch may be replayed."""


class TableError(KafkaLogError):
    """A topic's Iceberg table cannot be kept (docs/tables.md): the tables extra is missing, a table config
    does not fit the table, or the table is not the one this topic wrote. The log is never touched."""


class TableCatalogError(TableError):
    """The table's catalog cannot be reached or refused a request; names the catalog and the table."""


class TableConflictError(TableError):
    """The table changed under the materializer: someone else committed, altered, dropped or recreated it.
    Nothing was committed by the pass that raised it."""
