"""Retention (Kafka's deleteOldSegments), `.deleted` files, delete-records and topic deletion.

References are independent: kafka-python parses the segment files (record timestamps, offsets), a
plain-Python model states Kafka's three retention rules declaratively, checkpoint files are read as
text, and the `kafkalog` CLI runs in-process as a user would run it.
"""

from __future__ import annotations

import io
import json
import os
import threading
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import storage.log_manager as log_manager_module
from kafkalog_ds.cli import main
from storage.errors import LogLockedError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from storage.log_manager import LogManager
from storage.log_retention import (
    DELETE_MARKER_FILE,
    REASON_LOG_START_OFFSET,
    REASON_RETENTION_BYTES,
    REASON_RETENTION_MS,
)
from storage.topic_partition import TopicPartition, parse_log_dir_name, parse_segment_file
from storage.transactions.transaction_index import AbortedTxn, TransactionIndex
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
NOW = 1_700_000_000_000
HOUR = 3_600_000


# ---------------------------------------------------------------- helpers


def build(lm: LogManager, layout: list[list[int]], config: dict | None = None, tp: TopicPartition = TP) -> None:
    """One segment per list of record timestamps (one single-record batch each); the last list is the
    active segment (it may be empty). Timestamps are CreateTime values in the past."""
    lm.create_topic(tp.topic, tp.partition + 1, config or {})
    with lm.open_log(tp, writable=True) as log:
        for i, stamps in enumerate(layout):
            if i:
                log.roll()
            for ts in stamps:
                log.append(kp_batch([(ts, b"k", b"v" * 30, [])]))


def files_of(lm: LogManager, tp: TopicPartition = TP) -> list[str]:
    return sorted(f.name for f in lm.fs.listdir(lm.partition_dir(tp)) if not f.is_dir)


def live_segments(lm: LogManager, tp: TopicPartition = TP) -> list[dict]:
    """Base offset, size and largest record timestamp of every live .log, as kafka-python reads the files."""
    out = []
    d = lm.partition_dir(tp)
    for name in files_of(lm, tp):
        parsed = parse_segment_file(name)
        if parsed is None or parsed.suffix != ".log" or parsed.extra:
            continue
        data = lm.fs.read(lm.fs.join(d, name))
        batches = kp_parse(data)
        out.append(
            {
                "base": parsed.base_offset,
                "size": len(data),
                "max_ts": max((b["max_timestamp"] for b in batches), default=-1),
                "offsets": [r[0] for b in batches for r in b["records"]],
            }
        )
    return out


def model(
    segs: list[dict], log_start: int, *, delete: bool, retention_ms: int, retention_bytes: int, now: int
) -> tuple[list[int], bool]:
    """Kafka's rules stated as prefixes: (deleted base offsets, rolled). segs: live segments, active last."""
    deleted: list[int] = []
    rolled = False

    def keep_empty_active(k: int, rest: list[dict]) -> int:
        return k - 1 if k == len(rest) and rest[-1]["size"] == 0 else k

    rest = list(segs)
    # 1. segments whose successor starts at or below the log start offset
    k = 0
    while k + 1 < len(rest) and rest[k + 1]["base"] <= log_start:
        k += 1
    deleted += [s["base"] for s in rest[:k]]
    rest = rest[k:]
    log_start = max(log_start, rest[0]["base"])
    if delete and retention_bytes >= 0:
        total = sum(s["size"] for s in rest)
        if total >= retention_bytes:
            prefix = [sum(s["size"] for s in rest[:i]) for i in range(len(rest) + 1)]
            k = max(i for i in range(len(rest) + 1) if prefix[i] <= total - retention_bytes)
            k = keep_empty_active(k, rest)
            deleted += [s["base"] for s in rest[:k]]
            rolled |= k == len(rest)
            rest = rest[k:]
    if delete and retention_ms >= 0 and rest and not rolled:
        k = 0
        while k < len(rest) and now - rest[k]["max_ts"] > retention_ms:
            k += 1
        k = keep_empty_active(k, rest)
        deleted += [s["base"] for s in rest[:k]]
        rolled |= k == len(rest)
    return deleted, rolled


