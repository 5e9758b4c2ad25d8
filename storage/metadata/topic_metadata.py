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

from ..log_config import LogConfig
from ..topic_partition import topic_name_problem

TOPIC_FILE_SUFFIX = ".kafkalog-topic.json"
# A file name, and the temporary name a rewrite uses (".<8 hex>.tmp"), must fit in 255 bytes: topics
# longer than this get a shortened, hashed file name (`~` cannot appear in a topic name).
MAX_PLAIN_TOPIC_FILE_TOPIC = 255 - len(TOPIC_FILE_SUFFIX) - 13
MAX_PARTITIONS = 100_000  # per topic: `<249-char topic>-99999` is the longest directory name that fits
MAX_TOPIC_FILE_BYTES = 1 << 20  # a topic file holds a few config overrides; a larger one is not read whole


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
        return {
            "version": 1,
            "topic": self.name,
            "topicId": self.topic_id,
            "partitions": self.partitions,
            "config": self.config.overrides,
        }

    def to_bytes(self) -> bytes:
        """The topic file's bytes."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> TopicMetadata:
        """Parse a topic file and check its invariants (a partition count is trusted only within
        MAX_PARTITIONS: readers make a list of them); ValueError, KeyError or TypeError when it breaks one."""
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        topic, partitions, config = doc["topic"], doc["partitions"], doc.get("config", {})
        problem = topic_name_problem(topic)
        if problem:
            raise ValueError(f"'topic': {problem}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise ValueError(f"'partitions' must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}")
        if not isinstance(config, dict):
            raise ValueError(f"'config' must be an object, got {config!r}")
        topic_id = doc.get("topicId")
        if topic_id is not None and not isinstance(topic_id, str):
            raise ValueError(f"'topicId' must be a string, got {topic_id!r}")
        return cls(topic, partitions, LogConfig.from_dict(config), topic_id)


def read_topic_file(fs, path: str) -> bytes:
    """A topic file's bytes, read no further than MAX_TOPIC_FILE_BYTES (ValueError past it)."""
    data = fs.read(path, 0, MAX_TOPIC_FILE_BYTES + 1)
    if len(data) > MAX_TOPIC_FILE_BYTES:
        raise ValueError(f"larger than {MAX_TOPIC_FILE_BYTES} bytes")
    return data


def topic_named_in(data: bytes) -> str:
    """The topic a topic file names (for a long topic's hashed file name); ValueError, KeyError or TypeError."""
    topic = json.loads(data)["topic"]
    problem = topic_name_problem(topic)
    if problem:
        raise ValueError(f"'topic': {problem}")
    return topic
