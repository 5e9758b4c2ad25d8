"""Kafka's `partition.metadata` (PartitionMetadataFile): the topic id of a partition directory.

Two lines, `version: 0` and `topic_id: <id>`; the id is what kafka-topics.sh --describe prints as TopicId,
22 characters of base64url (16 bytes, unpadded), never the zero id nor the cluster metadata topic's.
"""

from __future__ import annotations

import base64
import re

from ..errors import ExportError

PARTITION_METADATA_FILE = "partition.metadata"
_TOPIC_ID_RE = re.compile(r"[A-Za-z0-9_-]{22}")
_RESERVED_TOPIC_IDS = {bytes(16): "the zero id", bytes(15) + b"\x01": "the id of the cluster metadata topic"}


def check_topic_id(text: str) -> str:
    """A Kafka topic id as kafka-topics.sh --describe prints it: 22 characters of base64url (16 bytes)."""
    if not _TOPIC_ID_RE.fullmatch(text):
        raise ExportError(
            f"--topic-id {text!r} is not a Kafka topic id: expected the 22-character TopicId that "
            f"kafka-topics.sh --describe prints (base64url of 16 bytes), e.g. 'kq3WGgVRSgSDwBQJuv0r5w'"
        )
    raw = base64.urlsafe_b64decode(text + "==")
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != text:
        raise ExportError(
            f"--topic-id {text!r} is not a Kafka topic id: its last character is not one Kafka "
            f"prints (the id does not encode 16 bytes exactly)"
        )
    if raw in _RESERVED_TOPIC_IDS:
        raise ExportError(f"--topic-id {text!r} is {_RESERVED_TOPIC_IDS[raw]}, not a topic's")
    return text


def read_partition_metadata(path: str) -> str | None:
    """The topic id in a broker's `partition.metadata` (`version: 0` / `topic_id: <id>`), or None if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    fields = [re.split(r":\s+", line, maxsplit=1) for line in lines[:2]]
    if len(fields) != 2 or fields[0] != ["version", "0"] or fields[1][0] != "topic_id" or len(fields[1]) != 2:
        raise ExportError(
            f"{path} is not a partition.metadata file Kafka writes (version: 0, topic_id: <id>): {text[:100]!r}"
        )
    return fields[1][1].strip()


def partition_metadata_bytes(topic_id: str) -> bytes:
    """The file as Kafka writes it (no newline after the id)."""
    return f"version: 0\ntopic_id: {topic_id}".encode()
