"""`kafkalog dump-log` for .log files: Kafka's DumpLogSegments batch and record lines, in the same
shape (field names, order), plus the options and the end-of-run report all dumpers share.

Files are read through the filesystem seam in growing chunks, so a 1 GiB segment never sits in
memory at once; a batch is never read whole unless it fits --max-message-size.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import crc32c as _crc32c
import numpy as np
import pyarrow as pa

from storage.common.constants import INT32_MAX
from storage.errors import DumpError, KafkaLogError, RecordTooLargeError
from storage.file_records import FIRST_CHUNK_BYTES, BatchChunk, select_batches
from storage.fs.filesystem import LogFileSystem
from storage.records.decoder import decode_batches
from storage.records.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    SCAN_BAD_LENGTH,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchScan,
    CompressionType,
    scan_batches,
)

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024  # Kafka's --max-message-size default
NO_MAX_BYTES = INT32_MAX  # Kafka's --max-bytes default (Integer.MAX_VALUE): no limit
MAX_CHUNK_BYTES = 2 * 1024 * 1024
RECORD_INDENT = "|"
CONTROL_TYPES = {
    0: "ABORT",
    1: "COMMIT",
    2: "LEADER_CHANGE",
    3: "SNAPSHOT_HEADER",
    4: "SNAPSHOT_FOOTER",
    5: "KRAFT_VERSION",
    6: "KRAFT_VOTERS",
}


@dataclass
class DumpOptions:
    print_data_log: bool = False
    deep_iteration: bool = False
    verify_index_only: bool = False
    index_sanity_check: bool = False
    skip_record_metadata: bool = False
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_bytes: int = NO_MAX_BYTES

    @property
    def deep(self) -> bool:
        return self.deep_iteration or self.print_data_log  # Kafka: --print-data-log implies deep iteration


@dataclass
class DumpReport:
    """What Kafka collects while dumping and prints on stderr at the end, keyed by absolute file name."""

    index_mismatches: dict = field(default_factory=dict)  # file -> [(index offset, log offset)]
    time_mismatches: dict = field(default_factory=dict)  # file -> [(index timestamp, log timestamp)]
    time_out_of_order: dict = field(default_factory=dict)  # file -> [(index timestamp, previous)]
    time_not_found: dict = field(default_factory=dict)  # file -> [(indexed offset, found log offset)]
    non_consecutive: dict = field(default_factory=dict)  # file -> [(offset, next offset)]
    errors: int = 0

    def print_to(self, err: TextIO) -> None:
        lines = []
        for name, pairs in self.index_mismatches.items():
            lines.append(f"Mismatches in :{name}")
            lines += [f"  Index offset: {a}, log offset: {b}" for a, b in reversed(pairs)]  # Kafka prepends
        for name, pairs in self.time_mismatches.items():
            lines.append(f"Found timestamp mismatch in :{name}")
            lines += [f"  Index timestamp: {a}, log timestamp: {b}" for a, b in pairs]
        for name, pairs in self.time_out_of_order.items():
            lines.append(f"Found out of order timestamp in :{name}")
            lines += [f"  Index timestamp: {a}, Previously indexed timestamp: {b}" for a, b in pairs]
        for pairs in self.time_not_found.values():
            lines.append("The following indexed offsets are not found in the log.")
            lines += [f"Indexed offset: {a}, found log offset: {b}" for a, b in pairs]
        for name, pairs in self.non_consecutive.items():
            lines.append(f"Non-consecutive offsets in {name}")
            lines += [f"  {a} is followed by {b}" for a, b in reversed(pairs)]
        if lines:
            err.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- reading batches


def _i32(x):
    """Wrap int64 values to Java int arithmetic."""
    return ((np.asarray(x, np.int64) + 2**31) % 2**32) - 2**31


def increment_sequence(seq, inc):
    """Kafka's DefaultRecordBatch.incrementSequence (wraps past Integer.MAX_VALUE), vectorized."""
    seq = np.asarray(seq, np.int64)
    inc = np.asarray(inc, np.int64)
    over = seq > _i32(INT32_MAX - inc)
    return np.where(over, _i32(_i32(inc - _i32(INT32_MAX - seq)) - 1), _i32(seq + inc))


