"""The transaction half of Kafka's ProducerStateManager for one partition, as a reader needs it: which producers
have a transaction open (and from which offset), the last stable offset, and the aborted transactions the log's
ABORT markers complete (to stand in for a `.txnindex` that is missing or fails its checks).

Built from the latest valid producer snapshot plus a scan of batch headers from its offset to the log end; only
transactional batches cost Python work, control batches a one-record decode.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from ..errors import CorruptIndexError, CorruptRecordError, TooManyProducersError
from ..file_records import BatchChunk
from ..records.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    as_uint8,
)
from .control_records import ControlRecordType, EndTransactionMarker
from .producer_snapshot import latest_valid_snapshot
from .transaction_index import ABORTED_TXN_DTYPE, ABORTED_TXN_VERSION, AbortedTxn, TransactionIndex

logger = logging.getLogger(__name__)

#: Producers with a transaction open that one partition's state tracks. Kafka bounds them by its producer
#: expiry; a reader has no clock to expire them by, so past this many a read_committed reader refuses the
#: partition (TooManyProducersError) rather than grow without bound. 100k open transactions is far beyond
#: any real partition (a Kafka Streams task holds one).
MAX_OPEN_TRANSACTIONS = 100_000


def collect_aborted(entries: np.ndarray, fetch_offset: int, upper_bound_offset: int) -> tuple[np.ndarray, bool]:
    """Kafka's LogSegment.collectAbortedTxns over rows of ABORTED_TXN_DTYPE (see TransactionIndex.collect_aborted):
    the entries overlapping [fetch_offset, upper_bound_offset), and whether the search is complete."""
    reached = np.flatnonzero(entries["last_stable_offset"].astype(np.int64) >= upper_bound_offset)
    scanned = entries[: int(reached[0]) + 1] if reached.size else entries
    keep = (scanned["last_offset"].astype(np.int64) >= fetch_offset) & (
        scanned["first_offset"].astype(np.int64) < upper_bound_offset
    )
    return scanned[keep], bool(reached.size)


class TransactionScan:
    """Producers' open transactions, advanced batch by batch as Kafka's ProducerAppendInfo does for the
    transaction fields: a transactional data batch opens its producer's transaction at its base offset (if none
    is open), a COMMIT or ABORT marker completes it (Kafka's CompletedTxn; a marker with no open transaction
    completes nothing). An ABORT yields an AbortedTxn whose lastStableOffset is Kafka's
    ProducerStateManager.lastStableOffset(completedTxn): the first offset of the earliest other open transaction,
    else the marker's offset + 1.

    Invariants: `ongoing` maps producerId -> first offset, in increasing first offset (insertion) order, and
    never holds more than max_open producers.
    """

    def __init__(self, partition: str, ongoing: dict[int, int] | None = None, max_open: int = MAX_OPEN_TRANSACTIONS):
        self.partition = partition
        self.max_open = max_open
        self.ongoing: dict[int, int] = {}
        for pid, first in sorted((ongoing or {}).items(), key=lambda kv: kv[1]):
            self._open(pid, first)

    def _open(self, pid: int, first: int) -> None:
        if len(self.ongoing) >= self.max_open:
            raise TooManyProducersError(
                f"partition {self.partition} has more than {self.max_open} transactions open at offset {first}: "
                f"more than a reader tracks (MAX_OPEN_TRANSACTIONS)"
            )
        self.ongoing[pid] = first

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction (Kafka's firstUnstableOffset), None if none is."""
        return next(iter(self.ongoing.values()), None)

    def _lso_after(self, pid: int, marker_offset: int) -> int:
        for other, first in self.ongoing.items():  # increasing first offset: the first other producer's
            if other != pid:
                return first
        return marker_offset + 1

    def feed(self, chunk: BatchChunk) -> list[AbortedTxn]:
        """Advance over a chunk of whole batches (offset order); the aborted transactions it completes."""
        headers = chunk.scan.headers
        attrs = headers["attributes"].astype(np.int64)
        pids = headers["producer_id"].astype(np.int64)
        # a control batch with a producer id is a marker whether or not its transactional bit is set, as
        # Kafka's ProducerAppendInfo (isControlBatch) and consumer (containsAbortMarker) read it
        txn = np.flatnonzero(((attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) != 0) & (pids >= 0))
        if not txn.size:
            return []
        aborted: list[AbortedTxn] = []
        bases = headers["base_offset"][txn].astype(np.int64).tolist()
        controls = (attrs[txn] & CONTROL_FLAG_MASK != 0).tolist()
        counts = headers["record_count"][txn].astype(np.int64).tolist()
        for i, pid, base, control, count in zip(txn.tolist(), pids[txn].tolist(), bases, controls, counts, strict=True):
            if not control:
                if pid not in self.ongoing:
                    self._open(pid, base)
                continue
            if count == 0:
                continue  # what Kafka's cleaner leaves of a marker whose transaction is gone: nothing to complete
            marker, _ = read_end_marker(chunk, i)
            first = self.ongoing.get(pid)
            if first is None:
                continue  # an empty transaction: nothing to complete (Kafka emits no CompletedTxn)
            if marker.control_type is ControlRecordType.ABORT:
                aborted.append(AbortedTxn(pid, first, base, self._lso_after(pid, base)))
            del self.ongoing[pid]
        return aborted


