"""The Python API: write Arrow or pandas rows into a topic, read a topic back as a pyarrow.RecordBatchReader.

Both run the engine's own paths: write() is the Spark sink's batch write (RecordStager routes and encodes,
commit_staged appends, as one Kafka transaction by default), read() plans offset ranges as
spark.read.format("kafkalog") does (python_datasource.planning) and decodes them with Log.read_records. Nothing
heavy is imported until a function runs, so `import kafkalog_ds` stays cheap. The guide is docs/python.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from python_datasource.planning import OffsetRange
    from python_datasource.source_options import OffsetSpec
    from storage.log_manager import LogManager

__all__ = ["PartitionWrite", "WriteResult", "read", "write"]

IsolationLevel = Literal["read_uncommitted", "read_committed"]
EARLIEST, LATEST = -2, -1  # as in the Spark Kafka connector's per-partition JSON offsets


class ArrowStreamExportable(Protocol):
    """Anything that exports the Arrow C stream interface (a Polars DataFrame, a DuckDB relation, ...)."""

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object: ...


WriteInput = Union["pa.Table", "pa.RecordBatch", "pa.RecordBatchReader", "pd.DataFrame", ArrowStreamExportable]


@dataclass(frozen=True)
class PartitionWrite:
    """The data records one write() call appended to one partition: offsets first_offset..last_offset."""

    records: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True)
class WriteResult:
    """What write() appended, by partition (only the partitions that got records)."""

    topic: str
    partitions: Mapping[int, PartitionWrite] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(w.records for w in self.partitions.values())


def write(
    root: str | os.PathLike[str],
    topic: str,
    data: WriteInput,
    *,
    partitions: int | None = None,
    config: Mapping[str, str] | None = None,
    compression: str = "none",
    transactional: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> WriteResult:
    """Produce rows to `topic` as the Spark sink's batch write does: columns value, and optionally key, partition,
    timestamp, headers; keyed rows go where Kafka's default partitioner puts them. Rows are staged before anything
    is appended, so bad input appends nothing; with `transactional` (the default) the call is one Kafka
    transaction over its partitions, which a read_committed reader sees whole or not at all.

    `partitions` and `config` apply to a topic this call creates (default 1 partition); `compression` is a Kafka
    codec name (none, gzip, snappy, lz4, zstd)."""
    import pyarrow as pa

    from python_datasource.options import SINK_COLUMNS
    from storage.errors import InvalidConfigError, UnknownTopicOrPartitionError
    from storage.log_manager import LogManager
    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged
    from storage.topic_partition import validate_topic_name

    validate_topic_name(topic)
    try:
        codec = CompressionType.for_name(compression)
    except (ValueError, AttributeError) as e:
        raise InvalidConfigError(f"compression: {e}") from None
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1):
        raise InvalidConfigError(f"partitions: expected a partition count of at least 1, got {partitions!r}")
    reader = _input_batches(data)
    fields = [f for f in reader.schema if f.name in SINK_COLUMNS and f.name != "topic"]  # the topic argument wins
    target = pa.schema([f.with_type(_without_views(f.type)) for f in fields])
    _check_columns(target, reader.schema.names)
    lm = LogManager(os.fspath(root), storage_options)
    try:
        meta = lm.topic(topic)
    except UnknownTopicOrPartitionError:
        meta = lm.get_or_create_topic(topic, partitions or 1, dict(config or {}))
    if partitions is not None and partitions != meta.partitions:
        raise InvalidConfigError(
            f"partitions={partitions}: topic '{topic}' exists with {meta.partitions} partition(s); "
            "partitions applies only to a topic write() creates"
        )
    writer_id = int.from_bytes(os.urandom(8), "big") & 0x7FFFFFFFFFFFFFFF  # a one-off producer id, as a batch write
    first_null = int.from_bytes(os.urandom(4), "big") % meta.partitions  # null keys: round robin from a random one
    stager = RecordStager(
        lm, writer_id, topic=topic, compression=codec, new_topic_config=dict(config or {}), task_index=first_null
    )
    try:
        for batch in reader:
            stager.add(_conform(batch, target))
        staged = stager.finish()
    except BaseException:
        stager.abort()
        raise
    if staged is None:
        return WriteResult(topic, {})
    result = commit_staged(lm, writer_id, 0, [staged], ephemeral=True, transactional=transactional)
    counts: dict[int, int] = {}
    for p in staged.partitions:
        counts[p.partition] = counts.get(p.partition, 0) + p.records
    writes = {}
    for tp, (first, last) in sorted(result.appended.items()):
        writes[tp.partition] = PartitionWrite(counts.get(tp.partition, 0), first, last)
    return WriteResult(topic, writes)


def read(
    root: str | os.PathLike[str],
    topic: str,
    *,
    partitions: Iterable[int] | None = None,
    starting_offsets: Literal["earliest"] | Mapping[int, int] = "earliest",
    ending_offsets: Literal["latest"] | Mapping[int, int] = "latest",
    starting_timestamp: int | None = None,
    isolation_level: IsolationLevel = "read_uncommitted",
    include_headers: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> pa.RecordBatchReader:
    """The records of `topic` as spark.read.format("kafkalog") returns them (key, value, topic, partition, offset,
    timestamp, timestampType[, headers]), partition by partition in offset order, streamed in Arrow batches.

    Offsets are fixed when read() returns: [starting_offsets, ending_offsets) per partition ({partition: offset},
    -2 earliest, -1 latest), or from starting_timestamp (ms: the first offset whose timestamp is >= it; a partition
    with none reads nothing). read_committed reads as Kafka's consumer at that level: no aborted transactions,
    nothing at or past the last stable offset."""
    import pyarrow as pa

    from python_datasource import planning
    from storage.errors import InvalidConfigError, UnknownTopicOrPartitionError
    from storage.log_manager import LogManager
    from storage.topic_partition import TopicPartition, validate_topic_name
    from storage.transactions.isolation import parse_isolation_level

    level = parse_isolation_level(isolation_level, "isolation_level")
    validate_topic_name(topic)
    if not isinstance(include_headers, bool):
        raise InvalidConfigError(f"include_headers: expected True or False, got {include_headers!r}")
    lm = LogManager(os.fspath(root), storage_options)
    with lm.snapshot():  # listings, topic and checkpoint files read once for the planning
        if not any(lm.fs.isdir(d) for d in lm.log_dirs):
            raise UnknownTopicOrPartitionError(f"log dir {lm.url()} does not exist")
        try:
            count = lm.topic(topic).partitions
        except UnknownTopicOrPartitionError:
            there = ", ".join(lm.topics()[:20]) or "none"
            raise UnknownTopicOrPartitionError(
                f"topic '{topic}' does not exist in {lm.url()} (topics there: {there})"
            ) from None
        chosen = _partitions(topic, partitions, count)
        start_spec, start_given = _start_spec(topic, chosen, starting_offsets, starting_timestamp)
        end_spec, end_given = _offsets_spec(topic, chosen, ending_offsets, "ending_offsets")
        tps = [TopicPartition(topic, p) for p in chosen]
        states = planning.partition_states(lm, tps, True, isolation_level=level)
        starts = planning.resolve(
            lm, start_spec, states, is_start=True, strategy="latest", require_all=False, isolation_level=level
        )
        ends = planning.resolve(lm, end_spec, states, is_start=False, require_all=False, isolation_level=level)
        _check_ranges(starts, ends, states, start_given, end_given)
        ranges = planning.ranges(starts, ends, states, True)
    schema = _schema(include_headers)
    return pa.RecordBatchReader.from_batches(schema, _read_ranges(lm, ranges, level, schema))


def _schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of read(): Spark's Kafka source schema (timestamps in microseconds, UTC)."""
    import pyarrow as pa

    from storage.records.decoder import RECORD_SCHEMA

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", RECORD_SCHEMA.field("headers").type))
    return pa.schema(fields)