def run(capsys, *argv):
    rc = main(list(argv), stdin=io.BytesIO(b""))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def consume_offsets(capsys, root, *extra, topic="t"):
    rc, out, err = run(capsys, "consume", root, "--topic", topic, *extra)
    assert rc == 0, err
    return [json.loads(line)["offset"] for line in out.splitlines()]


def checkpoint_text(lm: LogManager, name: str, log_dir: str | None = None) -> dict:
    """A checkpoint file read as plain text: {(topic, partition): offset}."""
    path = lm.fs.join(log_dir or lm.root, name)
    if not lm.fs.exists(path):
        return {}
    lines = lm.fs.read(path).decode().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2
    return {(t, int(p)): int(o) for t, p, o in (line.split() for line in lines[2:])}


# ---------------------------------------------------------------- retention.ms


def test_retention_ms_deletes_the_expired_prefix_by_record_timestamps(capsys, root):
    lm = LogManager(root)
    old, new = NOW - 10 * HOUR, NOW - HOUR
    # segment 2 is old again but sits behind a newer one: Kafka stops at the first segment it keeps
    build(lm, [[old, old], [old], [new - 5, old], [old], [new]], {"retention.ms": str(5 * HOUR)})
    before = live_segments(lm)
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.deleted_base_offsets == [0, 2] and result.reasons == {REASON_RETENTION_MS: 2}
    assert not result.rolled and result.segments_deleted == 2
    assert result.bytes_before == sum(s["size"] for s in before)
    assert result.bytes_after == sum(s["size"] for s in before[2:])
    assert result.log_start_offset_before == 0 and result.log_start_offset == 3
    assert [s["base"] for s in live_segments(lm)] == [3, 5, 6]
    names = files_of(lm)
    for base in (0, 2):
        for suffix in (".log", ".index", ".timeindex"):
            assert f"{base:020d}{suffix}.deleted" in names and f"{base:020d}{suffix}" not in names
    assert consume_offsets(capsys, root, "--offset", "earliest") == [3, 4, 5, 6]
    assert checkpoint_text(lm, "log-start-offset-checkpoint")[("t", 0)] == 3
    with lm.open_log(TP) as log:
        assert log.log_start_offset == 3
        with pytest.raises(OffsetOutOfRangeError, match="log start offset 3"):
            list(log.read_records(2))


def test_a_segment_holding_a_record_newer_than_retention_is_kept(root):
    lm = LogManager(root)
    retention = 5 * HOUR
    edge = NOW - retention  # now - ts == retention.ms: not yet past it
    build(lm, [[NOW - 9 * HOUR, edge], [NOW - 9 * HOUR], [NOW]], {"retention.ms": str(retention)})
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.segments_deleted == 0 and result.log_start_offset == 0
    assert lm.apply_retention(TP, now_ms=NOW + 1).deleted_base_offsets == [0, 2]


def test_retention_uses_record_timestamps_not_file_mtimes(root):
    lm = LogManager(root)
    build(lm, [[NOW - HOUR], [NOW - 10 * HOUR], [NOW]], {"retention.ms": str(5 * HOUR)})
    d = lm.partition_dir(TP)
    for name in files_of(lm):  # the files look ancient; segment 0's record is recent, so nothing expires
        os.utime(os.path.join(d, name), (1, 1))
    assert lm.apply_retention(TP, now_ms=NOW).segments_deleted == 0


