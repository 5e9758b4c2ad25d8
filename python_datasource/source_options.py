"""Reader options with the semantics of Spark's Kafka source, checked before any task runs."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field

from storage.errors import InvalidConfigError
from storage.fs.storage_options import storage_options_from_spark
from storage.log_config import InvalidOptionValueError, parse_option
from storage.transactions.isolation import READ_UNCOMMITTED, parse_isolation_level

from .options import note_unknown_options, refuse_kafka_options

EARLIEST, LATEST = -2, -1
# Spark's Kafka source schema, defined here once: (column, DDL type). The DDL string and the StructType
# (reader.kafka_struct) are derived from it; headers is there only with includeHeaders=true.
KAFKA_FIELDS = (
    ("key", "binary"),
    ("value", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "long"),
    ("timestamp", "timestamp"),
    ("timestampType", "int"),
    ("headers", "array<struct<key:string,value:binary>>"),
)
KAFKA_COLUMNS = tuple(name for name, _ in KAFKA_FIELDS)


def source_schema(include_headers: bool) -> str:
    """Spark's Kafka source schema (a DDL string), with the headers column when asked for."""
    fields = KAFKA_FIELDS if include_headers else KAFKA_FIELDS[:-1]
    return ", ".join(f"{name} {ddl}" for name, ddl in fields)


