"""Kafka's console producer for a log dir: JSON lines in, record batches appended.

Input is parsed a block at a time by Arrow's JSON reader (no per-line Python on the normal path);
only when a block has a problem is it walked line by line, to name the line at fault. Every block
is validated and encoded before anything is appended, so bad input writes nothing. The input shape
is the consumer's output (kafkalog_ds.consume), so the two round-trip.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from storage.common.constants import INT64_MAX, INT64_MIN
from storage.common.time import SYSTEM_TIME
from storage.errors import InvalidInputError, RecordTooLargeError, UnknownTopicOrPartitionError
from storage.log_config import LogConfig
from storage.log_manager import LogManager
from storage.records.builder import build_records
from storage.records.record_batch import CompressionType
from storage.staging.partitioner import partition_for_keys
from storage.topic_partition import TopicPartition, validate_topic_name

BLOCK_BYTES = 4 * 1024 * 1024  # stdin is parsed in blocks of about this size, cut at a line end
MAX_LINE_BYTES = 256 * 1024 * 1024  # a longer line is refused before it is buffered further
SPOOL_MEMORY_BYTES = 64 * 1024 * 1024  # encoded batches beyond this wait on disk until the input is all valid
DEFAULT_BATCH_SIZE = 200  # records per batch: kafka-console-producer's --batch-size default

#: Fields of an input line. topic, offset and timestampType are accepted and ignored, so that the
#: consumer's output can be fed back to the producer.
INPUT_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("value", pa.string()),
        ("timestamp", pa.int64()),
        ("partition", pa.int64()),
        ("headers", pa.list_(pa.list_(pa.string()))),
        ("base64", pa.list_(pa.string())),
        ("topic", pa.string()),
        ("offset", pa.int64()),
        ("timestampType", pa.string()),
    ]
)
_FIELDS = tuple(INPUT_SCHEMA.names)
_B64_NAME = re.compile(r"key|value|headers\.(0|[1-9][0-9]*)")
_WS = np.zeros(256, bool)
_WS[[9, 10, 13, 32]] = True  # JSON whitespace
NL = b"\n"


# ---------------------------------------------------------------- producer input


def iter_blocks(stream: BinaryIO, block_bytes: int = BLOCK_BYTES, max_line_bytes: int = MAX_LINE_BYTES):
    """(first line number, bytes ending at a line end) from a byte stream, about block_bytes at a time."""
    line_no, carry = 1, b""
    while True:
        data = stream.read(block_bytes)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if not data:
            if carry:
                yield line_no, carry
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
        else:
            block, carry = buf[: cut + 1], buf[cut + 1 :]
            yield line_no, block
            line_no += block.count(b"\n")
        if len(carry) > max_line_bytes:
            raise InvalidInputError(f"stdin line {line_no}: longer than {max_line_bytes} bytes; nothing was written")


def _nonblank_lines(block: bytes, first_line: int) -> np.ndarray:
    """Line numbers of the lines holding something besides JSON whitespace (Arrow skips the others)."""
    arr = np.frombuffer(block, np.uint8)
    nl = np.flatnonzero(arr == 10)
    ends = nl if (arr.size and arr[-1] == 10) else np.append(nl, arr.size)
    starts = np.concatenate(([0], ends[:-1] + 1))
    cs = np.concatenate(([0], np.cumsum(~_WS[arr])))
    return first_line + np.flatnonzero(cs[ends] - cs[starts] > 0)


def _json_type(v) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}[type(v)]


class _Duplicate(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _Duplicate(k)
        seen[k] = v
    return seen


def _string_problem(name: str, v) -> str | None:
    if v is not None and not isinstance(v, str):
        return f"'{name}' must be a string or null, got {_json_type(v)}"
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return f"'{name}' holds an unpaired UTF-16 surrogate"
    return None


def _int_problem(name: str, v, what: str) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        return f"'{name}' must be {what} or null, got {_json_type(v)} {json.dumps(v)[:40]}"
    if not INT64_MIN <= v <= INT64_MAX:
        return f"'{name}' {v} does not fit in 64 bits"
    return None


def line_problem(line: str, topic: str, num_partitions: int) -> str | None:
    """Why one input line is not a record we accept (None if it is fine). The slow, exact check."""
    try:
        obj = json.loads(line, object_pairs_hook=_no_duplicates)
    except _Duplicate as e:
        return f"field '{e.args[0]}' appears twice"
    except (json.JSONDecodeError, RecursionError) as e:
        return f"not valid JSON: {getattr(e, 'msg', e)} (column {getattr(e, 'colno', '?')})"
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {_json_type(obj)}"
    for k in obj:
        if k not in _FIELDS:
            return f"unknown field '{k}' (fields: key, value, timestamp, partition, headers, base64)"
    for name in ("key", "value", "topic", "timestampType"):
        problem = _string_problem(name, obj.get(name))
        if problem:
            return problem
    for name, what in (
        ("timestamp", "an integer (epoch milliseconds)"),
        ("partition", "an integer"),
        ("offset", "an integer"),
    ):
        problem = _int_problem(name, obj.get(name), what)
        if problem:
            return problem
    ts = obj.get("timestamp")
    if ts is not None and ts < 0:
        return f"invalid timestamp {ts}: a timestamp must be non-negative or null"
    p = obj.get("partition")
    if p is not None and not 0 <= p < num_partitions:
        return (
            f"partition {p} is out of range: topic '{topic}' has {num_partitions} partition(s), 0..{num_partitions - 1}"
        )
    headers = obj.get("headers")
    if headers is not None:
        if not isinstance(headers, list):
            return f"'headers' must be a list of [key, value] pairs, got {_json_type(headers)}"
        for i, h in enumerate(headers):
            if not isinstance(h, list) or len(h) != 2:
                return f"headers[{i}] must be a [key, value] pair, got {json.dumps(h)[:60]}"
            if not isinstance(h[0], str):
                return f"headers[{i}]: the key must be a string, got {_json_type(h[0])}"
            problem = _string_problem(f"headers[{i}] key", h[0]) or _string_problem(f"headers[{i}] value", h[1])
            if problem:
                return problem
    flags = obj.get("base64")
    if flags is not None:
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            return "'base64' must be a list of field names"
        for f in flags:
            if not _B64_NAME.fullmatch(f):
                return f"'base64' names '{f}': expected key, value or headers.<i>"
            if f.startswith("headers."):
                i = int(f[8:])
                target = headers[i][1] if headers is not None and i < len(headers) else None
            else:
                target = obj.get(f)
            if not isinstance(target, str):
                return f"'base64' names '{f}', which is not a string here"
            try:
                base64.b64decode(target, validate=True)
            except (binascii.Error, ValueError):
                return f"'{f}' is flagged as base64 but is not valid base64"
    return None


def find_bad_line(block: bytes, first_line: int, topic: str, num_partitions: int) -> tuple[int, str] | None:
    """The first line of a block that line_problem rejects, as (line number, problem)."""
    for i, line in enumerate(block.decode("utf-8").split("\n")):  # the error path only
        if line.strip(" \t\r"):
            problem = line_problem(line, topic, num_partitions)
            if problem:
                return first_line + i, problem
    return None


@dataclass
class ParsedBlock:
    table: pa.Table  # key, value (binary), timestamp (int64, nullable), headers list<struct<key, value>>
    partition: pa.Array  # int64, null where the partitioner decides
    lines: np.ndarray  # input line number of each row


def _fail(block, first_line, topic, num_partitions, fallback: str, row: int | None = None, lines=None):
    """The error for a block that failed a check: the exact line and problem when the slow check finds it."""
    found = find_bad_line(block, first_line, topic, num_partitions)
    if found is not None:
        return InvalidInputError(f"stdin line {found[0]}: {found[1]}; nothing was written")
    if row is not None and lines is not None and row < len(lines):
        where = f"line {int(lines[row])}"
    else:
        where = f"lines {first_line}..{first_line + max(0, block.count(NL) - 1)}"
    return InvalidInputError(f"stdin {where}: {fallback}; nothing was written")


def parse_block(block: bytes, first_line: int, topic: str, num_partitions: int) -> ParsedBlock:
    """Parse and validate a block of JSON lines into record columns; InvalidInputError names the bad line."""
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as e:
        line = first_line + block.count(b"\n", 0, e.start)
        column = e.start - block.rfind(NL, 0, e.start)
        raise InvalidInputError(
            f"stdin line {line}: not valid UTF-8 (byte {column} of the line); nothing was written"
        ) from None
    lines = _nonblank_lines(block, first_line)
    if not lines.size:
        return ParsedBlock(pa.table({"key": pa.array([], pa.binary())}), pa.array([], pa.int64()), lines)
    try:
        table = pj.read_json(
            pa.BufferReader(block),
            read_options=pj.ReadOptions(use_threads=True, block_size=len(block) + 1),
            parse_options=pj.ParseOptions(explicit_schema=INPUT_SCHEMA, unexpected_field_behavior="error"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise _fail(block, first_line, topic, num_partitions, str(e)) from None
    if table.num_rows != lines.size:  # two objects on one line, for example
        raise _fail(block, first_line, topic, num_partitions, "expected exactly one JSON object per line")
    table = table.combine_chunks()
    cols = {
        name: table.column(name).chunk(0) for name in ("key", "value", "timestamp", "partition", "headers", "base64")
    }

    def check(bad_mask, what):
        bad = np.flatnonzero(np.asarray(bad_mask, bool))
        if bad.size:
            raise _fail(block, first_line, topic, num_partitions, what, int(bad[0]), lines)

    ts, part = cols["timestamp"], cols["partition"]
    check(pc.fill_null(pc.less(ts, 0), False).to_numpy(zero_copy_only=False), "negative timestamp")
    check(
        pc.fill_null(pc.or_(pc.less(part, 0), pc.greater_equal(part, num_partitions)), False).to_numpy(
            zero_copy_only=False
        ),
        "partition out of range",
    )
    headers = _headers_column(cols["headers"], check)
    key = pc.cast(cols["key"], pa.binary())
    value = pc.cast(cols["value"], pa.binary())
    b64 = cols["base64"]
    if b64.null_count < len(b64):
        key, value, headers = _apply_base64(b64, key, value, headers, check)
    return ParsedBlock(pa.table({"key": key, "value": value, "timestamp": ts, "headers": headers}), part, lines)


_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _headers_column(headers: pa.ListArray, check) -> pa.Array:
    """list<list<string>> pairs -> list<struct<key string, value binary>>, checking every pair."""
    n = len(headers)
    outer = headers.offsets.to_numpy().astype(np.int64)
    pairs = headers.values
    # rows whose pairs are not all [string, string|null]
    plen = pc.fill_null(pc.list_value_length(pairs), -1).to_numpy(zero_copy_only=False)
    bad_pair = plen != 2
    if bad_pair.any():
        row_of = np.searchsorted(outer, np.flatnonzero(bad_pair), side="right") - 1
        mask = np.zeros(n, bool)
        mask[row_of[(row_of >= 0) & (row_of < n)]] = True
        check(mask & headers.is_valid().to_numpy(zero_copy_only=False), "bad header pair")
    m = len(pairs)
    if m == 0:
        offsets = pa.array(outer.astype(np.int32))
        empty = pa.StructArray.from_arrays(
            [pa.array([], pa.string()), pa.array([], pa.binary())], fields=list(_HEADER_TYPE.value_type)
        )
        return pa.ListArray.from_arrays(offsets, empty, mask=headers.is_null())
    inner = pairs.offsets.to_numpy().astype(np.int64)
    flat = pairs.values
    hkeys = flat.take(pa.array(inner[:-1]))
    hvals = pc.cast(flat.take(pa.array(inner[:-1] + 1)), pa.binary())
    if hkeys.null_count:
        null_at = np.flatnonzero(hkeys.is_null().to_numpy(zero_copy_only=False))
        mask = np.zeros(n, bool)
        mask[np.searchsorted(outer, null_at, side="right") - 1] = True
        check(mask, "null header key")
    entries = pa.StructArray.from_arrays([hkeys, hvals], fields=list(_HEADER_TYPE.value_type))
    return pa.ListArray.from_arrays(pa.array(outer.astype(np.int32)), entries, mask=headers.is_null())


def _apply_base64(b64: pa.ListArray, key, value, headers, check):
    """Decode the fields each row's 'base64' list names (rows that have one are few: a Python loop)."""
    rows = np.flatnonzero(pc.fill_null(pc.greater(pc.list_value_length(b64), 0), False).to_numpy(zero_copy_only=False))
    outer = headers.offsets.to_numpy().astype(np.int64)
    hvals = headers.values.field("value")
    repl: dict[str, dict] = {"key": {}, "value": {}, "headers": {}}
    for r in rows.tolist():  # rows flagged base64 only
        for name in b64[r].as_py():
            bad = np.zeros(len(key), bool)
            bad[r] = True
            if not _B64_NAME.fullmatch(name):
                check(bad, "bad base64 field name")
            if name.startswith("headers."):
                i = int(name[8:])
                if i >= outer[r + 1] - outer[r]:
                    check(bad, "base64 names a missing header")
                target, slot, where = hvals[int(outer[r]) + i].as_py(), int(outer[r]) + i, "headers"
            else:
                target, slot, where = (key if name == "key" else value)[r].as_py(), r, name
            try:
                repl[where][slot] = base64.b64decode(target, validate=True)
            except (binascii.Error, ValueError, TypeError):
                check(bad, "bad base64")

    def patch(arr, fixes):
        if not fixes:
            return arr
        mask = np.zeros(len(arr), bool)
        idx = sorted(fixes)
        mask[idx] = True
        return pc.replace_with_mask(arr, pa.array(mask), pa.array([fixes[i] for i in idx], pa.binary()))

    key, value = patch(key, repl["key"]), patch(value, repl["value"])
    if repl["headers"]:
        entries = pa.StructArray.from_arrays(
            [headers.values.field("key"), patch(hvals, repl["headers"])], fields=list(_HEADER_TYPE.value_type)
        )
        headers = pa.ListArray.from_arrays(headers.offsets, entries, mask=headers.is_null())
    return key, value, headers


