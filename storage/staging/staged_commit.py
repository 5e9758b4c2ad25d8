"""Two-phase append for many parallel writers and one committer (a Spark sink's shape): phase 2.

Phase 1 (storage/staging/record_stager.py, on executors) leaves each task's rows encoded and staged per
partition under ROOT, in a hidden staging directory (Kafka ignores it), described by a StagedFile.
Phase 2 (commit_staged, on the driver): per partition, under its write lock, skip the batch if
this writer already committed it, else mark it pending, add the staged bytes and mark it committed
(ProducerStateManager). Big staging logs are adopted (baseOffsets patched, files renamed in: no
copy); small ones are copied into the active segment so frequent small commits do not make tiny
segments. A replayed batch id is skipped partition by partition.

With transactional=True (the Spark sink's default) a micro-batch is one Kafka transaction over every
partition it writes (storage/transactions/transaction_coordinator.py): the data batches carry the
transactional bit, producerId = writer id, producerEpoch 0 and baseSequence = batch id; once every
partition's data is durable the decision "commit" is created (create-only, once), then each partition gets
its COMMIT marker. A crash before the decision leaves the data to be aborted (ABORT marker, `.txnindex`),
never cut; after it, the next opener writes the missing markers. Without it, a partial commit is cut off
by the next opener (the weaker, older behaviour). On immutable segments the transaction runs the same way
with create-only objects (_transaction_data_immutable, _marker_immutable): data and marker objects retried
on a lost race, the writer's transaction file in the partition tying its open data to the decision.

On a filesystem without append or locks (object stores: immutable segments) the commit reads a
partition's staged objects (ranged GETs), stamps every batch with the batch id
(ObjectProducerStateManager) and appends them as ONE segment object with a create-only write. A
writer that loses the race for the log end reopens the log, checks again whether its batch is in
(the winner may have been a replay of it) and retries, a bounded number of times.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..common.time import SYSTEM_TIME, Time
from ..errors import ConcurrentAppendError, KafkaStorageError, TransactionAbortedError
from ..log import Log, StagedSegment
from ..log_manager import LogManager
from ..objects.immutable_segment import immutable_segments
from ..topic_partition import LOG_FILE_SUFFIX, TopicPartition, segment_file_name
from ..transactions.commit_stamp import stamp_commit, stamp_segment
from ..transactions.transaction_coordinator import (
    ABORT,
    COMMIT,
    COMMIT_HORIZON_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    TransactionRef,
    decide,
    delete_decision,
    leftover_commits,
    new_transaction,
)

log = logging.getLogger(__name__)

STAGED_PREFIX = ".kafkalog-staged-"
APPEND_CHUNK_BYTES = 64 * 1024 * 1024  # the copy path appends at most this much at a time
HELD_LOGS = 64  # a transaction over at most this many partitions keeps each log open from its data to its marker
STAGED_MARKER = "task"  # in each staging directory: the task index; its mtime is the attempt's age
CONFLICT_RETRIES = 50  # immutable commits: how often a partition commit may lose the race for the log end


@dataclass(frozen=True)
class StagedPartition:
    """One task's staging log of one partition."""

    topic: str
    partition: int
    segments: tuple[StagedSegment, ...]
    records: int
    adopt: bool  # big enough, and the topic allows it: rename in; else copy

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


@dataclass(frozen=True)
class StagedFile:
    """One task's staging directory (name under ROOT) and what it holds."""

    name: str
    partitions: tuple[StagedPartition, ...]
    order: int = 0  # the task's partition id: commit appends tasks in this order

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)


@dataclass
class CommitResult:
    appended: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # tp -> (first, last offset)
    skipped: list[TopicPartition] = field(default_factory=list)  # already held this batch
    records: int = 0