# ---------------------------------------------------------------- write: input


def _input_batches(data: object) -> pa.RecordBatchReader:
    """The input as a stream of record batches: Arrow objects as they are, a pandas DataFrame converted (its
    index dropped), anything exporting the Arrow C stream interface imported."""
    import pyarrow as pa

    from storage.errors import InvalidConfigError

    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, pa.Table):
        return pa.RecordBatchReader.from_batches(data.schema, data.to_batches())
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatchReader.from_batches(data.schema, [data])
    pd = sys.modules.get("pandas")  # a DataFrame can exist only once pandas is imported
    if pd is not None and isinstance(data, pd.DataFrame):
        try:
            table = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise InvalidConfigError(f"the DataFrame does not convert to Arrow: {e}") from None
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    if hasattr(data, "__arrow_c_stream__"):
        return pa.RecordBatchReader.from_stream(data)
    raise TypeError(
        "write() takes a pyarrow Table, RecordBatch or RecordBatchReader, a pandas DataFrame, or an object with "
        f"__arrow_c_stream__; got {type(data).__name__}"
    )


def _without_views(t: pa.DataType) -> pa.DataType:
    """`t` with Arrow's view layouts (Polars exports string_view) as the large layouts the encoder reads."""
    import pyarrow as pa

    name = str(t)  # (the view types arrived in pyarrow 16; the package takes 15)
    if name == "string_view":
        return pa.large_string()
    if name == "binary_view":
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or name.startswith(("list_view<", "large_list_view<")):
        item = t.value_field.with_type(_without_views(t.value_type))
        return pa.list_(item) if pa.types.is_list(t) else pa.large_list(item)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_without_views(f.type)) for f in t])
    return t


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """The batch's columns of `target`, cast to its types where they differ (views only)."""
    import pyarrow as pa

    cols = [batch.column(f.name) for f in target]
    if all(c.type == f.type for c, f in zip(cols, target, strict=True)):
        return pa.RecordBatch.from_arrays(cols, schema=target)
    return pa.RecordBatch.from_arrays([c.cast(f.type) for c, f in zip(cols, target, strict=True)], schema=target)


