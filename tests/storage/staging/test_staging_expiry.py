"""Abandoned staging directories: a query stopped for good leaves `.kafkalog-staged-*` behind, and the
maintenance pass removes the staging of a writer with no trace younger than transactional.id.expiration.ms.
What a commit may still need (young staging, a writer with a younger attempt, a commit under way) is kept and
then commits whole; odd leftovers and races do no damage. File times are the store's wall clock, so the tests
move the pass's now_ms or back-date files (os.utime), never sleep."""

from __future__ import annotations

import io
import os
import shutil
import uuid
from datetime import datetime, timezone

import fsspec
import pyarrow as pa
import pytest

from kafkalog_ds.cli import main
from storage.common.time import SYSTEM_TIME
from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging import staging_expiry
from storage.staging.record_stager import RecordStager, staged_name
from storage.staging.staged_commit import STAGED_PREFIX, commit_staged
from storage.staging.staging_expiry import (
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG,
    expire_staging,
    staged_writer,
)
from storage.topic_partition import TopicPartition

EXP = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS  # 7 days, Kafka's default
DAY = 24 * 3600 * 1000
SLACK = 2_000  # file times may trail the clock a little (a coarse kernel clock, S3's whole seconds)
PARTITIONS = 2
W, V = 41, 42  # the writers


# ---------------------------------------------------------------- helpers


def rows(tag: str, n: int = 40) -> pa.Table:
    """n rows tagged `tag`, keyed so that both partitions get some."""
    return pa.table(
        {
            "key": pa.array([f"k{i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array([f"{tag}-{i}".encode() for i in range(n)], pa.binary()),
        }
    )


def stage(lm, writer: int, tag: str, task: int = 0):
    st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE, task_index=task)
    st.add(rows(tag))
    return st.finish()


def new_lm(root, fs=None) -> LogManager:
    lm = LogManager(root, fs=fs)
    lm.create_topic("t", PARTITIONS, {"retention.ms": "-1"})  # passes far in the future must not expire data
    return lm


def listing(lm) -> set[str]:
    """Every file under the root (relative paths), staging included."""
    fs, out = lm.fs, set()
    fs.invalidate_listings(lm.root)

    def walk(path: str, rel: str) -> None:
        for f in fs.listdir(path):
            if f.is_dir:
                walk(fs.join(path, f.name), f"{rel}{f.name}/")
            else:
                out.add(rel + f.name)

    walk(lm.root, "")
    return out


def staging(lm) -> set[str]:
    lm.fs.invalidate_listings(lm.root)
    return {f.name for f in lm.fs.listdir(lm.root) if f.name.startswith(STAGED_PREFIX)}


def tree_bytes(lm, name: str) -> int:
    fs = lm.fs

    def walk(path: str) -> int:
        return sum(walk(fs.join(path, f.name)) if f.is_dir else f.size for f in fs.listdir(path))

    path = fs.join(lm.root, name)
    return walk(path) if fs.isdir(path) else fs.size(path)


def backdate(root: str, name: str, ms: int) -> None:
    """Give every file (and directory) of a local staging entry the modification time `ms`."""
    top = os.path.join(root, name)
    for d, _, files in os.walk(top):
        for f in files:
            os.utime(os.path.join(d, f), (ms / 1000, ms / 1000))
        os.utime(d, (ms / 1000, ms / 1000))
    if not os.path.isdir(top):
        os.utime(top, (ms / 1000, ms / 1000))


def committed(lm) -> list[bytes]:
    out = []
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition("t", p)) as log:
            out += [
                v for b in log.read_records(0, isolation_level="read_committed") for v in b.column("value").to_pylist()
            ]
    return sorted(out)


def values(*tags: str) -> list[bytes]:
    return sorted(f"{tag}-{i}".encode() for tag in tags for i in range(40))


def run(lm, now: int, **settings):
    """One maintenance pass at `now` (also the lease's clock on object stores): its reports and output."""
    buf = io.StringIO()
    reps = run_once(lm.root, fs=lm.fs, now_ms=now, clock=lambda: now, cleaner_settings=settings or None, out=buf)
    assert not reps.failed, buf.getvalue()
    assert reps.staging is not None and not reps.staging.errors, buf.getvalue()
    return reps, buf.getvalue()


@pytest.fixture(params=["memory-objects", "s3"])
def object_lm(request):
    if request.param == "s3":
        root, opts = request.getfixturevalue("s3_root")
        lm = LogManager(root, opts)
        lm.create_topic("t", PARTITIONS, {"retention.ms": "-1"})
        return lm
    return new_lm(f"/obj-{uuid.uuid4().hex}", ObjectStoreFileSystem(fsspec.filesystem("memory")))


# ---------------------------------------------------------------- (1) a stopped query's leftover goes