# Spark's names, for messages (options arrive lowercased)
SPARK_NAMES = {
    n.lower(): n
    for n in (
        "path",
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "startingOffsetsByTimestamp",
        "endingTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "failOnDataLoss",
        "minPartitions",
        "maxRecordsPerPartition",
        "includeHeaders",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
    )
}
READER_OPTIONS = set(SPARK_NAMES)
# options Spark's Kafka source takes that mean nothing without a broker (consumer groups, polling, fetch
# retries) or that it never reads (checkpointLocation on a reader): accepted and ignored, as there
IGNORED_SOURCE_OPTIONS = {
    "checkpointlocation",
    "groupidprefix",
    "kafkaconsumer.polltimeoutms",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
}
# the one kafka.* consumer option that changes what a read returns (the others mean nothing without a broker)
ISOLATION_LEVEL_OPTION = "kafka.isolation.level"
# kafka.* options Spark's Kafka source refuses, with its reasons (KafkaSourceProvider.validateGeneralOptions)
REFUSED_SOURCE_KAFKA = {
    "kafka.auto.offset.reset": "Kafka option 'auto.offset.reset' is not supported. Instead set the source option "
    "'startingoffsets' to 'earliest' or 'latest' to specify where to start. Structured "
    "Streaming manages which offsets are consumed internally, rather than relying on the "
    "kafkaConsumer to do it.",
    "kafka.key.deserializer": "Kafka option 'key.deserializer' is not supported as keys are deserialized as byte "
    "arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize "
    "the keys.",
    "kafka.value.deserializer": "Kafka option 'value.deserializer' is not supported as values are deserialized as "
    "byte arrays with ByteArrayDeserializer. Use DataFrame operations to explicitly "
    "deserialize the values.",
    "kafka.enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported",
    "kafka.interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}
STREAM_ONLY = ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: `kind` is 'offsets' (per partition, -2 earliest / -1 latest,
    with `default` for partitions not listed), 'timestamps' (per partition) or 'timestamp' (global)."""

    kind: str
    per_partition: tuple = ()  # ((topic, partition, value), ...)
    default: int = EARLIEST

    def value_for(self, topic: str, partition: int) -> int | None:
        for t, p, v in self.per_partition:
            if t == topic and p == partition:
                return v
        return None


@dataclass(frozen=True)
class SourceOptions:
    path: str
    subscribe: tuple[str, ...] | None
    pattern: str | None
    assign: tuple[tuple[str, int], ...] | None
    starting: OffsetSpec
    ending: OffsetSpec
    strategy: str  # startingOffsetsByTimestampStrategy: error | latest
    fail_on_data_loss: bool
    min_partitions: int | None
    include_headers: bool
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    storage_options: dict = field(default_factory=dict)  # fsspec options from fs.* (e.g. fs.endpoint_url)
    max_records_per_partition: int | None = None
    isolation_level: str = READ_UNCOMMITTED  # kafka.isolation.level, as Kafka's consumer takes it
    # (level, message) about options ignored or misspelled: logged once per read by log_notes()
    notes: tuple[tuple[int, str], ...] = ()

    def log_notes(self) -> None:
        """Log the notes about ignored or misspelled options (parse(warn=True) does it at once)."""
        for level, message in self.notes:
            log.log(level, message)

    @classmethod
    def parse(cls, options: dict, *, streaming: bool | None, warn: bool = True) -> SourceOptions:
        """Check and parse reader options as Spark's Kafka source does. streaming=None: only what a
        batch and a stream read share (DataSource.schema() does not know which it serves). warn=False:
        the warnings about ignored or misspelled options are kept in `notes`, not logged: Spark parses
        a read's options in several Python processes (schema(), then reader(), or for a stream
        streamReader() in the planner and again in the stream runner); one of them logs them."""
        o = {k.lower(): v for k, v in options.items()}
        notes: list[tuple[int, str]] = []
        refuse_kafka_options(o, REFUSED_SOURCE_KAFKA)
        if "kafka.group.id" in o:
            notes.append(
                (
                    logging.WARNING,
                    "option 'kafka.group.id' is ignored: kafkalog has no consumer groups (Spark's Kafka source "
                    "warns that setting it is unsafe)",
                )
            )
        note_unknown_options(o, SPARK_NAMES, "source", ignored=IGNORED_SOURCE_OPTIONS, notes=notes)
        if not o.get("path"):
            raise InvalidConfigError(
                "option 'path' is required: the kafkalog root directory, "
                "e.g. .option('path', '/data/logs') or .load('/data/logs')"
            )
        chosen = [k for k in ("subscribe", "subscribepattern", "assign") if k in o]
        if len(chosen) != 1:
            raise InvalidConfigError(
                "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be set"
                + (f" (got {', '.join(SPARK_NAMES[k] for k in chosen)})" if chosen else "")
            )
        subscribe = pattern = assign = None
        if "subscribe" in o:
            subscribe = tuple(t.strip() for t in o["subscribe"].split(",") if t.strip())
            if not subscribe:
                raise InvalidConfigError("option 'subscribe' names no topic")
        elif "subscribepattern" in o:
            pattern = o["subscribepattern"].strip()
            if not pattern:
                raise InvalidConfigError(
                    f"Pattern to subscribe is empty as specified value for option "
                    f"'subscribePattern' is '{o['subscribepattern']}'"
                )
            try:
                re.compile(pattern)
            except re.error as e:
                raise InvalidConfigError(f"option 'subscribePattern' is not a valid regex: {e}") from None
        else:
            assign = tuple(_parse_assign(o["assign"]))
        starting = _range_limit(
            o,
            "startingtimestamp",
            "startingoffsetsbytimestamp",
            "startingoffsets",
            LATEST if streaming else EARLIEST,
            ending=False,
            streaming=streaming,
        )
        if streaming:  # as Spark's Kafka source: two are refused, endingTimestamp is not read at all
            if "endingoffsets" in o:
                raise InvalidConfigError(
                    "ending offset not valid in streaming queries (option 'endingOffsets' is for batch reads)"
                )
            if "endingoffsetsbytimestamp" in o:
                raise InvalidConfigError(
                    "ending timestamp not valid in streaming queries (option "
                    "'endingOffsetsByTimestamp' is for batch reads)"
                )
            if "endingtimestamp" in o:
                notes.append(
                    (
                        logging.WARNING,
                        "option 'endingTimestamp' is ignored by streaming queries, as Spark's Kafka source ignores it",
                    )
                )
            ending = OffsetSpec("offsets", (), LATEST)
        else:
            ending = _range_limit(
                o, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", LATEST, ending=True, streaming=False
            )
            if streaming is False:
                for k in STREAM_ONLY:
                    if k in o:
                        notes.append((logging.WARNING, f"{SPARK_NAMES[k]} option ignored in batch queries"))
        max_per_trigger = _int(o, "maxoffsetspertrigger", 1)
        min_per_trigger = _int(o, "minoffsetspertrigger", 1)
        if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
            raise InvalidConfigError(
                f"The value of minOffsetsPerTrigger({min_per_trigger}) is higher than the "
                f"maxOffsetsPerTrigger({max_per_trigger})."
            )
        strategy = parse_option(
            SPARK_NAMES["startingoffsetsbytimestampstrategy"],
            o.get("startingoffsetsbytimestampstrategy", "error"),
            "enum",
            choices=("error", "latest"),
            ignore_case=True,
        )
        parsed = cls(
            path=o["path"],
            subscribe=subscribe,
            pattern=pattern,
            assign=assign,
            starting=starting,
            ending=ending,
            strategy=strategy,
            fail_on_data_loss=_bool(o, "failondataloss", True),
            min_partitions=_int(o, "minpartitions", 1),
            include_headers=_bool(o, "includeheaders", False),
            max_offsets_per_trigger=max_per_trigger,
            min_offsets_per_trigger=min_per_trigger,
            max_trigger_delay_ms=_duration_ms(o.get("maxtriggerdelay", "15m")),
            storage_options=storage_options_from_spark(o),
            max_records_per_partition=_int(o, "maxrecordsperpartition", 1),
            isolation_level=parse_isolation_level(
                o.get(ISOLATION_LEVEL_OPTION, READ_UNCOMMITTED), ISOLATION_LEVEL_OPTION
            ),
            notes=tuple(notes),
        )
        if warn:
            parsed.log_notes()
        return parsed


def _bool(o: dict, key: str, default: bool) -> bool:
    return default if key not in o else parse_option(SPARK_NAMES[key], o[key], "boolean")


def _int(o: dict, key: str, minimum: int) -> int | None:
    return None if key not in o else parse_option(SPARK_NAMES[key], o[key], "long", at_least=minimum)


_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|min|m|h|d)?\s*", str(text))
    if not m:
        raise InvalidOptionValueError("maxTriggerDelay", text, "a duration such as 15m, 30s or 500ms")
    return int(m.group(1)) * _UNITS[m.group(2) or "ms"]


def _json(o: dict, key: str):
    try:
        return json.loads(o[key])
    except ValueError as e:
        raise InvalidConfigError(f"option '{SPARK_NAMES[key]}' is not valid JSON: {e}") from None


def _parse_assign(text: str):
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise InvalidConfigError(f"option 'assign' is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not all(isinstance(v, list) for v in doc.values()):
        raise InvalidConfigError(f'option \'assign\' must look like {{"topicA":[0,1],"topicB":[2,4]}}, got {text!r}')
    for topic, parts in doc.items():
        for p in parts:
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise InvalidConfigError(
                    f"option 'assign': partition {p!r} of topic {topic!r} is not a non-negative integer"
                )
            yield topic, p


def _per_partition(o: dict, key: str) -> tuple:
    doc = _json(o, key)
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise InvalidConfigError(
            f'option \'{SPARK_NAMES[key]}\' must look like {{"topicA":{{"0":23,"1":-1}}}}, got ' + repr(o[key])
        )
    out = []
    for topic, parts in doc.items():
        for p, v in parts.items():
            try:
                pi = int(p)
            except ValueError:
                pi = -1
            if pi < 0 or not isinstance(v, int) or isinstance(v, bool):
                raise InvalidConfigError(
                    f"option '{SPARK_NAMES[key]}': entry {topic}/{p} = {v!r} is not partition -> integer"
                )
            out.append((topic, pi, v))
    return tuple(out)


def _offset_forms(*, ending: bool, streaming: bool | None) -> str:
    """The values startingOffsets / endingOffsets take here, for messages."""
    words = "'latest'" if ending else ("'earliest'" if streaming is False else "'earliest' or 'latest'")
    return f'{words}, or a JSON object of offsets per partition like {{"topicA":{{"0":23,"1":-1}}}}'


def _range_limit(
    o: dict, global_ts: str, by_ts: str, offsets: str, default: int, *, ending: bool, streaming: bool | None
) -> OffsetSpec:
    """Spark's precedence: a global timestamp, then per-partition timestamps, then offsets."""
    name = SPARK_NAMES[offsets]
    if global_ts in o:
        ts = parse_option(
            SPARK_NAMES[global_ts], o[global_ts], "long", at_least=0, expected="milliseconds since the epoch"
        )
        return OffsetSpec("timestamp", (), ts)
    if by_ts in o:
        spec = _per_partition(o, by_ts)
        bad = [(t, p, v) for t, p, v in spec if v < 0]
        if bad:
            raise InvalidConfigError(
                f"option '{SPARK_NAMES[by_ts]}': timestamp {bad[0][2]} for {bad[0][0]}-{bad[0][1]} is negative"
            )
        return OffsetSpec("timestamps", spec, default)
    if offsets not in o:
        return OffsetSpec("offsets", (), default)
    text = str(o[offsets]).strip()
    if text.lower() in ("earliest", "latest"):
        v = EARLIEST if text.lower() == "earliest" else LATEST
        if ending and v == EARLIEST:
            raise InvalidConfigError(f"option '{name}': 'earliest' is not allowed for the end of a range")
        if not ending and streaming is False and v == LATEST:
            raise InvalidConfigError(f"option '{name}': 'latest' is not allowed for a batch query's start")
        return OffsetSpec("offsets", (), v)
    if not text.startswith("{"):
        raise InvalidConfigError(
            f"option '{name}' is {text!r}: expected {_offset_forms(ending=ending, streaming=streaming)}"
        )
    try:
        spec = _per_partition(o, offsets)
    except InvalidConfigError as e:
        raise InvalidConfigError(f"{e} (expected {_offset_forms(ending=ending, streaming=streaming)})") from None
    for t, p, v in spec:
        if v < EARLIEST or (ending and v == EARLIEST) or (not ending and streaming is False and v == LATEST):
            raise InvalidConfigError(
                f"option '{name}': offset {v} for {t}-{p} is not allowed here "
                f"(use an offset >= 0{', or -1 for latest' if ending else ', or -2 for earliest'})"
            )
    return OffsetSpec("offsets", spec, default)