def test_every_segment_expired_rolls_first_and_the_log_continues(capsys, root):
    lm = LogManager(root)
    old = NOW - 10 * HOUR
    build(lm, [[old], [old, old], [old]], {"retention.ms": str(HOUR)})
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.rolled and result.deleted_base_offsets == [0, 1, 3] and result.log_start_offset == 4
    assert result.bytes_after == 0
    assert live_segments(lm) == [{"base": 4, "size": 0, "max_ts": -1, "offsets": []}]
    assert consume_offsets(capsys, root) == []
    with lm.open_log(TP, writable=True) as log:
        assert log.append(kp_batch([(NOW, b"k", b"v", [])])).first_offset == 4
    assert consume_offsets(capsys, root) == [4]
    # the new active segment is never deleted while it is empty, and is rolled again once it has expired
    assert lm.apply_retention(TP, now_ms=NOW + 2 * HOUR).deleted_base_offsets == [4]
    assert lm.apply_retention(TP, now_ms=NOW + 3 * HOUR).segments_deleted == 0


def test_an_empty_active_segment_stays_and_nothing_is_rolled(root):
    lm = LogManager(root)
    old = NOW - 10 * HOUR
    build(lm, [[old], [old], []], {"retention.ms": str(HOUR)})
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.deleted_base_offsets == [0, 1] and not result.rolled and result.log_start_offset == 2
    assert [s["base"] for s in live_segments(lm)] == [2]


# ---------------------------------------------------------------- retention.bytes and the log start offset


def test_retention_bytes_deletes_oldest_while_the_rest_stays_at_or_above_the_limit(root):
    lm = LogManager(root)
    build(lm, [[NOW], [NOW, NOW], [NOW], [NOW]], {"retention.bytes": "1"})
    segs = live_segments(lm)
    total = sum(s["size"] for s in segs)
    lm.alter_topic_config("t", {"retention.bytes": str(total - segs[0]["size"] - segs[1]["size"])})
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.deleted_base_offsets == [0, 1] and result.reasons == {REASON_RETENTION_BYTES: 2}
    assert result.bytes_after == total - segs[0]["size"] - segs[1]["size"]
    lm.alter_topic_config("t", {"retention.bytes": str(result.bytes_after - 1)})  # one byte over: nothing fits
    assert lm.apply_retention(TP, now_ms=NOW).segments_deleted == 0
    lm.alter_topic_config("t", {"retention.bytes": "0"})  # everything goes, the active segment by a roll
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.rolled and result.deleted_base_offsets == [3, 4] and result.log_start_offset == 5


@pytest.mark.parametrize("policy", ["delete", "compact"])
def test_segments_below_the_log_start_offset_go_under_any_policy(capsys, root, policy):
    lm = LogManager(root)
    build(lm, [[NOW, NOW, NOW], [NOW, NOW], [NOW, NOW], [NOW]], {"cleanup.policy": policy})
    assert lm.delete_records(TP, 6) == 6  # inside segment 5..6: 0..2 and 3..4 are wholly below it
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.deleted_base_offsets == [0, 3] and result.reasons == {REASON_LOG_START_OFFSET: 2}
    assert result.log_start_offset == 6  # stays above the new first segment's base (5)
    assert consume_offsets(capsys, root) == [6, 7]


def test_compact_policy_ignores_time_and_size_retention(root):
    lm = LogManager(root)
    build(lm, [[1], [1], [1]], {"cleanup.policy": "compact", "retention.ms": "0", "retention.bytes": "0"})
    assert lm.apply_retention(TP, now_ms=NOW).segments_deleted == 0
    lm.alter_topic_config("t", {"cleanup.policy": "compact,delete"})
    assert lm.apply_retention(TP, now_ms=NOW).rolled


def test_unlimited_retention_deletes_nothing(root):
    lm = LogManager(root)
    build(lm, [[1], [1], [1]], {"retention.ms": "-1", "retention.bytes": "-1"})
    assert lm.apply_retention(TP, now_ms=NOW).segments_deleted == 0