# ---------------------------------------------------------------- producer


@dataclass
class _Piece:
    position: int
    length: int
    records: int


@contextlib.contextmanager
def sigint_deferred():
    """Hold back Ctrl-C (SIGINT) until the block is done, then deliver it: an append is never cut in the
    middle (a KeyboardInterrupt between two writes of one append would leave part of a batch in the
    segment and the indexes behind it). A no-op off the main thread, where signals cannot be handled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # to whatever handled it before: KeyboardInterrupt by default


class ProduceProgress:
    """A status line on a terminal while produce reads and appends: records, bytes, records/s. Redrawn
    at most every PROGRESS_INTERVAL_S; cleared before anything else is printed."""

    PROGRESS_INTERVAL_S = 0.25

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self.started = time.monotonic()
        self._drawn = self.started  # the first draw after PROGRESS_INTERVAL_S: small inputs show none
        self._shown = False

    def update(self, text: str, records: int, since: float | None = None) -> None:
        """Show `text` and the rate of `records` since `since` (default: the start)."""
        if self.stream is None:
            return
        now = time.monotonic()
        if now - self._drawn < self.PROGRESS_INTERVAL_S:
            return
        self._drawn = now
        rate = records / max(now - (self.started if since is None else since), 1e-9)
        self.stream.write(f"\r\033[K{text}, {rate:,.0f} records/s")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self.stream is not None and self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False


def _size(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n:,} bytes" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return ""  # unreachable


def produce(
    lm: LogManager,
    topic: str,
    stream: BinaryIO,
    out: TextIO,
    *,
    compression: str = "none",
    batch_size: int = DEFAULT_BATCH_SIZE,
    create: bool = True,
    partitions: int | None = None,
    block_bytes: int = BLOCK_BYTES,
    progress: TextIO | None = None,
    summary: TextIO | None = None,
) -> dict[int, tuple[int, int, int]]:
    """Append JSON-line records to a topic. Returns {partition: (records, first offset, last offset)}.

    `progress`: a terminal to show a status line on while reading and appending; `summary`: where the
    closing `Wrote N records (B bytes) to T in S s` line goes. Ctrl-C while appending stops between
    appends (sigint_deferred): what was appended is whole batches, and its `Wrote ...` lines are printed."""
    bar = ProduceProgress(progress)
    try:
        return _produce(lm, topic, stream, out, compression, batch_size, create, partitions, block_bytes, bar, summary)
    finally:
        bar.clear()


def _produce(
    lm,
    topic,
    stream,
    out,
    compression,
    batch_size,
    create,
    partitions,
    block_bytes,
    bar: ProduceProgress,
    summary: TextIO | None,
) -> dict[int, tuple[int, int, int]]:
    validate_topic_name(topic)
    codec = CompressionType.for_name(compression)
    try:
        meta = lm.topic(topic)
    except UnknownTopicOrPartitionError:
        if not create:
            raise UnknownTopicOrPartitionError(
                f"topic '{topic}' does not exist in {lm.url()} (--no-create was given)"
            ) from None
        meta = None
    if meta is not None and partitions is not None and partitions != meta.partitions:
        raise InvalidInputError(
            f"topic '{topic}' exists with {meta.partitions} partition(s); "
            f"--partitions {partitions} applies only when the topic is created"
        )
    num_partitions = meta.partitions if meta is not None else (partitions or 1)
    max_batch = (meta.config if meta is not None else LogConfig()).max_message_bytes
    pieces: dict[int, list[_Piece]] = {}
    null_keys = 0
    records_in = bytes_in = 0
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        for first_line, block in iter_blocks(stream, block_bytes):
            bytes_in += len(block)
            parsed = parse_block(block, first_line, topic, num_partitions)
            n = parsed.table.num_rows
            if not n:
                continue
            _check_timestamp_bounds(parsed, meta.config if meta is not None else LogConfig(), topic)
            parts, null_keys = _assign_partitions(parsed, num_partitions, null_keys)
            for p, rows, table in _group(parsed.table, parts, num_partitions):
                data, count = _encode(table, rows, parsed.lines, codec, batch_size, max_batch)
                pieces.setdefault(p, []).append(_Piece(spool.tell(), len(data), count))
                spool.write(data)
            records_in += n
            bar.update(f"reading stdin: {records_in:,} records, {_size(bytes_in)}", records_in)
        if meta is None:
            meta = lm.get_or_create_topic(topic, num_partitions)
            if meta.partitions != num_partitions:
                raise InvalidInputError(
                    f"topic '{topic}' was created meanwhile with {meta.partitions} partition(s); nothing was written"
                )
        result = {}
        written = written_bytes = 0
        appending_since = time.monotonic()
        for p in sorted(pieces):
            with lm.open_log(TopicPartition(topic, p), writable=True) as log:
                first: int | None = None
                last: int | None = None
                total = 0
                try:
                    for piece in pieces[p]:  # per block, not per record
                        spool.seek(piece.position)
                        data = spool.read(piece.length)
                        with sigint_deferred():  # all of this block's batches are appended, or none,
                            info = log.append(data)  # and then counted
                            first = info.first_offset if first is None else first
                            last = info.last_offset
                            total += info.num_records
                            written += info.num_records
                            written_bytes += info.valid_bytes
                        bar.update(
                            f"appending: {written:,} of {records_in:,} records, {_size(written_bytes)}",
                            written,
                            since=appending_since,
                        )
                finally:  # also when interrupted: say what was appended
                    if total:
                        assert first is not None and last is not None
                        result[p] = (total, first, last)
                        bar.clear()
                        out.write(
                            f"Wrote {total} record{'s' if total != 1 else ''} to {topic}-{p} at offsets "
                            f"{first}..{last}\n"
                        )
    if summary is not None:
        bar.clear()
        elapsed = time.monotonic() - bar.started
        if written:
            summary.write(
                f"Wrote {written} record{'s' if written != 1 else ''} ({written_bytes} bytes) to "
                f"{len(result)} partition(s) of {topic} in {elapsed:.2f} s\n"
            )
        else:
            summary.write(f"Wrote 0 records to {topic}: stdin held no records\n")
    return result


def _check_timestamp_bounds(parsed: ParsedBlock, cfg: LogConfig, topic: str) -> None:
    """The topic's message.timestamp.before/after.max.ms, checked before anything is appended."""
    now = SYSTEM_TIME.milliseconds()
    bounds = cfg.create_time_bounds(now)
    if bounds is None:
        return
    lo, hi = bounds
    ts = pc.fill_null(parsed.table.column("timestamp"), now).to_numpy()
    bad = np.flatnonzero((ts < lo) | (ts > hi))
    if bad.size:
        i = int(bad[0])
        raise InvalidInputError(
            f"stdin line {int(parsed.lines[i])}: timestamp {int(ts[i])} is out of range for topic '{topic}': it must "
            f"be within [{lo}, {hi}] (message.timestamp.before.max.ms / message.timestamp.after.max.ms); "
            f"nothing was written"
        )


