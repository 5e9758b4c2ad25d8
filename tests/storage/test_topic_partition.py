import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.errors import InvalidTopicError
from storage.topic_partition import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    EXTRA_FILE_SUFFIXES,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
    SEGMENT_FILE_SUFFIXES,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    LogDirName,
    SegmentFileName,
    TopicPartition,
    deleted_dir_name,
    future_dir_name,
    offset_to_file_prefix,
    parse_log_dir_name,
    parse_partition_dir,
    parse_segment_file,
    partition_dir_name,
    segment_file_name,
    stray_dir_name,
    topic_name_problem,
    unify_collision_chars,
    validate_topic_name,
)

LEGAL_CHARS = string.ascii_letters + string.digits + "._-"
topic_names = st.text(alphabet=LEGAL_CHARS, min_size=1, max_size=249).filter(lambda s: s not in (".", ".."))


def test_constants_are_kafkas_suffixes():
    assert (
        LOG_FILE_SUFFIX,
        INDEX_FILE_SUFFIX,
        TIME_INDEX_FILE_SUFFIX,
        TXN_INDEX_FILE_SUFFIX,
        PRODUCER_SNAPSHOT_FILE_SUFFIX,
    ) == (".log", ".index", ".timeindex", ".txnindex", ".snapshot")
    assert (DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX) == (".deleted", ".cleaned", ".swap")


@pytest.mark.parametrize(
    "name", ["a", "events", "my-topic", "my_topic.v2", "__consumer_offsets", "...", "-", "x" * 249, "0", "a..b"]
)
def test_legal_topic_names(name):
    assert validate_topic_name(name) == name
    assert topic_name_problem(name) is None


@pytest.mark.parametrize(
    "name,rule",
    [
        ("", "empty"),
        (".", '"." or ".."'),
        ("..", '"." or ".."'),
        ("x" * 250, "249"),
        ("a b", "ASCII alphanumerics"),
        ("a/b", "ASCII alphanumerics"),
        ("ä", "ASCII alphanumerics"),
        ("tab\t", "ASCII alphanumerics"),
        ("a:b", "ASCII alphanumerics"),
        ("ｆｕｌｌ", "ASCII alphanumerics"),
        (None, "string"),
        (3, "string"),
    ],
)
def test_illegal_topic_names_name_the_rule(name, rule):
    with pytest.raises(InvalidTopicError) as ei:
        validate_topic_name(name)
    assert rule in str(ei.value) and repr(name)[:40] in str(ei.value)


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=260))
def test_topic_validation_matches_a_model(name):
    legal = 1 <= len(name) <= 249 and name not in (".", "..") and all(c in LEGAL_CHARS for c in name)
    assert (topic_name_problem(name) is None) == legal


def test_collision_chars():
    assert unify_collision_chars("a.b_c") == unify_collision_chars("a_b.c") == "a_b_c"


def test_partition_dir_name():
    assert partition_dir_name(TopicPartition("events", 3)) == "events-3"
    assert partition_dir_name(("my-topic-2", 0)) == "my-topic-2-0"
    assert str(TopicPartition("t", 12)) == "t-12"
    for bad in (-1, 2**31, True, "3"):
        with pytest.raises(ValueError):
            partition_dir_name(("t", bad))


@settings(max_examples=200, deadline=None)
@given(topic_names, st.integers(0, 2**31 - 1))
def test_partition_dir_round_trip(topic, partition):
    tp = TopicPartition(topic, partition)
    assert parse_partition_dir(partition_dir_name(tp)) == tp
    assert parse_log_dir_name(partition_dir_name(tp)) == LogDirName(tp, "live")


@settings(max_examples=200, deadline=None)
@given(topic_names, st.integers(0, 2**31 - 1))
def test_suffixed_dir_round_trip(topic, partition):
    tp = TopicPartition(topic, partition)
    for make, kind in ((deleted_dir_name, "delete"), (future_dir_name, "future"), (stray_dir_name, "stray")):
        name = make(tp)
        parsed = parse_log_dir_name(name)
        assert parsed.kind == kind and parsed.topic_partition.partition == partition
        if kind == "future" or len(topic) + len(f"-{partition}.") + 32 + len(f"-{kind}") <= 255:
            assert parsed.topic_partition == tp
        else:  # truncated, as Kafka does, to stay within 255 characters
            assert len(name) == 255 and topic.startswith(parsed.topic_partition.topic)
        assert parse_partition_dir(name) is None