def commit_staged(
    lm: LogManager,
    writer_id: int,
    batch_id: int,
    staged: list[StagedFile],
    *,
    ephemeral: bool = False,
    lock_timeout: float | None = 600.0,
    conflict_retries: int = CONFLICT_RETRIES,
    transactional: bool = False,
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
    time: Time = SYSTEM_TIME,
) -> CommitResult:
    """Append every staged partition log, exactly once per (writer, batch, partition); then drop the files.

    Partitions are committed one at a time, each under its write lock; a crash between two leaves
    some committed and the replay skips exactly those. Every staged file is checked (present, of the
    size its message says) before a partition's commit begins, so a lost file fails the commit
    before anything is appended. Without append or locks (immutable segments) each partition's
    commit is one create-only segment object instead (see _commit_immutable).
    """
    result = CommitResult()
    by_tp: dict[TopicPartition, list[StagedPartition]] = {}
    for f in sorted(staged, key=lambda f: (f.order, f.name)):
        for p in f.partitions:
            by_tp.setdefault(TopicPartition(p.topic, p.partition), []).append(p)
    immutable = immutable_segments(lm.fs)
    with lm.snapshot():  # topic and checkpoint files read once, recovery points written once
        if transactional:
            _commit_transaction(
                lm,
                by_tp,
                writer_id,
                batch_id,
                result,
                ephemeral,
                lock_timeout,
                transaction_timeout_ms,
                time,
                immutable=immutable,
                retries=conflict_retries,
            )
        else:
            _commit_partitions(
                lm, by_tp, writer_id, batch_id, result, ephemeral, lock_timeout, conflict_retries, immutable
            )
    cleanup_staged(lm, writer_id, [f.name for f in staged])
    return result


def _commit_transaction(
    lm: LogManager,
    by_tp: dict,
    writer_id: int,
    batch_id: int,
    result: CommitResult,
    ephemeral: bool,
    lock_timeout: float | None,
    timeout_ms: int,
    clock: Time,
    *,
    immutable: bool = False,
    retries: int = CONFLICT_RETRIES,
) -> None:
    """One transaction over every partition: durable data everywhere, the decision once, then markers."""
    for path, parts in leftover_commits(lm.fs, lm.root, writer_id):  # a previous driver died among its markers
        for topic, partition in parts:  # opening rolls the transaction forward (the loader's resolve_pending)
            tp = TopicPartition(topic, partition)
            if immutable:  # a marker may lose the race for the log end: until the partition's is in
                _marker_immutable(lm, tp, writer_id, False, lock_timeout, retries, clock)
                continue
            with lm.open_log(tp, writable=True, lock_timeout=lock_timeout):
                pass
        delete_decision(lm.fs, path)
    txn = new_transaction(lm.fs, lm.root, writer_id, batch_id, timeout_ms=timeout_ms, now_ms=clock.milliseconds())
    written: dict[TopicPartition, tuple[int, int, int]] = {}  # tp -> (first, last data offset, records)
    with contextlib.ExitStack() as held:  # the logs kept open (and locked) from their data to their marker
        logs: dict[TopicPartition, Log] = {}
        keep = held if not immutable and len(by_tp) <= HELD_LOGS else None
        for tp in sorted(by_tp):
            if immutable:
                got = _transaction_data_immutable(
                    lm, tp, by_tp[tp], writer_id, batch_id, txn, lock_timeout, retries, clock
                )
            else:
                got = _transaction_data(lm, tp, by_tp[tp], writer_id, batch_id, txn, lock_timeout, keep=keep, logs=logs)
            if got is None:
                result.skipped.append(tp)
            else:
                written[tp] = got
        if not written:
            return
        # a transaction older than COMMIT_HORIZON_MS may have had its abort decision deleted: never commit it
        late = clock.milliseconds() - txn.started_ms > COMMIT_HORIZON_MS
        outcome = decide(
            lm.fs,
            txn.decision,
            ABORT if late else COMMIT,
            {
                "partitions": [[tp.topic, tp.partition, first] for tp, (first, _, _) in sorted(written.items())],
                "timestamp": clock.milliseconds(),
            },
        )
        for tp in sorted(written):
            if immutable:
                _transaction_marker_immutable(lm, tp, writer_id, ephemeral, lock_timeout, retries, clock)
            else:
                _transaction_marker(lm, tp, writer_id, txn, ephemeral, lock_timeout, plog=logs.get(tp))
    if outcome != COMMIT:
        raise TransactionAbortedError(
            f"batch {batch_id} of writer {writer_id} was aborted by another opener (its transaction "
            f"{lm.fs.url(txn.decision)} was open longer than {timeout_ms} ms) before it could commit"
            f"{', or by itself (older than the commit horizon)' if late else ''}: "
            f"ABORT markers were written in its {len(written)} partitions; the replay is a new transaction"
        )
    delete_decision(lm.fs, txn.decision)
    for tp, (first, last, records) in written.items():
        result.appended[tp] = (first, last)
        result.records += records


