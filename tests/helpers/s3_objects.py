"""A log's objects on S3 read with s3fs (independent of the engine) and checked as Kafka's files."""

from __future__ import annotations

import struct

from tests.helpers.kafka_reference import kafka_recovery_entries, kp_committed, kp_parse


def s3fs_of(server):
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options)


def partition_objects(s3, url, topic, partition):
    """{object name: bytes} of a partition prefix, fetched with s3fs (independent of the engine)."""
    prefix = url[len("s3://") :] + f"/{topic}-{partition}"
    try:
        names = s3.ls(prefix, detail=False, refresh=True)
    except FileNotFoundError:
        return {}
    return {n.rsplit("/", 1)[1]: s3.cat_file(n) for n in names}


def check_kafka_files(objs, interval):
    """Segments parse with kafka-python (CRCs good), each named by its first offset, offsets dense across
    them, and their .index/.timeindex are what Kafka's recovery builds (plus the max-timestamp entry a roll
    writes). Returns what a read_committed consumer is given, in offset order: (offset, timestamp, key, value,
    headers)."""
    all_batches, expected = [], 0
    for name in sorted(n for n in objs if n.endswith(".log")):
        base = int(name[:20])
        batches = kp_parse(objs[name])
        assert batches and all(b["crc_ok"] for b in batches), name
        assert sum(b["size"] for b in batches) == len(objs[name])
        assert base == expected == batches[0]["base_offset"], name
        index, timeindex, (max_ts, max_off) = kafka_recovery_entries(batches, interval, base)
        last_ts = struct.unpack_from(">q", timeindex, len(timeindex) - 12)[0] if timeindex else -1
        if max_ts > last_ts:
            timeindex += struct.pack(">qi", max_ts, max_off - base)
        assert objs[name[:20] + ".index"] == index, name
        assert objs[name[:20] + ".timeindex"] == timeindex, name
        all_batches += batches
        expected = batches[-1]["last_offset"] + 1
    offsets = [r[0] for b in all_batches for r in b["records"]]
    assert offsets == list(range(len(offsets)))  # data, aborted data and transaction markers: no gap
    records, still_open = kp_committed(all_batches)
    assert not still_open, f"{len(still_open)} records of a transaction left open"
    return records
