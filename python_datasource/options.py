"""Writer options and input schema checks, done on the driver before any data is written."""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from storage.errors import InvalidConfigError
from storage.fs.storage_options import storage_options_from_spark
from storage.log_config import CONFIG_KEYS_BY_NAME, LogConfig, parse_option
from storage.records.record_batch import CompressionType
from storage.topic_partition import validate_topic_name
from storage.transactions.transaction_coordinator import DEFAULT_TRANSACTION_TIMEOUT_MS

WRITER_OPTIONS = {
    "path",
    "topic",
    "compression.type",
    "partitions",
    "locktimeoutms",
    "checkpointlocation",
    "queryname",
    "transactional",
    "transaction.timeout.ms",
}
SINK_NAMES = {"locktimeoutms": "lockTimeoutMs", "checkpointlocation": "checkpointLocation", "queryname": "queryName"}
SINK_COLUMNS = ("key", "value", "headers", "topic", "partition", "timestamp")

# kafka.* options Spark's Kafka sink refuses, with its reasons (KafkaSourceProvider.kafkaParamsForProducer)
REFUSED_SINK_KAFKA = {
    "kafka.key.serializer": "Kafka option 'key.serializer' is not supported as keys are serialized with "
    "ByteArraySerializer.",
    "kafka.value.serializer": "Kafka option 'value.serializer' is not supported as value are serialized with "
    "ByteArraySerializer.",
}

log = logging.getLogger(__name__)


def refuse_kafka_options(opts: dict, refused: dict) -> None:
    """The kafka.* options Spark's Kafka connector refuses, refused with its own words."""
    for key, reason in refused.items():
        if key in opts:
            raise InvalidConfigError(reason)


def note_unknown_options(
    opts: dict, known: dict, where: str, *, ignored: Iterable[str] = (), notes: list | None = None
) -> list[str]:
    """Options Spark's Kafka connector would accept and ignore are ignored here too; one that looks like
    a misspelling of one of ours gets a warning naming ours as documented (e.g. startingOffsets).
    `known`: lowercase name -> documented spelling. The messages are logged, or with `notes` appended
    to it as (level, message) for the caller to log once. Returns the unknown names."""
    unknown = [k for k in opts if k not in known and k not in ignored and not k.startswith(("kafka.", "fs.", "spark."))]
    found: list[tuple[int, str]] = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
        if close:
            found.append(
                (
                    logging.WARNING,
                    f"option '{key}' is not an option of format('kafkalog') {where} and is ignored; "
                    f"did you mean {known[close[0]]}?",
                )
            )
        else:
            found.append(
                (
                    logging.INFO,
                    f"option '{key}' is ignored by format('kafkalog') {where} (as Spark's Kafka connector "
                    f"ignores options it does not know)",
                )
            )
    if notes is None:
        for level, message in found:
            log.log(level, message)
    else:
        notes.extend(found)
    return unknown


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
    compression_level: int | None = None  # compression.<codec>.level, as Kafka's producer takes it
    # each micro-batch one Kafka transaction over its partitions (docs/spark.md); false: the older
    # per-partition commit, whose partial commits are cut off
    transactional: bool = True
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS  # Kafka producer's transaction.timeout.ms
    partitions_given: bool = False  # `partitions` was set: a topic that exists must have that many

    @classmethod
    def parse(cls, options: dict) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise InvalidConfigError(
                "option 'path' is required: the kafkalog root directory (a Kafka log.dir), "
                "e.g. .option('path', '/data/logs') or .start('/data/logs')"
            )
        topic = opts.get("topic")
        if topic is not None:
            validate_topic_name(topic)
        codec_name = opts.get("compression.type", "none")
        try:
            codec = CompressionType.for_name(codec_name)
        except ValueError as e:
            raise InvalidConfigError(f"option 'compression.type': {e}") from None
        partitions = parse_option("partitions", opts.get("partitions", "1"), "int", at_least=1)
        topic_config = {k: v for k, v in opts.items() if k in CONFIG_KEYS_BY_NAME and k != "compression.type"}
        LogConfig.from_dict(topic_config)  # names the key and rule at fault
        refuse_kafka_options(opts, REFUSED_SINK_KAFKA)  # other kafka.* (a broker's settings) mean nothing here
        known = {**{k: SINK_NAMES.get(k, k) for k in WRITER_OPTIONS}, **{k: k for k in CONFIG_KEYS_BY_NAME}}
        note_unknown_options(opts, known, "sink")
        lock_timeout_s = parse_option("lockTimeoutMs", opts.get("locktimeoutms", "600000"), "long", at_least=0) / 1000
        transactional = parse_option("transactional", opts.get("transactional", "true"), "boolean")
        txn_timeout = parse_option(
            "transaction.timeout.ms",
            opts.get("transaction.timeout.ms", str(DEFAULT_TRANSACTION_TIMEOUT_MS)),
            "int",
            at_least=1,
        )
        level_key = f"compression.{codec.name.lower()}.level"  # the producer's level (KIP-390)
        level = (
            LogConfig.from_dict({level_key: opts[level_key]}).compression_level(codec) if level_key in opts else None
        )
        return cls(
            path,
            topic,
            codec,
            partitions,
            topic_config,
            opts.get("checkpointlocation"),
            lock_timeout_s,
            storage_options_from_spark(opts),
            level,
            transactional,
            txn_timeout,
            "partitions" in opts,
        )

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
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    fields = {f.name: f.dataType for f in schema.fields}
    text = (StringType, BinaryType)

    def bad(name, want):
        return InvalidConfigError(
            f"column '{name}' has type {fields[name].simpleString()}; the kafkalog sink takes {want}"
        )

    if "value" not in fields:
        raise InvalidConfigError(
            f"the kafkalog sink needs a 'value' column (string or binary); input columns: {', '.join(fields) or 'none'}"
        )
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], text):
            raise bad(name, "string or binary")
    if "topic" in fields and options.topic is None and not isinstance(fields["topic"], StringType):
        raise bad("topic", "string")  # (with the topic option, the column is not read: Spark's Kafka sink)
    if "topic" not in fields and options.topic is None:
        raise InvalidConfigError("no topic: set .option('topic', ...) or provide a 'topic' column")
    if "partition" in fields and not isinstance(fields["partition"], (IntegerType, ShortType, LongType)):
        raise bad("partition", "int")
    if "timestamp" in fields and not isinstance(fields["timestamp"], (TimestampType, TimestampNTZType, LongType)):
        raise bad("timestamp", "timestamp, or long milliseconds")
    if "headers" in fields:
        h = fields["headers"]
        ok = (
            isinstance(h, ArrayType)
            and isinstance(h.elementType, StructType)
            and [f.name for f in h.elementType.fields] == ["key", "value"]
            and isinstance(h.elementType["key"].dataType, StringType)
            and isinstance(h.elementType["value"].dataType, text)
        )
        if not ok:
            raise bad("headers", "array<struct<key:string,value:binary>>")