def test_a_stopped_querys_staging_goes_once_its_writer_is_gone_past_the_expiration(any_root):
    lm = new_lm(any_root)
    commit_staged(lm, W, 0, [stage(lm, W, "b0")], transactional=True)
    before_staging = SYSTEM_TIME.milliseconds()
    left = {stage(lm, W, "b1", task=0).name, stage(lm, W, "b1", task=1).name}  # the query stops: no commit
    after_staging = SYSTEM_TIME.milliseconds()
    assert staging(lm) == left
    others = listing(lm) - {p for p in listing(lm) if p.startswith(STAGED_PREFIX)}
    size = sum(tree_bytes(lm, n) for n in left)

    reps, out = run(lm, before_staging + EXP - SLACK)  # just inside the expiration: kept
    assert staging(lm) == left and reps.staging.kept_live == 2 and not reps.staging.removed
    assert "staging" not in out

    reps, out = run(lm, after_staging + EXP + SLACK)  # no trace of the writer for longer: gone
    assert staging(lm) == set()
    assert sorted(reps.staging.removed) == sorted(lm.fs.url(lm.fs.join(lm.root, n)) for n in left)
    assert reps.staging.bytes_removed == size > 0
    assert f"removed 2 abandoned staging dir(s), {size} bytes" in out
    assert listing(lm) == others  # nothing else touched
    assert committed(lm) == values("b0")


def test_a_shorter_expiration_is_set_with_kafkas_key(any_root):
    lm = new_lm(any_root)
    name = stage(lm, W, "b0").name
    t = SYSTEM_TIME.milliseconds()
    run(lm, t + 3_600_000 + SLACK)  # an hour later, the default keeps it
    assert staging(lm) == {name}
    reps, _ = run(lm, t + 3_600_000 + SLACK, **{TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG: "3600000"})
    assert staging(lm) == set() and len(reps.staging.removed) == 1


def test_kafka_maintain_takes_the_expiration_and_says_what_it_removed(root, capsys):
    lm = new_lm(root)
    name = stage(lm, W, "b0").name
    backdate(root, name, SYSTEM_TIME.milliseconds() - 2 * 3_600_000)
    size = tree_bytes(lm, name)

    def maintain(*extra):
        rc = main(["maintain", root, "--once", *extra], stdin=io.BytesIO(b""))
        cap = capsys.readouterr()
        return rc, cap.out, cap.err

    rc, out, err = maintain()
    assert rc == 0 and staging(lm) == {name} and "staging" not in out, err
    rc, out, err = maintain("--cleaner-config", "transactional.id.expiration.ms=3600000")
    assert rc == 0 and staging(lm) == set(), err
    assert f"removed 1 abandoned staging dir(s), {size} bytes" in out
    rc, _, err = maintain("--cleaner-config", "transactional.id.expiration.ms=0")
    assert rc == 1 and "transactional.id.expiration.ms" in err
    rc, _, err = maintain("--cleaner-config", "transactional.id.expiraton.ms=5")
    assert rc == 1 and "transactional.id.expiraton.ms" in err and "known: " in err
    assert "transactional.id.expiration.ms" in err.split("known: ")[1]


# ---------------------------------------------------------------- (2) what a commit may need stays


@pytest.mark.parametrize("transactional", [True, False])
def test_young_staging_is_kept_and_commits_whole(any_root, transactional):
    lm = new_lm(any_root)
    files = [stage(lm, W, "b0", task=0), stage(lm, W, "b0", task=1)]
    reps, _ = run(lm, SYSTEM_TIME.milliseconds() + 60_000)  # a minute later: young
    assert staging(lm) == {f.name for f in files} and reps.staging.kept_live == 2
    r = commit_staged(lm, W, 0, files, transactional=transactional)
    assert r.records == 80 and committed(lm) == values("b0", "b0") and staging(lm) == set()


def test_a_writer_with_a_younger_attempt_keeps_its_old_one(root):
    """A long micro-batch: task 0 staged 8 days ago, task 1 is staging now. Both stay; the commit takes both."""
    lm = new_lm(root)
    old, young = stage(lm, W, "old", task=0), stage(lm, W, "young", task=1)
    backdate(root, old.name, SYSTEM_TIME.milliseconds() - 8 * DAY)
    dead = stage(lm, V, "dead")  # another writer, stopped 8 days ago: it goes in the same pass
    backdate(root, dead.name, SYSTEM_TIME.milliseconds() - 8 * DAY)
    reps, _ = run(lm, SYSTEM_TIME.milliseconds())
    assert staging(lm) == {old.name, young.name} and reps.staging.kept_live == 2
    assert reps.staging.removed == [lm.fs.url(lm.fs.join(root, dead.name))]
    r = commit_staged(lm, W, 0, [old, young], transactional=True)
    assert r.records == 80 and committed(lm) == values("old", "young")