layouts = st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=3), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=layouts,
    empty_active=st.booleans(),
    start_frac=st.floats(0, 1),
    policy=st.sampled_from(["delete", "compact", "compact,delete"]),
    ms=st.one_of(st.just(-1), st.integers(0, 22)),
    bytes_frac=st.one_of(st.just(-1.0), st.floats(0, 1.2)),
)
def test_retention_equals_the_model(layout, empty_active, start_frac, policy, ms, bytes_frac):
    lm = LogManager(f"memory://kl-{uuid.uuid4().hex}")
    stamps = [[NOW - 1000 * t for t in seg] for seg in layout] + ([[]] if empty_active else [])
    build(lm, stamps, {"cleanup.policy": policy})
    segs = live_segments(lm)
    leo = sum(len(s) for s in layout)
    start = int(start_frac * leo)
    lm.delete_records(TP, start)
    total = sum(s["size"] for s in segs)
    retention_bytes = -1 if bytes_frac < 0 else int(bytes_frac * total)
    retention_ms = -1 if ms < 0 else ms * 1000
    lm.alter_topic_config("t", {"retention.ms": str(retention_ms), "retention.bytes": str(retention_bytes)})
    expected, rolled = model(
        segs, start, delete="delete" in policy, retention_ms=retention_ms, retention_bytes=retention_bytes, now=NOW
    )
    result = lm.apply_retention(TP, now_ms=NOW)
    assert result.deleted_base_offsets == expected and result.rolled == rolled
    left = live_segments(lm)
    assert [s["base"] for s in left] == ([leo] if rolled else [s["base"] for s in segs if s["base"] not in expected])
    new_start = leo if rolled else max(start, left[0]["base"])
    assert result.log_start_offset == new_start
    with lm.open_log(TP) as log:
        assert log.log_start_offset == new_start and log.log_end_offset == leo
        got = [o for b in log.read_records(log.log_start_offset) for o in b.column("offset").to_pylist()]
    assert got == list(range(new_start, leo))


# ---------------------------------------------------------------- locking and .deleted files


def test_the_partition_lock_is_taken_only_to_delete(root):
    lm = LogManager(root)
    build(lm, [[NOW - 10 * HOUR], [NOW]], {"retention.ms": str(20 * HOUR)})
    with lm.open_log(TP, writable=True):  # a writer (a sink commit) holds the partition
        assert lm.apply_retention(TP, now_ms=NOW, lock_timeout=0).segments_deleted == 0  # nothing to do: no lock
        lm.alter_topic_config("t", {"retention.ms": str(HOUR)})
        with pytest.raises(LogLockedError):
            lm.apply_retention(TP, now_ms=NOW, lock_timeout=0)
        [skipped] = lm.retention_pass(now_ms=NOW, lock_timeout=0)
        assert skipped.skipped and skipped.segments_deleted == 0
    [done] = lm.retention_pass(now_ms=NOW)
    assert done.deleted_base_offsets == [0] and done.skipped is None


def test_deleted_files_are_removed_only_after_file_delete_delay(root):
    lm = LogManager(root)
    build(lm, [[1], [1], [NOW]], {"retention.ms": str(HOUR), "file.delete.delay.ms": "30000"})
    lm.apply_retention(TP, now_ms=NOW)
    d = lm.partition_dir(TP)
    deleted = [n for n in files_of(lm) if n.endswith(".deleted")]
    assert len(deleted) == 6
    touched = [lm.fs.modified_ms(lm.fs.join(d, n)) for n in deleted]
    assert lm.remove_expired_deleted_files(TP, now_ms=min(touched) + 29_999) == []
    assert lm.remove_expired_deleted_files(TP, now_ms=max(touched) + 30_000) == sorted(deleted)
    assert not any(n.endswith(".deleted") for n in files_of(lm))
    assert [s["base"] for s in live_segments(lm)] == [2]


def test_renamed_files_are_touched_so_the_delay_counts_from_deletion(root):
    lm = LogManager(root)
    build(lm, [[1], [NOW]], {"retention.ms": str(HOUR)})
    d = lm.partition_dir(TP)
    for name in files_of(lm):
        os.utime(os.path.join(d, name), (1, 1))  # written long ago
    lm.apply_retention(TP, now_ms=NOW)
    assert all(lm.fs.modified_ms(lm.fs.join(d, n)) > 1000 for n in files_of(lm) if n.endswith(".deleted"))
    with lm.open_log(TP, writable=True):  # nor does a writer's loader remove them before the delay
        pass
    assert len([n for n in files_of(lm) if n.endswith(".deleted")]) == 3