def decrement_sequence(seq, dec):
    """Kafka's DefaultRecordBatch.decrementSequence (wraps below 0 to Integer.MAX_VALUE), vectorized."""
    seq = np.asarray(seq, np.int64)
    dec = np.asarray(dec, np.int64)
    return np.where(seq < dec, _i32(_i32(INT32_MAX - _i32(dec - seq)) + 1), _i32(seq - dec))


class SegmentReader:
    """Complete batches of a .log file from position 0 to `end`, read in growing chunks.

    After iteration `stop` is the position after the last complete batch and `bad` is
    (position, batchLength) when the walk met a length below the minimum or above max_batch_size.
    """

    def __init__(self, fs: LogFileSystem, path: str, end: int, max_batch_size: int):
        self.fs = fs
        self.path = path
        self.end = end
        self.max_batch_size = max_batch_size
        self.stop = 0
        self.bad: tuple[int, int] | None = None

    @staticmethod
    def _length(arr: np.ndarray, at: int) -> int:
        return struct.unpack_from(">i", arr.data, at + 8)[0]

    def chunks(self) -> Iterator[tuple[np.ndarray, BatchScan, int]]:
        pos, size = 0, FIRST_CHUNK_BYTES
        try:
            while pos < self.end:
                arr = np.frombuffer(self.fs.read(self.path, pos, min(self.end, pos + size)), np.uint8)
                scan = scan_batches(arr, max_batch_size=self.max_batch_size)
                if not len(scan):
                    if scan.reason == SCAN_BAD_LENGTH:
                        self.bad = (pos, self._length(arr, 0))
                        return
                    if len(arr) < LOG_OVERHEAD:
                        return  # partial tail
                    need = LOG_OVERHEAD + self._length(arr, 0)  # the walk allowed it: <= max_batch_size
                    if pos + need > self.end:
                        return
                    arr = np.frombuffer(self.fs.read(self.path, pos, pos + need), np.uint8)
                    scan = scan_batches(arr, max_batch_size=self.max_batch_size)
                    if not len(scan):
                        return
                yield arr, scan, pos
                if scan.reason == SCAN_BAD_LENGTH:
                    self.bad = (pos + scan.end, self._length(arr, scan.end))
                    pos += scan.end
                    return
                pos += scan.end
                size = min(size * 4, MAX_CHUNK_BYTES)
        finally:
            self.stop = pos

    def batch_table(self, want_last_offsets: np.ndarray | None = None, source: str = "") -> dict[str, Any]:
        """positions, sizes and last offsets of every batch the walk reaches; with want_last_offsets, also
        each wanted batch's largest record timestamp (decoded chunk by chunk; -1 for no records, and
        an entry in `errors` for a batch whose records cannot be read)."""
        cols: dict[str, list] = {"positions": [], "sizes": [], "last_offsets": [], "record_max_ts": []}
        errors: dict[int, str] = {}
        for arr, scan, base in self.chunks():
            last = scan.last_offsets
            cols["positions"].append(scan.positions + base)
            cols["sizes"].append(scan.sizes)
            cols["last_offsets"].append(last)
            max_ts = np.full(len(scan), -1, np.int64)
            if want_last_offsets is not None:
                sel = np.flatnonzero(np.isin(last, want_last_offsets))
                got_all = _records_of(arr, scan, base, source, sel, self.max_batch_size)
                for i, got in zip(sel.tolist(), got_all, strict=False):
                    if isinstance(got, Exception):
                        errors[base + int(scan.positions[i])] = one_line(got)
                    elif got.num_rows:
                        max_ts[i] = max(-1, int(got.column("timestamp").to_numpy().max()))
            cols["record_max_ts"].append(max_ts)
        out: dict[str, Any] = {k: np.concatenate(v) if v else np.empty(0, np.int64) for k, v in cols.items()}
        out["errors"] = errors
        return out