def _varint(buf, at: int, end: int, max_bytes: int) -> tuple[int, int] | None:
    """A zigzag varint at buf[at:end] (at most max_bytes bytes) and the position after it; None if it does not
    fit."""
    raw = shift = 0
    for k in range(max_bytes):
        if at + k >= end:
            return None
        byte = buf[at + k]
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), at + k + 1
        shift += 7
    return None


def _plain_marker_record(chunk: BatchChunk, i: int) -> tuple[bytes | None, bytes | None, int] | None:
    """(key, value, timestamp) of control batch i when it has the shape every marker writer gives it: CRC good,
    uncompressed, CreateTime, one record with no header filling the batch exactly; None for anything else (the
    full decoder then reads it and names what is wrong). One CRC-32C call and a few varints, no Arrow."""
    import crc32c as _crc32c

    h = chunk.scan.headers[i]
    attrs = int(h["attributes"])
    if attrs & (COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK) or int(h["record_count"]) != 1:
        return None
    start = int(chunk.scan.positions[i])
    end = start + int(chunk.scan.sizes[i])
    view = as_uint8(chunk.buf).data
    if _crc32c.crc32c(view[start + ATTRIBUTES_OFFSET : end]) != int(h["crc"]):
        return None
    buf = view[:end]
    at = start + RECORD_BATCH_OVERHEAD
    got = _varint(buf, at, end, 5)
    if got is None or got[0] != end - got[1]:
        return None
    at = got[1] + 1  # the record's attributes byte
    fields = []
    for max_bytes in (10, 5):  # timestampDelta (varlong), offsetDelta
        got = _varint(buf, at, end, max_bytes)
        if got is None:
            return None
        fields.append(got[0])
        at = got[1]
    if not 0 <= fields[1] <= int(h["last_offset_delta"]):
        return None
    parts: list[bytes | None] = []
    for _ in range(2):  # key, value
        got = _varint(buf, at, end, 5)
        if got is None or got[0] < -1 or got[1] + max(got[0], 0) > end:
            return None
        n, at = got
        parts.append(None if n < 0 else bytes(buf[at : at + n]))
        at += max(n, 0)
    got = _varint(buf, at, end, 5)
    if got is None or got[0] != 0 or got[1] != end:
        return None
    return parts[0], parts[1], int(h["base_timestamp"]) + fields[0]