def test_a_segments_txnindex_goes_with_it(any_root):
    """Kafka's LogSegment renames and deletes its `.txnindex` with its other files."""
    lm = LogManager(any_root)
    build(lm, [[1], [1], [NOW]], {"retention.ms": str(HOUR), "file.delete.delay.ms": "0"})
    d = lm.partition_dir(TP)
    for base in (0, 2):
        index = TransactionIndex.for_segment(lm.fs, d, base)
        index.append(AbortedTxn(producer_id=7, first_offset=base, last_offset=base, last_stable_offset=base))
        index.flush()
        index.close()
    lm.apply_retention(TP, now_ms=NOW)
    names = files_of(lm)
    assert "00000000000000000000.txnindex.deleted" in names and "00000000000000000000.txnindex" not in names
    assert "00000000000000000002.txnindex" in names  # the active segment's stays
    assert "00000000000000000000.txnindex.deleted" in lm.remove_expired_deleted_files(TP, now_ms=NOW + 10**12)
    assert not any(".txnindex" in n and not n.startswith("00000000000000000002") for n in files_of(lm))


# ---------------------------------------------------------------- delete-records


def test_delete_records_moves_the_start_and_readers_follow(capsys, root):
    lm = LogManager(root)
    lm.create_topic("t", 2)
    with lm.open_log(TP, writable=True) as log:
        log.append(kp_batch([(NOW, b"k", b"a", []), (NOW, b"k", b"b", []), (NOW, b"k", b"c", [])]))
        log.append(kp_batch([(NOW, b"k", b"d", [])]))
    rc, out, err = run(capsys, "delete-records", root, "--topic", "t", "--partition", "0", "--offset", "1")
    assert rc == 0, err
    assert out.splitlines()[-1] == "partition: t-0\tlow_watermark: 1"
    assert consume_offsets(capsys, root, "--partition", "0") == [1, 2, 3]  # from inside the first batch
    assert checkpoint_text(lm, "log-start-offset-checkpoint")[("t", 0)] == 1
    rc, out, err = run(capsys, "consume", root, "--topic", "t", "--partition", "0", "--offset", "0")
    assert rc == 1 and "log start offset 1" in err
    # a lower offset changes nothing; -1 means the high watermark (the log end)
    assert lm.delete_records(TP, 0) == 1
    rc, out, err = run(capsys, "delete-records", root, "--topic", "t", "--partition", "0", "--offset", "-1")
    assert rc == 0 and out.splitlines()[-1] == "partition: t-0\tlow_watermark: 4"
    assert consume_offsets(capsys, root, "--partition", "0") == []
    with lm.open_log(TP, writable=True) as log:
        assert log.append(kp_batch([(NOW, b"k", b"e", [])])).first_offset == 4
    assert consume_offsets(capsys, root, "--partition", "0") == [4]
    assert consume_offsets(capsys, root, "--partition", "1") == []


def test_delete_records_errors(capsys, root):
    lm = LogManager(root)
    build(lm, [[NOW, NOW, NOW]])
    rc, out, err = run(capsys, "delete-records", root, "--topic", "t", "--partition", "0", "--offset", "9")
    assert rc == 1
    assert "topic 't' partition 0" in err and "offset 9" in err and "log end offset (high watermark) 3" in err
    assert checkpoint_text(lm, "log-start-offset-checkpoint").get(("t", 0), 0) == 0
    rc, out, err = run(capsys, "delete-records", root, "--topic", "t", "--partition", "0", "--offset", "-2")
    assert rc == 2
    rc, out, err = run(capsys, "delete-records", root, "--topic", "nope", "--partition", "0", "--offset", "0")
    assert rc == 1 and "'nope' does not exist" in err
    rc, out, err = run(capsys, "delete-records", root, "--topic", "t", "--partition", "5", "--offset", "0")
    assert rc == 1 and "partition 5 does not exist" in err
    with pytest.raises(OffsetOutOfRangeError, match="-7"):
        lm.delete_records(TP, -7)


