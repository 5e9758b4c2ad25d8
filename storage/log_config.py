"""Topic-level log config: Kafka's key names, defaults and validation rules (Kafka 3.x).

Validation follows Kafka 3.x minimums, not Kafka 4's raised ones: segment.bytes >= 14,
segment.ms >= 1, index.interval.bytes >= 0, and zero delays or retentions are legal, so tests and
small deployments can use tiny segments. Values parse as Kafka's ConfigDef parses them (coerce); the
options of the sink, the source, the cleaner and the command line parse by the same types (parse_option).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .common.constants import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from .errors import InvalidConfigError

# the smallest RecordBatch v2: its 61-byte header and one record with null key and value (the same as
# records.record_batch.MIN_BATCH_BYTES, which is not imported here: it would load numba for config checks)
MIN_BATCH_BYTES = 68


CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
#: Topic-level compression.type values (Kafka's BrokerCompressionType). A producer says "none".
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
#: table.mode values (docs/tables.md): no table, every committed record a row, or one row per key.
TABLE_MODES = ("off", "append", "upsert")
#: table.partition.by values: the Iceberg transform of the record timestamp the table is partitioned by.
TABLE_PARTITIONS = ("hour", "day", "month", "year", "none")
TABLE_VALUE_FORMATS = ("none", "json")
#: Broker-level log.retention.check.interval.ms: how often the maintenance job passes over the logs.
DEFAULT_CHECK_INTERVAL_MS = 300_000


# ---------------------------------------------------------------- validators


@dataclass(frozen=True)
class Range:
    """Numeric bounds, shown as Kafka shows them: [14,...] or [0,...,1]."""

    min: float | None = None
    max: float | None = None

    def check(self, value) -> str | None:
        if self.min is not None and value < self.min:
            return f"Value must be at least {self.min}"
        if self.max is not None and value > self.max:
            return f"Value must be no more than {self.max}"
        return None

    def __str__(self):
        if self.max is None:
            return f"[{self.min},...]"
        if self.min is None:
            return f"[...,{self.max}]"
        return f"[{self.min},...,{self.max}]"


@dataclass(frozen=True)
class ValidString:
    """One of a fixed set of strings (case-sensitive, as in Kafka)."""

    values: tuple[str, ...]
    hint: str = ""

    def check(self, value) -> str | None:
        if value not in self.values:
            return f"String must be one of: {', '.join(self.values)}{self.hint}"
        return None

    def __str__(self):
        return "[" + ", ".join(self.values) + "]"


@dataclass(frozen=True)
class ValidList:
    """Every item of a list from a fixed set; an empty list is legal (Kafka 3.x)."""

    values: tuple[str, ...]

    def check(self, value) -> str | None:
        for item in value:
            if item not in self.values:
                return f"Invalid value {item!r}: each item must be one of {', '.join(self.values)}"
        return None

    def __str__(self):
        return "[" + ", ".join(self.values) + "]"


@dataclass(frozen=True)
class ValidName:
    """A string matching a pattern (Iceberg identifiers: no quoting needed in Spark SQL or DuckDB)."""

    pattern: str
    hint: str

    def check(self, value) -> str | None:
        if not re.fullmatch(self.pattern, value):
            return f"{self.hint}"
        return None

    def __str__(self):
        return self.hint


@dataclass(frozen=True)
class LevelRange:
    """A compression level: in [min, max], or the codec's 'default' sentinel (gzip's -1)."""

    min: int
    max: int
    sentinel: int | None = None

    def check(self, value) -> str | None:
        if value == self.sentinel or self.min <= value <= self.max:
            return None
        extra = f" or {self.sentinel}" if self.sentinel is not None else ""
        return f"Value must be in [{self.min},...,{self.max}]{extra}"

    def __str__(self):
        extra = f" or {self.sentinel}" if self.sentinel is not None else ""
        return f"[{self.min},...,{self.max}]{extra}"


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class ConfigKey:
    """One topic config: Kafka name, ConfigDef type, default, validator, a one-line doc."""

    name: str
    type: str  # int | long | double | string | list | boolean (Kafka's ConfigDef.Type names)
    default: Any
    validator: Any
    doc: str

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")

    @property
    def valid_values(self) -> str:
        return "" if self.validator is None else str(self.validator)

    @property
    def default_str(self) -> str:
        return format_value(self.type, self.default)


def _k(name, type_, default, validator, doc):
    return ConfigKey(name, type_, default, validator, doc)


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    _k(
        "cleanup.policy",
        "list",
        (CLEANUP_POLICY_DELETE,),
        ValidList((CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE)),
        "Old-segment policy: delete (retention), compact (keep the last record per key), or both.",
    ),
    _k(
        "compression.gzip.level",
        "int",
        -1,
        LevelRange(1, 9, -1),
        "gzip level when compression.type is gzip (-1: codec default).",
    ),
    _k("compression.lz4.level", "int", 9, LevelRange(1, 17), "lz4 level when compression.type is lz4."),
    _k(
        "compression.type",
        "string",
        "producer",
        ValidString(COMPRESSION_TYPES, " (a producer's 'none' is 'uncompressed' at topic level)"),
        "Codec of stored batches; 'producer' keeps the producer's codec.",
    ),
    _k("compression.zstd.level", "int", 3, LevelRange(-131072, 22), "zstd level when compression.type is zstd."),
    _k(
        "delete.retention.ms",
        "long",
        86400000,
        Range(0),
        "How long tombstones survive compaction (the delete horizon).",
    ),
    _k(
        "file.delete.delay.ms",
        "long",
        60000,
        Range(0),
        "Wait before removing a segment's .deleted files, so readers in flight finish.",
    ),
    _k("flush.messages", "long", INT64_MAX, Range(1), "Force an fsync after this many appended messages."),
    _k("flush.ms", "long", INT64_MAX, Range(0), "Force an fsync when this long has passed since the last one."),
    _k("index.interval.bytes", "int", 4096, Range(0), "Log bytes between offset-index entries."),
    _k(
        "max.compaction.lag.ms",
        "long",
        INT64_MAX,
        Range(1),
        "Longest a record may stay uncompacted before its log is cleaned regardless of dirty ratio.",
    ),
    _k(
        "max.message.bytes",
        "int",
        1048588,
        Range(MIN_BATCH_BYTES),
        "Largest record batch accepted (after compression); also the bound on its decompressed records. At least "
        "68, the smallest batch (Kafka accepts 0, with which nothing can be appended).",
    ),
    _k(
        "message.downconversion.enable",
        "boolean",
        True,
        None,
        "Kafka 3.x fetch down-conversion switch; accepted for compatibility, no effect here.",
    ),
    _k(
        "message.timestamp.after.max.ms",
        "long",
        INT64_MAX,
        Range(0),
        "Largest allowed lead of a record timestamp over the append time (CreateTime).",
    ),
    _k(
        "message.timestamp.before.max.ms",
        "long",
        INT64_MAX,
        Range(0),
        "Largest allowed lag of a record timestamp behind the append time (CreateTime).",
    ),
    _k(
        "message.timestamp.difference.max.ms",
        "long",
        INT64_MAX,
        Range(0),
        "Deprecated in Kafka 3.6 for the before/after pair; accepted for compatibility.",
    ),
    _k(
        "message.timestamp.type",
        "string",
        "CreateTime",
        ValidString(TIMESTAMP_TYPES),
        "Record timestamps: the producer's (CreateTime) or the append time (LogAppendTime).",
    ),
    _k(
        "min.cleanable.dirty.ratio",
        "double",
        0.5,
        Range(0, 1),
        "Dirty fraction of a log above which the cleaner compacts it.",
    ),
    _k("min.compaction.lag.ms", "long", 0, Range(0), "Shortest time a record stays uncompacted."),
    _k("min.insync.replicas", "int", 1, Range(1), "Replication setting; accepted for compatibility, no effect here."),
    _k("preallocate", "boolean", False, None, "Preallocate segment files; accepted, not used by this engine."),
    _k("retention.bytes", "long", -1, None, "Size a partition may grow to before old segments go; -1: no limit."),
    _k(
        "retention.ms",
        "long",
        604800000,
        Range(-1),
        "Age after which a segment is deleted (delete policy); -1: no time limit.",
    ),
    _k("segment.bytes", "int", 1073741824, Range(14), "Largest segment file; a new segment rolls past it."),
    _k("segment.index.bytes", "int", 10485760, Range(4), "Largest offset/time index file of a segment."),
    _k("segment.jitter.ms", "long", 0, Range(0), "Random jitter subtracted from segment.ms per segment."),
    _k("segment.ms", "long", 604800000, Range(1), "Roll a new segment when the active one is this old."),
    _k(
        "table.catalog",
        "string",
        "",
        ValidName(r"[A-Za-z0-9_-]{0,64}", "empty (ROOT's own catalog) or a pyiceberg catalog name of [A-Za-z0-9_-]"),
        "kafkalog: the pyiceberg catalog of the topic's table; empty: the SQLite catalog kept inside ROOT.",
    ),
    _k(
        "table.mode",
        "string",
        "off",
        ValidString(TABLE_MODES),
        "kafkalog: keep the topic as an Iceberg table: append (a row per record), upsert (a row per key; "
        "compacted topics), off.",
    ),
    _k(
        "table.name",
        "string",
        "",
        ValidName(r"[A-Za-z0-9_-]{0,200}", "empty (the topic, '.' as '_') or a name of [A-Za-z0-9_-]"),
        "kafkalog: the table's name in table.namespace; empty: the topic's name with '.' as '_'.",
    ),
    _k(
        "table.namespace",
        "string",
        "kafkalog",
        ValidName(r"[A-Za-z0-9_]{1,64}(\.[A-Za-z0-9_]{1,64}){0,3}", "names of [A-Za-z0-9_] joined by '.'"),
        "kafkalog: the Iceberg namespace of the table.",
    ),
    _k(
        "table.partition.by",
        "string",
        "day",
        ValidString(TABLE_PARTITIONS),
        "kafkalog: the table's hidden partitioning, a transform of the record timestamp (none: unpartitioned).",
    ),
    _k(
        "table.value.format",
        "string",
        "none",
        ValidString(TABLE_VALUE_FORMATS),
        "kafkalog: json parses each value into the columns of table.value.schema (records that do not parse go "
        "to the errors table); none keeps the value as bytes only.",
    ),
    _k(
        "table.value.schema",
        "string",
        "",
        None,
        "kafkalog: with table.value.format=json, the value's columns as a Spark DDL string ('id BIGINT, name STRING').",
    ),
    _k(
        "unclean.leader.election.enable",
        "boolean",
        False,
        None,
        "Replication setting; accepted for compatibility, no effect here.",
    ),
)

CONFIG_KEYS_BY_NAME: dict[str, ConfigKey] = {k.name: k for k in CONFIG_KEYS}


# ---------------------------------------------------------------- parsing


_INT_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def format_value(type_: str, value) -> str:
    """A value as Kafka prints it: lists comma-joined, booleans lower-case."""
    if type_ == "list":
        return ",".join(value)
    if type_ == "boolean":
        return "true" if value else "false"
    return str(value)


def _bad(key: ConfigKey, value, rule: str) -> InvalidConfigError:
    return InvalidConfigError(f"Invalid value {value!r} for configuration {key.name}: {rule}")


def coerce(type_: str, value) -> Any:
    """A value (a string, or an already typed Python value) as Kafka's ConfigDef parses `type_`: int,
    long, double, boolean, list (a tuple), string. Raises ValueError with Kafka's words if it does not."""
    if type_ in ("int", "long"):
        bits = "32" if type_ == "int" else "64"
        if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
            parsed = int(value.strip())
        elif isinstance(value, int) and not isinstance(value, bool):
            parsed = int(value)
        else:
            raise ValueError(f"Expected value to be a {bits}-bit integer")
        lo, hi = (INT32_MIN, INT32_MAX) if type_ == "int" else (INT64_MIN, INT64_MAX)
        if not lo <= parsed <= hi:
            raise ValueError(f"Expected value to be a {bits}-bit integer")
        return parsed
    if type_ == "double":
        if isinstance(value, str) and _DOUBLE_RE.fullmatch(value.strip()):
            number = float(value.strip())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            raise ValueError("Expected value to be a number")
        if not math.isfinite(number):
            raise ValueError("Expected value to be a finite number")
        return number
    if type_ == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ValueError("Expected value to be either true or false")
    if type_ == "list":
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",")) if value.strip() else ()
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(v.strip() for v in value)
        raise ValueError("Expected a comma-separated list")
    if type_ == "string":
        if not isinstance(value, str):
            raise ValueError("Expected a string")
        return value.strip()
    raise AssertionError(type_)  # pragma: no cover - a caller's table error


