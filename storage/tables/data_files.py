"""Decoded records as table rows, written as the table's Parquet data files.

table_rows turns a chunk the log engine decoded (decoder.RECORD_SCHEMA) into rows of the table's Arrow
schema: the Kafka columns as `spark.read.format("kafkalog")` builds them (timestamp ms -> us, UTC), then the
columns parsed from the value (table.value.format=json). Every record is a row; one whose value does not
parse keeps null parsed columns and is also an error row (for the errors table).

DataFileWriter writes rows to data files under the table's location, one open file per partition value
(the timestamp transform), in the order rows arrive: callers give each partition's records in offset order,
one partition after another, so each file is ordered by partition, offset (the table's sort order). Rows are
buffered per file up to ROW_GROUP_BYTES (one Parquet row group per flush), at most BUFFER_BYTES in all (the
largest buffer is flushed first), and a file rolls once write.target-file-size-bytes of Arrow data went in.
Files are named `<pass id>-<task>-<n>.parquet`: a pass that never commits leaves files that name it, and
nothing else does. Nothing is visible to readers until the catalog commit adds the DataFiles close() returns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ParquetFormatWriter, schema_to_pyarrow
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
from pyiceberg.table import TableProperties
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata, TableMetadataUtil
from pyiceberg.typedef import Record

from .table_schema import ERRORS_ARROW

ROW_GROUP_BYTES = 64 << 20
BUFFER_BYTES = 256 << 20
UNPARTITIONED = object()
#: Columns whose values never repeat enough for a Parquet dictionary: every page would start one and fall back
#: to plain encoding, about 10% of the write and of Spark's scan (benchmarks/table.py's figures in the docs).
NO_DICTIONARY = ("value", "offset", "timestamp")
#: Columns with no statistics in the Parquet files, and so no Iceberg metrics (the table sets their metrics mode
#: to none; pyiceberg warns on every file for a column with a mode and no statistics): a value's bounds prune
#: nothing, and computing them is 10% of the write.
NO_STATISTICS = ("value",)


def _leaf_paths(field: pa.Field, prefix: str = "") -> list[str]:
    """The Parquet column paths of an Arrow field (lists as Parquet's compliant `name.list.element`)."""
    name = prefix + field.name
    t = field.type
    if pa.types.is_struct(t):
        return [p for child in t for p in _leaf_paths(child, name + ".")]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _leaf_paths(pa.field("element", t.value_type), name + ".list.")
    return [name]


def _timestamps_us(chunk: pa.RecordBatch) -> pa.Array:
    """The record timestamps (ms) as Spark's Kafka source gives them: timestamp[us, UTC]."""
    return pa.array(chunk.column("timestamp").to_numpy() * 1000, pa.int64()).view(pa.timestamp("us", tz="UTC"))


def table_rows(
    chunk: pa.RecordBatch, topic: str, partition: int, value_schema=None
) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
    """(rows in the table's Arrow schema, error rows or None) of one decoded chunk of one partition."""
    n = chunk.num_rows
    ts = _timestamps_us(chunk)
    topics = pa.repeat(pa.scalar(topic, pa.string()), n)
    parts = pa.array(np.full(n, partition, np.int32))
    arrays = [chunk.column("key"), chunk.column("value"), topics, parts, chunk.column("offset"), ts]
    arrays += [chunk.column("timestampType"), chunk.column("headers")]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    errors = None
    if value_schema is not None:
        from .json_values import parse_json_values

        parsed = parse_json_values(chunk.column("value"), value_schema)
        arrays += list(parsed.columns)
        names += [f.name for f in value_schema.arrow_schema()]
        if len(parsed.error_rows):
            idx = pa.array(parsed.error_rows, pa.int64())
            errors = pa.RecordBatch.from_arrays(
                [
                    topics.take(idx),
                    parts.take(idx),
                    chunk.column("offset").take(idx),
                    ts.take(idx),
                    chunk.column("key").take(idx),
                    chunk.column("value").take(idx),
                    pa.array(parsed.error_messages, pa.string()),
                ],
                schema=ERRORS_ARROW,
            )
    return pa.RecordBatch.from_arrays(arrays, names=names), errors


@dataclass
class WriteContext:
    """What a task needs to write one table's data files (picklable: Spark tasks get it)."""

    metadata_json: str
    io_properties: dict
    pass_id: str

    @classmethod
    def of(cls, table, pass_id: str) -> WriteContext:
        return cls(table.metadata.model_dump_json(), dict(table.io.properties), pass_id)

    @functools.cached_property
    def metadata(self) -> TableMetadata:
        return TableMetadataUtil.parse_raw(self.metadata_json)

    @functools.cached_property
    def io(self):
        return load_file_io(self.io_properties, self.metadata.location)

    def __getstate__(self):
        return {"metadata_json": self.metadata_json, "io_properties": self.io_properties, "pass_id": self.pass_id}


class _ParquetWriter(ParquetFormatWriter):
    """pyiceberg's Parquet writer with the columns that get a dictionary and statistics chosen: pyiceberg has
    no table property for either, so the pyarrow arguments (`use_dictionary`, `write_statistics`) are set here."""

    def __init__(self, output, schema, properties, dictionary_columns: list, statistics_columns: list) -> None:
        super().__init__(output, schema, properties)
        self._parquet_writer_kwargs["use_dictionary"] = dictionary_columns
        self._parquet_writer_kwargs["write_statistics"] = statistics_columns


@dataclass
class _OpenFile:
    writer: _ParquetWriter
    path: str
    partition: Record
    buffered: list = field(default_factory=list)
    buffered_bytes: int = 0
    written_bytes: int = 0
    output: object = None


class DataFileWriter:
    """Rows of one table into Parquet data files (see the module doc); close() returns their DataFiles."""

    def __init__(self, ctx: WriteContext, task: str):
        meta = ctx.metadata
        self.ctx, self.task, self.io = ctx, task, ctx.io
        self.schema = meta.schema()
        self.spec = meta.spec()
        self.file_schema = schema_to_pyarrow(self.schema, include_field_ids=True)
        self.dictionary_columns = [p for f in self.file_schema if f.name not in NO_DICTIONARY for p in _leaf_paths(f)]
        self.statistics_columns = [p for f in self.file_schema if f.name not in NO_STATISTICS for p in _leaf_paths(f)]
        self.properties = meta.properties
        self.location = load_location_provider(meta.location, meta.properties)
        self.target = int(
            meta.properties.get(
                TableProperties.WRITE_TARGET_FILE_SIZE_BYTES, TableProperties.WRITE_TARGET_FILE_SIZE_BYTES_DEFAULT
            )
        )
        self.field = self.spec.fields[0] if self.spec.fields else None
        self.transform = None
        if self.field is not None:
            source_type = self.schema.find_field(self.field.source_id).field_type
            self.source_name = self.schema.find_column_name(self.field.source_id)
            self.transform = self.field.transform.pyarrow_transform(source_type)
        self.open: dict = {}
        self.files: list[DataFile] = []
        self.paths: list[str] = []  # every file started, committed or not (abort removes them)
        self.buffered = 0
        self.rows = 0
        self._n = 0

    def write(self, rows: pa.RecordBatch) -> None:
        """Append rows (the table's columns, in schema order) to the files of their partition values."""
        if rows.num_rows == 0:
            return
        pairs = zip(rows.columns, self.file_schema, strict=True)
        batch = pa.RecordBatch.from_arrays(
            [col.cast(f.type) if col.type != f.type else col for col, f in pairs], schema=self.file_schema
        )
        self.rows += batch.num_rows
        if self.transform is None:
            self._append(UNPARTITIONED, batch)
            return
        values = self.transform(batch.column(self.source_name)).to_numpy(zero_copy_only=False)
        lo, hi = values.min(), values.max()
        if lo == hi:
            self._append(int(lo), batch)
            return
        order = np.argsort(values, kind="stable")  # each value's rows keep their offset order
        sorted_values = values[order]
        cuts = np.flatnonzero(np.diff(sorted_values)) + 1
        for start, end in zip(np.r_[0, cuts], np.r_[cuts, len(order)], strict=True):
            self._append(int(sorted_values[start]), batch.take(pa.array(order[start:end])))

    def _append(self, value, batch: pa.RecordBatch) -> None:
        f = self.open.get(value)
        if f is None:
            f = self.open[value] = self._new_file(value)
        f.buffered.append(batch)
        f.buffered_bytes += batch.nbytes
        self.buffered += batch.nbytes
        if f.buffered_bytes >= ROW_GROUP_BYTES:
            self._flush(value)
        while self.buffered > BUFFER_BYTES:
            self._flush(max(self.open, key=lambda v: self.open[v].buffered_bytes))

    def _new_file(self, value) -> _OpenFile:
        self._n += 1
        name = f"{self.ctx.pass_id}-{self.task}-{self._n:05d}.parquet"
        if value is UNPARTITIONED:
            key, partition = None, Record()
        else:
            assert self.field is not None  # a partition value comes from the spec's field
            key = PartitionKey([PartitionFieldValue(self.field, value)], self.spec, self.schema)
            partition = Record(value)
        path = self.location.new_data_location(data_file_name=name, partition_key=key)
        output = self.io.new_output(path)
        self.paths.append(path)
        writer = _ParquetWriter(output, self.schema, self.properties, self.dictionary_columns, self.statistics_columns)
        return _OpenFile(writer, path, partition, output=output)

    def _flush(self, value) -> None:
        f = self.open[value]
        if f.buffered:
            f.writer.write(pa.Table.from_batches(f.buffered, schema=self.file_schema))
            self.buffered -= f.buffered_bytes
            f.written_bytes += f.buffered_bytes
            f.buffered, f.buffered_bytes = [], 0
        if f.written_bytes >= self.target:
            self._finish(value)

    def _finish(self, value) -> None:
        f = self.open.pop(value)
        stats = f.writer.close()
        self.files.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f.path,
                file_format=FileFormat.PARQUET,
                partition=f.partition,
                file_size_in_bytes=len(f.output),
                sort_order_id=None,
                spec_id=self.spec.spec_id,
                equality_ids=None,
                key_metadata=None,
                **stats.to_serialized_dict(),
            )
        )

    def close(self) -> list[DataFile]:
        for value in list(self.open):
            self._flush(value)
            if value in self.open:
                self._finish(value)
        return self.files

    def abort(self) -> None:
        """Drop what was written (a pass that will not commit): best effort, orphans are found later too."""
        for f in self.open.values():
            try:
                f.writer.close()
            except Exception:  # noqa: BLE001, S110 - never opened, or already failing
                pass
        self.open.clear()
        for path in self.paths:
            try:
                self.io.delete(path)
            except Exception:  # noqa: BLE001, S110 - a missing file is the goal
                pass
