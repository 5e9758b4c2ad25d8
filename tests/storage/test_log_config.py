import dataclasses

import pytest

from storage.errors import InvalidConfigError, KafkaLogError
from storage.log_config import CONFIG_KEYS, LogConfig, parse_config_pairs, parse_value
from storage.records.record_batch import CompressionType, TimestampType

LONG_MAX = 2**63 - 1

# Kafka 3.x topic-config defaults, typed as its documentation lists them (independent of the module).
KAFKA_3X_DEFAULTS = {
    "cleanup.policy": ("list", "delete"),
    "compression.type": ("string", "producer"),
    "delete.retention.ms": ("long", "86400000"),
    "file.delete.delay.ms": ("long", "60000"),
    "flush.messages": ("long", "9223372036854775807"),
    "flush.ms": ("long", "9223372036854775807"),
    "index.interval.bytes": ("int", "4096"),
    "max.compaction.lag.ms": ("long", "9223372036854775807"),
    "max.message.bytes": ("int", "1048588"),
    "message.timestamp.after.max.ms": ("long", "9223372036854775807"),
    "message.timestamp.before.max.ms": ("long", "9223372036854775807"),
    "message.timestamp.type": ("string", "CreateTime"),
    "min.cleanable.dirty.ratio": ("double", "0.5"),
    "min.compaction.lag.ms": ("long", "0"),
    "retention.bytes": ("long", "-1"),
    "retention.ms": ("long", "604800000"),
    "segment.bytes": ("int", "1073741824"),
    "segment.index.bytes": ("int", "10485760"),
    "segment.jitter.ms": ("long", "0"),
    "segment.ms": ("long", "604800000"),
}


def test_defaults_match_kafka_3x_docs():
    keys = {k.name: k for k in LogConfig.KEYS}
    cfg = LogConfig()
    strings = cfg.to_strings()
    for name, (type_, default) in KAFKA_3X_DEFAULTS.items():
        assert keys[name].type == type_, name
        assert keys[name].default_str == default, name
        assert strings[name] == default, name


def test_default_attributes():
    cfg = LogConfig()
    assert cfg.segment_bytes == 1073741824
    assert cfg.segment_ms == 604800000
    assert cfg.segment_index_bytes == 10485760
    assert cfg.index_interval_bytes == 4096
    assert cfg.retention_ms == 604800000
    assert cfg.retention_bytes == -1
    assert cfg.cleanup_policy == ("delete",)
    assert cfg.delete and not cfg.compact
    assert cfg.min_cleanable_dirty_ratio == 0.5
    assert cfg.max_compaction_lag_ms == LONG_MAX
    assert cfg.compression_type == "producer" and cfg.compression_codec is None
    assert cfg.message_timestamp_type == "CreateTime" and cfg.timestamp_type is TimestampType.CREATE_TIME
    assert cfg.overrides == {}
    assert LogConfig.from_dict({}) == cfg == LogConfig.from_dict(None)


def test_table_entries_are_complete_and_self_consistent():
    assert len({k.name for k in CONFIG_KEYS}) == len(CONFIG_KEYS)
    for key in CONFIG_KEYS:
        assert key.type in {"int", "long", "double", "string", "list", "boolean"}
        assert key.doc and "\n" not in key.doc
        # the printed default parses back to the default through the key's own rules
        assert parse_value(key, key.default_str) == key.default
    described = {k.name: k.valid_values for k in CONFIG_KEYS}
    assert described["segment.bytes"] == "[14,...]"
    assert described["min.cleanable.dirty.ratio"] == "[0,...,1]"
    assert described["retention.bytes"] == ""


def test_strings_are_parsed():
    cfg = LogConfig.from_dict(
        {
            "segment.bytes": " 1024 ",
            "segment.ms": "+60000",
            "min.cleanable.dirty.ratio": "1e-1",
            "cleanup.policy": "compact, delete",
            "preallocate": "TRUE",
            "retention.ms": "-1",
            "compression.type": "zstd",
            "message.timestamp.type": "LogAppendTime",
        }
    )
    assert cfg.segment_bytes == 1024 and isinstance(cfg.segment_bytes, int)
    assert cfg.segment_ms == 60000
    assert cfg.min_cleanable_dirty_ratio == pytest.approx(0.1)
    assert cfg.cleanup_policy == ("compact", "delete") and cfg.compact and cfg.delete
    assert cfg.preallocate is True
    assert cfg.retention_ms == -1
    assert cfg.compression_codec is CompressionType.ZSTD
    assert cfg.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert cfg.get("segment.bytes") == 1024


