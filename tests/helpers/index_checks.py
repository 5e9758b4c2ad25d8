"""Segment files checked against Kafka's index rebuild (kafka_reference.kafka_recovery_entries)."""

from __future__ import annotations

import struct

from storage.topic_partition import TopicPartition, parse_segment_file
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_parse

TP = TopicPartition("t", 0)


def live_files(lm, tp=TP) -> dict[int, dict[str, bytes]]:
    """base offset -> {suffix: bytes} of the live segment files; asserts no .cleaned/.swap is left."""
    d = lm.partition_dir(tp)
    out: dict[int, dict[str, bytes]] = {}
    for f in lm.fs.listdir(d):
        p = parse_segment_file(f.name)
        if p is None or p.suffix == ".snapshot":  # a producer snapshot belongs to no segment
            continue
        assert p.extra in ("", ".deleted"), f"leftover {f.name}"
        if not p.extra:
            out.setdefault(p.base_offset, {})[p.suffix] = lm.fs.read(lm.fs.join(d, f.name))
    return dict(sorted(out.items()))


def check_indexes(lm, tp=TP, interval=4096, cleaned=None):
    """Each .index equals Kafka's recovery rebuild; each .timeindex of cleaner output (`cleaned` base
    offsets; None: all) too, plus the final entry. (A segment appended over several writer sessions
    also holds each clean close's final time entry, as Kafka's does.)"""
    for base, files in live_files(lm, tp).items():
        batches = kp_parse(files[".log"])
        if not batches:
            continue
        index, timeindex, (max_ts, max_off) = kafka_recovery_entries(batches, interval, base)
        assert files[".index"] == index, f"segment {base}"
        final = struct.pack(">qi", max_ts, max_off - base)
        if cleaned is None or base in cleaned:
            assert files[".timeindex"] in (timeindex, timeindex + final), f"segment {base}"


def expected_indexes(log_bytes, base, interval):
    """Kafka's recovery rebuild of both indexes, plus the max-timestamp entry a roll appends."""
    batches = kp_parse(log_bytes)
    index, timeindex, (max_ts, max_off) = kafka_recovery_entries(batches, interval, base)
    last_ts = struct.unpack_from(">q", timeindex, len(timeindex) - 12)[0] if timeindex else -1
    if max_ts >= 0 and max_ts > last_ts:
        timeindex += struct.pack(">qi", max_ts, max_off - base)
    return index, timeindex
