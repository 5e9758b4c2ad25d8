"""The cleaner's progress callback: (bytes done, bytes total) of its reads, per chunk, only growing, ending at
the total; threaded from the maintenance pass's partition down to Cleaner.clean."""

from __future__ import annotations

from collections.abc import Callable

from storage.cleaner.cleaner_config import CleanerConfig
from storage.cleaner.log_cleaner_manager import LogCleanerManager
from storage.common.time import MockTime
from storage.log_maintenance import maintain_partition
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch

TP = TopicPartition("changelog", 0)
NOW = 1_700_000_000_000


def changelog(root: str, batches: int = 40) -> LogManager:
    """A compacted partition of small segments (a batch of 5 records over 10 keys each), all cleanable."""
    lm = LogManager(root)
    lm.create_topic(TP.topic, 1, {"cleanup.policy": "compact", "segment.bytes": "600"})
    with lm.open_log(TP, writable=True) as log:
        for b in range(batches):
            log.append(kp_batch([(NOW, f"k{(5 * b + i) % 10}".encode(), b"v" * 20, []) for i in range(5)]))
        log.roll()
    return lm


def recorder() -> tuple[list[tuple[int, int]], Callable[[int, int], None]]:
    """A progress callback, and the (done, total) it was called with."""
    calls: list[tuple[int, int]] = []
    return calls, lambda done, total: calls.append((done, total))


def test_compaction_over_several_segments_reports_growing_fractions_ending_at_the_total(root):
    lm = changelog(root)
    with lm.open_log(TP) as log:
        segments = len(log.segments) - 1  # all but the (empty) active one are cleaned
    assert segments >= 8
    calls, progress = recorder()
    clock = MockTime(NOW)
    res = LogCleanerManager(lm, time=clock).clean_partition(TP, clock.milliseconds(), progress=progress)

    assert res.ok and res.groups and res.records_dropped  # it compacted
    done = [d for d, _ in calls]
    totals = {t for _, t in calls}
    assert len(totals) == 1 and totals.pop() > 0
    total = calls[-1][1]
    assert done[0] == 0 and done[-1] == total
    assert all(a < b for a, b in zip(done, done[1:], strict=False))  # only grows, and never says the same twice
    # every one of the three reads (key count, offset map, rewrite: a third each here, the whole log being
    # dirty) moves it segment by segment, not once per pass
    for third in range(3):
        inside = [d for d in done if third * total < 3 * d < (third + 1) * total]
        assert len(inside) >= segments - 1, (third, done)


def test_a_partition_passes_its_compaction_progress_through(root):
    changelog(root)
    calls, progress = recorder()
    rep = maintain_partition(root, TP, now_ms=NOW, progress=progress)
    assert not rep.errors and rep.cleaned
    assert len(calls) > 3 and calls[0][0] == 0 and calls[-1][0] == calls[-1][1]


def test_reads_that_end_short_of_their_plan_still_only_grow_to_the_total(root):
    """A full offset map maps a prefix (pass 1 stops early, fewer segments are rewritten) and the next round
    starts mid-segment: each round's fractions still grow and end at the total."""
    lm = LogManager(root)
    lm.create_topic(TP.topic, 1, {"cleanup.policy": "compact", "segment.bytes": "5000"})
    with lm.open_log(TP, writable=True) as log:
        for version in range(2):
            for j in range(0, 600, 20):  # 600 keys twice
                log.append(kp_batch([(NOW, b"key-%04d" % k, b"v%d" % version, []) for k in range(j, j + 20)]))
        log.roll()
    manager = LogCleanerManager(lm, CleanerConfig(dedupe_buffer_size=12 * 256), time=MockTime(NOW))  # 230 keys
    full = 0
    for _ in range(20):
        calls, progress = recorder()
        res = manager.clean_partition(TP, NOW, force=True, progress=progress)
        assert res.ok, res.error
        done = [d for d, _ in calls]
        assert done[0] == 0 and done[-1] == calls[-1][1] and len({t for _, t in calls}) == 1
        assert all(a < b for a, b in zip(done, done[1:], strict=False))
        full += res.map_full
        if not res.map_full:
            break
    assert full >= 2 and not res.map_full
