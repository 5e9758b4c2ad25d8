"""Local ROOTs on mounts whose locks do not reach every machine are refused for writing.

The reference is proc(5)'s mountinfo format: lines as the kernel writes them for ext4, NFS with and
without its lock manager, and FUSE mounts of object stores.
"""

from __future__ import annotations

import os

import pytest

import storage.fs.mounts as mounts
from storage.errors import KafkaStorageError
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition

SAMPLE = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
40 27 0:45 / /mnt/shared rw,relatime - nfs4 fs1:/export rw,vers=4.2,hard,proto=tcp,local_lock=none,addr=10.0.0.2
41 27 0:46 / /mnt/nolock rw,relatime - nfs fs1:/old rw,vers=3,nolock,proto=tcp
42 27 0:47 / /mnt/my\040bucket rw,nosuid,nodev,relatime - fuse.s3fs s3fs rw,user_id=0,group_id=0
43 27 0:48 / /mnt/nfs-local rw,relatime - nfs4 fs1:/x rw,vers=4.1,local_lock=all
"""


def test_mountinfo_is_read_as_the_kernel_writes_it():
    ms = mounts.parse_mountinfo(SAMPLE)
    by_point = {m.point: m for m in ms}
    assert by_point["/mnt/my bucket"].fstype == "fuse.s3fs"  # \040 is a space
    assert mounts.mount_of("/mnt/shared/logs/t-0", ms).point == "/mnt/shared"
    assert mounts.mount_of("/mnt/sharedx/logs", ms).point == "/"  # a prefix of the name is not a parent
    reasons = {m.point: mounts.unsafe_reason(m) for m in ms}
    assert reasons["/"] is None and reasons["/mnt/shared"] is None  # NFS with its lock manager is fine
    assert "nolock" in reasons["/mnt/nolock"] and "local_lock" in reasons["/mnt/nfs-local"]
    assert "s3fs" in reasons["/mnt/my bucket"]


def test_a_writer_on_an_unsafe_mount_is_refused_and_nothing_is_written(root, tmp_path, monkeypatch):
    LogManager(root).create_topic("t", 1)
    point = os.path.realpath(root)
    fake = tmp_path / "mountinfo"
    fake.write_text(SAMPLE + f"50 27 0:60 / {point} rw,relatime - nfs fs1:/logs rw,vers=3,nolock\n")
    monkeypatch.setattr(mounts, "MOUNTINFO", str(fake))
    monkeypatch.setattr(mounts, "_by_device", {})
    before = sorted(os.listdir(os.path.join(root, "t-0")))
    with pytest.raises(KafkaStorageError, match=r"nolock.*KAFKALOG_SINGLE_HOST_LOCKS") as e:
        LogManager(root).open_log(TopicPartition("t", 0), writable=True)
    assert point in str(e.value)
    assert sorted(os.listdir(os.path.join(root, "t-0"))) == before
    with LogManager(root).open_log(TopicPartition("t", 0)) as log:  # reading takes no lock
        assert log.log_end_offset == 0
    monkeypatch.setenv(mounts.ALLOW_ENV, "1")
    LogManager(root).open_log(TopicPartition("t", 0), writable=True).close()
