"""Batch and stream readers: plan offset ranges on the driver, decode them to Arrow in the tasks."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from storage.errors import InvalidConfigError, OffsetOutOfRangeError
from storage.log_manager import LogManager
from storage.log_offsets import LogOffsetsCache
from storage.metadata.meta_properties import check_directory_id, directory_id
from storage.topic_partition import TopicPartition
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED

from . import planning
from .errors import short_traceback
from .source_options import KAFKA_COLUMNS, KAFKA_FIELDS, SourceOptions, source_schema

try:  # pyspark 4.2+: read limits and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)


def kafka_struct():
    """Spark's Kafka source schema with headers, as a StructType derived here from its DDL types
    (source_options.KAFKA_FIELDS): workers have no JVM to parse a DDL string."""
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, _ddl_type(ddl)) for name, ddl in KAFKA_FIELDS])


def _ddl_type(ddl: str):
    """The pyspark type of a DDL type of the Kafka schema: its primitives, array<...> and struct<name:type,...>."""
    from pyspark.sql import types as T

    primitives = {
        "binary": T.BinaryType,
        "string": T.StringType,
        "int": T.IntegerType,
        "long": T.LongType,
        "timestamp": T.TimestampType,
    }
    if ddl in primitives:
        return primitives[ddl]()
    if ddl.startswith("array<") and ddl.endswith(">"):
        return T.ArrayType(_ddl_type(ddl[len("array<") : -1]))
    if ddl.startswith("struct<") and ddl.endswith(">"):
        fields = [f.split(":", 1) for f in ddl[len("struct<") : -1].split(",")]  # no nested structs here
        return T.StructType([T.StructField(name, _ddl_type(t)) for name, t in fields])
    raise ValueError(f"not a DDL type of the Kafka schema: {ddl!r}")


def selected_columns(schema, include_headers: bool) -> tuple[str, ...]:
    """The columns a read yields: Spark's Kafka schema, or the subset (in its order) a user-specified
    schema names, each with its Kafka type. Anything else is refused, listing what may be asked for."""
    if schema is None:
        return KAFKA_COLUMNS if include_headers else KAFKA_COLUMNS[:-1]
    allowed = {f.name: f.dataType for f in kafka_struct().fields}
    fields = getattr(schema, "fields", None)
    if not fields:
        raise InvalidConfigError(
            f"a schema for format('kafkalog') selects columns of the Kafka source schema; got {schema!r}"
        )
    bad = [f for f in fields if f.name not in allowed or f.dataType != allowed[f.name]]
    names = [f.name for f in fields]
    if bad or len(set(names)) != len(names):
        shown = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in bad) or "a column twice"
        raise InvalidConfigError(
            f"a schema for format('kafkalog') selects columns of the Kafka source schema, "
            f"with their Kafka types: {source_schema(True)}; got {shown}"
        )
    return tuple(names)


class KafkaLogInputPartition(InputPartition):
    """One task's work: offsets [start, end) of one topic partition. An open start or end (earliest /
    latest asked for) is resolved when the task reads: pyspark keeps a DataFrame's planned partitions,
    so a DataFrame queried again still reads what the log holds then, as Spark's Kafka source does by
    planning every query anew."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        *,
        start_open: bool = False,
        end_open: bool = False,
        directory_id: str | None = None,
    ):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.start_open, self.end_open = start_open, end_open
        self.directory_id = directory_id  # the ROOT the driver planned on (storage/metadata/meta_properties.py)

    def __repr__(self) -> str:
        lo = "earliest" if self.start_open else self.start
        hi = "latest" if self.end_open else self.end
        return f"KafkaLogInputPartition({self.topic}-{self.partition} [{lo}, {hi}))"


