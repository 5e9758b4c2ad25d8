"""`kafkalog dump-log` for .index and .timeindex files: Kafka's DumpLogSegments entry lines,
and its checks of each index entry against the segment's .log (mismatches go to the DumpReport).
"""

from __future__ import annotations

import struct
from typing import Any, TextIO

import numpy as np

from storage.common.constants import INT32_MAX
from storage.errors import CorruptIndexError, DumpError
from storage.fs.filesystem import LogFileSystem
from storage.index import OffsetIndex, TimeIndex
from storage.records.record_batch import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD

from .dump_log import DumpOptions, DumpReport, SegmentReader, start_offset


def _log_path_for(fs: LogFileSystem, path: str) -> str:
    name = fs.basename(path)
    return fs.join(fs.dirname(path), name.split(".")[0] + ".log")


def _log_batches(
    fs: LogFileSystem, path: str, display: str, max_message_size: int, want_last_offsets: np.ndarray | None = None
) -> dict[str, Any]:
    log_path = _log_path_for(fs, path)
    if not fs.exists(log_path):
        raise DumpError(f"cannot check {display}: its log file {fs.url(log_path)} does not exist")
    reader = SegmentReader(fs, log_path, fs.size(log_path), max(max_message_size, RECORD_BATCH_OVERHEAD))
    return reader.batch_table(want_last_offsets, fs.url(log_path))


def _read_whole(fs: LogFileSystem, path: str) -> bytes:
    """An index file's bytes; Kafka's indexes are at most Integer.MAX_VALUE bytes, so a bigger file is refused."""
    size = fs.size(path)
    if size > INT32_MAX:
        raise DumpError(f"{fs.url(path)} is {size} bytes, larger than any Kafka index can be")
    return fs.read(path)


def _read_entries(fs: LogFileSystem, path: str, dtype: np.dtype) -> np.ndarray:
    data = _read_whole(fs, path)
    n = len(data) // dtype.itemsize
    return np.frombuffer(data, dtype, count=n)


def _stop_at_zero_entry(rel: np.ndarray) -> int:
    """Kafka stops at the first entry after the first whose offset is the base offset (preallocated zeros)."""
    zeros = np.flatnonzero(rel[1:] == 0)
    return int(zeros[0]) + 1 if zeros.size else len(rel)


def dump_index(
    fs: LogFileSystem, path: str, display: str, opts: DumpOptions, out: TextIO, report: DumpReport, abs_name: str
) -> None:
    base = start_offset(fs.basename(path), display)
    entries = _read_entries(fs, path, OffsetIndex.entry_dtype)
    if len(entries) == 0:
        out.write(f"{display} is empty.\n")
        return
    if opts.index_sanity_check:
        size = fs.size(path)
        OffsetIndex(fs, path, base, max(size, 8), file_size=size).sanity_check()
        out.write(f"{display} passed sanity check.\n")
        return
    rel = entries["relative_offset"].astype(np.int64)
    n = _stop_at_zero_entry(rel)
    offsets = base + rel[:n]
    positions = entries["position"].astype(np.int64)[:n]
    batches = _log_batches(fs, path, display, opts.max_message_size)
    bpos = batches["positions"]
    j = np.searchsorted(bpos, positions)
    jc = np.minimum(j, max(len(bpos) - 1, 0))
    hit = (j < len(bpos)) & (bpos[jc] == positions) if len(bpos) else np.zeros(n, bool)
    found = np.where(hit, batches["last_offsets"][jc] if len(bpos) else -1, -1)
    for i in np.flatnonzero(~hit).tolist():  # entries that point between batches: read that header, as Kafka does
        found[i] = _last_offset_at(fs, _log_path_for(fs, path), int(positions[i]), opts.max_message_size)
    bad = np.flatnonzero(found != offsets)
    if bad.size:
        mismatches = zip(offsets[bad].tolist(), found[bad].tolist(), strict=True)
        report.index_mismatches.setdefault(abs_name, []).extend(mismatches)
    if not opts.verify_index_only:
        rows = zip(offsets.tolist(), positions.tolist(), strict=True)
        out.write("".join(f"offset: {o} position: {p}\n" for o, p in rows))


def _last_offset_at(fs: LogFileSystem, log_path: str, position: int, max_message_size: int) -> int:
    """lastOffset of a batch read at an arbitrary position within max_message_size bytes, or -1."""
    if position < 0:
        return -1
    end = min(fs.size(log_path), position + max_message_size)
    head = fs.read(log_path, position, min(end, position + RECORD_BATCH_OVERHEAD))
    if len(head) < RECORD_BATCH_OVERHEAD:
        return -1
    base, length = struct.unpack_from(">qi", head, 0)
    if length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD or position + LOG_OVERHEAD + length > end:
        return -1
    return base + struct.unpack_from(">i", head, 23)[0]


def dump_time_index(
    fs: LogFileSystem, path: str, display: str, opts: DumpOptions, out: TextIO, report: DumpReport, abs_name: str
) -> None:
    base = start_offset(fs.basename(path), display)
    size = fs.size(path)
    if opts.index_sanity_check:
        index = TimeIndex(fs, path, base, max(size, 12), file_size=size)
        index.sanity_check()
        if index.entries and index.last_entry.timestamp < index.entry(0).timestamp:
            raise CorruptIndexError(
                f"Corrupt time index found, time index file ({fs.url(path)}) has non-zero size but the last "
                f"timestamp is {index.last_entry.timestamp} which is less than the first timestamp "
                f"{index.entry(0).timestamp}"
            )
        out.write(f"{display} passed sanity check.\n")
        return
    entries = _read_entries(fs, path, TimeIndex.entry_dtype)
    if len(entries) == 0:
        return
    rel = entries["relative_offset"].astype(np.int64)
    n = _stop_at_zero_entry(rel)
    offsets = base + rel[:n]
    stamps = entries["timestamp"].astype(np.int64)[:n]
    index_path = path[: -len(".timeindex")] + ".index"
    isize = fs.size(index_path) if fs.exists(index_path) else 0
    offset_index = OffsetIndex(fs, index_path, base, max(isize, 8), file_size=isize)
    batches = _log_batches(fs, path, display, opts.max_message_size, offsets)
    bpos, blast = batches["positions"], batches["last_offsets"]
    prev = -1
    lines = []
    for i in range(n):  # per index entry
        off, ts = int(offsets[i]), int(stamps[i])
        try:
            lookup = offset_index.lookup(off).position
        except CorruptIndexError:
            lookup = 0
        j = max(int(np.searchsorted(bpos, lookup)), int(np.searchsorted(blast, off)))
        if j >= len(bpos):
            report.time_not_found.setdefault(abs_name, []).append((off, -1))
        elif int(blast[j]) != off:
            report.time_not_found.setdefault(abs_name, []).append((off, int(blast[j])))
        else:
            problem = batches["errors"].get(int(bpos[j]))
            if problem is not None:
                raise DumpError(f"cannot check {display} entry {i}: {problem}")
            max_ts = int(batches["record_max_ts"][j])
            if max_ts != ts:
                report.time_mismatches.setdefault(abs_name, []).append((ts, max_ts))
            if prev >= ts:
                report.time_out_of_order.setdefault(abs_name, []).append((ts, prev))
        if not opts.verify_index_only:
            lines.append(f"timestamp: {ts} offset: {off}\n")
        prev = ts
    out.write("".join(lines))