def _transaction_data(
    lm: LogManager,
    tp: TopicPartition,
    pieces: list[StagedPartition],
    writer_id: int,
    batch_id: int,
    txn: TransactionRef,
    lock_timeout: float | None,
    *,
    keep: contextlib.ExitStack | None = None,
    logs: dict | None = None,
) -> tuple[int, int, int] | None:
    """A partition's data, durable, marked pending under the transaction; None if the batch is in. With `keep`,
    a log that took the data stays open on it (in `logs`) for the marker: no second open of the partition."""
    with contextlib.ExitStack() as stack:
        plog = stack.enter_context(lm.open_log(tp, writable=True, lock_timeout=lock_timeout))
        state = plog.producer_state
        state.resolve_pending(plog, opener=writer_id)  # this writer's own leftovers (a restarted query)
        if state.entry(writer_id).committed_batch_id >= batch_id:
            log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
            return None
        for piece in pieces:
            _check_staged(lm, piece)
        first = plog.log_end_offset
        state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces), txn)
        _append_pieces(lm, plog, pieces, stamp=(writer_id, batch_id))
        if plog.config.flush_overridden:  # the decision needs the data durable, whatever flush.ms says
            plog.flush()
        if keep is not None and logs is not None:
            keep.enter_context(stack.pop_all())
            logs[tp] = plog
        return first, plog.log_end_offset - 1, sum(p.records for p in pieces)


def _transaction_marker(
    lm: LogManager,
    tp: TopicPartition,
    writer_id: int,
    txn: TransactionRef,
    ephemeral: bool,
    lock_timeout,
    plog: Log | None = None,
) -> None:
    """End the partition's pending transaction as the decision says (resolve_pending writes the marker): in
    `plog`, the log still open from the data, or by opening the partition (its loader does it); then a
    one-off writer is forgotten."""
    with (
        contextlib.nullcontext(plog)
        if plog is not None
        else lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as opened
    ):
        state = opened.producer_state
        if plog is not None:
            state.resolve_pending(opened)
        p = state.entry(writer_id).pending
        if p is not None and p.transaction == txn:
            raise KafkaStorageError(f"{tp}: transaction {lm.fs.url(txn.decision)} is decided but still open")
        if ephemeral:
            state.forget(writer_id)


