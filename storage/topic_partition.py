"""Topic-partition identity and Kafka's file naming: topic names, partition dirs, segment files.

Partition directories are `<topic>-<partition>`; Kafka renames a directory it is deleting to
`<topic>-<partition>.<uniqueId>-delete` (and uses `-future` / `-stray` for moves and strays).
Segment files are named by their base offset, 20 digits zero padded, plus a suffix.
"""

from __future__ import annotations

import functools
import re
import uuid
from typing import NamedTuple

from .common.constants import INT32_MAX, INT64_MAX
from .errors import InvalidTopicError

MAX_TOPIC_NAME_LENGTH = 249
MAX_DIR_NAME_LENGTH = 255  # Kafka caps -delete / -stray dir names at this (file system limit)

DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"
STRAY_DIR_SUFFIX = "-stray"

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
TXN_INDEX_FILE_SUFFIX = ".txnindex"
PRODUCER_SNAPSHOT_FILE_SUFFIX = ".snapshot"
SEGMENT_FILE_SUFFIXES = (
    LOG_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    PRODUCER_SNAPSHOT_FILE_SUFFIX,
)

DELETED_FILE_SUFFIX = ".deleted"  # scheduled for removal after file.delete.delay.ms
CLEANED_FILE_SUFFIX = ".cleaned"  # compaction output being written
SWAP_FILE_SUFFIX = ".swap"  # compaction output ready to replace the originals
EXTRA_FILE_SUFFIXES = (DELETED_FILE_SUFFIX, CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)

PARTITION_METADATA_FILE = "partition.metadata"
LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"

_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")
_DIGITS_RE = re.compile(r"[0-9]+")
_SEGMENT_RE = re.compile(
    r"([0-9]{20})("
    + "|".join(re.escape(s) for s in SEGMENT_FILE_SUFFIXES)
    + r")("
    + "|".join(re.escape(s) for s in EXTRA_FILE_SUFFIXES)
    + r")?"
)


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self):
        return f"{self.topic}-{self.partition}"


def topic_name_problem(name) -> str | None:
    """Why Kafka would reject `name` as a topic name, or None if it is legal."""
    if not isinstance(name, str):
        return "a topic name must be a string"
    if name == "":
        return "a topic name can't be empty"
    if name in (".", ".."):
        return 'a topic name can\'t be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"a topic name can't be longer than {MAX_TOPIC_NAME_LENGTH} characters (it has {len(name)})"
    if not _TOPIC_RE.fullmatch(name):
        return "a topic name may contain only ASCII alphanumerics, '.', '_' and '-'"
    return None


def validate_topic_name(name) -> str:
    """Return `name` if Kafka accepts it as a topic name; else raise InvalidTopicError."""
    problem = topic_name_problem(name)
    if problem:
        raise InvalidTopicError(f"Topic name {name!r} is illegal: {problem}")
    return name


def unify_collision_chars(name: str) -> str:
    """Kafka treats topics that differ only in '.' vs '_' as colliding (metric names clash)."""
    return name.replace(".", "_")


def _check_partition(partition) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition <= INT32_MAX:
        raise ValueError(f"partition must be an int in [0, {INT32_MAX}], got {partition!r}")
    return partition


def partition_dir_name(tp: TopicPartition | tuple) -> str:
    """`topic-3`: the directory of a live partition under the log dir."""
    topic, partition = tp
    return f"{topic}-{_check_partition(partition)}"


def _suffixed_dir_name(tp, suffix: str, unique_id: str | None, capped: bool) -> str:
    topic, partition = tp
    uid = unique_id or uuid.uuid4().hex
    tail = f"-{_check_partition(partition)}.{uid}{suffix}"
    if capped:  # Kafka keeps the name within the file system limit by truncating the topic
        topic = topic[: max(0, MAX_DIR_NAME_LENGTH - len(tail))]
    return f"{topic}{tail}"


