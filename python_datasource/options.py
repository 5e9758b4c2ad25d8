"""Writer options and input schema checks, done on the driver before any data is written."""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass, field

from storage.errors import InvalidConfigError
from storage.log_config import CONFIG_KEYS_BY_NAME, LogConfig
from storage.records.record_batch import CompressionType
from storage.storage_options import storage_options_from_spark
from storage.topic_partition import validate_topic_name

WRITER_OPTIONS = {"path", "topic", "compression.type", "partitions", "locktimeoutms", "checkpointlocation", "queryname"}
SINK_COLUMNS = ("key", "value", "headers", "topic", "partition", "timestamp")


@dataclass(frozen=True)
class SinkOptions:
    path: str
    topic: str | None
    compression: CompressionType
    partitions: int  # for topics the sink creates
    topic_config: dict = field(default_factory=dict)  # Kafka topic configs for topics the sink creates
    checkpoint_location: str | None = None
    lock_timeout_s: float = 600.0  # how long a commit waits for another writer's partition lock
    storage_options: dict = field(default_factory=dict)  # fsspec options from fs.* (e.g. fs.endpoint_url)

    @classmethod
    def parse(cls, options: dict) -> "SinkOptions":
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise InvalidConfigError("option 'path' is required: the kafkalog root directory (a Kafka log.dir), "
                                     "e.g. .option('path', '/data/logs') or .start('/data/logs')")
        topic = opts.get("topic")
        if topic is not None:
            validate_topic_name(topic)
        codec_name = opts.get("compression.type", "none")
        try:
            codec = CompressionType.for_name(codec_name)
        except ValueError as e:
            raise InvalidConfigError(f"option 'compression.type': {e}") from None
        try:
            partitions = int(opts.get("partitions", "1"))
            if partitions < 1:
                raise ValueError
        except ValueError:
            raise InvalidConfigError(f"option 'partitions' must be a positive integer, got {opts['partitions']!r}") \
                from None
        topic_config = {k: v for k, v in opts.items() if k in CONFIG_KEYS_BY_NAME and k != "compression.type"}
        LogConfig.from_dict(topic_config)  # names the key and rule at fault
        unknown = sorted(k for k in opts if k not in WRITER_OPTIONS and k not in CONFIG_KEYS_BY_NAME
                         and not k.startswith(("spark.", "kafka.", "fs.")))  # kafka.* belong to a broker; none here
        if unknown:
            raise InvalidConfigError(
                f"unknown option(s) for format('kafkalog') sink: {', '.join(unknown)}; known: "
                f"path, topic, compression.type, partitions, lockTimeoutMs and Kafka topic configs "
                f"such as segment.bytes")
        try:
            lock_timeout_s = int(opts.get("locktimeoutms", "600000")) / 1000.0
            if lock_timeout_s < 0:
                raise ValueError
        except ValueError:
            raise InvalidConfigError(f"option 'lockTimeoutMs' must be a non-negative integer, got "
                                     f"{opts['locktimeoutms']!r}") from None
        return cls(path, topic, codec, partitions, topic_config, opts.get("checkpointlocation"), lock_timeout_s,
                   storage_options_from_spark(opts))

    def writer_id(self) -> int:
        """Stable per streaming query (derived from its checkpoint location); fresh for a batch write."""
        if self.checkpoint_location:
            loc = self.checkpoint_location
            if "://" not in loc:
                loc = os.path.abspath(loc)
            digest = hashlib.sha256(loc.rstrip("/").encode()).digest()
        else:
            digest = uuid.uuid4().bytes
        return int.from_bytes(digest[:8], "big") & 0x7FFFFFFFFFFFFFFF


def check_schema(schema, options: SinkOptions) -> None:
    """Spark's Kafka sink columns with Spark's types; a clear error naming the column otherwise."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, IntegerType, LongType, ShortType, StringType, StructType, TimestampNTZType,
        TimestampType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    text = (StringType, BinaryType)

    def bad(name, want):
        return InvalidConfigError(f"column '{name}' has type {fields[name].simpleString()}; the kafkalog sink "
                                  f"takes {want}")

    if "value" not in fields:
        raise InvalidConfigError("the kafkalog sink needs a 'value' column (string or binary); input columns: "
                                 f"{', '.join(fields) or 'none'}")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], text):
            raise bad(name, "string or binary")
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise bad("topic", "string")
    if "topic" not in fields and options.topic is None:
        raise InvalidConfigError("no topic: set .option('topic', ...) or provide a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"], (IntegerType, ShortType, LongType)):
        raise bad("partition", "int")
    if "timestamp" in fields and not isinstance(fields["timestamp"], (TimestampType, TimestampNTZType, LongType)):
        raise bad("timestamp", "timestamp, or long milliseconds")
    if "headers" in fields:
        h = fields["headers"]
        ok = (isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
              and [f.name for f in h.elementType.fields] == ["key", "value"]
              and isinstance(h.elementType["key"].dataType, StringType)
              and isinstance(h.elementType["value"].dataType, text))
        if not ok:
            raise bad("headers", "array<struct<key:string,value:binary>>")