def test_typed_values_are_accepted():
    cfg = LogConfig.from_dict(
        {"segment.bytes": 100, "min.cleanable.dirty.ratio": 1, "cleanup.policy": ["compact"], "preallocate": True}
    )
    assert cfg.segment_bytes == 100
    assert cfg.min_cleanable_dirty_ratio == 1.0 and isinstance(cfg.min_cleanable_dirty_ratio, float)
    assert cfg.cleanup_policy == ("compact",) and cfg.compact and not cfg.delete


@pytest.mark.parametrize(
    "overrides",
    [
        {"segment.bytes": "14"},
        {"segment.ms": "1"},
        {"index.interval.bytes": "0"},
        {"segment.index.bytes": "4"},
        {"retention.ms": "0"},
        {"retention.ms": "-1"},
        {"retention.bytes": "0"},
        {"retention.bytes": "-5"},
        {"delete.retention.ms": "0"},
        {"file.delete.delay.ms": "0"},
        {"min.compaction.lag.ms": "0"},
        {"max.compaction.lag.ms": "1"},
        {"segment.jitter.ms": "0"},
        {"flush.ms": "0"},
        {"flush.messages": "1"},
        {"max.message.bytes": "68"},
        {"min.cleanable.dirty.ratio": "0"},
        {"min.cleanable.dirty.ratio": "1"},
        {"cleanup.policy": ""},
        {"compression.gzip.level": "-1"},
        {"compression.gzip.level": "9"},
        {"compression.zstd.level": "-131072"},
        {"segment.bytes": str(2**31 - 1)},
        {"retention.ms": str(LONG_MAX)},
    ],
)
def test_kafka_3x_minimums_are_legal(overrides):
    cfg = LogConfig.from_dict(overrides)
    ((name, value),) = overrides.items()
    assert cfg.overrides[name] == (value if name != "min.cleanable.dirty.ratio" else str(float(value)))


def test_empty_cleanup_policy_means_neither():
    cfg = LogConfig.from_dict({"cleanup.policy": ""})
    assert cfg.cleanup_policy == () and not cfg.compact and not cfg.delete


@pytest.mark.parametrize(
    "name,value,rule",
    [
        ("segment.bytes", "13", "at least 14"),
        ("max.message.bytes", "0", "at least 68"),  # Kafka takes 0, and then no batch can be appended
        ("segment.ms", "0", "at least 1"),
        ("segment.index.bytes", "3", "at least 4"),
        ("index.interval.bytes", "-1", "at least 0"),
        ("retention.ms", "-2", "at least -1"),
        ("delete.retention.ms", "-1", "at least 0"),
        ("max.compaction.lag.ms", "0", "at least 1"),
        ("flush.messages", "0", "at least 1"),
        ("min.cleanable.dirty.ratio", "1.5", "no more than 1"),
        ("min.cleanable.dirty.ratio", "-0.1", "at least 0"),
        ("min.cleanable.dirty.ratio", "nan", "number"),
        ("min.cleanable.dirty.ratio", "inf", "number"),
        ("segment.bytes", str(2**31), "32-bit integer"),
        ("segment.ms", str(2**63), "64-bit integer"),
        ("segment.bytes", "1_000", "32-bit integer"),
        ("segment.bytes", "1.5", "32-bit integer"),
        ("segment.bytes", "", "32-bit integer"),
        ("cleanup.policy", "compact,Delete", "'Delete'"),
        ("cleanup.policy", "compact,", "''"),
        ("compression.type", "none", "uncompressed"),
        ("compression.type", "GZIP", "one of"),
        ("message.timestamp.type", "createtime", "one of"),
        ("preallocate", "yes", "true or false"),
        ("compression.gzip.level", "0", "[1,...,9] or -1"),
        ("compression.lz4.level", "18", "[1,...,17]"),
    ],
)
def test_bad_values_name_key_value_and_rule(name, value, rule):
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig.from_dict({name: value})
    msg = str(ei.value)
    assert name in msg and repr(value) in msg and rule in msg


@pytest.mark.parametrize("value", [True, 1.0, 2.5, None, [1]])
def test_wrong_python_types_rejected_for_int(value):
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        LogConfig.from_dict({"segment.bytes": value})


def test_unknown_key_suggests_close_names():
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig.from_dict({"segment_bytes": "100"})
    assert "segment_bytes" in str(ei.value) and "segment.bytes" in str(ei.value)
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig.from_dict({"retention.msec": "1"})
    assert "retention.ms" in str(ei.value)
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig().get("zzzz")
    assert "zzzz" in str(ei.value) and "segment.bytes" in str(ei.value)  # lists the valid keys
    assert issubclass(InvalidConfigError, KafkaLogError)


