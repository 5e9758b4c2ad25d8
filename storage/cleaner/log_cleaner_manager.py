"""LogCleanerManager: which compacted logs to clean, which range, in what order (Kafka's LogCleanerManager).

A log's dirty range starts at its entry in ROOT/cleaner-offset-checkpoint (or the log start offset)
and ends at the first uncleanable offset: the lowest of the active segment's base offset, the last
stable offset (the first offset of a transaction still open, which may yet abort), and the base of the
first segment holding a record newer than min.compaction.lag.ms; rounded down to a segment base. Logs whose dirty ratio
dirty bytes / (clean + dirty bytes) exceeds min.cleanable.dirty.ratio are cleanable, the dirtiest
first, as are logs whose oldest dirty segment began more than max.compaction.lag.ms ago. The
checkpoint moves only after a cleaning's last swap, so a crash before it just cleans again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..common.constants import INT64_MAX
from ..common.time import SYSTEM_TIME, Time
from ..log import Log
from ..log_manager import ROOT_LOCK_FILE, LogManager
from ..metadata.checkpoint import CLEANER_OFFSET_CHECKPOINT_FILE, OffsetCheckpointFile
from ..segment_swap import settle_hint, settled_bound
from ..topic_partition import TopicPartition
from ..transactions.producer_state_manager import ProducerStateManager
from .clean_progress import CleanProgress
from .cleaner import Cleaner, CleanResult
from .cleaner_config import CleanerConfig
from .segment_merger import DEFAULT_MERGE_MIN_AGE_MS

logger = logging.getLogger(__name__)


@dataclass
class LogToClean:
    """One log's cleanable range and the byte counts the selection ranks it by (Kafka's LogToClean)."""

    tp: TopicPartition
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int  # > 0: some dirty data is older than max.compaction.lag.ms
    min_cleanable_ratio: float
    log: Log = field(repr=False, compare=False, default=None)  # type: ignore[assignment]  # always given; last for the repr
    owned: bool = field(repr=False, compare=False, default=False)  # opened by the manager, closed after cleaning

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def need_compaction_now(self) -> bool:
        return self.max_compaction_delay_ms > 0

    @property
    def is_cleanable(self) -> bool:
        """Kafka's rule: ratio strictly above min.cleanable.dirty.ratio, or overdue with dirty bytes."""
        overdue = self.need_compaction_now and self.cleanable_bytes > 0
        return overdue or self.cleanable_ratio > self.min_cleanable_ratio


def cleanable_offsets(
    log: Log, checkpoint_offset: int | None, now_ms: int, bound: int | None = None
) -> tuple[int, int, bool]:
    """(first dirty offset, first uncleanable offset, checkpoint needs rewriting). A checkpoint below
    the log start or past the log end is reset to the log start, as Kafka does. `bound` caps the
    uncleanable offset (object stores: segment_swap.settled_bound)."""
    start = log.log_start_offset
    force = False
    if checkpoint_offset is None:
        first_dirty = start
    elif checkpoint_offset < start or checkpoint_offset > log.log_end_offset:
        logger.warning(
            "%s: cleaner checkpoint %d is outside [%d, %d]; cleaning from the log start",
            log.tp,
            checkpoint_offset,
            start,
            log.log_end_offset,
        )
        first_dirty, force = start, True
    else:
        first_dirty = checkpoint_offset
    # nothing at or past the LSO: an open transaction may still abort (Kafka's firstUncleanableDirtyOffset)
    uncleanable = min(log.active_segment.base_offset, log.last_stable_offset)
    if bound is not None:
        uncleanable = min(uncleanable, bound)
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for seg in log.non_active_segments_from(first_dirty):
            if seg.largest_timestamp > now_ms - lag:
                uncleanable = min(uncleanable, seg.base_offset)
                break
    return first_dirty, max(first_dirty, uncleanable), force


def max_compaction_delay(log: Log, first_dirty_offset: int, now_ms: int) -> int:
    """How far past max.compaction.lag.ms the oldest dirty non-active segment's first batch is (0: not)."""
    stamps = [s.rolling_based_timestamp for s in log.non_active_segments_from(first_dirty_offset)]
    firsts = [t for t in stamps if t is not None and t > 0]
    earliest = min(firsts) if firsts else INT64_MAX
    until = now_ms - max(log.config.max_compaction_lag_ms, 0)
    return until - earliest if earliest < until else 0