def _transaction_data_immutable(
    lm: LogManager,
    tp: TopicPartition,
    pieces: list[StagedPartition],
    writer_id: int,
    batch_id: int,
    txn: TransactionRef,
    lock_timeout: float | None,
    retries: int,
    clock: Time,
) -> tuple[int, int, int] | None:
    """A partition's data on immutable segments: once the writer's own earlier transaction here is ended
    (resolve_pending as its opener), the writer's transaction file names `txn`, then the stamped data goes in
    as one create-only object, retried on a lost race as _commit_immutable does. None if the batch is in."""
    data = None
    headers: dict = {}  # first batch headers by base offset, kept across attempts (segments are immutable)
    lost: ConcurrentAppendError | None = None
    for attempt in _race_attempts(lm, retries):
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            state.headers.update(headers)
            headers = state.headers
            state.resolve_pending(plog, opener=writer_id, now_ms=clock.milliseconds())
            if writer_id in state.transactions()[1]:  # its marker lost the race: reopen and end it first
                continue
            if state.entry(writer_id).committed_batch_id >= batch_id:
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                return None
            if data is None:  # one buffer: the partition's data must be one object
                data = _read_stamped(lm, tp, pieces, writer_id, batch_id, plog.max_batch_size, transactional=True)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces), txn)
            try:
                plog.append(data)  # patched in place (offsets, LogAppendTime); every attempt redoes all of it
            except ConcurrentAppendError as e:
                log.info(
                    "%s: transaction data of batch %d lost offset %d (attempt %d)", tp, batch_id, first, attempt + 1
                )
                lost = e
                continue
            state.complete(writer_id)
            return first, plog.log_end_offset - 1, sum(p.records for p in pieces)
    raise ConcurrentAppendError(
        f"{tp.topic}-{tp.partition}: batch {batch_id} of writer {writer_id} lost the race for the log end to other "
        f"writers {max(1, retries)} times; its transaction stays open until it is aborted",
        topic=tp.topic,
        partition=tp.partition,
        offset=lost.offset if lost is not None else -1,
    )


def _transaction_marker_immutable(
    lm: LogManager, tp: TopicPartition, writer_id: int, ephemeral: bool, lock_timeout, retries: int, clock: Time
) -> None:
    """The marker phase on immutable segments (crash tests count these calls): see _marker_immutable."""
    _marker_immutable(lm, tp, writer_id, ephemeral, lock_timeout, retries, clock)


def _marker_immutable(
    lm: LogManager, tp: TopicPartition, writer_id: int, ephemeral: bool, lock_timeout, retries: int, clock: Time
) -> None:
    """Open the partition until the writer has no transaction open in it: each opening ends the decided
    transactions (resolve_pending); a marker that lost the race for the log end is retried after a reopen."""
    for _ in _race_attempts(lm, retries):
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            state.resolve_pending(plog, now_ms=clock.milliseconds())
            if writer_id not in state.transactions()[1]:
                if ephemeral:
                    state.forget(writer_id)
                return
    raise ConcurrentAppendError(
        f"{tp.topic}-{tp.partition}: the marker of writer {writer_id}'s transaction lost the race for the log end "
        f"{max(1, retries)} times; the next opener of the partition writes it",
        topic=tp.topic,
        partition=tp.partition,
        offset=-1,
    )


def _commit_partitions(
    lm: LogManager,
    by_tp: dict,
    writer_id: int,
    batch_id: int,
    result: CommitResult,
    ephemeral: bool,
    lock_timeout: float | None,
    conflict_retries: int,
    immutable: bool,
) -> None:
    for tp in sorted(by_tp):
        if immutable:
            _commit_immutable(
                lm,
                tp,
                by_tp[tp],
                writer_id,
                batch_id,
                result,
                ephemeral=ephemeral,
                lock_timeout=lock_timeout,
                retries=conflict_retries,
            )
            continue
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            if state.entry(writer_id).committed_batch_id >= batch_id:
                result.skipped.append(tp)
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                continue
            pieces = by_tp[tp]
            for piece in pieces:
                _check_staged(lm, piece)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces))
            _append_pieces(lm, plog, pieces)
            state.complete(writer_id)
            if ephemeral:
                state.forget(writer_id)
            result.appended[tp] = (first, plog.log_end_offset - 1)
            result.records += sum(p.records for p in pieces)


