"""Turn source options into offset ranges per partition, the way Spark's Kafka source plans them."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from storage.errors import DataLossError, KafkaLogError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from storage.log_manager import LogManager
from storage.log_offsets import LogOffsetsCache
from storage.topic_partition import TopicPartition
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED

from .source_options import EARLIEST, LATEST, OffsetSpec, SourceOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionState:
    """A partition's offsets as a reader at one isolation level sees them: `log_end` is where it may read to
    (the log end offset, or under read_committed the last stable offset, as Kafka's ListOffsets LATEST)."""

    log_start: int
    log_end: int
    stable: bool = False  # log_end is the last stable offset (read_committed)

    @property
    def end_name(self) -> str:
        return "last stable offset" if self.stable else "log end offset"


# Kafka's internal topics (Topic.isInternal): Spark's Kafka source reads none of them, whatever the strategy
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


def topic_partitions(lm: LogManager, opts: SourceOptions, *, batch: bool = False) -> list[TopicPartition]:
    """subscribe / subscribePattern / assign, against the topics under ROOT now, as Spark's Kafka source
    resolves them (ConsumerStrategy, checked against Kafka 4.4 and the 4.2.0 connector): a subscribed or
    assigned topic that does not exist fails the read (the connector's UnknownTopicOrPartitionException),
    batch or stream; an assigned partition the topic does not have is not read; a pattern matches a topic
    when it is found anywhere in the name (Regex.findFirstIn, so `^...$` anchors it) and matching nothing
    reads nothing. A batch read of a ROOT that does not exist is an error of its own."""
    if batch and not any(lm.fs.isdir(d) for d in lm.log_dirs):
        raise UnknownTopicOrPartitionError(f"log dir {lm.url()} does not exist")
    if opts.assign is not None:
        wanted = sorted({TopicPartition(t, p) for t, p in opts.assign if t not in INTERNAL_TOPICS})
        present = set(_existing(lm, sorted({tp.topic for tp in wanted})))
        absent = [f"{tp.topic}-{tp.partition}" for tp in wanted if tp not in present]
        if absent:
            log.warning(
                "assigned partition(s) %s do not exist in %s: not read (as Spark's Kafka source)",
                ", ".join(absent),
                lm.url(),
            )
        return [tp for tp in wanted if tp in present]
    if opts.subscribe is not None:  # looked up by name: O(the topics read), not O(everything under ROOT)
        return sorted(set(_existing(lm, [t for t in opts.subscribe if t not in INTERNAL_TOPICS])))
    existing = [t for t in lm.topics() if t not in INTERNAL_TOPICS]
    assert opts.pattern is not None  # exactly one of assign, subscribe, subscribePattern (SourceOptions)
    pattern = re.compile(opts.pattern)
    names = [t for t in existing if pattern.search(t)]
    if not names:
        log.warning(
            "no topic in %s matches subscribePattern %r (topics there: %s)",
            lm.url(),
            opts.pattern,
            ", ".join(existing[:20]) or "none",
        )
    return sorted(tp for t in names for tp in lm.partitions(t))


def _existing(lm: LogManager, topics: list[str]) -> list[TopicPartition]:
    """Every partition of these topics; a topic that is not there fails, naming the topics that are."""
    found, missing = [], []
    for t in topics:
        try:
            found.extend(lm.partitions(t))
        except UnknownTopicOrPartitionError:
            missing.append(t)
    if missing:
        existing = [t for t in lm.topics() if t not in INTERNAL_TOPICS]
        raise UnknownTopicOrPartitionError(
            f"topic(s) {', '.join(missing)} do not exist in {lm.url()} (topics there: "
            f"{', '.join(existing[:20]) or 'none'}), as Spark's Kafka source fails on a topic the broker does "
            "not have; to wait for a topic that a writer has not created yet, use subscribePattern "
            f"(e.g. '^{re.escape(missing[0])}$'), which reads nothing until it appears"
        )
    return found


def partition_states(
    lm: LogManager,
    tps: list[TopicPartition],
    fail_on_data_loss: bool,
    cache: LogOffsetsCache | None = None,
    *,
    isolation_level: str = READ_UNCOMMITTED,
) -> dict:
    """Log start and end offsets per partition (the end: the last stable offset under read_committed); one gone
    since it was listed is data loss. A stream reader passes its cache, so that partitions whose files did not
    change are not reopened."""
    stable = isolation_level == READ_COMMITTED
    out = {}
    for tp in tps:
        try:
            if cache is not None:
                snap = cache.offsets(lm, tp)
                end = snap.last_stable_offset if stable else snap.log_end_offset
                out[tp] = PartitionState(snap.log_start_offset, end, stable)
                continue
            with lm.open_log(tp) as plog:
                end = plog.last_stable_offset if stable else plog.log_end_offset
                out[tp] = PartitionState(plog.log_start_offset, end, stable)
        except UnknownTopicOrPartitionError as e:
            _data_loss(fail_on_data_loss, f"{tp.topic}-{tp.partition} does not exist: {e}")
    return out


def _data_loss(fail: bool, message: str) -> None:
    if fail:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip what is gone and go on.")
    log.warning("%s; skipping (failOnDataLoss=false)", message)


def resolve(
    lm: LogManager,
    spec: OffsetSpec,
    states: dict,
    *,
    is_start: bool,
    strategy: str = "error",
    require_all: bool = True,
    isolation_level: str = READ_UNCOMMITTED,
) -> dict[TopicPartition, int]:
    """Offsets for one end of the range: -2 earliest, -1 latest (the states' end), or by timestamp (Kafka
    ListOffsets at the isolation level: under read_committed an offset at or past the LSO is not found)."""
    out = {}
    listed = {(t, p) for t, p, _ in spec.per_partition}
    if spec.kind != "timestamp" and spec.per_partition and require_all:
        # as Spark's Kafka source: the partitions named must be the partitions read, no fewer and no more
        missing = [f"{tp.topic}-{tp.partition}" for tp in states if (tp.topic, tp.partition) not in listed]
        read = {(tp.topic, tp.partition) for tp in states}
        extra = [f"{t}-{p}" for t, p in sorted(listed - read)]
        if missing or extra:
            name = ("starting" if is_start else "ending") + (
                "OffsetsByTimestamp" if spec.kind == "timestamps" else "Offsets"
            )
            raise KafkaLogError(
                f"option '{name}' must give every partition the query reads, and no other"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; not read by the query: {', '.join(extra)}" if extra else "")
            )
    for tp, st in states.items():
        value: int | None
        if spec.kind == "timestamp":
            value, by_time = spec.default, True
        else:
            value = spec.value_for(tp.topic, tp.partition)
            by_time = spec.kind == "timestamps" and value is not None
            if value is None:
                value = spec.default
        if by_time:
            with lm.open_log(tp) as plog:
                found = plog.offset_for_timestamp(value, isolation_level=isolation_level)
            if found is None:
                if is_start and strategy == "error":
                    raise KafkaLogError(
                        f"no record at or after timestamp {value} in {tp.topic}-{tp.partition} ({st.end_name} "
                        f"{st.log_end}); set startingOffsetsByTimestampStrategy=latest to start at the end instead"
                    )
                found = st.log_end
            out[tp] = found
        elif value == EARLIEST:
            out[tp] = st.log_start
        elif value == LATEST:
            out[tp] = st.log_end
        else:
            out[tp] = value
    return out


def open_ended(spec: OffsetSpec, states: dict, which: int) -> set:
    """The partitions whose end of the range is `which` (EARLIEST or LATEST) by name, not a fixed offset
    or a timestamp: the reader resolves those when it reads (see reader.KafkaLogInputPartition)."""
    if spec.kind != "offsets":
        return set()
    out = set()
    for tp in states:
        value = spec.value_for(tp.topic, tp.partition)
        if (spec.default if value is None else value) == which:
            out.add((tp.topic, tp.partition))
    return out


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int


def ranges(
    starts: dict, ends: dict, states: dict, fail_on_data_loss: bool, *, stream: bool = False
) -> list[OffsetRange]:
    """Check each range against what the log holds now, as Spark's Kafka source does when it reads: offsets
    below the log start (retention, delete-records) or an end beyond the log end are data loss (fail, or with
    failOnDataLoss=false read what is there); a start beyond the end fails a batch read and is data loss to a
    stream (the start was set beyond the log, or the partition was made anew). Gaps from compaction are not
    data loss."""
    out = []
    for tp, start in starts.items():
        if tp not in ends or tp not in states:
            continue
        st, end = states[tp], ends[tp]
        lost = False
        if start < st.log_start:
            _data_loss(
                fail_on_data_loss,
                f"offsets {start}..{st.log_start - 1} of {tp.topic}-{tp.partition} are gone (log start offset "
                f"is now {st.log_start}, by retention or delete-records)",
            )
            start, lost = st.log_start, True
        if end > st.log_end:
            _data_loss(
                fail_on_data_loss,
                f"ending offset {end} of {tp.topic}-{tp.partition} is beyond its {st.end_name} "
                f"{st.log_end}: offsets {st.log_end}..{end - 1} are not there"
                + (
                    " for a read_committed reader (past the log end, or behind a transaction still open)"
                    if st.stable
                    else ""
                ),
            )
            end = st.log_end
        if start > end:
            if lost:  # everything asked for is gone, and skipped
                continue
            if stream:
                _data_loss(
                    fail_on_data_loss,
                    f"{tp.topic}-{tp.partition}: starting offset {start} is beyond its {st.end_name} {end}: "
                    "the start was set beyond the offsets the partition has, or the partition was deleted "
                    "and made anew",
                )
                continue
            raise OffsetOutOfRangeError(
                f"{tp.topic}-{tp.partition}: starting offset {start} is after ending offset {end}"
            )
        if start < end:
            out.append(OffsetRange(tp.topic, tp.partition, start, end))
    return out


def split(
    lm: LogManager, rs: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Cut big ranges at segment or index boundaries until there are about min_partitions of them,
    each partition's share in proportion to its size (Spark's KafkaOffsetRangeCalculator idea); then
    cut every range into pieces of at most max_records offsets (maxRecordsPerPartition)."""
    rs = _split_min(lm, rs, min_partitions)
    if not max_records:
        return rs
    out: list = []
    for r in rs:
        pieces = -(-(r.end - r.start) // max_records)
        bounds = [r.start + (r.end - r.start) * k // pieces for k in range(pieces)] + [r.end]
        out.extend(OffsetRange(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b)
    return out


def _split_min(lm: LogManager, rs: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    if not min_partitions or len(rs) >= min_partitions:
        return rs
    total = sum(r.end - r.start for r in rs)
    out = []
    for r in rs:
        want = max(1, round(min_partitions * (r.end - r.start) / total))
        if want == 1:
            out.append(r)
            continue
        with lm.open_log(TopicPartition(r.topic, r.partition)) as plog:
            points = plog.split_points(r.start, r.end)
        cuts, step = [], (r.end - r.start) / want
        for k in range(1, want):
            target = r.start + step * k
            best = min(points, key=lambda p: abs(p - target), default=None)
            if best is not None and best not in cuts:
                cuts.append(best)
        bounds = [r.start] + sorted(cuts) + [r.end]
        out.extend(OffsetRange(r.topic, r.partition, a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b)
    return out