def _records_of(arr: np.ndarray, scan: BatchScan, base: int, source: str, sel: np.ndarray, max_bytes: int) -> Iterator:
    """Decoded records of the selected batches of a chunk, or their errors, one batch at a time."""
    if not sel.size:
        return iter(())
    sub = BatchScan(scan.positions[sel], scan.headers[sel], scan.end, 0)
    return decode_per_batch(arr, sub, base, source, max_bytes)


def batch_validity(arr: np.ndarray, scan: BatchScan) -> np.ndarray:
    """Kafka's isValid per batch: sizeInBytes >= 61 and the stored CRC equals the CRC-32C of the bytes."""
    view = arr.data
    sizes = scan.sizes
    crcs = scan.headers["crc"]
    out = np.zeros(len(scan), bool)
    for i, p in enumerate(scan.positions.tolist()):  # one C call per batch
        size = int(sizes[i])
        out[i] = size >= RECORD_BATCH_OVERHEAD and _crc32c.crc32c(view[p + ATTRIBUTES_OFFSET : p + size]) == int(
            crcs[i]
        )
    return out


def decode_per_batch(arr: np.ndarray, scan: BatchScan, base: int, source: str, max_bytes: int) -> Iterator:
    """Records of each batch as an Arrow batch, or the error that stopped its decoding (CRC not checked),
    one batch at a time. A batch's records decompress to at most max_bytes (--max-message-size), as the
    readers bound them by max.message.bytes: a batch beyond it is reported, never inflated whole."""
    chunk = BatchChunk(arr, scan, base, source)
    for i in range(len(scan)):  # per batch: the output is per record anyway
        part = select_batches(chunk, i, i + 1)
        try:
            yield decode_batches(
                part.buf,
                scan=part.scan,
                verify_crc=False,
                skip_control=False,
                max_message_bytes=max_bytes,
                source=source,
                base_position=part.base_position,
            )
        except RecordTooLargeError as e:
            limit = str(e).replace("(max.message.bytes)", "(--max-message-size)")  # dump-log's name for it
            yield RecordTooLargeError(f"{limit}; raise --max-message-size to read it")
        except KafkaLogError as e:
            yield e


# ---------------------------------------------------------------- formatting


def _bool(v) -> str:
    return "true" if v else "false"


def _codec_name(codec: int) -> str:
    try:
        return CompressionType(codec).kafka_name
    except ValueError:
        return f"unknown({codec})"