def parse_value(key: ConfigKey, value):
    """Parse and validate one topic config value (a string or an already typed Python value)."""
    if value is None:
        raise _bad(key, value, "a value is required")
    try:
        parsed = coerce(key.type, value)
    except ValueError as e:
        raise _bad(key, value, str(e)) from None
    if key.validator is not None:
        problem = key.validator.check(parsed)
        if problem:
            raise _bad(key, value, problem)
    return parsed


# ---------------------------------------------------------------- options


class InvalidOptionValueError(InvalidConfigError):
    """An option value that does not parse as its type or lies outside its bounds. The message names the
    option, what it must be and the value given; `expected` alone is for callers that name the option
    their own way (argparse)."""

    def __init__(self, name: str, value, expected: str):
        super().__init__(f"option '{name}' must be {expected}, got {value!r}")
        self.name, self.value, self.expected = name, value, expected


def parse_option(
    name: str,
    value,
    type_: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    choices: tuple[str, ...] = (),
    ignore_case: bool = False,
    expected: str | None = None,
) -> Any:
    """One option value (of the sink, the source, the cleaner or a command line) by type: int, long,
    double, boolean, list, string as Kafka's ConfigDef parses them (coerce), or enum: one of `choices`
    (a list's items too, when given), returned as spelled there. Numbers within [at_least or (above,
    at_most]. Anything else raises InvalidOptionValueError; `expected` replaces the generated wording."""
    want = expected or _expectation(type_, at_least, above, at_most, choices)
    parsed: Any
    try:
        if type_ == "enum":
            parsed = _choice(str(value).strip(), choices, ignore_case)
        else:
            parsed = coerce(type_, value)
            for item in parsed if type_ == "list" and choices else ():
                _choice(item, choices, ignore_case)
    except ValueError:
        raise InvalidOptionValueError(name, value, want) from None
    if type_ in ("int", "long", "double") and (
        (at_least is not None and parsed < at_least)
        or (above is not None and parsed <= above)
        or (at_most is not None and parsed > at_most)
    ):
        raise InvalidOptionValueError(name, value, want)
    return parsed