def test_deleted_dir_name_format():
    name = deleted_dir_name(TopicPartition("events", 3))
    assert re.fullmatch(r"events-3\.[0-9a-f]{32}-delete", name)
    assert deleted_dir_name(TopicPartition("events", 3)) != name  # a fresh unique id each time
    assert deleted_dir_name(("t", 0), unique_id="abc") == "t-0.abc-delete"
    long_name = deleted_dir_name(TopicPartition("x" * 249, 7))
    assert len(long_name) == 255 and re.fullmatch(r"x{213}-7\.[0-9a-f]{32}-delete", long_name)
    assert len(future_dir_name(TopicPartition("x" * 249, 7))) > 255  # Kafka does not cap -future


def test_parse_kafka_named_dirs():
    uid = "3b7a3a1bb0a64f1a8c0d52e4c3e1a2f4"
    assert parse_log_dir_name(f"my.topic-12.{uid}-delete") == (TopicPartition("my.topic", 12), "delete")
    assert parse_log_dir_name(f"my-topic-0.{uid}-future") == (TopicPartition("my-topic", 0), "future")
    assert parse_log_dir_name(f"t-5.{uid}-stray") == (TopicPartition("t", 5), "stray")
    assert parse_log_dir_name("foo-delete-3") == (TopicPartition("foo-delete", 3), "live")
    assert parse_log_dir_name("__consumer_offsets-49") == (TopicPartition("__consumer_offsets", 49), "live")


@pytest.mark.parametrize(
    "name",
    [
        "cleaner-offset-checkpoint",
        "recovery-point-offset-checkpoint",
        "meta.properties",
        ".lock",
        "topic",
        "topic-",
        "-3",
        "topic-x",
        "topic--",
        "t-3-delete",
        "t-3.-delete",
        "t-x.abc-delete",
        ".-3",
        "..-3",
        "a b-3",
        "t-99999999999",
        "t-+3",
        "t-3.abc-deleted",
        "x" * 250 + "-1",
    ],
)
def test_non_partition_dirs_are_none(name):
    assert parse_log_dir_name(name) is None
    assert parse_partition_dir(name) is None


def test_offset_to_file_prefix():
    assert offset_to_file_prefix(0) == "00000000000000000000"
    assert offset_to_file_prefix(368769) == "00000000000000368769"
    assert offset_to_file_prefix(2**63 - 1) == "09223372036854775807"
    for bad in (-1, 2**63, 1.0, True):
        with pytest.raises(ValueError):
            offset_to_file_prefix(bad)


def test_parse_segment_file_examples():
    assert parse_segment_file("00000000000000000000.log.swap") == (0, ".log", ".swap")
    assert parse_segment_file("00000000000000000000.log") == SegmentFileName(0, ".log", "")
    assert parse_segment_file("00000000000000368769.timeindex.deleted") == (368769, ".timeindex", ".deleted")
    assert parse_segment_file("00000000000000000042.index.cleaned") == (42, ".index", ".cleaned")
    assert parse_segment_file("00000000000000000007.snapshot") == (7, ".snapshot", "")
    assert parse_segment_file("09223372036854775807.txnindex") == (2**63 - 1, ".txnindex", "")


@pytest.mark.parametrize(
    "name",
    [
        "0.log",
        "0000000000000000000.log",
        "000000000000000000000.log",
        "00000000000000000000.lo",
        "00000000000000000000.log.tmp",
        "00000000000000000000.log.swap.deleted",
        "00000000000000000000.deleted",
        "99999999999999999999.log",
        "0000000000000000000a.log",
        "00000000000000000000",
        "partition.metadata",
        "leader-epoch-checkpoint",
        "00000000000000000000.log ",
        "-0000000000000000001.log",
    ],
)
def test_parse_segment_file_rejects(name):
    assert parse_segment_file(name) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**63 - 1), st.sampled_from(SEGMENT_FILE_SUFFIXES), st.sampled_from(("",) + EXTRA_FILE_SUFFIXES))
def test_segment_file_round_trip(offset, suffix, extra):
    name = segment_file_name(offset, suffix, extra)
    assert len(name) == 20 + len(suffix) + len(extra)
    assert parse_segment_file(name) == (offset, suffix, extra)


def test_segment_file_name_rejects_unknown_suffix():
    with pytest.raises(ValueError):
        segment_file_name(0, ".idx")
    with pytest.raises(ValueError):
        segment_file_name(0, ".log", ".tmp")