def log_to_clean(
    log: Log, checkpoint_offset: int | None, now_ms: int, bound: int | None = None
) -> tuple[LogToClean, bool]:
    """The LogToClean of a log, and whether its checkpoint entry must be rewritten."""
    first_dirty, uncleanable, force = cleanable_offsets(log, checkpoint_offset, now_ms, bound)
    floor = log.non_active_segments_from(uncleanable)
    first_uncleanable = floor[0].base_offset if floor else log.active_segment.base_offset
    clean = sum(s.size for s in log.segments_in_range(-1, first_dirty))
    dirty = sum(s.size for s in log.segments_in_range(min(first_dirty, first_uncleanable), first_uncleanable))
    ltc = LogToClean(
        log.tp,
        first_dirty,
        max(first_dirty, first_uncleanable),
        clean,
        dirty,
        max_compaction_delay(log, first_dirty, now_ms),
        log.config.min_cleanable_dirty_ratio,
        log,
    )
    return ltc, force


class LogCleanerManager:
    """Selection, the cleaner-offset-checkpoint under ROOT, and a run over every compacted log."""

    def __init__(
        self,
        lm: LogManager,
        config: CleanerConfig | None = None,
        *,
        cleaner: Cleaner | None = None,
        merge_min_age_ms: int = DEFAULT_MERGE_MIN_AGE_MS,
        check=None,
        time: Time = SYSTEM_TIME,
    ):
        self.lm = lm
        self.time = time  # now, when a run is given no now_ms
        self.cleaner = cleaner or Cleaner(config, time=time)
        self.cleaner.check = check  # object stores: the maintenance lease, re-checked before each swap
        self.merge_min_age_ms = merge_min_age_ms  # object stores: see segment_swap.settled_bound
        self.checkpoint = OffsetCheckpointFile(lm.fs, lm.fs.join(lm.root, CLEANER_OFFSET_CHECKPOINT_FILE))
        self.last_errors: dict[TopicPartition, BaseException] = {}  # partitions cleanable_logs could not assess

    # ------------------------------------------------------------------ checkpoint
    def checkpoints(self) -> dict[TopicPartition, int]:
        return {TopicPartition(*k): v for k, v in self.lm.read_checkpoint(self.checkpoint).items()}

    def update_checkpoint(self, tp: TopicPartition, offset: int | None) -> None:
        """Set (or with None remove) a partition's first dirty offset; read-merge-write under the root lock.

        Without locks (object stores) the read-merge-write is unlocked and the file a hint: a lost
        update puts another partition's entry back to an older, smaller offset (or drops a new one),
        which only makes its next cleaning re-read data that was clean already."""
        fs = self.lm.fs
        self.lm.forget_snapshot()
        fs.mkdirs(self.lm.root)
        lock = (
            fs.lock(fs.join(self.lm.root, ROOT_LOCK_FILE), timeout=60)
            if fs.capabilities.locks
            else contextlib.nullcontext()
        )
        with lock:
            cur = self.checkpoint.read()
            key = TopicPartition(tp.topic, tp.partition)
            if offset is None:
                if key not in cur:
                    return
                del cur[key]
            elif cur.get(key) == offset:
                return
            else:
                cur[key] = int(offset)
            self.checkpoint.write(cur)

    def _bound(self, log: Log, now_ms: int) -> int | None:
        """Object stores: clean only settled segments, with the writer-state hint complete below them
        (storage/segment_swap.py). Elsewhere: not from a pending sink commit on (its resolution reads
        the commit's first batch), else None (no cap). Either way, not from a table's next offset on."""
        hold = self.lm.table_hold(log.tp)  # a topic kept as a table: nothing it has not committed yet is cleaned
        if not log.immutable:
            bound = ProducerStateManager(log.fs, log.dir).first_unstable_offset()
        else:
            bound = settle_hint(log, settled_bound(log, now_ms=now_ms, min_age_ms=self.merge_min_age_ms))
        return hold if bound is None else bound if hold is None else min(bound, hold)

    # ------------------------------------------------------------------ selection
    def _compacted_logs(self) -> Iterable[tuple[TopicPartition, Log | None, BaseException | None]]:
        for topic in self.lm.topics():
            try:
                meta = self.lm.topic(topic)
            except Exception as e:  # noqa: BLE001 - reported per partition, others go on
                yield TopicPartition(topic, 0), None, e
                continue
            if not meta.config.compact:
                continue
            for tp in self.lm.partitions(topic):
                if not self.lm.fs.isdir(self.lm.partition_dir(tp)):
                    continue
                try:
                    yield tp, self.lm.open_log(tp), None
                except Exception as e:  # noqa: BLE001
                    yield tp, None, e

    def cleanable_logs(
        self, logs: LogManager | Iterable[Log] | None = None, now_ms: int | None = None
    ) -> list[LogToClean]:
        """Cleanable compacted logs, dirtiest first. From a LogManager (default: ours) the logs are
        opened read-only and owned by the result; a list of Logs stays the caller's."""
        now = self.time.milliseconds() if now_ms is None else int(now_ms)
        self.last_errors = {}
        marks = self.checkpoints()
        owned = logs is None or isinstance(logs, LogManager)
        source: Iterable[tuple[TopicPartition, Log | None, BaseException | None]]
        if logs is None or isinstance(logs, LogManager):
            if logs is not None and logs is not self.lm:
                raise ValueError("cleanable_logs: pass this manager's LogManager, a list of Logs, or nothing")
            source = self._compacted_logs()
        else:
            source = ((lg.tp, lg, None) for lg in logs if lg.config.compact)
        chosen = []
        for tp, lg, err in source:
            if err is not None:
                self.last_errors[tp] = err
                continue
            assert lg is not None
            try:
                ltc, force = log_to_clean(lg, marks.get(tp), now, self._bound(lg, now))
                if force:
                    self.update_checkpoint(tp, ltc.first_dirty_offset)
            except Exception as e:  # noqa: BLE001
                self.last_errors[tp] = e
                ltc = None
            if ltc is not None and ltc.total_bytes > 0 and ltc.is_cleanable:
                ltc.owned = owned
                chosen.append(ltc)
            elif owned:
                lg.close()
        chosen.sort(key=lambda t: (-t.cleanable_ratio, t.tp))
        return chosen

    # ------------------------------------------------------------------ cleaning
    def clean(
        self, ltc: LogToClean, now_ms: int | None = None, *, progress: CleanProgress | None = None
    ) -> CleanResult:
        """Clean one log and then move its checkpoint. Failures come back in the result, not raised.
        `progress(done, total)`: see Cleaner.clean."""
        try:
            res = self.cleaner.clean(
                ltc.log, ltc.first_dirty_offset, ltc.first_uncleanable_offset, now_ms=now_ms, progress=progress
            )
            self.update_checkpoint(ltc.tp, res.end_offset)  # last: a crash before it only repeats work
        except Exception as e:  # noqa: BLE001 - one partition's failure must not stop the others
            logger.warning("cleaning %s failed: %s: %s", ltc.tp, type(e).__name__, e)
            res = CleanResult(
                ltc.tp.topic,
                ltc.tp.partition,
                ltc.first_dirty_offset,
                ltc.first_uncleanable_offset,
                error=f"{type(e).__name__}: {e}",
                exception=e,
            )
        finally:
            if ltc.owned:
                ltc.log.close()
        return res

    def clean_partition(
        self,
        tp: TopicPartition,
        now_ms: int | None = None,
        *,
        force: bool = False,
        progress: CleanProgress | None = None,
    ) -> CleanResult:
        """Clean one partition now; with force even below the dirty ratio (e.g. to drop expired tombstones).
        `progress(done, total)` is called as it goes (Cleaner.clean); not at all when there is nothing to clean."""
        now = self.time.milliseconds() if now_ms is None else int(now_ms)
        try:
            lg = self.lm.open_log(tp)
        except Exception as e:  # noqa: BLE001
            return CleanResult(tp.topic, tp.partition, -1, -1, error=f"{type(e).__name__}: {e}", exception=e)
        try:
            ltc, _ = log_to_clean(lg, self.checkpoints().get(tp), now, self._bound(lg, now))
        except Exception as e:  # noqa: BLE001 - e.g. a damaged segment met finding the LSO: reported, as below
            lg.close()
            return CleanResult(tp.topic, tp.partition, -1, -1, error=f"{type(e).__name__}: {e}", exception=e)
        except BaseException:
            lg.close()
            raise
        ltc.owned = True
        if not force and not ltc.is_cleanable:
            lg.close()
            return CleanResult(
                tp.topic,
                tp.partition,
                ltc.first_dirty_offset,
                ltc.first_uncleanable_offset,
                end_offset=ltc.first_dirty_offset,
            )
        return self.clean(ltc, now, progress=progress)

    def run_once(self, now_ms: int | None = None) -> list[CleanResult]:
        """Clean every cleanable compacted log once, dirtiest first; one result per partition tried."""
        now = self.time.milliseconds() if now_ms is None else int(now_ms)
        todo = self.cleanable_logs(now_ms=now)
        results = [
            CleanResult(tp.topic, tp.partition, -1, -1, error=f"{type(e).__name__}: {e}", exception=e)
            for tp, e in self.last_errors.items()
        ]
        for ltc in todo:
            results.append(self.clean(ltc, now))
        return results
