"""TopicMetadata and its file: what a broker keeps in its metadata log (partition count, topic id, config
overrides), kept here as one JSON file per topic in the first log dir.

File: `<topic>.kafkalog-topic.json` (a file, not a directory, so a Kafka broker pointed at the log dir
still loads it), holding `{"version": 1, "topic", "topicId", "partitions", "config": {key: value}}` with
sorted keys. Invariants: `topic` is the file's own topic (a long topic's hashed file name is resolved
through it); `partitions` is 1..MAX_PARTITIONS; `config` holds only overrides, as strings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .log_config import LogConfig

TOPIC_FILE_SUFFIX = ".kafkalog-topic.json"
# A file name, and the temporary name a rewrite uses (".<8 hex>.tmp"), must fit in 255 bytes: topics
# longer than this get a shortened, hashed file name (`~` cannot appear in a topic name).
MAX_PLAIN_TOPIC_FILE_TOPIC = 255 - len(TOPIC_FILE_SUFFIX) - 13
MAX_PARTITIONS = 100_000  # per topic: `<249-char topic>-99999` is the longest directory name that fits


def topic_file_name(topic: str) -> str:
    """`<topic>.kafkalog-topic.json`, or for a long topic `<first 200 chars>~<16 hex of its SHA-256>...`."""
    if len(topic) <= MAX_PLAIN_TOPIC_FILE_TOPIC:
        return topic + TOPIC_FILE_SUFFIX
    return f"{topic[:200]}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}{TOPIC_FILE_SUFFIX}"


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: int
    config: LogConfig
    topic_id: str | None = None
    persisted: bool = True  # False: inferred from partition directories only

    def to_json(self) -> dict:
        return {"version": 1, "topic": self.name, "topicId": self.topic_id, "partitions": self.partitions,
                "config": self.config.overrides}

    def to_bytes(self) -> bytes:
        """The topic file's bytes."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> TopicMetadata:
        """Parse a topic file; ValueError, KeyError or TypeError when it is not one."""
        doc = json.loads(data)
        return cls(doc["topic"], int(doc["partitions"]), LogConfig.from_dict(doc.get("config", {})),
                   doc.get("topicId"))


def topic_named_in(data: bytes) -> str:
    """The topic a topic file names (for a long topic's hashed file name); ValueError, KeyError or TypeError."""
    return json.loads(data)["topic"]