def _assign_partitions(parsed: ParsedBlock, num_partitions: int, null_keys: int) -> tuple[np.ndarray, int]:
    """Explicit partitions win; the rest go where Kafka's default partitioner puts their keys."""
    part = parsed.partition
    missing = part.is_null().to_numpy(zero_copy_only=False)
    out = pc.fill_null(part, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if missing.any():
        keys = parsed.table.column("key")
        if not missing.all():
            keys = keys.filter(pa.array(missing))
        out[missing] = partition_for_keys(keys, num_partitions, null_key_start=null_keys)
        null_keys += keys.null_count
    return out, null_keys


def _group(table: pa.Table, parts: np.ndarray, num_partitions: int):
    """(partition, original row numbers, rows) per partition present, rows kept in input order."""
    if parts.size and (parts == parts[0]).all():
        yield int(parts[0]), np.arange(parts.size), table
        return
    order = np.argsort(parts, kind="stable")
    bounds = np.searchsorted(parts[order], np.arange(num_partitions + 1))
    sorted_table = table.take(pa.array(order))
    for p in np.flatnonzero(np.diff(bounds)).tolist():
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        yield p, order[lo:hi], sorted_table.slice(lo, hi - lo)


def _encode(
    table: pa.Table, rows: np.ndarray, lines: np.ndarray, codec: CompressionType, batch_size: int, max_batch: int
) -> tuple[bytes, int]:
    """Encode rows batch_size at a time; a record too large names its input line."""
    parts = []
    for start in range(0, table.num_rows, batch_size):  # per batch
        try:
            # relative offsets increase batch to batch; Log.append assigns the real ones
            parts.append(
                build_records(
                    table.slice(start, batch_size), compression=codec, base_offset=start, max_batch_bytes=max_batch
                )
            )
        except RecordTooLargeError as e:
            if e.row is None:
                raise
            line = int(lines[rows[start + e.row]])
            raise InvalidInputError(f"stdin line {line}: {e.reason}; nothing was written") from None
    return b"".join(parts), table.num_rows