def deleted_dir_name(tp: TopicPartition | tuple, unique_id: str | None = None) -> str:
    """`topic-3.<uuid hex>-delete`: what a partition dir is renamed to when its topic is deleted.

    As in Kafka, a long topic is truncated so the name stays within 255 characters.
    """
    return _suffixed_dir_name(tp, DELETE_DIR_SUFFIX, unique_id, capped=True)


def future_dir_name(tp: TopicPartition | tuple, unique_id: str | None = None) -> str:
    """`topic-3.<uuid hex>-future`: a partition being moved to another log dir."""
    return _suffixed_dir_name(tp, FUTURE_DIR_SUFFIX, unique_id, capped=False)


def stray_dir_name(tp: TopicPartition | tuple, unique_id: str | None = None) -> str:
    """`topic-3.<uuid hex>-stray`: a partition dir the metadata no longer knows."""
    return _suffixed_dir_name(tp, STRAY_DIR_SUFFIX, unique_id, capped=True)


class LogDirName(NamedTuple):
    topic_partition: TopicPartition
    kind: str  # "live" | "delete" | "future" | "stray"


_KINDS = ((DELETE_DIR_SUFFIX, "delete"), (FUTURE_DIR_SUFFIX, "future"), (STRAY_DIR_SUFFIX, "stray"))


@functools.lru_cache(maxsize=1 << 16)  # every listing of ROOT parses every name again; results are immutable
def parse_log_dir_name(name: str) -> LogDirName | None:
    """Classify a directory under the log dir, or None if it is not a partition dir.

    For `-delete` and `-stray` dirs the topic may be a truncated prefix of the real one.
    """
    kind = "live"
    base = name
    for suffix, k in _KINDS:
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            base, dot, unique_id = stem.rpartition(".")
            if not dot or not unique_id or not base or any(c.isspace() for c in unique_id):
                return None
            kind = k
            break
    topic, dash, part = base.rpartition("-")
    if not dash or not _DIGITS_RE.fullmatch(part) or topic_name_problem(topic):
        return None
    partition = int(part)
    if partition > INT32_MAX:
        return None
    return LogDirName(TopicPartition(topic, partition), kind)


def parse_partition_dir(name: str) -> TopicPartition | None:
    """The TopicPartition of a live partition dir (`topic-3`); None for anything else."""
    parsed = parse_log_dir_name(name)
    return parsed.topic_partition if parsed is not None and parsed.kind == "live" else None


# ---------------------------------------------------------------- segment files


def offset_to_file_prefix(offset: int) -> str:
    """A base offset as Kafka names files by it: 20 digits, zero padded."""
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
        raise ValueError(f"a file base offset must be an int in [0, 2**63-1], got {offset!r}")
    return f"{offset:020d}"


def segment_file_name(base_offset: int, suffix: str, extra: str = "") -> str:
    """`00000000000000000042.log` (+ optional `.deleted` / `.cleaned` / `.swap`)."""
    if suffix not in SEGMENT_FILE_SUFFIXES:
        raise ValueError(f"unknown segment file suffix {suffix!r}")
    if extra and extra not in EXTRA_FILE_SUFFIXES:
        raise ValueError(f"unknown extra file suffix {extra!r}")
    return offset_to_file_prefix(base_offset) + suffix + extra


class SegmentFileName(NamedTuple):
    base_offset: int
    suffix: str  # .log .index .timeindex .txnindex .snapshot
    extra: str  # "" or .deleted .cleaned .swap


def parse_segment_file(name: str) -> SegmentFileName | None:
    """`00000000000000000000.log.swap` -> (0, '.log', '.swap'); None for any other name.

    Only Kafka's exact 20-digit form is recognised, so a file name always round-trips.
    """
    m = _SEGMENT_RE.fullmatch(name)
    if m is None:
        return None
    offset = int(m.group(1))
    if offset > INT64_MAX:
        return None
    return SegmentFileName(offset, m.group(2), m.group(3) or "")
