"""A writer that opens a partition while a cleaner in another process has written its `.cleaned`
output, but not yet swapped it in, must leave that output alone; and a swap whose output is gone must
replace nothing. Found by the cluster test: the writer's loader removed the output as crash debris,
the swap then renamed the sources to `.deleted` and installed nothing, and committed records were gone.

The reference is kafka-python parsing every live `.log` file: each record with a key never written
twice must still be there.
"""

from __future__ import annotations

import os

from storage.cleaner.cleaner import Cleaner
from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition, parse_segment_file
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "400",
    "min.cleanable.dirty.ratio": "0.01",
    "file.delete.delay.ms": "0",
}


def fill(root: str) -> dict[bytes, bytes]:
    """40 records; every 4th updates one hot key, the others have keys written once. Returns the latest
    value per key (what compaction must keep)."""
    lm = LogManager(root)
    lm.create_topic("t", 1, CONFIG)
    latest = {}
    with lm.open_log(TP, writable=True) as log:
        for i in range(40):
            key = b"hot" if i % 4 == 0 else b"k%d" % i
            log.append(kp_batch([(1_700_000_000_000 + i, key, b"v%d" % i, [])]))
            latest[key] = b"v%d" % i
    return latest


def live_records(root: str) -> dict[bytes, bytes]:
    d = os.path.join(root, "t-0")
    out = {}
    for name in sorted(os.listdir(d)):
        parsed = parse_segment_file(name)
        if parsed is None or parsed.suffix != ".log" or parsed.extra:
            continue
        with open(os.path.join(d, name), "rb") as f:
            for batch in kp_parse(f.read()):
                assert batch["crc_ok"]
                for _offset, _ts, key, value, _headers in batch["records"]:
                    out[key] = value
    return out


def test_a_writer_opening_mid_cleaning_leaves_the_cleaners_output(root, monkeypatch):
    latest = fill(root)
    real = Cleaner._partition_lock

    def a_writer_opens_first(self, log):  # the sink's next commit, just before the swap takes the lock
        with LogManager(root).open_log(TP, writable=True):
            pass
        return real(self, log)

    monkeypatch.setattr(Cleaner, "_partition_lock", a_writer_opens_first)
    [rep] = run_once(root)
    assert not rep.errors, rep.line()
    assert rep.records_dropped > 0  # the cleaning really happened
    assert live_records(root) == latest


def test_a_swap_whose_output_is_gone_replaces_nothing(root, monkeypatch):
    latest = fill(root)
    before = live_records(root)
    real = Cleaner._partition_lock

    def output_removed(self, log):  # anything that removed the `.cleaned` files (an old loader, a person)
        for name in os.listdir(log.dir):
            if ".cleaned" in name:
                os.remove(os.path.join(log.dir, name))
        return real(self, log)

    monkeypatch.setattr(Cleaner, "_partition_lock", output_removed)
    [rep] = run_once(root)
    assert rep.errors and "is gone; nothing was replaced" in " ".join(rep.errors), rep.line()
    assert live_records(root) == before == latest