# ---------------------------------------------------------------- topic deletion


def delete_dirs(lm: LogManager) -> list[str]:
    return sorted(
        f.name
        for d in lm.log_dirs
        for f in lm.fs.listdir(d)
        if f.is_dir and (parse_log_dir_name(f.name) or (None, None))[1] == "delete"
    )


def test_delete_topic_renames_every_partition_and_forgets_the_topic(capsys, any_root):
    lm = LogManager(any_root)
    build(lm, [[NOW, NOW]], {"file.delete.delay.ms": "5000"}, tp=TopicPartition("t", 2))  # topic t, 3 partitions
    lm.create_topic("keep", 1)
    lm.delete_records(TopicPartition("t", 2), 1)
    assert ("t", 2) in checkpoint_text(lm, "recovery-point-offset-checkpoint")
    rc, out, err = run(capsys, "topics", any_root, "--delete", "--topic", "t")
    assert rc == 0 and out == "Topic t is marked for deletion.\n"
    gone = delete_dirs(lm)
    assert sorted(parse_log_dir_name(n).topic_partition for n in gone) == [TopicPartition("t", p) for p in range(3)]
    assert lm.topics() == ["keep"]
    assert not lm.fs.exists(lm.fs.join(lm.root, "t.kafkalog-topic.json"))
    for writable in (False, True):
        with pytest.raises(UnknownTopicOrPartitionError):
            lm.open_log(TopicPartition("t", 0), writable=writable)
    rc, out, err = run(capsys, "consume", any_root, "--topic", "t")
    assert rc == 1 and "'t' does not exist" in err
    assert not any(
        k[0] == "t"
        for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint")
        for k in checkpoint_text(lm, name)
    )
    # the data is still there until the delay passes
    victim = [n for n in gone if n.startswith("t-2.")][0]
    data = lm.fs.read(lm.fs.join(lm.root, victim, f"{0:020d}.log"))
    assert [r[0] for b in kp_parse(data) for r in b["records"]] == [0, 1]
    # a topic of the same name starts afresh (no stale log start offset)
    lm.create_topic("t", 3)
    with lm.open_log(TopicPartition("t", 2)) as log:
        assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    rc, out, err = run(capsys, "topics", any_root, "--delete", "--topic", "nope")
    assert rc == 1 and "'nope' does not exist" in err
    assert run(capsys, "topics", any_root, "--delete", "--topic", "nope", "--if-exists")[0] == 0


def test_delete_dirs_are_removed_after_the_topics_delay(root):
    lm = LogManager(root)
    lm.create_topic("t", 2, {"file.delete.delay.ms": "5000"})
    lm.delete_topic("t", now_ms=NOW)
    assert len(delete_dirs(lm)) == 2
    marker = json.loads(lm.fs.read(lm.fs.join(lm.root, delete_dirs(lm)[0], DELETE_MARKER_FILE)))
    assert marker["deleteTimeMs"] == NOW and marker["fileDeleteDelayMs"] == 5000
    assert lm.remove_deleted_topic_dirs(now_ms=NOW + 4999) == []
    assert len(lm.remove_deleted_topic_dirs(now_ms=NOW + 5000)) == 2
    assert delete_dirs(lm) == [] and not [n for n in os.listdir(root) if n.startswith("t")]


def test_a_delete_dir_without_marker_counts_from_its_mtime(root):
    lm = LogManager(root)
    kafka_made = os.path.join(root, "t-0.0123456789abcdef0123456789abcdef-delete")
    os.makedirs(kafka_made)
    mtime = lm.fs.modified_ms(kafka_made)
    assert lm.remove_deleted_topic_dirs(now_ms=mtime + 59_999) == []
    assert lm.remove_deleted_topic_dirs(now_ms=mtime + 60_000) == [kafka_made]