def read_end_marker(chunk: BatchChunk, i: int) -> tuple[EndTransactionMarker, int]:
    """The marker in control batch i of the chunk and its record's timestamp: the batch's first record's key,
    value and timestamp (Kafka reads the first record), checked as EndTransactionMarker.deserialize does. A
    batch of the usual shape is read directly (_plain_marker_record), any other by the full decoder (imported
    only then: it loads numba, which a commit process otherwise never needs)."""
    plain = _plain_marker_record(chunk, i)
    if plain is not None:
        position = chunk.base_position + int(chunk.scan.positions[i])
        marker = EndTransactionMarker.deserialize(plain[0], plain[1], source=chunk.source, position=position)
        return marker, plain[2]

    from ..records.decoder import decode_batches

    start = int(chunk.scan.positions[i])
    end = start + int(chunk.scan.sizes[i])
    position = chunk.base_position + start
    records = decode_batches(chunk.buf[start:end], skip_control=False, source=chunk.source, base_position=position)
    if not records.num_rows:
        raise CorruptRecordError("control batch holds no record", source=chunk.source, position=position)
    key = records.column("key")[0].as_py()
    value = records.column("value")[0].as_py()
    marker = EndTransactionMarker.deserialize(key, value, source=chunk.source, position=position)
    return marker, int(records.column("timestamp")[0].as_py())


def load_snapshot_state(log, end: int) -> tuple[int, dict[int, int]]:
    """(offset, producerId -> open transaction's first offset) from the latest snapshot of `log` whose offset
    lies in [log start, `end`] and that reads back whole and agrees with the log (snapshot_not_in_log); a bad
    one is logged and an older one tried. With none: the log start offset and no open transaction (Kafka's
    loader rebuilds from there). A snapshot that reads whole but disagrees with the log is logged and the log
    scanned from its start.

    A snapshot holding a transaction open from below the log start is Kafka's state, not damage: a segment roll
    took it while the transaction was open (its marker, stamped now, rolled a segment of old records by
    segment.ms), then retention or delete-records removed where the transaction began. That claim cannot be
    checked against the log any more, so the log is scanned from its start (which finds any part of the
    transaction at or above it), logged without a warning. Kafka's loader drops a snapshot at the log start
    (ProducerStateManager.truncateAndReload) and scans from there too; one above the log start it trusts."""
    start = log.log_start_offset
    found = latest_valid_snapshot(log.fs, log.dir, start, end)
    if found is None:
        return start, {}
    snap, entries = found
    first = entries["current_txn_first_offset"].astype(np.int64)
    open_ = first >= 0
    ongoing = dict(zip(entries["producer_id"][open_].astype(np.int64).tolist(), first[open_].tolist(), strict=True))
    below = {pid: f for pid, f in ongoing.items() if f < start}
    if below:
        pid, f = min(below.items(), key=lambda kv: kv[1])
        logger.info(
            "producer snapshot %s holds producer %d's transaction open from offset %d, below the log start %d "
            "(deleted since): scanning the log from its start",
            log.fs.url(snap.path),
            pid,
            f,
            start,
        )
        return start, {}
    why = snapshot_not_in_log(log, snap.offset, entries)
    if why is not None:
        logger.warning(
            "not trusting producer snapshot %s: %s; scanning the log from its start", log.fs.url(snap.path), why
        )
        return log.log_start_offset, {}
    return snap.offset, ongoing