@pytest.mark.parametrize("transactional", [True, False])
def test_a_commit_under_way_keeps_its_old_staging(root, monkeypatch, transactional):
    """Staging 8 days old whose commit began a moment ago (the writer's state in the first partition says so):
    a pass between that partition and the next keeps it, and the commit ends with every record."""
    lm = new_lm(root)
    files = [stage(lm, W, "b0", task=0), stage(lm, W, "b0", task=1)]
    for f in files:
        backdate(root, f.name, SYSTEM_TIME.milliseconds() - 8 * DAY)
    passes = []
    append = sc._append_pieces

    def append_then_maintain(*args, **kwargs):
        append(*args, **kwargs)
        if not passes:  # after the first partition's data, before the second's
            passes.append(expire_staging(lm, now_ms=SYSTEM_TIME.milliseconds()))

    monkeypatch.setattr(sc, "_append_pieces", append_then_maintain)
    r = commit_staged(lm, W, 0, files, transactional=transactional)
    assert len(passes) == 1 and not passes[0].removed and passes[0].kept_live == 2 and not passes[0].errors
    assert r.records == 80 and committed(lm) == values("b0", "b0")


# ---------------------------------------------------------------- (3) odd leftovers, races


def test_odd_leftovers_do_no_damage(root, tmp_path):
    lm = new_lm(root)
    old = SYSTEM_TIME.milliseconds() - 8 * DAY
    dead = stage(lm, W, "dead").name
    stray_file = staged_name(V)  # a file where a directory is expected: removed as cleanup_staged would
    with open(os.path.join(root, stray_file), "wb") as f:
        f.write(b"not a staging dir")
    empty = staged_name(43)  # a task that died between its directory and its marker
    os.mkdir(os.path.join(root, empty))
    hex32 = uuid.uuid4().hex
    unparsable = [
        f"{STAGED_PREFIX}x-{hex32}",
        f"{STAGED_PREFIX}99999999999999999999-{hex32}",  # not an int64
        f"{STAGED_PREFIX}-5-{hex32}",
        f"{STAGED_PREFIX}5-short",
        f"{STAGED_PREFIX}5-{hex32}-more",
        STAGED_PREFIX,
    ]
    for n in unparsable:
        os.makedirs(os.path.join(root, n, "t-0"))
        with open(os.path.join(root, n, "task"), "wb") as f:
            f.write(b"0\n")
    precious = tmp_path / "precious"  # a link named like a staging dir: what it points to is not ours
    precious.mkdir()
    (precious / "data").write_bytes(b"keep me")
    linked = staged_name(44)
    os.symlink(precious, os.path.join(root, linked))
    for n in [dead, stray_file, empty, *unparsable, linked]:
        backdate(root, n, old)
    os.utime(precious / "data", (old / 1000, old / 1000))
    expected = tree_bytes(lm, dead) + tree_bytes(lm, stray_file)

    buf = io.StringIO()
    reps = run_once(root, now_ms=SYSTEM_TIME.milliseconds(), out=buf)
    assert not reps.failed, buf.getvalue()
    s = reps.staging
    assert staging(lm) == {*unparsable, linked}
    assert sorted(s.removed) == sorted(lm.fs.url(os.path.join(root, n)) for n in (dead, stray_file, empty))
    assert s.bytes_removed == expected
    assert sorted(s.unrecognised) == sorted(lm.fs.url(os.path.join(root, n)) for n in unparsable)
    assert (precious / "data").read_bytes() == b"keep me"  # the link could not be removed: reported, kept
    assert len(s.errors) == 1 and linked in s.errors[0], s.errors
    assert f"staging: {s.errors[0]}" in buf.getvalue()
    for n in unparsable:
        assert os.path.isfile(os.path.join(root, n, "task"))


def test_names_parse_only_as_the_stager_writes_them():
    name = staged_name(2**63 - 1)
    assert staged_writer(name) == 2**63 - 1 and staged_writer(staged_name(0)) == 0
    for bad in (name + "x", name.upper(), name[:-1], f"{STAGED_PREFIX}٣-{uuid.uuid4().hex}", "t-0", ""):
        assert staged_writer(bad) is None, bad


