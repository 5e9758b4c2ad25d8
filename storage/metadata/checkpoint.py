"""Kafka's offset checkpoint files: a text map of topic-partition -> offset, written atomically.

Format (Kafka's CheckpointFile with the offset formatter): line 1 the version `0`, line 2 the
number of entries, then one `topic partition offset` line per entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..common.constants import INT32_MAX, INT64_MAX, INT64_MIN
from ..errors import CorruptCheckpointError
from ..fs.filesystem import LogFileSystem
from ..topic_partition import TopicPartition, topic_name_problem

RECOVERY_POINT_CHECKPOINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT_FILE = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT_FILE = "cleaner-offset-checkpoint"

CHECKPOINT_VERSION = 0
#: Refuse larger files before reading them (about 5 million entries); a hostile file must not
#: make us allocate without bound.
MAX_CHECKPOINT_BYTES = 256 * 1024 * 1024

_INT_RE = re.compile(r"[+-]?[0-9]+")
_LINE_BREAK_RE = re.compile(r"\r\n|\r|\n")  # what Java's BufferedReader.readLine splits on


class OffsetCheckpointFile:
    """One checkpoint file at `path` on `fs`. Reads return {TopicPartition: offset}."""

    def __init__(self, fs: LogFileSystem, path: str):
        self.fs = fs
        self.path = path

    def __repr__(self):
        return f"OffsetCheckpointFile({self.fs.url(self.path)!r})"

    def read(self) -> dict[TopicPartition, int]:
        """The entries; {} if the file is missing or empty (as Kafka reads a fresh log dir)."""
        url = self.fs.url(self.path)
        try:
            if not self.fs.exists(self.path):
                return {}
            size = self.fs.size(self.path)
            if size > MAX_CHECKPOINT_BYTES:
                raise CorruptCheckpointError(f"{size} bytes exceeds the {MAX_CHECKPOINT_BYTES}-byte limit", path=url)
            data = self.fs.read(self.path)
        except FileNotFoundError:
            return {}
        return parse_checkpoint(data, source=url)

    def write(self, entries: Mapping[TopicPartition, int], *, durable: bool = True) -> None:
        """Replace the file with `entries` in one step (tmp + rename where the store has it)."""
        self.fs.write_atomic(self.path, format_checkpoint(entries), durable=durable)


def format_checkpoint(entries: Mapping[TopicPartition, int]) -> bytes:
    """The file's bytes for `entries`, sorted by topic and partition."""
    lines = [str(CHECKPOINT_VERSION), str(len(entries))]
    legal: set[str] = set()  # a topic's name is checked once, not once per partition
    for (topic, partition), offset in sorted(entries.items()):
        if topic not in legal:
            problem = topic_name_problem(topic)
            if problem:
                raise ValueError(f"checkpoint entry {topic!r}: {problem}")
            legal.add(topic)
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition <= INT32_MAX:
            raise ValueError(f"checkpoint entry {topic}-{partition}: partition must be an int in [0, 2**31-1]")
        if isinstance(offset, bool) or not isinstance(offset, int) or not INT64_MIN <= offset <= INT64_MAX:
            raise ValueError(f"checkpoint entry {topic}-{partition}: offset {offset!r} is not a 64-bit int")
        lines.append(f"{topic} {partition} {offset}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def parse_checkpoint(data: bytes, *, source: str = "<checkpoint>") -> dict[TopicPartition, int]:
    """Parse a checkpoint file's bytes; any malformed line raises CorruptCheckpointError."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptCheckpointError(f"not UTF-8 text (byte {e.start})", path=source) from None
    if text == "":
        return {}
    lines = _LINE_BREAK_RE.split(text)
    if lines[-1] == "":  # the terminator of the last line
        lines.pop()

    def bad(msg: str, lineno: int) -> CorruptCheckpointError:
        shown = lines[lineno - 1] if lineno <= len(lines) else ""
        if len(shown) > 80:
            shown = shown[:80] + "..."
        return CorruptCheckpointError(f"{msg}: {shown!r}", path=source, line=lineno)

    if not _INT_RE.fullmatch(lines[0]):
        raise bad("the version is not an integer", 1)
    if int(lines[0]) != CHECKPOINT_VERSION:
        raise bad(f"unrecognised version (expected {CHECKPOINT_VERSION})", 1)
    if len(lines) < 2:
        return {}  # Kafka reads a version-only file as empty
    if not _INT_RE.fullmatch(lines[1]) or int(lines[1]) < 0:
        raise bad("the entry count is not a non-negative integer", 2)
    expected = int(lines[1])
    out: dict[TopicPartition, int] = {}
    legal: set[str] = set()  # a topic's name is checked once, not once per partition
    for lineno in range(3, len(lines) + 1):
        fields = lines[lineno - 1].split()
        if len(fields) != 3:
            raise bad("expected 'topic partition offset'", lineno)
        topic, part, off = fields
        if topic not in legal:
            if topic_name_problem(topic):
                raise bad(f"illegal topic name ({topic_name_problem(topic)})", lineno)
            legal.add(topic)
        if not _INT_RE.fullmatch(part) or not 0 <= int(part) <= INT32_MAX:
            raise bad("the partition is not a non-negative 32-bit integer", lineno)
        if not _INT_RE.fullmatch(off) or not INT64_MIN <= int(off) <= INT64_MAX:
            raise bad("the offset is not a 64-bit integer", lineno)
        tp = TopicPartition(topic, int(part))
        if tp in out:
            raise bad(f"duplicate entry for {tp}", lineno)
        out[tp] = int(off)
    if len(out) != expected:
        raise CorruptCheckpointError(f"expected {expected} entries but found {len(out)}", path=source)
    return out
