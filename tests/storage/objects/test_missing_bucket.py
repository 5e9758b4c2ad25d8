"""A log dir in a bucket that does not exist, against moto's S3 server: one error naming the bucket and the
object, from the first write as from a listing, never `[Errno 2] create: not found`. A missing object in a
bucket that exists is still FileNotFoundError (or an empty listing), which readers rely on."""

import re
import uuid

import pytest

from storage.errors import KafkaStorageError
from storage.log_dirs import open_filesystem
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.topic_partition import TopicPartition

MISSING = "kafkalog-no-such-bucket"


def bucket_error(url: str) -> str:
    return f"bucket {MISSING!r} does not exist ({url}): create it first"


@pytest.fixture
def missing_root(s3_server):
    """(url, storage_options) of a prefix in a bucket the server does not have."""
    return f"s3://{MISSING}/logs-{uuid.uuid4().hex[:8]}", s3_server.storage_options


def test_creating_a_topic_in_a_missing_bucket_says_the_bucket_does_not_exist(missing_root):
    url, opts = missing_root
    with pytest.raises(KafkaStorageError) as e:
        LogManager(url, opts).create_topic("events", 1)
    text = str(e.value)
    where = re.escape(url) + "(/[^)]+)?"  # the log dir or an object in it, whichever is reached first
    assert re.fullmatch(re.escape(bucket_error("URL")).replace("URL", where), text), text
    assert "\n" not in text and "Errno" not in text and "not found" not in text
    assert opts["secret"] not in text and opts["key"] not in text


def test_every_store_operation_on_a_missing_bucket_names_it(missing_root):
    url, opts = missing_root
    fs, root = open_filesystem(url, opts)
    obj = fs.join(root, "events-0", "00000000000000000000.log")
    calls = {
        "create_exclusive": lambda: fs.create_exclusive(obj, b"x"),
        "write_atomic": lambda: fs.write_atomic(obj, b"x"),
        "read": lambda: fs.read(obj, 0, 1),
        "size": lambda: fs.size(obj),
        "listdir": lambda: fs.listdir(root),
    }
    for name, call in calls.items():
        with pytest.raises(KafkaStorageError) as e:
            call()
        assert str(e.value) == bucket_error(fs.url(obj if name != "listdir" else root)), name


def test_missing_objects_in_a_bucket_that_exists_keep_their_errors(s3_root):
    url, opts = s3_root
    fs, root = open_filesystem(url, opts)
    obj = fs.join(root, "events-0", "00000000000000000000.log")
    assert fs.listdir(root) == [] and not fs.exists(obj)
    with pytest.raises(FileNotFoundError, match="not found"):
        fs.read(obj, 0, 1)
    with pytest.raises(FileNotFoundError):
        fs.size(obj)
    lm = LogManager(url, opts)  # and the log dir works once there is something to find
    lm.create_topic("events", 1)
    with lm.open_log(TopicPartition("events", 0)) as log:
        assert log.log_end_offset == 0


def test_a_bucket_deleted_under_an_open_reader_is_named_not_taken_for_a_replaced_object(s3_server):
    """A reader pins the object it opened; a missing bucket is no replaced segment (whose reader would look
    for the `.deleted` twin and then report the object as removed by maintenance)."""
    bucket = f"kafkalog-gone-{uuid.uuid4().hex[:8]}"
    s3_server.create_bucket(bucket)
    fs, root = open_filesystem(f"s3://{bucket}/logs", s3_server.storage_options)
    assert isinstance(fs, ObjectStoreFileSystem)
    obj = fs.join(root, "events-0", "00000000000000000000.log")
    fs.write_atomic(obj, b"0123456789")
    reader = fs.open_reader(obj)
    assert reader.read(0, 4) == b"0123"
    fs.fsspec_fs.rm(f"{bucket}/logs", recursive=True)
    fs.fsspec_fs.rmdir(bucket)
    with pytest.raises(KafkaStorageError) as e:
        reader.read(4, 8)
    assert str(e.value) == f"bucket {bucket!r} does not exist ({fs.url(obj)}): create it first"