def _check_columns(schema: pa.Schema, names: list[str]) -> None:
    """The Spark sink's columns and rules (python_datasource.options.check_schema), on Arrow types; `names`: every
    input column, for the message when 'value' is missing."""
    import pyarrow as pa

    from storage.errors import InvalidConfigError

    types = {f.name: f.type for f in schema}

    def text(t: pa.DataType) -> bool:
        return (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_null(t)
        )

    def bad(name: str, want: str) -> InvalidConfigError:
        return InvalidConfigError(f"column '{name}' has type {types[name]}; write() takes {want}")

    if "value" not in types:
        raise InvalidConfigError(
            f"write() needs a 'value' column (string or binary); input columns: {', '.join(names) or 'none'}"
        )
    for name in ("key", "value"):
        if name in types and not text(types[name]):
            raise bad(name, "string or binary")
    if "partition" in types and not (pa.types.is_integer(types["partition"]) or pa.types.is_null(types["partition"])):
        raise bad("partition", "an integer (null: Kafka's partitioner decides)")
    ts = types.get("timestamp")
    if ts is not None and not (pa.types.is_timestamp(ts) or pa.types.is_integer(ts) or pa.types.is_null(ts)):
        raise bad("timestamp", "a timestamp, or integer milliseconds since the epoch")
    h = types.get("headers")
    if h is not None and not pa.types.is_null(h):
        ok = (
            (pa.types.is_list(h) or pa.types.is_large_list(h))
            and pa.types.is_struct(h.value_type)
            and [f.name for f in h.value_type] == ["key", "value"]
            and (pa.types.is_string(h.value_type["key"].type) or pa.types.is_large_string(h.value_type["key"].type))
            and text(h.value_type["value"].type)
        )
        if not ok:
            raise bad("headers", "list<struct<key: string, value: binary or string>>")


# ---------------------------------------------------------------- read: options


def _partitions(topic: str, partitions: Iterable[int] | None, count: int) -> list[int]:
    """The partitions to read: all, or the ones named, each checked against the topic."""
    from storage.errors import InvalidConfigError, UnknownTopicOrPartitionError

    if partitions is None:
        return list(range(count))
    if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Iterable):
        raise InvalidConfigError(f"partitions: expected partition numbers, e.g. [0, 2]; got {partitions!r}")
    chosen = list(partitions)
    for p in chosen:
        if isinstance(p, bool) or not isinstance(p, int):
            raise InvalidConfigError(f"partitions: {p!r} is not a partition number")
        if not 0 <= p < count:
            raise UnknownTopicOrPartitionError(
                f"partitions: partition {p} does not exist: topic '{topic}' has {count} partition(s), 0..{count - 1}"
            )
    return sorted(set(chosen))