def snapshot_not_in_log(log, snapshot_offset: int, entries: np.ndarray) -> str | None:
    """Why a snapshot's transaction claims are not the log's (None: they agree), from one scan of batch headers
    over [the oldest offset an entry names, the snapshot's offset), no record decoded:

    - an open transaction (currentTxnFirstOffset f >= 0) starts at a transactional data batch of its producer,
      at f, below the snapshot's offset, and no marker of that producer lies in (f, snapshot offset);
    - an entry's lastOffset L (its last data batch; -1: none kept; below the log start: gone, not checked)
      is the last offset of a data batch of that producer below the snapshot's offset; when that batch is
      transactional and the entry says no transaction is open, a marker of the producer follows it before
      the snapshot's offset.

    What this cannot see: an entry left out whole, or a lastOffset moved to another data batch of the same
    producer that is not transactional. A snapshot that fails is a hint gone bad, not a reason to refuse the log."""
    start = log.log_start_offset
    pids = entries["producer_id"].astype(np.int64)
    firsts = entries["current_txn_first_offset"].astype(np.int64)
    lasts = entries["last_offset"].astype(np.int64)
    opens = {int(p): int(f) for p, f in zip(pids[firsts >= 0].tolist(), firsts[firsts >= 0].tolist(), strict=True)}
    for pid, f in opens.items():
        if not start <= f < snapshot_offset:
            return f"producer {pid}'s open transaction starts at {f}, outside [log start, {snapshot_offset})"
    checked = lasts >= start
    if (lasts[checked] >= snapshot_offset).any():
        k = int(np.flatnonzero(checked & (lasts >= snapshot_offset))[0])
        return f"producer {int(pids[k])}'s last batch ends at {int(lasts[k])}, not below {snapshot_offset}"
    by_last = {int(last): int(p) for p, last in zip(pids[checked].tolist(), lasts[checked].tolist(), strict=True)}
    if len(by_last) != int(checked.sum()):
        return "two producers name the same last offset"
    lo = min([*opens.values(), *by_last], default=snapshot_offset)
    if lo >= snapshot_offset:
        return None
    want_first = dict(opens)  # producer -> where its open transaction's first batch must be
    need_marker: dict[int, int] = {}  # closed producer -> the transactional batch a marker must follow
    seen_last: set[int] = set()
    relevant = np.fromiter(set(opens) | set(by_last.values()), np.int64)
    for chunk in log.read(lo, snapshot_offset):
        h = chunk.scan.headers
        base = h["base_offset"].astype(np.int64)
        attrs = h["attributes"].astype(np.int64)
        hp = h["producer_id"].astype(np.int64)
        last = base + h["last_offset_delta"].astype(np.int64)
        control = attrs & CONTROL_FLAG_MASK != 0
        txn_data = (attrs & TRANSACTIONAL_FLAG_MASK != 0) & ~control
        markers = control & (h["record_count"].astype(np.int64) > 0)
        for i in np.flatnonzero(np.isin(hp, relevant) & (markers | txn_data | np.isin(last, list(by_last)))).tolist():
            pid, b = int(hp[i]), int(base[i])
            if markers[i]:
                opened = opens.get(pid)
                if opened is not None and b > opened:
                    return f"producer {pid}'s transaction open from {opened} has a marker at {b}"
                if need_marker.get(pid, snapshot_offset) < b:
                    del need_marker[pid]
                continue
            if want_first.get(pid) == b:
                if not txn_data[i]:
                    return f"producer {pid}'s open transaction starts at {b}, where its batch is not transactional"
                del want_first[pid]
            owner = by_last.get(int(last[i]))
            if owner is not None and not control[i]:
                if owner != pid:
                    return f"the batch ending at {int(last[i])} is producer {pid}'s, not producer {owner}'s"
                seen_last.add(int(last[i]))
                if txn_data[i] and pid not in opens:
                    need_marker[pid] = b
    if want_first:
        pid, f = next(iter(want_first.items()))
        return f"no transactional data batch of producer {pid} at offset {f} (its open transaction)"
    missing = set(by_last) - seen_last
    if missing:
        last = min(missing)
        return f"no data batch of producer {by_last[last]} ends at offset {last} (its last batch)"
    if need_marker:
        pid, b = next(iter(need_marker.items()))
        return f"producer {pid}'s transactional batch at {b} has no marker below {snapshot_offset}, yet no open one"
    return None


def as_entries(txns: Iterable[AbortedTxn]) -> np.ndarray:
    """AbortedTxn tuples as rows of ABORTED_TXN_DTYPE (what a `.txnindex` holds)."""
    return np.array([(ABORTED_TXN_VERSION, *t) for t in txns], ABORTED_TXN_DTYPE)


