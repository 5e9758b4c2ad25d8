"""`kafkalog export-to-broker`: hand a kafkalog topic to a Kafka broker, as partition directories it loads
as its own with nothing to recover or rebuild (docs/kafka-broker.md says why each file is as it is).

For each partition this writes, into a temporary `<topic>-<p>.<uuid>-delete` directory of the target (the
name Kafka gives deleted partitions: a broker removes one a crash left behind, never loads it as the
partition):

- `<base>.log`: every segment holding records at or above the log start offset (and the last one), its
  batches read through the engine and checked before a byte is written: framing, magic 2, offsets
  increasing and inside the segment's range, the CRC-32C, every record's framing (decoded). Two header
  fields may change: `partitionLeaderEpoch` becomes 0 (outside the CRC), and in a non-transactional
  batch a producer id without a sequence (what kafkalog's sink writes, which Kafka's cleaner refuses)
  becomes "no producer" (CRC computed again). Transactional batches and markers keep their producer
  fields (a marker names its data's producer).
- `<base>.index` / `<base>.timeindex`: Kafka's append rule over those batches, trimmed to their entries,
  the time index ending with the segment's largest record timestamp (batches without records do not
  count for it).
- `<base>.txnindex`: the engine's aborted transactions, in the segment holding each ABORT marker (where
  Kafka appends them), checked against a scan of the batches written.
- `<log end>.snapshot`: the producer snapshot a clean shutdown leaves, built from the batches written, so
  the broker loads producers (epochs, sequences) from it without reading the log.
- `leader-epoch-checkpoint` and `partition.metadata` with the cluster's topic id.

A partition with a transaction still open is refused (a broker could never end it). Nothing of kafkalog's
own (`kafkalog-producer-state.json`, `.lock`). Every partition is written before anything in the target
changes, so a damaged source changes nothing.
Then the directories are put in place:

- in a stopped broker's log dir (it holds `meta.properties`), locked for the whole run as Kafka locks it
  (a POSIX lock on `<log.dir>/.lock`: a running broker is refused, none starts meanwhile), with
  `.kafka_cleanshutdown` present: each partition directory the broker created empty is exchanged with the
  new one in one step, and that partition's entries in the log dir's checkpoint files are updated;
- or in a staging directory (missing, empty, or holding only partition directories) that the user copies
  to the broker hosts; a log start offset above the first segment goes in `<topic>.delete-records.json`
  for kafka-delete-records.sh.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from storage.errors import CorruptRecordError, ExportError, KafkaStorageError, UnknownTopicOrPartitionError
from storage.file_records import BatchChunk, head
from storage.log_manager import LogManager
from storage.metadata.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    format_checkpoint,
    parse_checkpoint,
)
from storage.objects.immutable_segment import IndexBuilder
from storage.records.decoder import iter_decoded
from storage.records.record_batch import (
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    BatchScan,
    as_uint8,
    compute_crc,
    validate_batches,
)
from storage.topic_partition import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    TopicPartition,
    deleted_dir_name,
    parse_log_dir_name,
    partition_dir_name,
    segment_file_name,
)
from storage.transactions.producer_snapshot import encode_snapshot, snapshot_file_name
from storage.transactions.producer_table import ProducerTable
from storage.transactions.transaction_index import ABORTED_TXN_VERSION

from .produce import sigint_deferred

KAFKA_LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
META_PROPERTIES = "meta.properties"
PARTITION_METADATA_FILE = "partition.metadata"
REPLICATION_OFFSET_CHECKPOINT_FILE = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
DELETE_RECORDS_SUFFIX = ".delete-records.json"
_TOPIC_ID_RE = re.compile(r"[A-Za-z0-9_-]{22}")
_RESERVED_TOPIC_IDS = {bytes(16): "the zero id", bytes(15) + b"\x01": "the id of the cluster metadata topic"}


# ---------------------------------------------------------------- small pieces


def check_topic_id(text: str) -> str:
    """A Kafka topic id as kafka-topics.sh --describe prints it: 22 characters of base64url (16 bytes)."""
    if not _TOPIC_ID_RE.fullmatch(text):
        raise ExportError(
            f"--topic-id {text!r} is not a Kafka topic id: expected the 22-character TopicId that "
            f"kafka-topics.sh --describe prints (base64url of 16 bytes), e.g. 'kq3WGgVRSgSDwBQJuv0r5w'"
        )
    raw = base64.urlsafe_b64decode(text + "==")
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != text:
        raise ExportError(
            f"--topic-id {text!r} is not a Kafka topic id: its last character is not one Kafka "
            f"prints (the id does not encode 16 bytes exactly)"
        )
    if raw in _RESERVED_TOPIC_IDS:
        raise ExportError(f"--topic-id {text!r} is {_RESERVED_TOPIC_IDS[raw]}, not a topic's")
    return text


def read_partition_metadata(path: str) -> str | None:
    """The topic id in a broker's `partition.metadata` (`version: 0` / `topic_id: <id>`), or None if absent."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(4096)
    except FileNotFoundError:
        return None
    lines = text.splitlines()
    fields = [re.split(r":\s+", line, maxsplit=1) for line in lines[:2]]
    if len(fields) != 2 or fields[0] != ["version", "0"] or fields[1][0] != "topic_id" or len(fields[1]) != 2:
        raise ExportError(
            f"{path} is not a partition.metadata file Kafka writes (version: 0, topic_id: <id>): {text[:100]!r}"
        )
    return fields[1][1].strip()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_new(path: str, data: bytes | memoryview) -> None:
    """Create a file with these bytes, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_replace(path: str, data: bytes) -> None:
    """Replace a file in one step (tmp + fsync + rename + directory fsync), as Kafka writes its checkpoints."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


