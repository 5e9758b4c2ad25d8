"""Batch and streaming Arrow writers: executors stage encoded batches, the driver commits them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from storage.errors import InvalidRecordError
from storage.log_manager import LogManager
from storage.metadata.meta_properties import check_directory_id, directory_id
from storage.staging.staged_commit import StagedFile, cleanup_staged, commit_staged

from .errors import ROW_ERRORS, row_error_type, short_traceback
from .options import SINK_COLUMNS, SinkOptions

# The encoder (RecordStager: Arrow, numba kernels) is imported by the tasks that write, not by the
# driver's commit process, which unpickles this module's classes but only moves staged bytes.


@dataclass
class KafkaLogCommitMessage(WriterCommitMessage):
    staged: StagedFile | None  # byte ranges of the task's staging file; None when it had no rows
    # A row the task cannot write (ROW_ERRORS): the message and class of the error, which the driver's commit
    # raises; the task staged nothing. See _StagingWriter._stage.
    refused: str | None = None
    refused_type: type[Exception] | None = None
    task: int = 0


def _task_index() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


class _StagingWriter:
    """Shared by both writers: the write() side and the commit() side."""

    def __init__(self, options: SinkOptions, writer_id: int):
        self.options = options
        self.writer_id = writer_id
        lm = self._lm()  # on the driver: tasks check that they see this same ROOT (a local path on a cluster)
        self.directory_id = directory_id(lm.fs, lm.root, create=True) if lm.fs.capabilities.locks else None

    def _stage(self, iterator: Iterator) -> KafkaLogCommitMessage:
        """Stage the task's rows. A row it cannot write (a partition the topic lacks, a null topic, ...) fails
        every attempt of the task alike: raised here, Spark would log it three times with its stack trace per
        attempt, retry the task up to spark.task.maxFailures times and report it again. So the task stops
        staging, removes what it staged, reads the rest of its input without writing it, and hands the error to
        the driver, whose commit raises it once, before anything is committed (docs/spark.md, "What Spark
        prints when a write fails"). Any other error fails the task, for Spark to retry."""
        from storage.staging.record_stager import RecordStager

        lm = self._lm()
        check_directory_id(lm.fs, lm.root, self.directory_id)
        task = _task_index()
        stager = RecordStager(
            lm,
            self.writer_id,
            topic=self.options.topic,
            compression=self.options.compression,
            compression_level=self.options.compression_level,
            new_topic_config=self.options.topic_config,
            new_topic_partitions=self.options.partitions,
            task_index=task,
        )
        try:
            for batch in iterator:
                cols = [c for c in batch.schema.names if c in SINK_COLUMNS]
                stager.add(batch.select(cols))
            return KafkaLogCommitMessage(stager.finish())
        except ROW_ERRORS as error:
            stager.abort()
            for _ in iterator:  # pyspark's worker expects its input read to the end (and is then reused)
                pass
            return KafkaLogCommitMessage(None, str(error), row_error_type(error), task)
        except BaseException:
            stager.abort()
            raise

    def _lm(self) -> LogManager:
        return LogManager(self.options.path, self.options.storage_options)

    def _commit(self, messages: list[KafkaLogCommitMessage | None], batch_id: int, ephemeral: bool) -> None:
        refused = sorted((m for m in messages if m is not None and m.refused is not None), key=lambda m: m.task)
        if refused:  # Spark then calls abort(), which removes the other tasks' staging
            raise refusal(refused, None if ephemeral else batch_id)
        staged = [m.staged for m in messages if m is not None and m.staged is not None]
        commit_staged(
            self._lm(),
            self.writer_id,
            batch_id,
            staged,
            ephemeral=ephemeral,
            lock_timeout=self.options.lock_timeout_s,
            transactional=self.options.transactional,
            transaction_timeout_ms=self.options.transaction_timeout_ms,
        )

    def _abort(self, messages) -> None:
        names = [m.staged.name for m in messages if m is not None and m.staged is not None]
        cleanup_staged(self._lm(), self.writer_id, names)


def refusal(refused: list[KafkaLogCommitMessage], batch_id: int | None) -> Exception:
    """The error a write's commit raises when tasks found rows they cannot write: the first task's, as it
    found it, saying how many other tasks found some and that nothing was committed."""
    first = refused[0]
    others = f", and {len(refused) - 1} other task(s) refused rows too" if len(refused) > 1 else ""
    what = "this write" if batch_id is None else f"micro-batch {batch_id}"
    cls = first.refused_type or InvalidRecordError
    return cls(f"{first.refused} (task {first.task}{others}; nothing of {what} was committed)")


class KafkaLogBatchWriter(_StagingWriter, DataSourceArrowWriter):
    """`df.write.format("kafkalog")`: one commit, under a one-off writer id."""

    def write(self, iterator: Iterator) -> KafkaLogCommitMessage:
        return self._stage(iterator)

    @short_traceback
    def commit(self, messages) -> None:
        self._commit(messages, 0, ephemeral=True)

    def abort(self, messages) -> None:
        self._abort(messages)


class KafkaLogStreamWriter(_StagingWriter, DataSourceStreamArrowWriter):
    """`writeStream.format("kafkalog")`: exactly-once per (query, batch id, partition)."""

    def write(self, iterator: Iterator) -> KafkaLogCommitMessage:
        return self._stage(iterator)

    @short_traceback
    def commit(self, messages, batchId: int) -> None:
        self._commit(messages, batchId, ephemeral=False)

    def abort(self, messages, batchId: int) -> None:
        self._abort(messages)