@pytest.mark.parametrize("when", ["before its walk", "during its delete"])
def test_a_directory_that_vanishes_mid_pass_is_neither_counted_nor_an_error(root, monkeypatch, when):
    """A commit's cleanup (or another pass) removes a leftover while this pass looks at it or deletes it."""
    lm = new_lm(root)
    victim, other = stage(lm, W, "a").name, stage(lm, V, "b").name
    for n in (victim, other):
        backdate(root, n, SYSTEM_TIME.milliseconds() - 8 * DAY)
    victim_path = os.path.join(root, victim)
    if when == "before its walk":
        walk = staging_expiry._walk

        def vanishing_walk(fs, path, depth):
            if path == victim_path:
                shutil.rmtree(victim_path, ignore_errors=True)
            return walk(fs, path, depth)

        monkeypatch.setattr(staging_expiry, "_walk", vanishing_walk)
    else:
        delete_dir = type(lm.fs).delete_dir

        def racing_delete_dir(fs, path):
            if path == victim_path:
                shutil.rmtree(victim_path)
                raise FileNotFoundError(path)
            return delete_dir(fs, path)

        monkeypatch.setattr(type(lm.fs), "delete_dir", racing_delete_dir)
    reps, _ = run(lm, SYSTEM_TIME.milliseconds())
    assert reps.staging.removed == [lm.fs.url(os.path.join(root, other))]
    assert staging(lm) == set() and not reps.staging.errors


# ---------------------------------------------------------------- (4) object stores


def test_object_store_staging_goes_when_abandoned_and_stays_while_needed(object_lm):
    lm = object_lm
    t0 = SYSTEM_TIME.milliseconds()
    left = {stage(lm, W, "dead", task=0).name, stage(lm, W, "dead", task=1).name}  # a stopped query's
    live = [stage(lm, V, "live", task=0), stage(lm, V, "live", task=1)]
    stray = f"{STAGED_PREFIX}{W}-{uuid.uuid4().hex}"  # an object where a prefix is expected
    lm.fs.write_atomic(lm.fs.join(lm.root, stray), b"stray", durable=False)
    odd = f"{STAGED_PREFIX}nope-{uuid.uuid4().hex}"  # no writer's name
    lm.fs.write_atomic(lm.fs.join(lm.root, odd, "task"), b"0\n", durable=False)
    assert staging(lm) == left | {f.name for f in live} | {stray, odd}

    reps, _ = run(lm, SYSTEM_TIME.milliseconds() + 60_000)  # all young: everything stays
    assert not reps.staging.removed and reps.staging.kept_live == 5
    r = commit_staged(lm, V, 0, live, transactional=True)
    assert r.records == 80 and committed(lm) == values("live", "live")
    assert staging(lm) == left | {stray, odd}
    size = sum(tree_bytes(lm, n) for n in left | {stray})
    # besides the staging, only what the pass itself expires: V's transaction files, past the same 7 days
    others = {p for p in listing(lm) if not p.startswith(STAGED_PREFIX) and "/kafkalog-txn-" not in p}

    later = SYSTEM_TIME.milliseconds() + EXP + SLACK
    run(lm, t0 + EXP - SLACK)  # W's traces are younger than that: kept
    assert staging(lm) == left | {stray, odd}
    reps, out = run(lm, later)
    assert staging(lm) == {odd}
    assert sorted(reps.staging.removed) == sorted(lm.fs.url(lm.fs.join(lm.root, n)) for n in left | {stray})
    assert reps.staging.bytes_removed == size > 0 and f"removed 3 abandoned staging dir(s), {size} bytes" in out
    assert reps.staging.unrecognised == [lm.fs.url(lm.fs.join(lm.root, odd))]
    assert {p for p in listing(lm) if not p.startswith(STAGED_PREFIX) and "/kafkalog-txn-" not in p} == others
    assert committed(lm) == values("live", "live")


def test_an_object_store_commit_under_way_keeps_its_old_staging(monkeypatch):
    """On an object store the writer's transaction file in the first partition (written as its data goes in) is
    the trace: staging objects 8 days old stay for the second partition, and the commit ends whole."""
    lm = new_lm(f"/obj-{uuid.uuid4().hex}", ObjectStoreFileSystem(fsspec.filesystem("memory")))
    files = [stage(lm, W, "b0", task=0), stage(lm, W, "b0", task=1)]
    old = datetime.fromtimestamp((SYSTEM_TIME.milliseconds() - 8 * DAY) / 1000, tz=timezone.utc)
    store = fsspec.filesystem("memory").store
    backdated = [k for k in store if lm.root.strip("/") in k and f"/{STAGED_PREFIX}" in k]
    for k in backdated:  # (the memory store's only time is its creation time)
        store[k].created = old
    assert len(backdated) >= 4
    passes = []
    data = sc._transaction_data_immutable

    def data_then_maintain(*args, **kwargs):
        got = data(*args, **kwargs)
        if not passes:  # after the first partition's data, before the second's
            passes.append(expire_staging(lm, now_ms=SYSTEM_TIME.milliseconds()))
        return got

    monkeypatch.setattr(sc, "_transaction_data_immutable", data_then_maintain)
    r = commit_staged(lm, W, 0, files, transactional=True)
    assert len(passes) == 1 and not passes[0].removed and passes[0].kept_live == 2 and not passes[0].errors
    assert r.records == 80 and committed(lm) == values("b0", "b0")
