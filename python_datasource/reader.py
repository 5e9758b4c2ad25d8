"""Batch and stream readers: plan offset ranges on the driver, decode them to Arrow in the tasks."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from storage.errors import OffsetOutOfRangeError
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition

from . import planning
from .source_options import SourceOptions

try:  # pyspark 4.2+: read limits and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - pyspark 4.1
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None
    SupportsTriggerAvailableNow = object

log = logging.getLogger(__name__)

KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                "timestampType int")
HEADERS_FIELD = "headers array<struct<key:string,value:binary>>"


def source_schema(include_headers: bool) -> str:
    return KAFKA_SCHEMA + (", " + HEADERS_FIELD if include_headers else "")


class KafkaLogInputPartition(InputPartition):
    """One task's work: offsets [start, end) of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __repr__(self) -> str:
        return f"KafkaLogInputPartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def read_range(path: str, part: KafkaLogInputPartition, include_headers: bool,
               fail_on_data_loss: bool, storage_options: dict | None = None) -> Iterator[pa.RecordBatch]:
    """Records [start, end) of one partition as Arrow batches in Spark's Kafka schema."""
    if not isinstance(part, KafkaLogInputPartition):  # Spark plans one placeholder task for an empty read
        return
    tp = TopicPartition(part.topic, part.partition)
    with LogManager(path, storage_options).open_log(tp) as plog:
        start = part.start
        if start < plog.log_start_offset:
            planning._data_loss(fail_on_data_loss, f"offsets {start}..{plog.log_start_offset - 1} of {tp.topic}-"
                                                   f"{tp.partition} were removed before they were read")
            start = plog.log_start_offset
        if start >= part.end:
            return
        try:
            chunks = plog.read_records(start, part.end)
            for batch in chunks:
                yield _to_spark(batch, part, include_headers)
        except OffsetOutOfRangeError as e:
            planning._data_loss(fail_on_data_loss, str(e))


def _to_spark(batch: pa.RecordBatch, part: KafkaLogInputPartition, include_headers: bool) -> pa.RecordBatch:
    n = batch.num_rows
    ts_ms = batch.column("timestamp").to_numpy()
    cols = [
        batch.column("key"), batch.column("value"),
        pa.repeat(pa.scalar(part.topic, pa.string()), n),
        pa.array(np.full(n, part.partition, np.int32)),
        batch.column("offset"),
        pa.array(ts_ms * 1000, pa.int64()).view(pa.timestamp("us", tz="UTC")),
        batch.column("timestampType"),
    ]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if include_headers:
        cols.append(batch.column("headers"))
        names.append("headers")
    return pa.RecordBatch.from_arrays(cols, names=names)


class KafkaLogBatchReader(DataSourceReader):
    """spark.read: ranges fixed at planning time."""

    def __init__(self, options: SourceOptions):
        self.options = options

    def partitions(self):
        o = self.options
        lm = LogManager(o.path, o.storage_options)
        states = planning.partition_states(lm, planning.topic_partitions(lm, o), o.fail_on_data_loss)
        starts = planning.resolve(lm, o.starting, states, is_start=True, strategy=o.strategy)
        ends = planning.resolve(lm, o.ending, states, is_start=False)
        rs = planning.split(lm, planning.ranges(starts, ends, states, o.fail_on_data_loss), o.min_partitions)
        return [KafkaLogInputPartition(r.topic, r.partition, r.start, r.end) for r in rs]

    def read(self, partition):
        o = self.options
        return read_range(o.path, partition, o.include_headers, o.fail_on_data_loss, o.storage_options)


def _to_json(offsets: dict) -> dict:
    out: dict = {}
    for tp, off in sorted(offsets.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(off)
    return out


def _from_json(doc: dict) -> dict:
    return {TopicPartition(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()}


class KafkaLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """spark.readStream: offsets {"topic": {"partition": offset}}; new partitions start at earliest."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._target: dict | None = None  # Trigger.AvailableNow: do not go past this
        self._last_trigger = time.monotonic()

    def _states(self) -> dict:
        lm = LogManager(self.options.path, self.options.storage_options)
        return planning.partition_states(lm, planning.topic_partitions(lm, self.options),
                                         self.options.fail_on_data_loss)

    def initialOffset(self) -> dict:
        o = self.options
        states = self._states()
        lm = LogManager(o.path, o.storage_options)
        return _to_json(planning.resolve(lm, o.starting, states, is_start=True, strategy=o.strategy,
                                         require_all=True))

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
        return _to_json({tp: st.log_end for tp, st in self._states().items()})

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        states = self._states()
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

    def partitions(self, start: dict, end: dict):
        o = self.options
        lm = LogManager(o.path, o.storage_options)
        states = self._states()
        begin, stop = _from_json(start), _from_json(end)
        for tp in begin:
            if tp not in states:
                planning._data_loss(o.fail_on_data_loss, f"{tp.topic}-{tp.partition} was read before and is gone now")
        starts = {tp: begin.get(tp, st.log_start) for tp, st in states.items()}  # new partitions: earliest
        ends = {tp: stop[tp] for tp in states if tp in stop}
        rs = planning.split(lm, planning.ranges(starts, ends, states, o.fail_on_data_loss), o.min_partitions)
        return [KafkaLogInputPartition(r.topic, r.partition, r.start, r.end) for r in rs]

    def read(self, partition):
        o = self.options
        return read_range(o.path, partition, o.include_headers, o.fail_on_data_loss, o.storage_options)

    def commit(self, end: dict) -> None:
        pass