def _append_pieces(lm: LogManager, plog, pieces: list[StagedPartition], stamp: tuple[int, int] | None = None) -> None:
    """Adopt the big staging logs; copy the others with as few appends as APPEND_CHUNK_BYTES allows (each
    append flushes, so the tasks' small pieces of a partition go in together: one fsync per file).
    `stamp` (writer id, batch id): make every batch a transactional batch of that commit first."""
    pending: list[bytearray] = []
    size = 0
    where = f"staged batches of {plog.tp.topic}-{plog.tp.partition}"

    def flush_pending():
        nonlocal pending, size
        if pending:
            data = pending[0] if len(pending) == 1 else bytearray(b"".join(pending))
            if stamp is not None:
                stamp_commit(data, *stamp, max_batch_size=plog.max_batch_size, source=where, transactional=True)
            plog.append(data)
        pending, size = [], 0

    for piece in pieces:
        if piece.adopt and _same_log_dir(lm, piece, plog.dir):
            flush_pending()
            if stamp is not None:
                for seg in piece.segments:
                    _stamp_staged_segment(lm, seg, *stamp, max_batch_size=plog.max_batch_size)
            plog.adopt_segments(list(piece.segments))
            continue
        for data in read_staged(lm, piece):
            if size and size + len(data) > APPEND_CHUNK_BYTES:
                flush_pending()
            pending.append(data)
            size += len(data)
    flush_pending()


def _commit_immutable(
    lm: LogManager,
    tp: TopicPartition,
    pieces: list[StagedPartition],
    writer_id: int,
    batch_id: int,
    result: CommitResult,
    *,
    ephemeral: bool,
    lock_timeout: float | None,
    retries: int,
) -> None:
    """One partition's commit on immutable segments: check, stamp, append as one object; on a lost race
    reopen, check again (the winner may have been a replay of this very batch) and retry."""
    data = None
    headers: dict = {}  # first batch headers by base offset, kept across attempts (segments are immutable)
    lost: ConcurrentAppendError | None = None
    for attempt in _race_attempts(lm, retries):
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            state.headers = headers
            if state.entry(writer_id).committed_batch_id >= batch_id:
                result.skipped.append(tp)
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                return
            if data is None:  # one buffer: the partition's commit must be one object to be atomic
                data = _read_stamped(lm, tp, pieces, writer_id, batch_id, plog.max_batch_size)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces))
            try:
                plog.append(data)  # patched in place (offsets, LogAppendTime); every attempt redoes all of it
            except ConcurrentAppendError as e:
                log.info(
                    "%s: batch %d of writer %d lost offset %d to another writer (attempt %d); retrying",
                    tp,
                    batch_id,
                    writer_id,
                    first,
                    attempt + 1,
                )
                lost = e
                continue
            state.complete(writer_id)
            if ephemeral:
                state.forget(writer_id)
            result.appended[tp] = (first, plog.log_end_offset - 1)
            result.records += sum(p.records for p in pieces)
            return
    assert lost is not None  # every attempt that did not return lost a race
    raise ConcurrentAppendError(
        f"{tp.topic}-{tp.partition}: batch {batch_id} of writer {writer_id} lost the race for "
        f"the log end to other writers {max(1, retries)} times (last at offset {lost.offset}); "
        f"nothing of it was appended",
        topic=tp.topic,
        partition=tp.partition,
        offset=lost.offset,
    )


def _race_attempts(lm: LogManager, retries: int) -> Iterator[int]:
    """The attempts (0, 1, ...; at most max(1, retries)) of a create-only write racing other writers for the
    log end of an immutable-segment partition: before each but the first a random back-off that grows with
    the losses (at most 1 s); before each a LIST of every log dir, so open_log's existence checks come from
    the listing cache."""
    for attempt in range(max(1, retries)):
        if attempt:
            time.sleep(random.uniform(0, min(1.0, 0.005 * 2 ** min(attempt, 8))))
        for d in lm.log_dirs:
            lm.fs.listdir(d)
        yield attempt


def _read_stamped(
    lm: LogManager,
    tp: TopicPartition,
    pieces: list[StagedPartition],
    writer_id: int,
    batch_id: int,
    max_batch_size: int,
    *,
    transactional: bool = False,
) -> bytearray:
    data = bytearray()
    for piece in pieces:
        for chunk in read_staged(lm, piece):
            data += chunk
    stamp_commit(
        data,
        writer_id,
        batch_id,
        max_batch_size=max_batch_size,
        source=f"staged batches of {tp.topic}-{tp.partition}",
        transactional=transactional,
    )
    return data