def batch_lines(scan: BatchScan, base: int, valid: np.ndarray) -> list[str]:
    """One Kafka printBatchLevel line per batch (v2 layout)."""
    h = scan.headers
    attrs = h["attributes"].astype(np.int64)
    base_offset = h["base_offset"].astype(np.int64)
    last = scan.last_offsets
    last_seq = np.where(h["base_sequence"] == -1, -1, increment_sequence(h["base_sequence"], h["last_offset_delta"]))
    cols = dict(
        base=base_offset.tolist(),
        last=last.tolist(),
        count=h["record_count"].tolist(),
        bseq=h["base_sequence"].tolist(),
        lseq=last_seq.tolist(),
        pid=h["producer_id"].tolist(),
        pep=h["producer_epoch"].tolist(),
        ple=h["partition_leader_epoch"].tolist(),
        txn=((attrs & TRANSACTIONAL_FLAG_MASK) != 0).tolist(),
        ctl=((attrs & CONTROL_FLAG_MASK) != 0).tolist(),
        dh=((attrs & DELETE_HORIZON_FLAG_MASK) != 0).tolist(),
        bts=h["base_timestamp"].tolist(),
        pos=(scan.positions + base).tolist(),
        tst=((attrs & TIMESTAMP_TYPE_MASK) != 0).tolist(),
        mts=h["max_timestamp"].tolist(),
        size=scan.sizes.tolist(),
        magic=h["magic"].tolist(),
        codec=(attrs & COMPRESSION_CODEC_MASK).tolist(),
        crc=h["crc"].tolist(),
        valid=valid.tolist(),
    )
    out = []
    for i in range(len(scan)):  # per batch
        c = {k: v[i] for k, v in cols.items()}
        horizon = f"OptionalLong[{c['bts']}]" if c["dh"] else "OptionalLong.empty"
        out.append(
            f"baseOffset: {c['base']} lastOffset: {c['last']} count: {c['count']} baseSequence: {c['bseq']} "
            f"lastSequence: {c['lseq']} producerId: {c['pid']} producerEpoch: {c['pep']} "
            f"partitionLeaderEpoch: {c['ple']} isTransactional: {_bool(c['txn'])} isControl: {_bool(c['ctl'])} "
            f"deleteHorizonMs: {horizon} position: {c['pos']} "
            f"{'LogAppendTime' if c['tst'] else 'CreateTime'}: {c['mts']} size: {c['size']} magic: {c['magic']} "
            f"compresscodec: {_codec_name(c['codec'])} crc: {c['crc']} isvalid: {_bool(c['valid'])}"
        )
    return out


def _text(b: bytes) -> str:
    """Kafka's StringDecoder: new String(bytes, UTF_8), malformed input replaced."""
    return b.decode("utf-8", "replace")


def _control_suffix(key: bytes | None, value: bytes | None) -> str:
    if key is None or len(key) < 4:
        return " controlType: UNKNOWN(-1)"
    type_id = struct.unpack_from(">h", key, 2)[0]
    name = CONTROL_TYPES.get(type_id, "UNKNOWN")
    if type_id in (0, 1) and value is not None and len(value) >= 6:
        return f" endTxnMarker: {name} coordinatorEpoch: {struct.unpack_from('>i', value, 2)[0]}"
    return f" controlType: {name}({type_id})"


def record_lines(records: pa.RecordBatch, header, opts: DumpOptions) -> list[str]:
    """Kafka's per-record line for one batch: metadata, control marker, then key and payload."""
    offsets = records.column("offset").to_pylist()
    timestamps = records.column("timestamp").to_pylist()
    keys = records.column("key").to_pylist()
    values = records.column("value").to_pylist()
    headers = records.column("headers").to_pylist()
    ts_name = header.timestamp_type.kafka_name
    if header.base_sequence >= 0:
        seqs = increment_sequence(header.base_sequence, np.asarray(offsets, np.int64) - header.base_offset).tolist()
    else:
        seqs = [-1] * len(offsets)
    out = []
    for i, offset in enumerate(offsets):  # output: one line per record
        key, value = keys[i], values[i]
        line = f"{RECORD_INDENT} "
        prefix = line
        if not opts.skip_record_metadata:
            hkeys = ",".join(h["key"] for h in headers[i] or ())
            line += (
                f"offset: {offset} {ts_name}: {timestamps[i]} keySize: {-1 if key is None else len(key)} "
                f"valueSize: {-1 if value is None else len(value)} sequence: {seqs[i]} headerKeys: [{hkeys}]"
            )
            prefix = " "
            if header.is_control:
                line += _control_suffix(key, value)
        else:
            line = ""
        if opts.print_data_log and not header.is_control:
            if key is not None:
                line += f"{prefix}key: {_text(key)}"
            if value is not None:
                line += f" payload: {_text(value)}"
        out.append(line)
    return out


# ---------------------------------------------------------------- files


def start_offset(name: str, display: str) -> int:
    head = name.split(".")[0]
    if not head.isdigit():
        raise DumpError(
            f"cannot dump {display}: the file name must start with the segment's base offset "
            f"(like 00000000000000000000{name[name.find('.') :] if '.' in name else ''})"
        )
    return int(head)