def test_delete_topic_fails_cleanly_while_a_writer_holds_a_partition(root):
    lm = LogManager(root)
    build(lm, [[NOW]], tp=TopicPartition("t", 1))
    with lm.open_log(TopicPartition("t", 1), writable=True):
        with pytest.raises(LogLockedError, match="partition 1 .*nothing was deleted"):
            lm.delete_topic("t", lock_timeout=0.05)
    assert lm.topics() == ["t"] and delete_dirs(lm) == []
    with lm.open_log(TopicPartition("t", 1)) as log:
        assert log.log_end_offset == 1


def test_delete_topic_waits_for_a_commit_and_renames_under_the_lock(any_root, monkeypatch):
    lm = LogManager(any_root)
    build(lm, [[NOW]])
    held = []
    real = log_manager_module._rename_dir

    def checked_rename(fs, src, dst):
        try:
            with fs.lock(fs.join(src, ".lock"), timeout=0):
                held.append(False)
        except LogLockedError:
            held.append(True)
        real(fs, src, dst)

    monkeypatch.setattr(log_manager_module, "_rename_dir", checked_rename)
    writer = lm.open_log(TP, writable=True)
    done = []
    deleter = threading.Thread(target=lambda: done.append(lm.delete_topic("t", lock_timeout=None)))
    deleter.start()
    for _i in range(20):  # the commit goes on while the deletion waits; each append may roll
        writer.append(kp_batch([(NOW, b"k", b"x" * 100, [])]))
    writer.close()
    deleter.join()
    assert held == [True] and len(done[0]) == 1
    offsets = []
    for name in sorted(f.name for f in lm.fs.listdir(done[0][0])):
        if name.endswith(".log"):
            offsets += [r[0] for b in kp_parse(lm.fs.read(lm.fs.join(done[0][0], name))) for r in b["records"]]
    assert offsets == list(range(21))


def test_a_writer_waiting_for_the_lock_of_a_deleted_partition_fails_cleanly(any_root):
    lm = LogManager(any_root)
    build(lm, [[NOW]])
    dir = lm.partition_dir(TP)
    outcome = []

    def writer():
        try:
            with lm.open_log(TP, writable=True, lock_timeout=None):
                outcome.append("opened")
        except Exception as e:  # noqa: BLE001 - the test records whatever it is
            outcome.append(e)

    with lm.fs.lock(lm.fs.join(dir, ".lock")):  # deletion holds the partition lock...
        t = threading.Thread(target=writer)
        t.start()
        lm.fs.delete(lm.fs.join(lm.root, "t.kafkalog-topic.json"))  # ...removes the topic...
        log_manager_module._rename_dir(lm.fs, dir, lm.fs.join(lm.root, "t-0.abc-delete"))  # ...renames the dir
    t.join()
    assert len(outcome) == 1 and isinstance(outcome[0], UnknownTopicOrPartitionError), outcome
    assert not lm.fs.isdir(dir) and lm.topics() == []  # nothing recreated


@pytest.mark.parametrize("round", range(4))
def test_racing_writer_and_deletion_end_in_one_clean_state(any_root, round):
    lm = LogManager(any_root)
    build(lm, [[NOW]])
    first = lm.open_log(TP, writable=True)
    outcome, done = [], []

    def writer():
        try:
            log = lm.open_log(TP, writable=True, lock_timeout=None)
        except Exception as e:  # noqa: BLE001
            outcome.append(e)
            return
        log.append(kp_batch([(NOW, b"k", b"late", [])]))
        log.close()
        outcome.append("appended")

    threads = [
        threading.Thread(target=writer),
        threading.Thread(target=lambda: done.append(lm.delete_topic("t", lock_timeout=None))),
    ]
    for t in threads[:: 1 if round % 2 else -1]:
        t.start()
    first.close()
    for t in threads:
        t.join()
    assert outcome == ["appended"] or isinstance(outcome[0], UnknownTopicOrPartitionError), outcome
    assert len(done) == 1 and lm.topics() == [] and not lm.fs.isdir(lm.fs.join(lm.root, "t-0"))