def test_compaction_lag_conflict():
    with pytest.raises(InvalidConfigError, match="min.compaction.lag.ms"):
        LogConfig.from_dict({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    LogConfig.from_dict({"min.compaction.lag.ms": "5", "max.compaction.lag.ms": "5"})


def test_direct_construction_is_validated():
    with pytest.raises(InvalidConfigError, match="segment.bytes"):
        LogConfig(segment_bytes=13)
    cfg = LogConfig(segment_bytes="100", cleanup_policy="compact")
    assert cfg.segment_bytes == 100 and cfg.cleanup_policy == ("compact",)
    assert cfg.overrides == {"segment.bytes": "100", "cleanup.policy": "compact"}


def test_immutable_and_with_overrides():
    cfg = LogConfig.from_dict({"segment.bytes": "1000"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.segment_bytes = 5
    new = cfg.with_overrides({"cleanup.policy": "compact", "segment.ms": 10})
    assert cfg.cleanup_policy == ("delete",) and cfg.segment_ms == 604800000
    assert new.segment_bytes == 1000 and new.compact and new.segment_ms == 10
    assert new.overrides == {"segment.bytes": "1000", "cleanup.policy": "compact", "segment.ms": "10"}
    assert new.with_overrides({"segment.bytes": "2000"}).segment_bytes == 2000
    with pytest.raises(InvalidConfigError):
        cfg.with_overrides({"segment.bytes": "1"})
    assert hash(cfg) == hash(LogConfig.from_dict({"segment.bytes": 1000}))


def test_overrides_keep_explicit_defaults_and_canonical_strings():
    cfg = LogConfig.from_dict({"segment.bytes": "1073741824", "cleanup.policy": " compact , delete "})
    assert cfg.overrides == {"segment.bytes": "1073741824", "cleanup.policy": "compact,delete"}
    assert all(isinstance(v, str) for v in cfg.overrides.values())
    assert LogConfig.from_dict(cfg.overrides) == cfg


def test_to_dict_has_every_key():
    d = LogConfig().to_dict()
    assert set(d) == {k.name for k in CONFIG_KEYS}
    assert d["cleanup.policy"] == ("delete",) and d["segment.bytes"] == 1073741824
    for name, value in d.items():
        assert LogConfig().get(name) == value


def test_max_segment_ms_follows_kafka():
    assert LogConfig.from_dict({"segment.ms": "100"}).max_segment_ms == 100
    cfg = LogConfig.from_dict({"segment.ms": "100", "cleanup.policy": "compact", "max.compaction.lag.ms": "50"})
    assert cfg.max_segment_ms == 50
    cfg = LogConfig.from_dict({"segment.ms": "100", "max.compaction.lag.ms": "50"})  # delete only: no cap
    assert cfg.max_segment_ms == 100


def test_compression_codec_for_every_topic_value():
    expect = {
        "uncompressed": CompressionType.NONE,
        "gzip": CompressionType.GZIP,
        "snappy": CompressionType.SNAPPY,
        "lz4": CompressionType.LZ4,
        "zstd": CompressionType.ZSTD,
        "producer": None,
    }
    for name, codec in expect.items():
        assert LogConfig.from_dict({"compression.type": name}).compression_codec is codec


def test_parse_config_pairs():
    assert parse_config_pairs(["segment.bytes=100", "cleanup.policy=compact,delete", "x=a=b"]) == {
        "segment.bytes": "100",
        "cleanup.policy": "compact,delete",
        "x": "a=b",
    }
    assert parse_config_pairs(["a=1", "a=2"]) == {"a": "2"}
    assert parse_config_pairs([" k =v"]) == {"k": "v"}
    with pytest.raises(InvalidConfigError, match="'segment.bytes'.*key=value"):
        parse_config_pairs(["segment.bytes"])
    with pytest.raises(InvalidConfigError, match="empty"):
        parse_config_pairs(["=5"])
    assert LogConfig.from_dict(parse_config_pairs(["segment.bytes=100"])).segment_bytes == 100


def test_the_smallest_batch_is_what_the_config_floor_says():
    import pyarrow as pa

    from storage.log_config import MIN_BATCH_BYTES as floor
    from storage.records.builder import build_records
    from storage.records.record_batch import MIN_BATCH_BYTES

    smallest = build_records(pa.table({"key": pa.array([None], pa.binary()), "value": pa.array([None], pa.binary())}))
    assert floor == MIN_BATCH_BYTES == len(smallest)