def dump_log(
    fs: LogFileSystem, path: str, display: str, opts: DumpOptions, out: TextIO, report: DumpReport, abs_name: str
) -> None:
    name = fs.basename(path)
    out.write(f"Log starting offset: {start_offset(name, display)}\n")
    size = fs.size(path)
    reader = SegmentReader(fs, path, min(size, opts.max_bytes), opts.max_message_size)
    source = fs.url(path)
    state: dict[str, Any] = {"last_offset": -1, "failed": []}
    for arr, scan, base in reader.chunks():
        old = np.flatnonzero(scan.headers["magic"] < MAGIC_V2)
        if old.size:
            i = int(old[0])
            if i:
                _dump_batches(arr, _head(scan, i), base, source, opts, out, report, abs_name, state)
            raise DumpError(
                f"message format v{int(scan.headers['magic'][i])} (before Kafka 0.11) is not supported "
                f"({source}, position {base + int(scan.positions[i])})"
            )
        _dump_batches(arr, scan, base, source, opts, out, report, abs_name, state)
    if reader.bad is not None:
        pos, length = reader.bad
        if length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD:
            raise DumpError(
                f"corrupt batch: batchLength {length} is below the minimum "
                f"{RECORD_BATCH_OVERHEAD - LOG_OVERHEAD} ({source}, position {pos})"
            )
        if pos + LOG_OVERHEAD + length <= reader.end:
            raise DumpError(
                f"batch of {length + LOG_OVERHEAD} bytes is larger than --max-message-size "
                f"{opts.max_message_size} ({source}, position {pos}); raise --max-message-size to read it"
            )
        reader.stop = pos  # a length past the end of the file: a torn tail, reported below as Kafka does
    trailing = reader.end - reader.stop
    if trailing > 0 and opts.max_bytes == NO_MAX_BYTES:
        out.write(f"Found {trailing} invalid bytes at the end of {name}\n")
    if state["failed"]:
        raise DumpError(
            f"{len(state['failed'])} batch(es) of {display} could not be decoded; the first: {state['failed'][0]}"
        )


def _dump_batches(
    arr,
    scan: BatchScan,
    base: int,
    source: str,
    opts: DumpOptions,
    out: TextIO,
    report: DumpReport,
    abs_name: str,
    state: dict,
) -> None:
    """Print the batch lines of one chunk and, with deep iteration, every record under its batch."""
    lines = batch_lines(scan, base, batch_validity(arr, scan))
    if not opts.deep:
        out.write("\n".join(lines) + "\n")
        return
    decoded = decode_per_batch(arr, scan, base, source, opts.max_message_size)
    for i, line in enumerate(lines):  # per batch
        text = [line]
        records = next(decoded)
        if isinstance(records, Exception):
            state["failed"].append(one_line(records))
            text.append(f"{RECORD_INDENT} error: the records of this batch cannot be read: {one_line(records)}")
            out.write("\n".join(text) + "\n")
            continue
        offs = records.column("offset").to_numpy()
        if offs.size:
            prev = np.concatenate(([state["last_offset"]], offs[:-1]))
            gaps = np.flatnonzero((offs != prev + 1) & (prev != -1))
            if gaps.size:
                pairs = zip(prev[gaps].tolist(), offs[gaps].tolist(), strict=True)
                report.non_consecutive.setdefault(abs_name, []).extend(pairs)
            state["last_offset"] = int(offs[-1])
        text += record_lines(records, scan.header(i, base), opts)
        out.write("\n".join(text) + "\n")


def _head(scan: BatchScan, n: int) -> BatchScan:
    """The first n batches of a scan (n < len(scan))."""
    return BatchScan(scan.positions[:n], scan.headers[:n], int(scan.positions[n]), 0)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split("\n"))