_RENAME_EXCHANGE = 2
_libc: Any = None  # ctypes.CDLL once loaded, False where renameat2 is missing


def _exchange(a: str, b: str) -> bool:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not
    available (another OS, an old libc, a filesystem that does not support it)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.renameat2  # noqa: B018 (glibc 2.28+)
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    at_fdcwd = -100
    if _libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


# ---------------------------------------------------------------- what is exported


@dataclass
class PartitionExport:
    tp: TopicPartition
    log_start: int = 0
    log_end: int = 0
    first_base: int = 0  # base offset of the first segment written
    segments: int = 0
    skipped_segments: int = 0  # wholly below the log start offset
    recordless_segments: int = 0  # holding only batches compaction emptied
    batches: int = 0
    records: int = 0  # data records
    markers: int = 0  # transaction markers (control records: one offset each, never handed to a consumer)
    bytes: int = 0
    epochs_reset: int = 0  # batches whose partitionLeaderEpoch was not 0 (set to 0)
    producers_cleared: int = 0  # batches whose producer fields Kafka would refuse (cleared)
    txn_batches: int = 0  # transactional data batches and transaction markers carried
    aborted_txns: int = 0  # entries written to `.txnindex` files
    producers: int = 0  # entries of the producer snapshot at the log end
    first_offset: int | None = None  # of the first batch written (the leader epoch's start)
    cleaned_to: int | None = None  # kafkalog's cleaner-offset-checkpoint entry, when it lies in the exported range
    staged: str | None = None  # the temporary directory holding it

    @property
    def needs_log_start_entry(self) -> bool:
        return self.log_start > self.first_base

    @property
    def broker_log_start(self) -> int:
        """The log start offset the broker will have: kafkalog's, or the first segment written if that is above."""
        return max(self.log_start, self.first_base)


@dataclass
class ExportResult:
    topic: str
    topic_id: str
    target: str
    broker_log_dir: bool
    partitions: list[PartitionExport] = field(default_factory=list)
    not_here: list[int] = field(default_factory=list)  # broker mode: partitions with no directory in this log dir
    delete_records_file: str | None = None
    seconds: float = 0.0


@dataclass
class _Written:
    """One segment as written: its batches, data records, markers, bytes and first batch's base offset."""

    batches: int = 0
    records: int = 0
    markers: int = 0
    bytes: int = 0
    epochs_reset: int = 0
    producers_cleared: int = 0
    txn_batches: int = 0
    first_offset: int | None = None