def read_range(
    path: str,
    part: KafkaLogInputPartition,
    columns: tuple[str, ...],
    fail_on_data_loss: bool,
    storage_options: dict | None = None,
    isolation_level: str = READ_UNCOMMITTED,
) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches with `columns` of Spark's Kafka schema, as a
    consumer at `isolation_level` returns them (read_committed: no aborted data, nothing at or past the LSO)."""
    if not isinstance(part, KafkaLogInputPartition):  # Spark plans one placeholder task for an empty read
        return
    tp = TopicPartition(part.topic, part.partition)
    lm = LogManager(path, storage_options)
    if lm.fs.capabilities.locks:
        check_directory_id(lm.fs, lm.root, getattr(part, "directory_id", None))
    with lm.open_log(tp) as plog:
        start = plog.log_start_offset if getattr(part, "start_open", False) else part.start
        if getattr(part, "end_open", False):
            end = plog.last_stable_offset if isolation_level == READ_COMMITTED else plog.log_end_offset
        else:
            end = part.end
        if start < plog.log_start_offset:
            planning._data_loss(
                fail_on_data_loss,
                f"offsets {start}..{plog.log_start_offset - 1} of {tp.topic}-"
                f"{tp.partition} were removed before they were read",
            )
            start = plog.log_start_offset
        if start >= end:
            return
        try:
            chunks = plog.read_records(start, end, isolation_level=isolation_level)
            for batch in chunks:
                yield _to_spark(batch, part, columns)
        except OffsetOutOfRangeError as e:
            planning._data_loss(fail_on_data_loss, str(e))


def _to_spark(batch: pa.RecordBatch, part: KafkaLogInputPartition, columns: tuple[str, ...]) -> pa.RecordBatch:
    """The decoded records in Spark's Kafka schema, only the columns asked for (each one shipped to
    Spark costs: a narrow schema ships less)."""
    n = batch.num_rows
    make = {
        "key": lambda: batch.column("key"),
        "value": lambda: batch.column("value"),
        "topic": lambda: pa.repeat(pa.scalar(part.topic, pa.string()), n),
        "partition": lambda: pa.array(np.full(n, part.partition, np.int32)),
        "offset": lambda: batch.column("offset"),
        "timestamp": lambda: pa.array(batch.column("timestamp").to_numpy() * 1000, pa.int64()).view(
            pa.timestamp("us", tz="UTC")
        ),
        "timestampType": lambda: batch.column("timestampType"),
        "headers": lambda: batch.column("headers"),
    }
    return pa.RecordBatch.from_arrays([make[c]() for c in columns], names=list(columns))


class KafkaLogBatchReader(DataSourceReader):
    """spark.read: ranges fixed at planning time."""

    def __init__(self, options: SourceOptions, columns: tuple[str, ...]):
        self.options = options
        self.columns = columns

    @short_traceback
    def partitions(self):
        o = self.options
        with LogManager(o.path, o.storage_options).snapshot() as lm:  # topic and checkpoint files read once
            tps = planning.topic_partitions(lm, o, batch=True)
            states = planning.partition_states(lm, tps, o.fail_on_data_loss, isolation_level=o.isolation_level)
            level = o.isolation_level
            starts = planning.resolve(lm, o.starting, states, is_start=True, strategy=o.strategy, isolation_level=level)
            ends = planning.resolve(lm, o.ending, states, is_start=False, isolation_level=level)
            rs = planning.split(
                lm,
                planning.ranges(starts, ends, states, o.fail_on_data_loss),
                o.min_partitions,
                o.max_records_per_partition,
            )
            dir_id = directory_id(lm.fs, lm.root) if lm.fs.capabilities.locks else None
        open_start = planning.open_ended(o.starting, states, planning.EARLIEST)
        open_end = planning.open_ended(o.ending, states, planning.LATEST)
        first: dict[tuple[str, int], int] = {}
        for i, r in enumerate(rs):
            first.setdefault((r.topic, r.partition), i)
        last = {(r.topic, r.partition): i for i, r in enumerate(rs)}
        return [
            KafkaLogInputPartition(
                r.topic,
                r.partition,
                r.start,
                r.end,
                start_open=(r.topic, r.partition) in open_start and first[(r.topic, r.partition)] == i,
                end_open=(r.topic, r.partition) in open_end and last[(r.topic, r.partition)] == i,
                directory_id=dir_id,
            )
            for i, r in enumerate(rs)
        ]

    def read(self, partition):
        o = self.options
        return read_range(o.path, partition, self.columns, o.fail_on_data_loss, o.storage_options, o.isolation_level)


def _to_json(offsets: dict) -> dict:
    out: dict = {}
    for tp, off in sorted(offsets.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(off)
    return out


def _from_json(doc: dict) -> dict:
    return {TopicPartition(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()}


class KafkaLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream: offsets {"topic": {"partition": offset}}; new partitions start at earliest."""

    def __init__(self, options: SourceOptions, columns: tuple[str, ...]):
        self.options = options
        self.columns = columns
        self._target: dict | None = None  # Trigger.AvailableNow: do not go past this
        self._last_trigger = time.monotonic()
        self._lm: LogManager | None = None
        self._offsets = LogOffsetsCache()  # partitions whose files did not change are not reopened
        self._planned: dict | None = None  # latestOffset's states, reused by the partitions() call after it
        self._notes_logged = False  # the options' warnings: logged by the stream runner's copy, once

    def __getstate__(self):  # tasks get a copy for read(): the driver-side caches stay behind
        state = dict(self.__dict__)
        state["_lm"], state["_offsets"], state["_planned"] = None, LogOffsetsCache(), None
        return state

    def _log_manager(self) -> LogManager:
        if self._lm is None:
            self._lm = LogManager(self.options.path, self.options.storage_options)
        return self._lm

    def _states(self) -> dict:
        if not self._notes_logged:  # only Spark's stream runner asks for offsets (the planner's copy does not)
            self._notes_logged = True
            self.options.log_notes()
        with self._log_manager().snapshot() as lm:
            tps = planning.topic_partitions(lm, self.options)
            self._offsets.forget(set(tps))
            return planning.partition_states(
                lm, tps, self.options.fail_on_data_loss, self._offsets, isolation_level=self.options.isolation_level
            )

    @short_traceback
    def initialOffset(self) -> dict:
        o = self.options
        states = self._states()
        with self._log_manager().snapshot() as lm:
            return _to_json(
                planning.resolve(
                    lm,
                    o.starting,
                    states,
                    is_start=True,
                    strategy=o.strategy,
                    require_all=True,
                    isolation_level=o.isolation_level,
                )
            )

    @short_traceback
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: st.log_end for tp, st in self._states().items()}

    def getDefaultReadLimit(self):
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self):
        """Spark asks right after latestOffset, for the progress report: the offsets just found serve."""
        states = self._planned if self._planned is not None else self._states()
        return _to_json({tp: st.log_end for tp, st in states.items()})

    @short_traceback
    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        states = self._planned = self._states()
        latest = {tp: st.log_end for tp, st in states.items()}
        if self._target is not None:
            latest = {tp: min(off, self._target.get(tp, states[tp].log_start)) for tp, off in latest.items()}
        if start is None or limit is None or isinstance(limit, ReadAllAvailable):
            return _to_json(latest)
        begin = _from_json(start)
        lag = {tp: max(0, end - begin.get(tp, states[tp].log_start)) for tp, end in latest.items()}
        total = sum(lag.values())
        o = self.options
        if o.min_offsets_per_trigger is not None and total < o.min_offsets_per_trigger and self._target is None:
            if (time.monotonic() - self._last_trigger) * 1000 < o.max_trigger_delay_ms:
                return start  # wait for more data, up to maxTriggerDelay
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_offsets_per_trigger
        if cap is not None and total > cap:
            for tp, n in lag.items():  # in proportion to each partition's lag, as Spark's Kafka source does
                share = cap * n / total
                share = int(np.ceil(share)) if share < 1 else int(np.floor(share))
                latest[tp] = begin.get(tp, states[tp].log_start) + min(n, share)
        self._last_trigger = time.monotonic()
        return _to_json(latest)

    @short_traceback
    def partitions(self, start: dict, end: dict):
        o = self.options
        # Spark plans a trigger's partitions right after its latestOffset: the offsets found there serve both
        # (one look at each partition per trigger; on object stores one LIST at most)
        states, self._planned = (self._planned if self._planned is not None else self._states()), None
        begin, stop = _from_json(start), _from_json(end)
        for tp in begin:
            if tp not in states:
                planning._data_loss(o.fail_on_data_loss, f"{tp.topic}-{tp.partition} was read before and is gone now")
        starts = {tp: begin.get(tp, st.log_start) for tp, st in states.items()}  # new partitions: earliest
        ends = {tp: stop[tp] for tp in states if tp in stop}
        with self._log_manager().snapshot() as lm:
            rs = planning.split(
                lm,
                planning.ranges(starts, ends, states, o.fail_on_data_loss, stream=True),
                o.min_partitions,
                o.max_records_per_partition,
            )
            dir_id = directory_id(lm.fs, lm.root) if lm.fs.capabilities.locks and rs else None
        return [KafkaLogInputPartition(r.topic, r.partition, r.start, r.end, directory_id=dir_id) for r in rs]

    def read(self, partition):
        o = self.options
        return read_range(o.path, partition, self.columns, o.fail_on_data_loss, o.storage_options, o.isolation_level)

    def commit(self, end: dict) -> None:
        pass


class FailedStreamReader(DataSourceStreamReader):
    """A stream reader whose options were refused: every call raises that error (see
    KafkaLogDataSource.streamReader for why it is not raised at once)."""

    def __init__(self, error: Exception):
        self.error = error

    @short_traceback
    def initialOffset(self) -> dict:
        raise self.error

    @short_traceback
    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        raise self.error

    @short_traceback
    def partitions(self, start: dict, end: dict):
        raise self.error

    def read(self, partition):
        raise self.error

    def commit(self, end: dict) -> None:
        pass
