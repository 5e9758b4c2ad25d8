"""A topic file is checked before it is obeyed: a partition count past MAX_PARTITIONS, a wrong type, a file
that names another topic or one too large to read whole is refused with an error naming the file,
instead of a reader listing a billion partitions or parsing gigabytes.

The reference is the file LogManager.create_topic writes, edited by hand as a damaged disk or a careless
operator would leave it.
"""

from __future__ import annotations

import json

import pytest

from storage.errors import InvalidConfigError
from storage.log_manager import LogManager
from storage.metadata.topic_metadata import MAX_PARTITIONS, MAX_TOPIC_FILE_BYTES, TopicMetadata, topic_file_name


def _rewrite(lm: LogManager, topic: str, edit) -> str:
    path = lm.fs.join(lm.root, topic_file_name(topic))
    doc = json.loads(lm.fs.read(path))
    edit(doc)
    lm.fs.write_atomic(path, json.dumps(doc).encode())
    return path


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("partitions", MAX_PARTITIONS + 1, "'partitions' must be an integer from 1"),
        ("partitions", 10**12, "'partitions' must be an integer from 1"),
        ("partitions", 0, "'partitions' must be an integer from 1"),
        ("partitions", "3", "'partitions' must be an integer from 1"),
        ("partitions", True, "'partitions' must be an integer from 1"),
        ("config", ["retention.ms", "1"], "'config' must be an object"),
        ("topicId", 7, "'topicId' must be a string"),
        ("topic", "other", "it names topic 'other'"),
        ("topic", "bad name", "'topic': a topic name may contain only"),
    ],
)
def test_a_damaged_topic_file_is_refused_naming_the_file(any_root, field, value, says):
    lm = LogManager(any_root)
    lm.create_topic("events", 2)
    path = _rewrite(lm, "events", lambda doc: doc.__setitem__(field, value))
    for call in (lambda m: m.topic("events"), lambda m: m.partitions("events")):
        with pytest.raises(InvalidConfigError) as e:
            call(LogManager(any_root))
        assert lm.url(path) in str(e.value) and says in str(e.value), str(e.value)


def test_a_topic_file_too_large_to_read_whole_is_refused(any_root):
    lm = LogManager(any_root)
    lm.create_topic("events", 1)
    path = _rewrite(lm, "events", lambda doc: doc.__setitem__("padding", "x" * MAX_TOPIC_FILE_BYTES))
    with pytest.raises(InvalidConfigError, match="larger than") as e:
        LogManager(any_root).topic("events")
    assert lm.url(path) in str(e.value)


def test_a_long_topics_hashed_file_must_name_a_legal_topic(any_root):
    long = "t" * 249
    lm = LogManager(any_root)
    lm.create_topic(long, 1)
    assert "~" in topic_file_name(long)
    assert LogManager(any_root).topics() == [long]
    _rewrite(lm, long, lambda doc: doc.__setitem__("topic", 12))
    with pytest.raises(InvalidConfigError, match="is not valid"):
        LogManager(any_root).topics()


def test_what_create_topic_writes_reads_back_equal(any_root):
    lm = LogManager(any_root)
    made = lm.create_topic("events", 3, {"cleanup.policy": "compact", "segment.bytes": "1048576"})
    read = LogManager(any_root).topic("events")
    assert read == made and read.partitions == 3 and read.config.compact
    assert TopicMetadata.from_bytes(made.to_bytes()) == made