def _clear_invalid_producer_fields(buf: bytearray, scan) -> np.ndarray:
    """Non-transactional batches with a producerId but no sequence (or epoch), as kafkalog's sink writes them
    (its writer id, baseSequence -1), are not valid idempotent batches for Kafka: a broker's cleaner that
    rewrites one fails ("Invalid negative sequence number used") and marks the partition uncleanable. Their
    producer fields go back to "no producer" (-1), as a non-idempotent producer writes them, and the CRC is
    computed again (after the stored one was checked). Transactional and control batches are never changed
    (their marker must name the producer of their data). Returns the indexes of the batches changed."""
    h = scan.headers
    bad = np.flatnonzero(
        (h["producer_id"].astype(np.int64) >= 0)
        & ((h["base_sequence"].astype(np.int64) < 0) | (h["producer_epoch"].astype(np.int64) < 0))
        & ((h["attributes"].astype(np.int64) & (CONTROL_FLAG_MASK | TRANSACTIONAL_FLAG_MASK)) == 0)
    )
    for i in bad.tolist():
        p = int(scan.positions[i])
        struct.pack_into(">qhi", buf, p + PRODUCER_ID_OFFSET, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
        struct.pack_into(">I", buf, p + CRC_OFFSET, compute_crc(memoryview(buf)[p : p + int(scan.sizes[i])]))
    return bad


def _check_transactional_batches(chunk, attrs: np.ndarray) -> None:
    """A transactional batch must carry a producer id and epoch, and a data batch a sequence, as Kafka's
    producer writes them: Kafka's cleaner refuses to rewrite one without (MemoryRecordsBuilder), and it cannot
    be cleared as a non-transactional one is (its marker names its producer)."""
    h = chunk.scan.headers
    txn = (attrs & TRANSACTIONAL_FLAG_MASK) != 0
    bad = np.flatnonzero(
        txn
        & (
            (h["producer_id"].astype(np.int64) < 0)
            | (h["producer_epoch"].astype(np.int64) < 0)
            | (((attrs & CONTROL_FLAG_MASK) == 0) & (h["base_sequence"].astype(np.int64) < 0))
        )
    )
    if bad.size:
        i = int(bad[0])
        raise ExportError(
            f"{chunk.source} holds a transactional batch at offset {int(h['base_offset'][i])} (position "
            f"{chunk.base_position + int(chunk.scan.positions[i])}) with producerId {int(h['producer_id'][i])}, "
            f"epoch {int(h['producer_epoch'][i])}, baseSequence {int(h['base_sequence'][i])}: a transaction's "
            f"batches need all three (a Kafka broker's cleaner refuses to rewrite it otherwise)"
        )


def _as_exported(chunk, buf: bytearray, cleared: np.ndarray) -> BatchChunk | None:
    """The chunk as written (the rewritten bytes, cleared producer fields in its headers), for the producer
    table; None when no batch in it has a producer. Empty control batches (a transaction compaction removed)
    change no producer state in Kafka (ProducerAppendInfo.append skips them), so they are hidden from it
    too."""
    scan = chunk.scan
    if not (scan.headers["producer_id"] >= 0).any():
        return None
    headers = scan.headers.copy()
    empty_control = ((headers["attributes"].astype(np.int64) & CONTROL_FLAG_MASK) != 0) & (
        headers["record_count"].astype(np.int64) == 0
    )
    hide = np.flatnonzero(empty_control)
    for col, value in (("producer_id", NO_PRODUCER_ID), ("producer_epoch", NO_PRODUCER_EPOCH)):
        headers[col][cleared] = value
        headers[col][hide] = value
    headers["base_sequence"][cleared] = NO_SEQUENCE
    return BatchChunk(
        memoryview(buf), BatchScan(scan.positions, headers, scan.end, scan.reason), chunk.base_position, chunk.source
    )


def _write_segment(log, seg, upper: int | None, end: int, out_dir: str, producers: ProducerTable) -> _Written:
    """Copy one segment's checked batches (epochs set to 0) and write Kafka's indexes for them; `producers`
    is fed the batches as written."""
    w = _Written()
    builder = IndexBuilder(log.config.index_interval_bytes)
    prev_last = None
    path = os.path.join(out_dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for chunk in seg.checked_chunks_from_start(upper=upper):
            base = chunk.scan.headers["base_offset"].astype(np.int64)
            keep = int(np.searchsorted(base, end, side="left"))  # a writer's batches past the log end we read
            if keep < len(chunk.scan):
                if not keep:
                    break
                chunk = head(chunk, keep)
            scan = chunk.scan
            validate_batches(
                chunk.buf,
                scan,
                source=chunk.source,
                base_position=chunk.base_position,
                expected_first_offset=None if prev_last is None else prev_last + 1,
            )
            attrs = scan.headers["attributes"].astype(np.int64)
            _check_transactional_batches(chunk, attrs)
            w.txn_batches += int(np.count_nonzero((attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) != 0))
            for _ in iter_decoded(
                chunk.buf,
                scan=scan,
                source=chunk.source,
                base_position=chunk.base_position,
                max_message_bytes=log.max_batch_size,
                verify_crc=False,
                skip_control=False,
            ):
                pass  # every record's framing, as a consumer will decode it
            if chunk.base_position != w.bytes:
                raise CorruptRecordError(
                    f"batches not contiguous: expected position {w.bytes}",
                    source=chunk.source,
                    position=chunk.base_position,
                )
            buf = bytearray(memoryview(chunk.buf)[: scan.end])
            w.epochs_reset += int(np.count_nonzero(scan.headers["partition_leader_epoch"] != 0))
            at = scan.positions.astype(np.int64)[:, None] + np.arange(
                PARTITION_LEADER_EPOCH_OFFSET, PARTITION_LEADER_EPOCH_OFFSET + 4
            )
            as_uint8(buf)[at.reshape(-1)] = 0
            cleared = _clear_invalid_producer_fields(buf, scan)
            w.producers_cleared += int(cleared.size)
            exported = _as_exported(chunk, buf, cleared)
            if exported is not None:
                producers.feed(exported)
            view = memoryview(buf)
            while view:
                view = view[os.write(fd, view) :]
            counts = scan.headers["record_count"].astype(np.int64)
            # a batch with no records (kept by compaction) has a maxTimestamp but no record with it: it does not
            # count for the time index, or Kafka's ListOffsets would stop in this segment and find nothing
            max_ts = np.where(counts > 0, scan.headers["max_timestamp"].astype(np.int64), -1)
            builder.add(scan.positions.astype(np.int64) + w.bytes, scan.sizes, scan.last_offsets, max_ts)
            if w.first_offset is None:
                w.first_offset = int(base[0])
            prev_last = int(scan.last_offsets[-1])
            w.bytes += scan.end
            w.batches += len(scan)
            control = (scan.headers["attributes"].astype(np.int64) & CONTROL_FLAG_MASK) != 0
            w.records += int(counts[~control].sum())
            w.markers += int(counts[control].sum())
        os.fsync(fd)
    finally:
        os.close(fd)
        seg.release_readers()
    if os.path.getsize(path) != w.bytes:
        raise KafkaStorageError(f"{path}: wrote {w.bytes} bytes, the file holds {os.path.getsize(path)}")
    off_rows, time_rows = builder.finish(seg.base_offset)
    _write_new(os.path.join(out_dir, segment_file_name(seg.base_offset, INDEX_FILE_SUFFIX)), off_rows.tobytes())
    _write_new(os.path.join(out_dir, segment_file_name(seg.base_offset, TIME_INDEX_FILE_SUFFIX)), time_rows.tobytes())
    return w


def _open_transaction_error(log, tp: TopicPartition, lso: int) -> ExportError:
    """The refusal of a partition whose transaction is still open at `lso` (the engine's last stable offset)."""
    producer = ""
    for chunk in log.read(lso, lso + 1):
        h = chunk.scan.headers
        if int(h["attributes"][0]) & TRANSACTIONAL_FLAG_MASK:  # (below the log start it may be another's)
            producer = f" of producer {int(h['producer_id'][0])}"
        break
    return ExportError(
        f"{tp.topic}-{tp.partition}: the transaction{producer} from offset {lso} is still open (no COMMIT or "
        f"ABORT marker yet), and a broker must not be handed a transaction no coordinator of its own can end: "
        f"wait for its writer to commit it, or let `kafkalog maintain` abort it once it is older than its "
        f"transaction.timeout.ms, then export again"
    )


def _aborted_by_segment(
    log, tp: TopicPartition, first: int, end: int, scanned, bases: list[int]
) -> dict[int, np.ndarray]:
    """The engine's aborted transactions whose ABORT marker is exported (its `.txnindex` entries, checked as it
    reads them), by the written segment holding the marker: Kafka appends an abort's entry to the index of the
    segment its marker went into (UnifiedLog.append, LogSegment.updateTxnIndex).

    Checked against `scanned`, the aborts the exported batches complete by themselves (a scan from the first
    written offset): each must be an entry, with the same first offset where the engine's starts in range and a
    lastStableOffset not above the scan's (a larger one would make a broker's read_committed fetch stop its
    search for aborted transactions too early); an entry the scan lacks must have begun before the first
    written offset."""
    engine = log.collect_aborted_txns(first, end)
    engine = engine[engine["last_offset"].astype(np.int64) < end]
    where = f"{tp.topic}-{tp.partition}"
    by_marker = {(int(r["producer_id"]), int(r["last_offset"])): r for r in engine}
    for txn in scanned:
        row = by_marker.pop((txn.producer_id, txn.last_offset), None)
        if row is None:
            raise ExportError(
                f"{where}: the ABORT marker of producer {txn.producer_id} at offset {txn.last_offset} ends a "
                f"transaction from offset {txn.first_offset}, but the partition's transaction indexes hold no "
                f"entry for it (run `kafkalog maintain` to rebuild them, or report this)"
            )
        efirst, elso = int(row["first_offset"]), int(row["last_stable_offset"])
        if (
            (efirst >= first and efirst != txn.first_offset)
            or efirst > txn.first_offset
            or elso > txn.last_stable_offset
        ):
            raise ExportError(
                f"{where}: the transaction index entry (producerId {txn.producer_id}, firstOffset {efirst}, "
                f"lastOffset {txn.last_offset}, lastStableOffset {elso}) does not match the log, which gives "
                f"firstOffset {txn.first_offset} and lastStableOffset {txn.last_stable_offset}"
            )
    for (pid, last), row in by_marker.items():
        if int(row["first_offset"]) >= first:
            raise ExportError(
                f"{where}: the transaction index names an aborted transaction of producer {pid} (offsets "
                f"{int(row['first_offset'])}..{last}) that the log does not hold as one"
            )
    at = np.searchsorted(np.asarray(bases, np.int64), engine["last_offset"].astype(np.int64), side="right") - 1
    # (a marker in a left-out recordless segment below every written one lies below the broker's log start)
    return {bases[k]: engine[at == k] for k in np.unique(at[at >= 0]).tolist()}


def _build_partition(lm: LogManager, tp: TopicPartition, topic_id: str, out_dir: str) -> PartitionExport:
    """Write one partition's Kafka directory into out_dir (made here). Segments wholly below the log start
    offset are left out, and so are segments holding no record (only batches compaction emptied), but for
    the last: a broker takes such a segment's largest timestamp from its file's mtime, so ListOffsets by
    time would stop in it and answer "none". A partition with a transaction still open is refused."""
    part = PartitionExport(tp)
    with lm.open_log(tp) as log:
        part.log_start = log.log_start_offset
        part.log_end = log.log_end_offset  # raises when the log's tail is damaged
        lso = log.last_stable_offset
        if lso < part.log_end:
            raise _open_transaction_error(log, tp, lso)
        os.mkdir(out_dir)
        segs = log.segments
        kept = [
            (s, segs[i + 1].base_offset if i + 1 < len(segs) else None)
            for i, s in enumerate(segs)
            if i + 1 == len(segs) or segs[i + 1].base_offset > part.log_start
        ]
        part.skipped_segments = len(segs) - len(kept)
        producers = ProducerTable(f"{tp.topic}-{tp.partition}", kept[0][0].base_offset)
        first = None
        written: list[int] = []
        for seg, upper in kept:
            w = _write_segment(log, seg, upper, part.log_end, out_dir, producers)
            if not (w.records or w.markers) and upper is not None:
                for sfx in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
                    os.unlink(os.path.join(out_dir, segment_file_name(seg.base_offset, sfx)))
                part.recordless_segments += 1
                continue
            written.append(seg.base_offset)
            if first is None:
                first = seg.base_offset
                part.first_offset = w.first_offset
            part.segments += 1
            part.batches += w.batches
            part.records += w.records
            part.markers += w.markers
            part.bytes += w.bytes
            part.epochs_reset += w.epochs_reset
            part.producers_cleared += w.producers_cleared
            part.txn_batches += w.txn_batches
        assert first is not None  # the last segment is always written
        part.first_base = first
        if producers.txns.ongoing:  # the engine's last stable offset said none: they disagree
            pid, at = next(iter(producers.txns.ongoing.items()))
            raise ExportError(
                f"{tp.topic}-{tp.partition}: producer {pid}'s transaction from offset {at} has no marker in the "
                f"log, yet the partition's transaction state ({lm.url()}) holds none open"
            )
        aborted = _aborted_by_segment(log, tp, kept[0][0].base_offset, part.log_end, producers.aborted, written)
        for base, rows in aborted.items():
            if len(rows):
                rows = rows.copy()
                rows["version"] = ABORTED_TXN_VERSION
                _write_new(os.path.join(out_dir, segment_file_name(base, TXN_INDEX_FILE_SUFFIX)), rows.tobytes())
                part.aborted_txns += len(rows)
        # the producer snapshot a clean shutdown leaves at the log end: a broker loads producers and open
        # transactions from it without reading the log (with none after a clean shutdown it would start
        # from an empty producer table, and without a clean shutdown re-read the whole log)
        table = producers.to_array()
        part.producers = len(table)
        _write_new(os.path.join(out_dir, snapshot_file_name(part.log_end)), encode_snapshot(table))
    cleaned = lm.read_checkpoint(lm.checkpoint_file(CLEANER_OFFSET_CHECKPOINT_FILE, lm.log_dir_of(tp))).get(tp)
    if cleaned is not None and part.broker_log_start <= cleaned <= part.log_end:
        part.cleaned_to = cleaned
    epochs = f"0\n1\n0 {part.first_offset}\n" if part.first_offset is not None else "0\n0\n"
    _write_new(os.path.join(out_dir, LEADER_EPOCH_CHECKPOINT_FILE), epochs.encode())
    _write_new(os.path.join(out_dir, PARTITION_METADATA_FILE), f"version: 0\ntopic_id: {topic_id}".encode())
    _fsync_dir(out_dir)
    return part


# ---------------------------------------------------------------- the target


class _Target:
    """The directory written to: a stopped broker's log dir (locked while we work) or a staging directory."""

    def __init__(self, path: str, allow_unclean_shutdown: bool):
        self.path = os.path.abspath(path)
        self.lock_fd: int | None = None
        self.broker = os.path.isfile(os.path.join(self.path, META_PROPERTIES))
        if not self.broker:
            self._check_staging()
            return
        self._lock()
        if not allow_unclean_shutdown and not os.path.exists(os.path.join(self.path, CLEAN_SHUTDOWN_FILE)):
            self.close()
            raise ExportError(
                f"{self.path} has no {CLEAN_SHUTDOWN_FILE}: the broker did not shut down cleanly (or never ran), so "
                f"at its next start it would recover (re-read and re-index) every segment of this log dir. Start it "
                f"and stop it cleanly (kafka-server-stop.sh, or SIGTERM), then run this again; or pass "
                f"--allow-unclean-shutdown to accept that recovery"
            )

    def _check_staging(self) -> None:
        if not os.path.exists(self.path):
            return
        if not os.path.isdir(self.path):
            raise ExportError(f"--to {self.path} is a file, not a directory")
        others = [
            n
            for n in os.listdir(self.path)
            if not (
                n.endswith(DELETE_RECORDS_SUFFIX)
                or (parse_log_dir_name(n) is not None and os.path.isdir(os.path.join(self.path, n)))
            )
        ]
        if others:
            shown = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
            raise ExportError(
                f"--to {self.path} is neither a Kafka broker's log dir (it has no {META_PROPERTIES}) "
                f"nor a staging directory (missing, empty, or holding only partition directories): "
                f"it holds {shown}"
            )

    def _lock(self) -> None:
        """Kafka's FileLock on <log.dir>/.lock is a POSIX record lock (FileChannel.tryLock is fcntl on Linux)."""
        path = os.path.join(self.path, KAFKA_LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise ExportError(
                    f"{path} is locked by another process: a Kafka broker is running on the log dir "
                    f"{self.path}; stop it cleanly first (kafka-server-stop.sh)"
                ) from None
            raise
        self.lock_fd = fd

    def close(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # releases the lock
            self.lock_fd = None

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)


def _existing_topic_dirs(target: _Target, topic: str) -> dict[int, str]:
    out = {}
    if os.path.isdir(target.path):
        for name in os.listdir(target.path):
            parsed = parse_log_dir_name(name)
            if (
                parsed is not None
                and parsed.kind == "live"
                and parsed.topic_partition.topic == topic
                and os.path.isdir(target.join(name))
            ):
                out[parsed.topic_partition.partition] = target.join(name)
    return out


def _check_broker_partition_dir(path: str) -> str | None:
    """A partition directory the broker made for the topic and never wrote to; returns its topic id."""
    data = []
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if ".log" in name and os.path.isfile(full) and os.path.getsize(full):
            data.append(f"{name} ({os.path.getsize(full)} bytes)")
    if data:
        raise ExportError(
            f"{path} already holds records ({', '.join(sorted(data)[:3])}): it was exported already, or "
            f"the broker wrote to it. export-to-broker fills only partitions the broker created empty; "
            f"name the others with --partition, or delete and recreate the topic on the cluster"
        )
    return read_partition_metadata(os.path.join(path, PARTITION_METADATA_FILE))


def _update_checkpoints(target: _Target, part: PartitionExport) -> None:
    """The broker log dir's checkpoints for one exported partition (each file replaced in one step)."""
    key = TopicPartition(part.tp.topic, part.tp.partition)
    changes = {
        LOG_START_OFFSET_CHECKPOINT_FILE: part.log_start if part.needs_log_start_entry else None,
        RECOVERY_POINT_CHECKPOINT_FILE: part.log_end,
        REPLICATION_OFFSET_CHECKPOINT_FILE: part.log_end,  # the high watermark: every record is committed
        CLEANER_OFFSET_CHECKPOINT_FILE: part.cleaned_to,  # compaction done by kafkalog is not redone
    }
    for name, value in changes.items():
        path = target.join(name)
        try:
            with open(path, "rb") as f:
                entries = dict(parse_checkpoint(f.read(), source=path))
        except FileNotFoundError:
            entries = {}
        if value is None:
            if key not in entries:
                continue
            del entries[key]
        elif entries.get(key) == value:
            continue
        else:
            entries[key] = value
        _write_replace(path, format_checkpoint(entries))


# ---------------------------------------------------------------- the command


def export_topic(
    lm: LogManager,
    topic: str,
    to: str,
    *,
    topic_id: str | None = None,
    partitions: list[int] | None = None,
    allow_unclean_shutdown: bool = False,
    out: TextIO | None = None,
) -> ExportResult:
    """Export a kafkalog topic into a broker's log dir or a staging directory (see the module docstring)."""
    started = time.monotonic()
    meta = lm.topic(topic)
    if partitions:
        bad = sorted({p for p in partitions if not 0 <= p < meta.partitions})
        if bad:
            raise UnknownTopicOrPartitionError(
                f"--partition {bad[0]}: topic '{topic}' has {meta.partitions} partition(s) in {lm.url()}"
            )
    if topic_id is not None:
        check_topic_id(topic_id)
    for d in lm.log_dirs:
        if lm.fs.protocol == "file" and os.path.abspath(to) == os.path.abspath(d):
            raise ExportError(
                f"--to {to} is the kafkalog log dir itself: give a broker's log dir or a staging directory"
            )
    target = _Target(to, allow_unclean_shutdown)
    staged: list[PartitionExport] = []
    try:
        existing = _existing_topic_dirs(target, topic)
        if target.broker:
            beyond = sorted(p for p in existing if p >= meta.partitions)
            if beyond:
                raise ExportError(
                    f"the broker's log dir {target.path} holds partition {beyond[0]} of topic '{topic}', "
                    f"which has {meta.partitions} partition(s) in {lm.url()}: create the topic on the "
                    f"cluster with --partitions {meta.partitions}"
                )
            wanted = sorted(set(partitions)) if partitions else sorted(existing)
            if not wanted:
                raise ExportError(
                    f"the broker's log dir {target.path} holds no directory of topic '{topic}': create "
                    f"the topic on the cluster first (kafka-topics.sh --create --topic {topic} "
                    f"--partitions {meta.partitions} ...), start the broker once so that it makes them, "
                    f"stop it cleanly, then run this"
                )
            missing = [p for p in wanted if p not in existing]
            if missing:
                raise ExportError(
                    f"the broker's log dir {target.path} holds no directory for partition {missing[0]} "
                    f"of topic '{topic}': this broker is not its replica, or keeps it in another of its "
                    f"log.dirs (run this there), or the topic was not created on the cluster"
                )
            not_here = [p for p in range(meta.partitions) if p not in wanted and not partitions]
            ids = {}
            for p in wanted:
                found = _check_broker_partition_dir(existing[p])
                if found is not None:
                    ids[p] = found
            if topic_id is None:
                if len(set(ids.values())) > 1:
                    raise ExportError(
                        f"the partition directories of topic '{topic}' in {target.path} name different "
                        f"topic ids ({', '.join(sorted(set(ids.values())))}); give --topic-id"
                    )
                if len(ids) < len(wanted):
                    first = min(set(wanted) - set(ids))
                    raise ExportError(
                        f"partition {first} of topic '{topic}' in {target.path} has "
                        f"no partition.metadata to take the topic id from: give --topic-id (the TopicId "
                        f"kafka-topics.sh --describe prints)"
                    )
                topic_id = check_topic_id(next(iter(ids.values())))
            else:
                other = {v for v in ids.values() if v != topic_id}
                if other:
                    raise ExportError(
                        f"--topic-id {topic_id} is not the id of topic '{topic}' on this broker: its "
                        f"partition directories in {target.path} name {sorted(other)[0]} (see "
                        f"kafka-topics.sh --describe --topic {topic})"
                    )
        else:
            if topic_id is None:
                raise ExportError(
                    "--topic-id is required for a staging directory: the TopicId that kafka-topics.sh "
                    f"--describe --topic {topic} prints once the topic is created on the cluster"
                )
            wanted = sorted(set(partitions)) if partitions else list(range(meta.partitions))
            clash = [p for p in wanted if p in existing]
            if clash:
                raise ExportError(
                    f"the staging directory {target.path} holds {existing[clash[0]]} already: give an empty one"
                )
            not_here = []
            os.makedirs(target.path, exist_ok=True)
        result = ExportResult(topic, topic_id, target.path, target.broker, not_here=not_here)

        # read, check and write every partition before anything replaces a directory
        for p in wanted:
            tp = TopicPartition(topic, p)
            tmp = target.join(deleted_dir_name(tp))
            part = PartitionExport(tp, staged=tmp)
            staged.append(part)
            built = _build_partition(lm, tp, topic_id, tmp)
            built.staged = tmp
            staged[-1] = built
        if target.broker:
            _fsync_dir(target.path)

        for part in staged:
            final = target.join(partition_dir_name(part.tp))
            tmp_dir = part.staged
            assert tmp_dir is not None
            with sigint_deferred():  # a directory and its checkpoint entries change together
                if target.broker:
                    if not _exchange(tmp_dir, final):
                        old = target.join(deleted_dir_name(part.tp))
                        os.rename(final, old)
                        os.rename(tmp_dir, final)
                        tmp_dir = part.staged = old
                    _fsync_dir(target.path)
                    _update_checkpoints(target, part)
                    shutil.rmtree(tmp_dir)  # the broker's empty directory, now under the temporary name
                else:
                    os.rename(tmp_dir, final)
                part.staged = None
            result.partitions.append(part)
            if out is not None:
                out.write(_partition_line(part))
        if not target.broker:
            _fsync_dir(target.path)
            starts = [p for p in result.partitions if p.needs_log_start_entry]
            if starts:
                result.delete_records_file = target.join(topic + DELETE_RECORDS_SUFFIX)
                doc = {
                    "partitions": [
                        {"topic": topic, "partition": p.tp.partition, "offset": p.log_start} for p in starts
                    ],
                    "version": 1,
                }
                _write_replace(result.delete_records_file, (json.dumps(doc, indent=2) + "\n").encode())
        result.seconds = time.monotonic() - started
        if out is not None:
            out.write(summary_line(result))
        return result
    finally:
        for part in staged:
            if part.staged is not None:
                shutil.rmtree(part.staged, ignore_errors=True)
        target.close()


def _partition_line(p: PartitionExport) -> str:
    extra = []
    if p.skipped_segments:
        extra.append(f"{p.skipped_segments} segment(s) below the log start left out")
    if p.recordless_segments:
        extra.append(f"{p.recordless_segments} segment(s) holding no record left out")
    if p.epochs_reset:
        extra.append(f"partitionLeaderEpoch set to 0 in {p.epochs_reset} batch(es)")
    if p.producers_cleared:
        extra.append(f"producer id without a sequence cleared in {p.producers_cleared} batch(es)")
    if p.txn_batches:
        extra.append(
            f"{p.txn_batches} transactional batch(es) and marker(s) carried, {p.aborted_txns} aborted "
            f"transaction(s) in .txnindex, {p.producers} producer(s) in the snapshot at the log end"
        )
    return (
        f"{p.tp.topic}-{p.tp.partition}: {p.segments} segment(s), {_records(p.records, p.markers)}, {p.bytes} bytes, "
        f"log start "
        f"offset {p.broker_log_start}, log end offset {p.log_end}" + "".join(f"; {e}" for e in extra) + "\n"
    )


def _records(records: int, markers: int) -> str:
    """Data records as a consumer counts them, and the offsets transaction markers take beside them."""
    return f"{records} records" + (f" (and {markers} transaction markers, one offset each)" if markers else "")


def summary_line(r: ExportResult) -> str:
    segs = sum(p.segments for p in r.partitions)
    records = sum(p.records for p in r.partitions)
    markers = sum(p.markers for p in r.partitions)
    size = sum(p.bytes for p in r.partitions)
    head_ = (
        f"Exported {len(r.partitions)} partition(s) of topic {r.topic} (TopicId {r.topic_id}): {segs} segment(s), "
        f"{_records(records, markers)}, {size} bytes in {r.seconds:.2f} s, "
    )
    if r.broker_log_dir:
        text = head_ + f"into the broker's log dir {r.target}; start the broker"
        if r.not_here:
            text += (
                f". Partition(s) {', '.join(map(str, r.not_here))} have no directory in this log dir and were "
                f"not exported here: run this where the broker keeps them (another broker or log dir)"
            )
        return text + "\n"
    text = head_ + (
        f"into the staging directory {r.target}; copy its {r.topic}-<partition> directories into the "
        f"log dir of each broker that holds them, stopped cleanly"
    )
    if r.delete_records_file:
        text += (
            f". Some partitions start above their first segment: once the broker runs, "
            f"kafka-delete-records.sh --offset-json-file {r.delete_records_file} sets their log start offsets"
        )
    return text + "\n"