def _choice(text: str, choices: tuple[str, ...], ignore_case: bool) -> str:
    for c in choices:
        if c == text or (ignore_case and c.lower() == text.lower()):
            return c
    raise ValueError(text)


def _expectation(type_: str, at_least, above, at_most, choices: tuple[str, ...]) -> str:
    """What a value of this type and bounds must be, in words: 'an integer >= 1', "'error' or 'latest'"."""
    quoted = [f"'{c}'" for c in choices]
    one_of = " or ".join(quoted) if len(quoted) <= 2 else "one of " + ", ".join(quoted)
    if type_ == "enum":
        return one_of
    if type_ == "boolean":
        return "true or false"
    if type_ == "list":
        return "a comma-separated list" + (f" of {', '.join(quoted)}" if choices else "")
    if type_ == "string":
        return "a string"
    noun = "a number" if type_ == "double" else "an integer"
    if above is not None and at_most is not None:
        return f"{noun} in ({above}, {at_most}]"
    if at_least is not None and at_most is not None:
        return f"{noun} from {at_least} to {at_most}"
    if at_least is not None:
        return f"{noun} >= {at_least}"
    if above is not None:
        return f"{noun} > {above}"
    return noun + (f" <= {at_most}" if at_most is not None else "")


def _unknown(name) -> InvalidConfigError:
    names = [k.name for k in CONFIG_KEYS]
    close = difflib.get_close_matches(str(name).replace("_", "."), names, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(names)}"
    return InvalidConfigError(f"Unknown topic config name: {name!r}{hint}")