class TransactionState:
    """A partition's transaction state as of its log end: the open transactions (producerId -> first offset),
    where the header scan began (the snapshot's offset, or the log start), and, for each segment in the scanned
    range whose `.txnindex` is missing yet should hold entries, or fails its checks, the aborted transactions
    the scan found in it (ABORTED_TXN_DTYPE rows, by segment base offset). Memory: the open transactions
    (at most MAX_OPEN_TRANSACTIONS) plus 34 bytes per aborted transaction of the distrusted indexes.
    """

    def __init__(self, ongoing: dict[int, int], scan_start: int, rebuilt: dict[int, np.ndarray]):
        self.ongoing = ongoing
        self.scan_start = scan_start
        self.rebuilt = rebuilt

    @classmethod
    def load(
        cls,
        log,
        end: int,
        *,
        max_open: int | None = None,
        from_log_start: bool = False,
        compare_indexes: bool = False,
    ) -> TransactionState:
        """Scan `log` (a Log) up to `end`, its log end offset, from its latest valid snapshot (from its log start
        when `from_log_start`, or when the segment holding the snapshot's offset has an index to replace: the
        scan must then cover that segment whole). With `compare_indexes` (implies from_log_start) an index whose
        entries are not the aborts the scan found in its segment is replaced too."""
        from_log_start = from_log_start or compare_indexes
        scan_start, ongoing = (log.log_start_offset, {}) if from_log_start else load_snapshot_state(log, end)
        max_open = MAX_OPEN_TRANSACTIONS if max_open is None else max_open
        scan = TransactionScan(f"{log.tp.topic}-{log.tp.partition}", ongoing, max_open)
        found: dict[int, list[AbortedTxn]] = {}
        if scan_start < end:
            for chunk in log.read(scan_start, end):
                for txn in scan.feed(chunk):
                    seg = log.segment_for(txn.last_offset)
                    found.setdefault(seg.base_offset if seg is not None else 0, []).append(txn)
        rebuilt: dict[int, np.ndarray] = {}
        for seg in log.segments_in_range(scan_start, end):
            txns = found.get(seg.base_offset, [])
            why = distrust(log.txn_index(seg), has_entries=bool(txns))
            if why is None and compare_indexes:
                why = entries_differ(log.txn_index(seg), txns)
            if why is None:
                continue
            if seg.base_offset < scan_start and not from_log_start:
                logger.warning("%s; scanning the log from its start", why)
                return cls.load(log, end, max_open=max_open, from_log_start=True, compare_indexes=compare_indexes)
            logger.warning("%s; using the %d aborted transactions the log holds instead", why, len(txns))
            rebuilt[seg.base_offset] = as_entries(txns)
        return cls(scan.ongoing, scan_start, rebuilt)

    def covers(self, base_offset: int) -> bool:
        """Whether the scan read the whole segment at base_offset (its index was checked against it)."""
        return base_offset >= self.scan_start

    def last_stable_offset(self, log_start_offset: int, log_end_offset: int) -> int:
        """The first offset of the earliest open transaction, not below the log start (Kafka's
        UnifiedLog.updateFirstUnstableOffset), else the log end offset."""
        first = next(iter(self.ongoing.values()), None)
        return log_end_offset if first is None else min(max(first, log_start_offset), log_end_offset)


def entries_differ(index: TransactionIndex, txns: list[AbortedTxn]) -> str | None:
    """Why a sane index's entries are not the aborts a scan from the log start found in its segment (None: the
    same producers, first and last offsets; a missing file holds none)."""
    have = index.entries() if index.fs.exists(index.path) else np.empty(0, ABORTED_TXN_DTYPE)
    fields = ["producer_id", "first_offset", "last_offset"]
    mine = {tuple(int(r[f]) for f in fields) for r in have}
    log_has = {(t.producer_id, t.first_offset, t.last_offset) for t in txns}
    if mine == log_has:
        return None
    extra, missing = sorted(mine - log_has), sorted(log_has - mine)
    return (
        f"transaction index {index.fs.url(index.path)} disagrees with the log: entries the log does not back "
        f"{extra[:3]}, aborts it lacks {missing[:3]}"
    )


def distrust(index: TransactionIndex, *, has_entries: bool) -> str | None:
    """Why a segment's index must not be used (None: use it): it fails its checks (TransactionIndex.sanity_check
    and the entry checks of every read), or it is missing though the log holds aborts in the segment."""
    url = index.fs.url(index.path)
    try:
        exists = index.fs.exists(index.path)
        if exists:
            index.sanity_check()
    except CorruptIndexError as e:
        return f"not trusting transaction index {url}: {e}"
    if not exists and has_entries:
        return f"transaction index {url} is missing"
    return None