def _offsets_spec(topic: str, chosen: list[int], value: object, option: str) -> tuple[OffsetSpec, dict[int, int]]:
    """An OffsetSpec for starting_offsets / ending_offsets, and the offsets given per partition (not -2/-1). As
    the Spark Kafka connector: a dict names every partition read and no other; 'latest' cannot start a batch
    read, 'earliest' cannot end one."""
    from python_datasource.source_options import OffsetSpec
    from storage.errors import InvalidConfigError

    starting = option == "starting_offsets"
    word = "earliest" if starting else "latest"
    if isinstance(value, str):
        if value != word:
            raise InvalidConfigError(
                f"{option}: {value!r} is not allowed here; expected '{word}', or a dict "
                f"{{partition: offset}} with -2 for earliest, -1 for latest"
            )
        return OffsetSpec("offsets", (), EARLIEST if starting else LATEST), {}
    if not isinstance(value, Mapping):
        raise InvalidConfigError(f"{option}: expected '{word}' or a dict {{partition: offset}}, got {value!r}")
    given: dict[int, int] = {}
    for p, off in value.items():
        if isinstance(p, bool) or not isinstance(p, int) or isinstance(off, bool) or not isinstance(off, int):
            raise InvalidConfigError(f"{option}: entry {p!r}: {off!r} is not partition number: offset")
        if off < EARLIEST or off == (LATEST if starting else EARLIEST):
            allowed = "an offset >= 0, or -2 for earliest" if starting else "an offset >= 0, or -1 for latest"
            raise InvalidConfigError(f"{option}: offset {off} for {topic}-{p} is not allowed here (use {allowed})")
        if off >= 0:
            given[p] = off
    missing, extra = sorted(set(chosen) - set(value)), sorted(set(value) - set(chosen))
    if missing or extra:
        raise InvalidConfigError(
            f"{option} must give every partition read an offset, and no other partition (as Spark's Kafka "
            f"connector); reading {topic} partitions {chosen}"
            + (f"; missing: {missing}" if missing else "")
            + (f"; not read: {extra} (pass partitions=[...] to read only some)" if extra else "")
        )
    per = tuple((topic, p, off) for p, off in sorted(value.items()))
    return OffsetSpec("offsets", per, EARLIEST if starting else LATEST), given


def _start_spec(
    topic: str, chosen: list[int], offsets: object, timestamp: int | None
) -> tuple[OffsetSpec, dict[int, int]]:
    """starting_timestamp (a global timestamp, as Spark's startingTimestamp), else starting_offsets."""
    from python_datasource.source_options import OffsetSpec
    from storage.errors import InvalidConfigError

    if timestamp is None:
        return _offsets_spec(topic, chosen, offsets, "starting_offsets")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise InvalidConfigError(f"starting_timestamp: expected milliseconds since the epoch (>= 0), got {timestamp!r}")
    if not (isinstance(offsets, str) and offsets == "earliest"):
        raise InvalidConfigError("give starting_offsets or starting_timestamp, not both")
    return OffsetSpec("timestamp", (), timestamp), {}


def _check_ranges(starts: dict, ends: dict, states: dict, start_given: dict, end_given: dict) -> None:
    """Offsets the caller gave that the log cannot serve, named with the option and the partition (the Spark
    source's checks would word them in its own options)."""
    from storage.errors import OffsetOutOfRangeError

    for tp, st in states.items():
        where = f"{tp.topic}-{tp.partition}"
        s, e = starts[tp], ends[tp]
        if tp.partition in start_given and not st.log_start <= s <= st.log_end:
            side = "below its log start offset" if s < st.log_start else f"past its {st.end_name}"
            bound = st.log_start if s < st.log_start else st.log_end
            raise OffsetOutOfRangeError(f"starting_offsets: offset {s} of {where} is {side} {bound}")
        if tp.partition in end_given and not st.log_start <= e <= st.log_end:
            side = "below its log start offset" if e < st.log_start else f"past its {st.end_name}"
            bound = st.log_start if e < st.log_start else st.log_end
            raise OffsetOutOfRangeError(f"ending_offsets: offset {e} of {where} is {side} {bound}")
        if s > e:
            raise OffsetOutOfRangeError(f"{where}: starting offset {s} is after ending offset {e}")


# ---------------------------------------------------------------- read: batches


def _read_ranges(lm: LogManager, ranges: list[OffsetRange], level: str, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Each range's records, decoded a chunk at a time (one partition open at a time), in read()'s schema."""
    from storage.topic_partition import TopicPartition

    for r in ranges:
        with lm.open_log(TopicPartition(r.topic, r.partition)) as log:
            for batch in log.read_records(r.start, r.end, isolation_level=level):
                yield _kafka_batch(batch, r.topic, r.partition, schema)


def _kafka_batch(batch: pa.RecordBatch, topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """Decoded records (storage.records.decoder.RECORD_SCHEMA) as rows of Spark's Kafka source schema."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    columns = {
        "key": batch.column("key"),
        "value": batch.column("value"),
        "topic": pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": pa.array(np.full(n, partition, np.int32)),
        "offset": batch.column("offset"),
        "timestamp": pc.multiply(batch.column("timestamp"), 1000).view(pa.timestamp("us", tz="UTC")),
        "timestampType": batch.column("timestampType"),
        "headers": batch.column("headers"),
    }
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