def parse_config_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """['k=v', ...] (the CLI's --config) to a dict; a later pair for the same key wins, as in Kafka."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise InvalidConfigError(f"Invalid config {pair!r}: expected key=value")
        k, v = pair.split("=", 1)
        k = k.strip()
        if not k:
            raise InvalidConfigError(f"Invalid config {pair!r}: the key is empty")
        out[k] = v
    return out


# ---------------------------------------------------------------- the config


@dataclass(frozen=True)
class LogConfig:
    """An immutable, validated topic config. Attributes are the Kafka names with '_' for '.'."""

    cleanup_policy: tuple[str, ...] = (CLEANUP_POLICY_DELETE,)
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_type: str = "producer"
    compression_zstd_level: int = 3
    delete_retention_ms: int = 86400000
    file_delete_delay_ms: int = 60000
    flush_messages: int = INT64_MAX
    flush_ms: int = INT64_MAX
    index_interval_bytes: int = 4096
    max_compaction_lag_ms: int = INT64_MAX
    max_message_bytes: int = 1048588
    message_downconversion_enable: bool = True
    message_timestamp_after_max_ms: int = INT64_MAX
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_difference_max_ms: int = INT64_MAX
    message_timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    min_insync_replicas: int = 1
    preallocate: bool = False
    retention_bytes: int = -1
    retention_ms: int = 604800000
    segment_bytes: int = 1073741824
    segment_index_bytes: int = 10485760
    segment_jitter_ms: int = 0
    segment_ms: int = 604800000
    table_catalog: str = ""
    table_mode: str = "off"
    table_name: str = ""
    table_namespace: str = "kafkalog"
    table_partition_by: str = "day"
    table_value_format: str = "none"
    table_value_schema: str = ""
    unclean_leader_election_enable: bool = False
    # Kafka names given explicitly (Kafka's overriddenConfigs); not part of equality.
    explicit: frozenset = dataclasses.field(default=frozenset(), repr=False, compare=False)

    KEYS: ClassVar[tuple[ConfigKey, ...]] = CONFIG_KEYS

    def __post_init__(self):
        for key in CONFIG_KEYS:
            raw = getattr(self, key.attr)
            parsed = parse_value(key, raw)
            if parsed != raw or type(parsed) is not type(raw):
                object.__setattr__(self, key.attr, parsed)
        unknown = [n for n in self.explicit if n not in CONFIG_KEYS_BY_NAME]
        if unknown:
            raise _unknown(unknown[0])
        object.__setattr__(self, "explicit", frozenset(self.explicit))
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise InvalidConfigError(
                f"conflicting topic config: min.compaction.lag.ms ({self.min_compaction_lag_ms}) > "
                f"max.compaction.lag.ms ({self.max_compaction_lag_ms})"
            )
        self._check_table_configs()

    def _check_table_configs(self) -> None:
        """The table.* keys together: upsert needs a compacted topic, a JSON value format its schema."""
        if self.table_mode == "upsert" and not self.compact:
            raise InvalidConfigError(
                "conflicting topic config: table.mode=upsert keeps one row per key, for compacted topics: it needs "
                f"cleanup.policy with compact (it is {format_value('list', self.cleanup_policy) or 'empty'})"
            )
        if self.table_value_format == "json" and not self.table_value_schema:
            raise InvalidConfigError(
                "conflicting topic config: table.value.format=json needs table.value.schema, the value's columns "
                "as a Spark DDL string ('id BIGINT, name STRING')"
            )
        if self.table_value_schema:
            if self.table_value_format != "json":
                raise InvalidConfigError(
                    "conflicting topic config: table.value.schema is set but table.value.format is "
                    f"{self.table_value_format!r}: set table.value.format=json to parse values into its columns"
                )
            from .tables.value_schema import parse_value_schema  # pure Python: no Arrow or Iceberg here

            parse_value_schema(self.table_value_schema)

    # -- construction
    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None) -> LogConfig:
        """Defaults overridden by `overrides` (Kafka names; strings parsed as Kafka parses them)."""
        kwargs = {}
        for name, value in (overrides or {}).items():
            key = CONFIG_KEYS_BY_NAME.get(name)
            if key is None:
                raise _unknown(name)
            kwargs[key.attr] = parse_value(key, value)
        return cls(**kwargs, explicit=frozenset(overrides or {}))

    def with_overrides(self, overrides: Mapping[str, Any]) -> LogConfig:
        """A new config: this one's overrides, then `overrides` on top."""
        return LogConfig.from_dict({**self.overrides, **dict(overrides)})

    # -- access
    def get(self, name: str):
        key = CONFIG_KEYS_BY_NAME.get(name)
        if key is None:
            raise _unknown(name)
        return getattr(self, key.attr)

    @property
    def overrides(self) -> dict[str, str]:
        """Keys set explicitly or differing from Kafka's default, as Kafka-style strings."""
        return dict(self._overrides)

    @property
    def flush_overridden(self) -> bool:
        """flush.messages or flush.ms is set: flush by them, not after every append."""
        return "flush.messages" in self._overrides or "flush.ms" in self._overrides

    @functools.cached_property
    def _overrides(self) -> dict[str, str]:  # computed once: appends consult it (the config is immutable)
        out = {}
        for key in CONFIG_KEYS:
            value = getattr(self, key.attr)
            if key.name in self.explicit or value != key.default:
                out[key.name] = format_value(key.type, value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every key (Kafka name) to its typed value."""
        return {key.name: getattr(self, key.attr) for key in CONFIG_KEYS}

    def to_strings(self) -> dict[str, str]:
        """Every key to its value as Kafka prints it."""
        return {key.name: format_value(key.type, getattr(self, key.attr)) for key in CONFIG_KEYS}

    # -- derived, as Kafka's LogConfig derives them
    @property
    def compact(self) -> bool:
        return CLEANUP_POLICY_COMPACT in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return CLEANUP_POLICY_DELETE in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """segment.ms, capped by max.compaction.lag.ms on compacted topics (Kafka's maxSegmentMs)."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    @property
    def compression_codec(self):
        """The CompressionType to store batches with, or None for 'producer' (keep theirs)."""
        from .records.record_batch import CompressionType

        if self.compression_type == "producer":
            return None
        return CompressionType.for_name(self.compression_type)

    def compression_level(self, codec) -> int | None:
        """compression.<codec>.level for gzip and zstd; None where the codec has no level here (lz4's
        frames use the fast compressor; Kafka's gzip -1 is zlib's default)."""
        name = getattr(codec, "name", str(codec)).lower()
        if name == "zstd":
            return self.compression_zstd_level
        if name == "gzip" and self.compression_gzip_level != -1:
            return self.compression_gzip_level
        return None

    @property
    def timestamp_type(self):
        from .records.record_batch import TimestampType

        return (
            TimestampType.LOG_APPEND_TIME
            if self.message_timestamp_type == "LogAppendTime"
            else TimestampType.CREATE_TIME
        )

    def create_time_bounds(self, now_ms: int) -> tuple[int, int] | None:
        """[lo, hi] a CreateTime record timestamp must fall in at append time (Kafka's LogValidator),
        from message.timestamp.before/after.max.ms (and the older difference.max.ms); None: unbounded."""
        before = min(self.message_timestamp_before_max_ms, self.message_timestamp_difference_max_ms)
        after = min(self.message_timestamp_after_max_ms, self.message_timestamp_difference_max_ms)
        if self.message_timestamp_type != "CreateTime" or (before == INT64_MAX and after == INT64_MAX):
            return None
        return max(now_ms - before, INT64_MIN), min(now_ms + after, INT64_MAX)


def _check_table() -> None:
    fields = {f.name: f for f in dataclasses.fields(LogConfig) if f.name != "explicit"}
    assert set(fields) == {k.attr for k in CONFIG_KEYS}, "LogConfig fields and CONFIG_KEYS differ"
    for k in CONFIG_KEYS:
        assert fields[k.attr].default == k.default, k.name


_check_table()