def _stamp_staged_segment(lm: LogManager, seg: StagedSegment, writer_id: int, batch_id: int, *, max_batch_size: int):
    """Stamp a staged segment's batches in place before it is adopted (stamp_segment, transactional): its
    batch headers are read and 40 bytes per batch written back; the records are not read."""
    path = lm.fs.join(seg.dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
    stamp_segment(
        lm.fs, path, seg.positions, seg.size, writer_id, batch_id, max_batch_size=max_batch_size, transactional=True
    )


def _same_log_dir(lm: LogManager, piece: StagedPartition, partition_dir: str) -> bool:
    """Adopting renames files: only within one log dir (a partition placed after staging may not be)."""
    fs = lm.fs
    return fs.dirname(fs.dirname(piece.segments[0].dir)) == fs.dirname(partition_dir)


def _check_staged(lm: LogManager, piece: StagedPartition) -> None:
    for seg in piece.segments:
        path = lm.fs.join(seg.dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
        size = lm.fs.size(path) if lm.fs.exists(path) else None
        if size != seg.size:
            raise KafkaStorageError(
                f"staged segment {lm.url(path)} holds {size} bytes, its commit message says "
                f"{seg.size}; nothing was appended"
            )


def read_staged(lm: LogManager, piece: StagedPartition):
    """A staging log's batches in whole-batch chunks of up to APPEND_CHUNK_BYTES (the copy path), each
    a bytearray Log.append takes over."""
    for seg in piece.segments:
        path = lm.fs.join(seg.dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
        ends = np.append(seg.positions[1:], seg.size) if len(seg.positions) else np.zeros(0, np.int64)
        start = 0
        while start < seg.size:
            # the last batch end within the chunk budget (at least one batch)
            k = max(
                int(np.searchsorted(ends, start + APPEND_CHUNK_BYTES, side="right")),
                int(np.searchsorted(ends, start, side="right")) + 1,
            )
            end = int(ends[k - 1])
            data = lm.fs.read(path, start, end)
            if len(data) != end - start:
                raise KafkaStorageError(
                    f"staged segment {lm.url(path)} is shorter than its commit message says ({start}..{end})"
                )
            yield bytearray(data)
            start = end


def cleanup_staged(lm: LogManager, writer_id: int, names: list[str] | None = None) -> None:
    """Delete this writer's staging directories in every log dir: all of them, or the named ones plus
    any older unnamed ones (attempts that failed or were killed before reporting). Newer unnamed ones
    are left alone: a restarted query may already be staging its replay while an old commit finishes."""
    prefix = f"{STAGED_PREFIX}{writer_id}-"
    fs = lm.fs
    found: list[tuple[str, str, bool]] = []  # (log dir, name, is_dir)
    for log_dir in lm.log_dirs:  # (a missing log dir lists as empty)
        found += [(log_dir, f.name, f.is_dir) for f in fs.listdir(log_dir) if f.name.startswith(prefix)]

    def age(log_dir: str, name: str, is_dir: bool) -> int:
        path = fs.join(log_dir, name)
        marker = fs.join(path, STAGED_MARKER)
        return fs.modified_ms(marker if is_dir and fs.exists(marker) else path)

    if names is None:
        doomed = found
    else:
        named = [f for f in found if f[1] in set(names)]
        others = [f for f in found if f[1] not in set(names)]
        oldest = min((age(*f) for f in named), default=None) if others else None  # ages cost a request each
        doomed = named + ([f for f in others if age(*f) <= oldest] if oldest is not None else [])
    for log_dir, name, is_dir in doomed:
        path = fs.join(log_dir, name)
        if is_dir:
            fs.delete_dir(path)
        else:
            fs.delete(path)
