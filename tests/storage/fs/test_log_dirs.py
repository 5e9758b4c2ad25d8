"""Several log dirs, as Kafka's log.dirs: placement, lookup, duplicates, per-dir checkpoints, deletion.

References: a plain model of "fewest partitions first, ties to the first listed", the directory tree
as the OS lists it, checkpoint files read as text, and kafka-python parsing the segments.
"""

from __future__ import annotations

import io
import json
import os
import uuid

import pytest

from kafkalog_ds.cli import main
from storage.errors import InvalidConfigError, KafkaStorageError
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition, parse_log_dir_name
from tests.helpers.kafka_reference import kp_batch, kp_parse

NOW = 1_700_000_000_000


@pytest.fixture
def dirs(tmp_path):
    return [str(tmp_path / name) for name in ("a", "b", "c")]


def placed(dirs: list[str]) -> dict[TopicPartition, str]:
    """Which dir holds each live partition directory, from the OS listing."""
    out = {}
    for d in dirs:
        for name in os.listdir(d) if os.path.isdir(d) else []:
            parsed = parse_log_dir_name(name)
            if parsed is not None and parsed.kind == "live" and os.path.isdir(os.path.join(d, name)):
                assert parsed.topic_partition not in out, f"{parsed.topic_partition} in two dirs"
                out[parsed.topic_partition] = d
    return out


def model_placement(dirs: list[str], existing: dict[str, int], new: list[TopicPartition]) -> dict:
    counts = dict(existing)
    out = {}
    for tp in new:
        best = sorted(dirs, key=lambda d: (counts[d], dirs.index(d)))[0]
        counts[best] += 1
        out[tp] = best
    return out


