"""Kafka's console consumer for a log dir: records out as JSON lines, in the shape the producer
(kafkalog_ds.produce) reads back.
"""

from __future__ import annotations

import base64
import json
from typing import TextIO

import numpy as np
import pyarrow as pa

from storage.log_manager import LogManager
from storage.records.record_batch import TimestampType
from storage.topic_partition import TopicPartition
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED

from .produce import sigint_deferred


def _text_or_base64(b: bytes | None, name: str, flags: list) -> str | None:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        flags.append(name)
        return base64.b64encode(b).decode("ascii")


def records_to_json(batch: pa.RecordBatch, topic: str, partition: int, ensure_ascii: bool = False) -> list[str]:
    """One JSON line per record. Keys, values and header values print as UTF-8 text when they are valid
    UTF-8, else as base64, and the record gets a 'base64' list naming those fields."""
    cols = {
        name: batch.column(name).to_pylist()
        for name in ("offset", "timestamp", "timestampType", "key", "value", "headers")
    }
    names = {int(t): t.kafka_name for t in TimestampType}
    out = []
    for i, offset in enumerate(cols["offset"]):  # output: one line per record
        flags: list = []
        key = _text_or_base64(cols["key"][i], "key", flags)
        value = _text_or_base64(cols["value"][i], "value", flags)
        headers = [
            [h["key"], _text_or_base64(h["value"], f"headers.{j}", flags)]
            for j, h in enumerate(cols["headers"][i] or ())
        ]
        rec = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "timestamp": cols["timestamp"][i],
            "timestampType": names.get(cols["timestampType"][i], "NoTimestampType"),
            "key": key,
            "value": value,
            "headers": headers,
        }
        if flags:
            rec["base64"] = flags
        out.append(json.dumps(rec, ensure_ascii=ensure_ascii))
    return out


def consume(
    lm: LogManager,
    topic: str,
    out: TextIO,
    *,
    partition: int | None = None,
    offset: str | int = "earliest",
    timestamp: int | None = None,
    max_messages: int | None = None,
    ensure_ascii: bool = False,
    isolation_level: str = READ_UNCOMMITTED,
) -> int:
    """Print records as JSON lines, partition by partition; returns how many were printed. At read_committed,
    as Kafka's consumer: no aborted records, nothing at or past the last stable offset, which is also where
    'latest' starts (seekToEnd), and a timestamp found at or past it finds nothing."""
    meta = lm.topic(topic)
    parts = [partition] if partition is not None else list(range(meta.partitions))
    printed = 0
    for p in parts:
        with lm.open_log(TopicPartition(topic, p)) as log:
            if timestamp is not None:
                start = log.offset_for_timestamp(timestamp, isolation_level=isolation_level)
                if start is None:
                    continue
            elif offset == "earliest":
                start = log.log_start_offset
            elif offset == "latest":
                start = log.last_stable_offset if isolation_level == READ_COMMITTED else log.log_end_offset
            else:
                start = int(offset)
            for batch in log.read_records(start, isolation_level=isolation_level):
                if max_messages is not None and batch.num_rows > max_messages - printed:
                    batch = batch.slice(0, max_messages - printed)
                for part in output_slices(batch):
                    lines = records_to_json(part, topic, p, ensure_ascii)
                    if lines:
                        with sigint_deferred():  # Ctrl-C stops between writes: output ends with a whole line
                            write_whole(out, "\n".join(lines) + "\n")
                    printed += len(lines)
                if max_messages is not None and printed >= max_messages:
                    return printed
    return printed


def write_whole(out: TextIO, text: str) -> None:
    """Write all of `text`. A signal handled while a write blocks on a full pipe (Ctrl-C held back by
    sigint_deferred) makes the binary buffer take only part of the bytes, and TextIOWrapper.write drops
    the rest without a word (CPython 3.11); so the bytes go to the buffer here, until all are taken."""
    buffer = getattr(out, "buffer", None)
    if buffer is None or not getattr(out, "encoding", None):
        out.write(text)
        return
    out.flush()  # what the text layer holds goes first
    data = memoryview(text.encode(out.encoding, out.errors or "strict"))
    while data.nbytes:
        n = buffer.write(data)
        if not n:  # a non-blocking stdout took nothing: wait for it, do not spin
            buffer.flush()
            continue
        data = data[n:]


OUTPUT_SLICE_BYTES = 1 << 20  # JSON is made for this many key and value bytes at a time


def output_slices(batch: pa.RecordBatch):
    """The batch in slices of about OUTPUT_SLICE_BYTES of keys and values (at least one record each), so
    the text made from it stays small whatever the records hold."""
    n = batch.num_rows
    sizes = np.zeros(n, np.int64)
    for name in ("key", "value"):
        col = batch.column(name)
        offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + n + 1]
        sizes += np.diff(offsets.astype(np.int64))
    ends = np.cumsum(sizes)
    start = 0
    while start < n:
        base = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + OUTPUT_SLICE_BYTES, side="right")))
        yield batch.slice(start, stop - start)
        start = stop
