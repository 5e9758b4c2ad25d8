"""A maintenance pass's progress output (_Progress): on a terminal the bar, redrawn in place with the partition
under way and its compaction's fraction at most every 0.2 s; elsewhere a plain line at most every 5 s; the
partition's final line as before. On a MockTime: nothing here sleeps or races the wall clock."""

from __future__ import annotations

import io
import re
import threading

import pytest

import storage.log_maintenance as maintenance
from storage.common.time import MockTime
from storage.log_maintenance import PartitionReport, _Progress, run_once
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch

TP = TopicPartition("changelog", 0)
CLEAR = "\r\033[K"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def done_report(tp: TopicPartition = TP) -> PartitionReport:
    return PartitionReport(tp.topic, tp.partition, bytes_before=40, bytes_after=17, duration_s=1.5)


def take(out: io.StringIO) -> str:
    """What was written since the last take."""
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    return text


def test_on_a_terminal_the_bar_is_redrawn_in_place_at_most_every_fifth_of_a_second():
    clock, out = MockTime(), Terminal()
    progress = _Progress(out, 3, time=clock)
    progress.begin(f"{TP}: under way")
    compaction = progress.compaction(TP)
    clock.sleep(250)
    compaction(17 << 20, 40 << 20)
    assert take(out) == f"{CLEAR}[{'.' * 30}] 0/3 partitions; changelog-0: compacting 42% (17/40 MB), 0s"
    clock.sleep(100)
    compaction(18 << 20, 40 << 20)
    progress.tick()
    assert take(out) == ""  # 0.1 s after the last redraw
    clock.sleep(100)
    compaction(20 << 20, 40 << 20)
    assert take(out) == f"{CLEAR}[{'.' * 30}] 0/3 partitions; changelog-0: compacting 50% (20/40 MB), 0s"
    clock.sleep(2000)
    progress.tick()  # the work says nothing (a kernel compiling): the bar still moves, its time goes on
    assert take(out) == f"{CLEAR}[{'.' * 30}] 0/3 partitions; changelog-0: compacting 50% (20/40 MB), 2s"

    progress.report(done_report())  # the partition's own line, as before, then the bar alone
    assert take(out) == f"{CLEAR}{done_report().line()}\n[{'#' * 10}{'.' * 20}] 1/3 partitions"
    assert "\n" not in done_report().line()
    clock.sleep(5000)
    progress.tick()
    assert take(out) == ""  # between partitions: nothing under way


def test_elsewhere_a_plain_line_at_most_every_five_seconds():
    clock, out = MockTime(), io.StringIO()
    progress = _Progress(out, 2, time=clock)
    clock.sleep(60_000)  # (a table pass before the partitions: not the partition's time)
    progress.begin(f"{TP}: under way")
    compaction = progress.compaction(TP)
    for done in range(0, 40, 10):  # 4 s of reports
        compaction(done, 100)
        clock.sleep(1000)
    assert take(out) == ""
    clock.sleep(999)
    compaction(55, 100)
    assert take(out) == ""  # 4.999 s
    clock.sleep(1)
    compaction(60, 100)
    assert take(out) == "changelog-0: compacting 60% (60/100 bytes), 5s\n"
    clock.sleep(4000)
    compaction(80, 100)
    progress.tick()
    assert take(out) == ""
    clock.sleep(1000)
    progress.tick()  # nothing new from the work for 5 s: the line again, later
    assert take(out) == "changelog-0: compacting 80% (80/100 bytes), 10s\n"

    progress.report(done_report())
    assert take(out) == done_report().line() + "\n"  # the final line as before: no bar, no escapes
    other = TopicPartition("changelog", 1)
    progress.begin(f"{other}: under way")
    clock.sleep(4999)
    progress.tick()
    assert take(out) == ""
    clock.sleep(1)
    progress.tick()
    assert take(out) == "changelog-1: under way, 5s\n"


def test_ticking_runs_a_thread_only_while_the_partitions_run():
    def ticker_alive() -> bool:
        return any(t.name == "kafkalog-maintenance-progress" for t in threading.enumerate())

    progress = _Progress(io.StringIO(), 1, time=MockTime())
    with progress.ticking():
        assert ticker_alive()
    assert not ticker_alive()


@pytest.fixture
def stepping_clock(monkeypatch):
    """The pass's _Progress on a MockTime that moves 2 s at each read (so a line every third read), and no
    ticking thread (one tick an hour): the output depends only on the work's own reports."""
    clock = MockTime(auto_tick_ms=2000)
    monkeypatch.setattr(maintenance, "PROGRESS_TIME", clock)
    monkeypatch.setattr(_Progress, "TICK_S", 3600.0)
    return clock


def test_a_pass_prints_each_partitions_compaction_as_it_goes(root, stepping_clock):
    lm = LogManager(root)
    lm.create_topic(TP.topic, 2, {"cleanup.policy": "compact", "segment.bytes": "600"})
    for p in range(2):
        with lm.open_log(TopicPartition(TP.topic, p), writable=True) as log:
            for b in range(30):
                log.append(kp_batch([(0, f"k{(5 * b + i) % 10}".encode(), b"v" * 20, []) for i in range(5)]))
            log.roll()
    out = io.StringIO()
    reports = run_once(root, out=out)
    assert not reports.failed and all(r.cleaned for r in reports)

    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("maintenance pass: 2 partition(s), 0 failed")
    start = 0
    for rep in reports:
        final = lines.index(rep.line())  # the partition's line, unchanged, after its progress lines
        step = re.compile(f"{rep.topic}-{rep.partition}" + r": compacting (\d+)% \((\d+)/(\d+) kB\), (\d+)s")
        steps = [step.fullmatch(line) for line in lines[start:final]]
        assert len(steps) >= 3 and all(steps), lines
        pcts, secs = [int(m[1]) for m in steps], [int(m[4]) for m in steps]  # type: ignore[index]
        assert pcts == sorted(pcts) and secs == sorted(secs) and secs[0] >= 5
        start = final + 1
