"""Independent references for tests: kafka-python builds and parses batches; plain-Python models."""

from __future__ import annotations

import struct

from kafka.record import MemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def kp_batch(records, *, codec: str = "none", producer_id=-1, producer_epoch=-1, base_sequence=-1) -> bytes:
    """One v2 batch built by kafka-python. records: iterable of (timestamp, key, value, headers)."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=CODECS[codec],
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=2**30,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=list(headers or []))
    return bytes(b.build())


def kp_parse(data: bytes) -> list[dict]:
    """Every batch of a .log byte string as kafka-python sees it, with its position; records included."""
    out = []
    recs = MemoryRecords(bytes(data))
    pos = 0
    while recs.has_next():
        batch = recs.next_batch()
        if batch is None:
            break
        size = batch.size_in_bytes
        out.append(
            {
                "position": pos,
                "size": size,
                "base_offset": batch.base_offset,
                "last_offset": batch.last_offset,
                "max_timestamp": batch.max_timestamp,
                "crc_ok": batch.validate_crc(),
                "is_control": batch.is_control_batch,
                "is_transactional": batch.is_transactional,
                "producer_id": batch.producer_id,
                "records": [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch],
            }
        )
        pos += size
    return out


def kp_committed(batches: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """What a read_committed consumer is given, by brute force over kp_parse's batches in log order (Kafka's
    rule, independent of the engine): a transactional batch is held per producer until that producer's
    marker, given on COMMIT (control key type 1), dropped on ABORT (0); non-transactional batches are given at
    once; control records never. Returns (records given, records of transactions still open at the end)."""
    given, held = [], {}
    for b in batches:
        if b["is_control"]:
            for r in b["records"]:
                kind = int.from_bytes(r[2][2:4], "big")
                pending = held.pop(b["producer_id"], [])
                if kind == 1:
                    given += pending
        elif b["is_transactional"]:
            held.setdefault(b["producer_id"], []).extend(b["records"])
        else:
            given += b["records"]
    return sorted(given), [r for rs in held.values() for r in rs]


def kafka_recovery_entries(batches: list[dict], interval: int, base_offset: int):
    """Offset and time index entries of Kafka's recovery: per batch, if bytes since the last entry
    exceed index.interval.bytes, index (lastOffset -> position) and (max ts so far -> its offset)."""
    offset_entries, time_entries = [], []
    max_ts, max_ts_offset = -1, -1
    last_entry_pos = 0
    last_time = -1
    for b in batches:
        if b["max_timestamp"] > max_ts:
            max_ts, max_ts_offset = b["max_timestamp"], b["last_offset"]
        if b["position"] - last_entry_pos > interval:
            offset_entries.append((b["last_offset"] - base_offset, b["position"]))
            if max_ts > last_time:
                time_entries.append((max_ts, max_ts_offset - base_offset))
                last_time = max_ts
            last_entry_pos = b["position"]
    index = b"".join(struct.pack(">ii", o, p) for o, p in offset_entries)
    timeindex = b"".join(struct.pack(">qi", t, o) for t, o in time_entries)
    return index, timeindex, (max_ts, max_ts_offset)


def kp_control_batch(
    base_offset: int, timestamp: int, producer_id: int, *, commit: bool = True, producer_epoch: int = 0
) -> bytes:
    """A COMMIT or ABORT marker as a broker writes it: one record (key: version 0, type; value: version 0,
    coordinator epoch 0), attributes transactional + control, baseSequence -1; built by kafka-python, with
    the control bit (which it does not set) added and the CRC-32C recomputed."""
    import crc32c

    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        batch_size=2**20,
    )
    b.append(
        0,
        timestamp=timestamp,
        key=struct.pack(">hh", 0, 1 if commit else 0),
        value=struct.pack(">hi", 0, 0),
        headers=[],
    )
    out = bytearray(b.build())
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | 0x20)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)