def checkpoint_text(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    lines = open(path).read().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2
    return {(t, int(p)): int(o) for t, p, o in (line.split() for line in lines[2:])}


def run(capsys, *argv):
    rc = main(list(argv), stdin=io.BytesIO(b""))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_root_keeps_meaning_the_first_dir(dirs, root):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    assert lm.root == dirs[0] and lm.log_dirs == dirs
    assert lm.url() == "log.dirs=" + ",".join(dirs)
    single = LogManager(root)
    assert single.log_dirs == [single.root] and single.url() == single.root
    spaced = LogManager("log.dirs=" + " , ".join(dirs) + "/")
    assert spaced.log_dirs == dirs


def test_new_partitions_go_to_the_dir_with_fewest(dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("x", 5)
    want = model_placement(dirs, {d: 0 for d in dirs}, [TopicPartition("x", p) for p in range(5)])
    assert placed(dirs) == want
    counts = {d: list(want.values()).count(d) for d in dirs}
    lm.create_topic("y", 4)
    want.update(model_placement(dirs, counts, [TopicPartition("y", p) for p in range(4)]))
    assert placed(dirs) == want
    # a Kafka-style dir added by hand counts too
    os.makedirs(os.path.join(dirs[2], "z-0"))
    os.makedirs(os.path.join(dirs[2], "z-1"))
    counts = {d: list(placed(dirs).values()).count(d) for d in dirs}
    lm.create_topic("w", 2)
    assert {tp: d for tp, d in placed(dirs).items() if tp.topic == "w"} == model_placement(
        dirs, counts, [TopicPartition("w", 0), TopicPartition("w", 1)]
    )
    # topic files live in the first dir only
    assert sorted(n for n in os.listdir(dirs[0]) if n.endswith(".kafkalog-topic.json")) == [
        "w.kafkalog-topic.json",
        "x.kafkalog-topic.json",
        "y.kafkalog-topic.json",
    ]
    assert not any(n.endswith(".json") for d in dirs[1:] for n in os.listdir(d))


def test_partitions_are_found_in_any_dir_and_checkpoints_are_per_dir(capsys, dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("t", 3)
    where = placed(dirs)
    for p in range(3):
        tp = TopicPartition("t", p)
        assert lm.partition_dir(tp) == os.path.join(where[tp], f"t-{p}")
        assert lm.log_dir_of(tp) == where[tp]
        with lm.open_log(tp, writable=True) as log:
            log.append(kp_batch([(NOW, b"k", str(p).encode() * (p + 1), [])] * (p + 1)))
    for p in range(3):
        tp = TopicPartition("t", p)
        data = open(os.path.join(where[tp], f"t-{p}", f"{0:020d}.log"), "rb").read()
        assert [r[3] for b in kp_parse(data) for r in b["records"]] == [str(p).encode() * (p + 1)] * (p + 1)
    rc, out, err = run(capsys, "consume", "log.dirs=" + ",".join(dirs), "--topic", "t")
    assert rc == 0, err
    assert [(json.loads(line)["partition"], json.loads(line)["offset"]) for line in out.splitlines()] == [
        (0, 0),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
        (2, 2),
    ]
    doc = lm.describe()
    assert [(p.partition, p.log_dir, p.log_end_offset) for p in doc.topics[0].partitions] == [
        (p, where[TopicPartition("t", p)], p + 1) for p in range(3)
    ]
    for d in dirs:
        mine = {(tp.topic, tp.partition) for tp, holder in where.items() if holder == d}
        assert set(checkpoint_text(os.path.join(d, "recovery-point-offset-checkpoint"))) == mine
    # delete-records lands in the holder's log-start-offset-checkpoint and is read back from there
    tp = TopicPartition("t", 2)
    assert lm.delete_records(tp, 2) == 2
    for d in dirs:
        assert (("t", 2) in checkpoint_text(os.path.join(d, "log-start-offset-checkpoint"))) == (d == where[tp])
    with LogManager("log.dirs=" + ",".join(dirs)).open_log(tp) as log:
        assert log.log_start_offset == 2
    assert json.loads(run(capsys, "describe", "log.dirs=" + ",".join(dirs), "--json")[1])[
        "root"
    ] == "log.dirs=" + ",".join(dirs)


def test_a_topic_file_in_another_dir_is_read(dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("t", 2, {"retention.ms": "1234"})
    os.rename(os.path.join(dirs[0], "t.kafkalog-topic.json"), os.path.join(dirs[1], "t.kafkalog-topic.json"))
    again = LogManager("log.dirs=" + ",".join(dirs))
    assert again.topics() == ["t"] and again.topic("t").config.retention_ms == 1234
    again.alter_topic_config("t", {"retention.ms": "99"})
    assert LogManager("log.dirs=" + ",".join(dirs)).topic("t").config.retention_ms == 99
    assert not os.path.exists(os.path.join(dirs[0], "t.kafkalog-topic.json"))


def test_the_same_partition_in_two_dirs_is_an_error_naming_both(capsys, dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("t", 1)
    holder = placed(dirs)[TopicPartition("t", 0)]
    other = [d for d in dirs if d != holder][0]
    os.makedirs(os.path.join(other, "t-0"))
    for call in (
        lambda: lm.open_log(TopicPartition("t", 0)),
        lambda: lm.describe(),
        lambda: lm.partition_dir(TopicPartition("t", 0)),
    ):
        with pytest.raises(KafkaStorageError) as e:
            call()
        assert os.path.join(holder, "t-0") in str(e.value) and os.path.join(other, "t-0") in str(e.value)
    rc, out, err = run(capsys, "describe", "log.dirs=" + ",".join(dirs))
    assert rc == 1 and "two log dirs" in err


def test_bad_log_dir_lists(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(InvalidConfigError, match="same kind of filesystem"):
        LogManager(f"log.dirs={a},memory://x")
    with pytest.raises(InvalidConfigError, match="listed twice"):
        LogManager([a, b, a + "/"])
    with pytest.raises(InvalidConfigError, match="empty log dir"):
        LogManager(f"log.dirs={a},,{b}")


def test_a_comma_in_a_path_never_splits_it(tmp_path, monkeypatch, capsys):
    """Several log dirs are asked for explicitly (a list, or log.dirs=...): a ROOT with a comma is one
    directory, and nothing is created outside it (the old comma split made a lock in the working dir)."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    root = str(tmp_path / "logs,2024")
    assert run(capsys, "topics", root, "--create", "--topic", "t")[0] == 0
    assert main(["produce", root, "--topic", "t"], stdin=io.BytesIO(b'{"value": "v"}\n')) == 0
    lm = LogManager(root)
    assert lm.log_dirs == [root] and lm.url() == root
    assert os.path.isdir(os.path.join(root, "t-0")) and os.listdir(work) == []
    assert sorted(os.listdir(tmp_path)) == ["cwd", "logs,2024"]


def test_memory_log_dirs_and_the_cli(capsys):
    roots = [f"memory://kl-{uuid.uuid4().hex}" for _ in range(2)]
    root = "log.dirs=" + ",".join(roots)
    lines = "".join(json.dumps({"value": f"v{i}", "partition": i % 2}) + "\n" for i in range(4)).encode()
    assert run(capsys, "topics", root, "--create", "--topic", "m", "--partitions", "2")[0] == 0
    assert main(["produce", root, "--topic", "m"], stdin=io.BytesIO(lines)) == 0
    capsys.readouterr()
    lm = LogManager(root)
    assert [lm.log_dir_of(TopicPartition("m", p)) for p in range(2)] == ["/" + r.split("://")[1] for r in roots]
    rc, out, err = run(capsys, "consume", root, "--topic", "m")
    assert rc == 0 and [json.loads(line)["value"] for line in out.splitlines()] == ["v0", "v2", "v1", "v3"]


def test_deleting_a_topic_spread_over_dirs(capsys, dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("t", 4, {"file.delete.delay.ms": "10"})
    where = placed(dirs)
    with lm.open_log(TopicPartition("t", 3), writable=True) as log:
        log.append(kp_batch([(NOW, b"k", b"v", [])]))
    rc, out, err = run(capsys, "topics", "log.dirs=" + ",".join(dirs), "--delete", "--topic", "t")
    assert rc == 0, err
    assert placed(dirs) == {}
    for tp, d in where.items():  # each partition renamed inside its own log dir
        names = [n for n in os.listdir(d) if (parse_log_dir_name(n) or (None,))[0] == tp]
        assert len(names) == 1 and names[0].endswith("-delete")
    assert all(not checkpoint_text(os.path.join(d, "recovery-point-offset-checkpoint")) for d in dirs)
    removed = lm.remove_deleted_topic_dirs(now_ms=NOW * 2)
    assert len(removed) == 4 and not [n for d in dirs for n in os.listdir(d) if n.startswith("t-")]


def test_retention_with_several_dirs_writes_the_holders_checkpoint(dirs):
    lm = LogManager("log.dirs=" + ",".join(dirs))
    lm.create_topic("pad", 1)  # so the retained topic's partition lands in the second dir
    lm.create_topic("t", 1, {"retention.ms": "1000"})
    tp = TopicPartition("t", 0)
    holder = lm.log_dir_of(tp)
    assert holder == dirs[1]
    with lm.open_log(tp, writable=True) as log:
        log.append(kp_batch([(1, b"k", b"v", [])]))
        log.roll()
        log.append(kp_batch([(NOW, b"k", b"v", [])]))
    result = lm.apply_retention(tp, now_ms=NOW)
    assert result.deleted_base_offsets == [0] and result.log_start_offset == 1
    assert checkpoint_text(os.path.join(dirs[1], "log-start-offset-checkpoint")) == {("t", 0): 1}
    assert ("t", 0) not in checkpoint_text(os.path.join(dirs[0], "log-start-offset-checkpoint"))
