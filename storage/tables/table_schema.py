"""The Iceberg schema, partition spec, sort order and properties of a topic's table and of its errors table.

A topic's table has the Kafka source's columns with the types `spark.read.format("kafkalog")` returns (key
binary, value binary, topic string, partition int, offset long, timestamp timestamptz, timestampType int,
headers list<struct<key string, value binary>>; all optional, as Spark's), then the columns of
table.value.schema. It is partitioned by a transform of `timestamp` (table.partition.by) and sorted by
partition, offset (each data file's rows are in that order). The errors table keeps the records whose value
did not parse: topic, partition, offset, timestamp, key, value and the error. Both carry `kafkalog.*`
properties naming the topic, its id and the table configs they were made from; a table whose schema, spec or
properties differ is not this topic's table (check_table).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import DayTransform, HourTransform, IdentityTransform, MonthTransform, YearTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from ..errors import TableConflictError
from .table_config import TableConfig

PROP_TOPIC = "kafkalog.topic"
PROP_TOPIC_ID = "kafkalog.topic-id"
PROP_ROLE = "kafkalog.role"  # table | errors
PROP_SHAPE = "kafkalog.table-config"  # TableConfig.shape_json()
#: pyiceberg re-applies a refused commit on top of the winner's snapshot this many times (default 4): a fast
#: append from a stale base would land with stale offsets. At 0 a refused commit raises CommitFailedException,
#: and the materializer decides (materializer._commit_with_retries), so two passes never both commit a range.
NO_COMMIT_RETRIES = {"commit.retry.num-retries": "0"}

TRANSFORMS = {"hour": HourTransform, "day": DayTransform, "month": MonthTransform, "year": YearTransform}

#: The Kafka source's columns (python_datasource/source_options.KAFKA_FIELDS), as Arrow types.
KAFKA_ARROW = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
ERRORS_ARROW = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("error", pa.string()),
    ]
)


class _Ids:
    def __init__(self):
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def _iceberg_type(t: pa.DataType, ids: _Ids) -> IcebergType:
    """The Iceberg type of an Arrow type the tables use (the Kafka columns and table.value.schema's)."""
    if pa.types.is_boolean(t):
        return BooleanType()
    if pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
        return IntegerType()
    if pa.types.is_int64(t):
        return LongType()
    if pa.types.is_float32(t):
        return FloatType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_decimal(t):
        return DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return BinaryType()
    if pa.types.is_date32(t):
        return DateType()
    if pa.types.is_timestamp(t):
        return TimestamptzType() if t.tz else TimestampType()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        element_id = ids.next()
        return ListType(element_id, _iceberg_type(t.value_type, ids), element_required=not t.value_field.nullable)
    if pa.types.is_struct(t):
        return StructType(*_fields(list(t), ids))
    raise TypeError(f"no Iceberg type for Arrow {t}")  # value_schema only makes the types above


def _fields(arrow_fields, ids: _Ids) -> list[NestedField]:
    out = []
    for f in arrow_fields:
        fid = ids.next()
        out.append(NestedField(fid, f.name, _iceberg_type(f.type, ids), required=not f.nullable))
    return out


def table_schema(value_fields: pa.Schema | None = None) -> Schema:
    """The schema of a topic's table: the Kafka columns, then table.value.schema's (value_fields)."""
    ids = _Ids()
    fields = _fields(list(KAFKA_ARROW), ids)
    if value_fields is not None:
        fields += _fields(list(value_fields), ids)
    return Schema(*fields)


def errors_schema() -> Schema:
    return Schema(*_fields(list(ERRORS_ARROW), _Ids()))


def arrow_schema(value_fields: pa.Schema | None = None) -> pa.Schema:
    """The table's columns as Arrow (no field ids): what rows are built as before they are written."""
    return pa.schema(list(KAFKA_ARROW) + (list(value_fields) if value_fields is not None else []))


def partition_spec(schema: Schema, partition_by: str) -> PartitionSpec:
    if partition_by == "none":
        return UNPARTITIONED_PARTITION_SPEC
    source = schema.find_field("timestamp")
    return PartitionSpec(
        PartitionField(
            source_id=source.field_id,
            field_id=1000,
            transform=TRANSFORMS[partition_by](),
            name=f"timestamp_{partition_by}",
        )
    )


def sort_order(schema: Schema) -> SortOrder:
    return SortOrder(
        SortField(source_id=schema.find_field("partition").field_id, transform=IdentityTransform()),
        SortField(source_id=schema.find_field("offset").field_id, transform=IdentityTransform()),
    )


def table_properties(cfg: TableConfig, topic_id: str | None, role: str) -> dict[str, str]:
    return {
        "format-version": "2",
        "write.parquet.compression-codec": "zstd",
        "write.parquet.compression-level": "1",  # 1.5x the write speed of zstd's default 3 (benchmarks/table.py)
        "write.metadata.metrics.column.value": "none",  # no statistics for values: data_files.NO_STATISTICS
        **NO_COMMIT_RETRIES,
        PROP_TOPIC: cfg.topic,
        PROP_TOPIC_ID: topic_id or "",
        PROP_ROLE: role,
        PROP_SHAPE: cfg.shape_json(),
    }


def _shape_of(t: Any) -> Any:
    """A type with its field ids left out (ids are the table's own): names, types, optionality."""
    if isinstance(t, (StructType, Schema)):
        return tuple((f.name, _shape_of(f.field_type), f.required) for f in t.fields)
    if isinstance(t, ListType):
        return ("list", _shape_of(t.element_type), t.element_required)
    return str(t)


def check_table(table, cfg: TableConfig, topic_id: str | None, role: str, expected: Schema) -> None:
    """Raise TableConflictError unless `table` is this topic's table as made: its properties, schema and
    partitioning. The message says what differs, so the user can tell a stray table from an altered one."""
    name = ".".join(table.name())
    props = table.properties
    problems = []
    if props.get(PROP_TOPIC) != cfg.topic or props.get(PROP_ROLE) != role:
        problems.append(
            f"it is not kafkalog's {'errors table' if role == 'errors' else 'table'} of topic '{cfg.topic}' "
            f"({PROP_TOPIC}={props.get(PROP_TOPIC)!r}, {PROP_ROLE}={props.get(PROP_ROLE)!r})"
        )
    elif topic_id and props.get(PROP_TOPIC_ID) and props.get(PROP_TOPIC_ID) != topic_id:
        problems.append(
            f"it was made for another topic '{cfg.topic}' (topic id {props.get(PROP_TOPIC_ID)}, this one is "
            f"{topic_id}): the topic was deleted and created again"
        )
    elif props.get(PROP_SHAPE) != cfg.shape_json():
        problems.append(f"it was made from other table configs ({props.get(PROP_SHAPE)})")
    elif any(props.get(k) != v for k, v in NO_COMMIT_RETRIES.items()):
        problems.append(
            "its property commit.retry.num-retries was changed from 0: pyiceberg would then re-apply a refused "
            "commit with stale offsets"
        )
    if not problems and _shape_of(table.schema()) != _shape_of(expected):
        problems.append(f"its schema was changed: it is {table.schema()}")
    if not problems and role == "table":
        want = [(f.name, str(f.transform)) for f in partition_spec(expected, cfg.partition_by).fields]
        have = [(f.name, str(f.transform)) for f in table.spec().fields]
        if want != have:
            problems.append(f"its partitioning was changed: it is {have}, kafkalog writes {want}")
    if problems:
        raise TableConflictError(f"table {name} of topic '{cfg.topic}': {problems[0]}; kafkalog will not write to it")
