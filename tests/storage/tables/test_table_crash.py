"""A materialization pass crashed at every one of its operations (table_kill_driver.counted_operations: data
files opened and finished, every FileIO create and delete, the catalog's commit before and after it lands,
each write of ROOT's table state, each orphan file removed), on a table that already has a snapshot, a dead
pass's files to clean up, and records of committed, aborted and open transactions to add.

After each crash, before anything else runs: the table is at its old snapshot or at the new one (the healthy
pass's offsets, one snapshot on top of the old), its rows are the model's at its offsets (none lost, none
twice, none of an aborted or open transaction) and ROOT's table state is not ahead of it. Then a pass just
short of ORPHAN_MIN_AGE_MS after the crash finishes the work (the healthy pass's offsets and rows) and leaves
the crashed pass's files alone (that pass might still be running), and a pass at ORPHAN_MIN_AGE_MS removes
every one of them that no snapshot names: the data folders then hold exactly the files the snapshots name.

The crash is a BaseException raised in place of the operation (and of every later one, on any thread), so no
handler of the pass runs on as if it were an error; the pass's pyiceberg thread pool is drained before the
root is looked at.
"""

from __future__ import annotations

import collections
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.utils.concurrent import ExecutorFactory  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.tables.materializer import materialize_topic  # noqa: E402
from storage.tables.table_state import ORPHAN_MIN_AGE_MS, read_state  # noqa: E402
from tests.helpers.table_model import DAY, T0, TopicModel, Workload  # noqa: E402
from tests.storage.tables.table_kill_driver import (  # noqa: E402
    COMMIT,
    COMMIT_LANDED,
    Counter,
    assert_equals_model,
    counted_operations,
    data_files_on_disk,
    load_table,
    op_kind,
    referenced_files,
    table_offsets,
)

TOPIC = "t"
PARTITIONS = 2
NOW = T0 + 30 * DAY  # the first passes; the crashed one runs ORPHAN_MIN_AGE_MS later
CRASH_NOW = NOW + ORPHAN_MIN_AGE_MS


class Crash(BaseException):
    """The pass's process dies here: not an Exception, so nothing on the way up handles it as an error."""


class Crasher:
    """A tick that records operations and raises Crash at operation `crash_at` (or at the first whose label
    is `crash_on`), and at every operation after it, on any thread."""

    def __init__(self, crash_at: int | None = None, crash_on: str | None = None):
        self.crash_at, self.crash_on = crash_at, crash_on
        self.ops: list[str] = []
        self.crashed_at: str | None = None
        self._lock = threading.Lock()

    def __call__(self, label: str) -> None:
        with self._lock:
            if self.crashed_at is not None:
                raise Crash(f"after the crash: {label}")
            if len(self.ops) == self.crash_at or label == self.crash_on:
                self.crashed_at = label
                raise Crash(f"operation {len(self.ops)}: {label}")
            self.ops.append(label)


def crashing_pass(lm, crasher: Crasher, now_ms: int) -> None:
    """A pass that must die at the crasher's operation, on a thread pool of its own, drained after: no
    operation of it runs on once this returns."""
    pool = ThreadPoolExecutor(4, thread_name_prefix="crashed-pass")
    saved = ExecutorFactory._instance, ExecutorFactory._instance_pid
    ExecutorFactory._instance, ExecutorFactory._instance_pid = pool, os.getpid()
    try:
        with counted_operations(crasher), pytest.raises(Crash):
            materialize_topic(lm, TOPIC, now_ms=now_ms)
    finally:
        pool.shutdown(wait=True)
        ExecutorFactory._instance, ExecutorFactory._instance_pid = saved
    assert crasher.crashed_at is not None


def restore(template: str, root: str) -> None:
    shutil.rmtree(root)
    shutil.copytree(template, root)


def build(tmp_path, mode: str, partition_by: str, seed: int, json_values: bool):
    """ROOT with a table at its first snapshot, a dead pass's files (written, never committed: it crashed
    at its first catalog commit) and records since, of plain batches and transactions committed, aborted and
    left open. Returns (root, model, a copy of ROOT to start each crash from)."""
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    config = {"table.mode": mode, "table.partition.by": partition_by}
    if mode == "upsert":
        config["cleanup.policy"] = "compact"
    if json_values:  # the workload's values are not JSON: each one that is not null is an errors table row
        config.update({"table.value.format": "json", "table.value.schema": "a INT"})
    lm.create_topic(TOPIC, PARTITIONS, config)
    model = TopicModel(TOPIC, PARTITIONS)
    work = Workload(lm, model, seed, keys=6)
    for _ in range(6):
        work.step()
    work.close_transactions()
    rep = materialize_topic(lm, TOPIC, now_ms=NOW)
    assert rep.committed, rep.line()
    for _ in range(3):
        work.step()
    dead = Crasher(crash_on=COMMIT)
    crashing_pass(lm, dead, NOW)  # a dead pass: its files stay until a pass runs ORPHAN_MIN_AGE_MS later
    for _ in range(2):
        work.step()
    work.transactional_batch(0, 2)
    work.end_transaction(0, "abort")
    work.transactional_batch(1, 2)
    work.end_transaction(1, "commit")
    work.plain_batch(1, 3)
    work.transactional_batch(1, 2)  # left open: holds partition 1 at its first offset
    work.plain_batch(0, 3)
    assert set(model.outcome.values()) == {"commit", "abort"}
    template = str(tmp_path / "template")
    shutil.copytree(root, template)
    return root, model, template


class Tables:
    """The topic's table and, with a JSON value format, its errors table, as the catalog has them now."""

    def __init__(self, lm, json_values: bool):
        self.table = load_table(lm, TOPIC)
        self.errors = load_table(lm, TOPIC, errors=True) if json_values else None

    def snapshot_id(self) -> int:
        return self.table.current_snapshot().snapshot_id

    def error_offsets(self) -> dict[int, int] | None:
        return table_offsets(self.errors) if self.errors is not None else None

    def referenced(self) -> set[str]:
        return referenced_files(self.table) | (referenced_files(self.errors) if self.errors is not None else set())


def check_errors_table(errors, model, where: str) -> int:
    """The errors table holds one row per committed record with a value below its own offsets (none of the
    workload's values is JSON), none twice. Returns its row count."""
    offsets = table_offsets(errors)
    t = errors.scan().to_arrow()
    got = sorted(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), strict=True))
    want = sorted((r.partition, r.offset) for r in model.committed(offsets) if r.value is not None)
    assert got == want, f"{where}: the errors table at {offsets}: {len(got)} rows, {len(want)} expected"
    return len(got)


@pytest.mark.parametrize(
    "mode,partition_by,seed,json_values",
    [("append", "day", 5, False), ("upsert", "month", 6, False), ("append", "none", 7, True)],
    ids=["append", "upsert", "append-json-errors-table"],
)
def test_a_crash_at_every_operation_of_a_pass_leaves_the_old_snapshot_or_the_new(
    tmp_path, mode, partition_by, seed, json_values
):
    root, model, template = build(tmp_path, mode, partition_by, seed, json_values)
    lm = LogManager(root)
    old = Tables(lm, json_values)
    old_id, old_offsets, old_count = old.snapshot_id(), table_offsets(old.table), len(old.table.snapshots())
    old_rows = assert_equals_model(old.table, model, mode, "before")["rows"]
    old_errors = old.error_offsets()
    dead_files = data_files_on_disk(root) - old.referenced()
    assert dead_files  # the dead pass's

    # the healthy pass: what "new" is, and how many operations it makes
    healthy = Counter()
    with counted_operations(healthy):
        rep = materialize_topic(lm, TOPIC, now_ms=CRASH_NOW)
    assert rep.committed and rep.error is None, rep.line()
    assert rep.orphans_removed == len(dead_files)
    new = Tables(lm, json_values)
    new_offsets, new_errors = table_offsets(new.table), new.error_offsets()
    assert new_offsets != old_offsets and len(new.table.snapshots()) == old_count + 1
    new_rows = assert_equals_model(new.table, model, mode, "healthy")["rows"]
    assert data_files_on_disk(root) == new.referenced()
    if json_values:
        assert new_errors != old_errors and check_errors_table(new.errors, model, "healthy")
    total = len(healthy.ops)
    kinds = collections.Counter(op_kind(op) for op in healthy.ops)
    commits = 2 if json_values else 1
    assert kinds["remove orphan"] == len(dead_files), kinds
    assert kinds[COMMIT] == kinds[COMMIT_LANDED] == commits, kinds
    assert kinds["write_state"] == 3, kinds  # the dead pass cleaned up after, this pass begun and ended

    outcomes = collections.Counter()
    state_behind = []
    for k in range(total):
        restore(template, root)
        lm = LogManager(root)
        before = data_files_on_disk(root)
        crasher = Crasher(crash_at=k)
        crashing_pass(lm, crasher, CRASH_NOW)
        where = f"crash at operation {k}/{total} ({crasher.crashed_at})"

        # right after the crash: the old snapshot or the new one, nothing between
        now = Tables(lm, json_values)
        snap = now.table.current_snapshot()
        if snap.snapshot_id == old_id:
            outcome = "old"
            assert table_offsets(now.table) == old_offsets, where
        else:
            outcome = "new"
            assert snap.parent_snapshot_id == old_id and len(now.table.snapshots()) == old_count + 1, where
            assert table_offsets(now.table) == new_offsets, where
        got = assert_equals_model(now.table, model, mode, where)
        assert got["rows"] == (new_rows if outcome == "new" else old_rows), where
        if json_values:  # committed first: old or new too, and new whenever the table is
            errors_at = now.error_offsets()
            assert errors_at in (old_errors, new_errors) and (outcome == "old" or errors_at == new_errors), where
            check_errors_table(now.errors, model, where)
            outcome += ", errors table " + ("new" if errors_at == new_errors else "old")
        outcomes[outcome] += 1
        state = read_state(lm.fs, lm.root, TOPIC)
        assert all(state.next_offsets.get(p, 0) <= o for p, o in table_offsets(now.table).items()), (where, state)
        if crasher.crashed_at == COMMIT_LANDED and not (json_values and outcome.endswith("errors table new")):
            assert outcome == "new", where  # the commit was made; only its answer was lost
        crashed_files = (data_files_on_disk(root) - before) - now.referenced()

        # a pass just short of ORPHAN_MIN_AGE_MS later finishes the work and keeps the crashed pass's files
        rep = materialize_topic(lm, TOPIC, now_ms=CRASH_NOW + ORPHAN_MIN_AGE_MS - 1)
        assert rep.error is None, (where, rep.error)
        assert rep.committed == outcome.startswith("old"), (where, rep.line())
        now = Tables(lm, json_values)
        assert table_offsets(now.table) == new_offsets, where
        assert assert_equals_model(now.table, model, mode, where)["rows"] == new_rows, where
        if json_values:
            assert now.error_offsets() == new_errors, where
            check_errors_table(now.errors, model, where)
        assert crashed_files <= data_files_on_disk(root), f"{where}: a pass removed files of a pass that may still run"
        final_id = now.snapshot_id()

        # one at ORPHAN_MIN_AGE_MS removes them: the data folders hold exactly what the snapshots name
        rep = materialize_topic(lm, TOPIC, now_ms=CRASH_NOW + ORPHAN_MIN_AGE_MS)
        assert rep.error is None and not rep.committed, (where, rep.line())
        assert rep.orphans_removed >= len(crashed_files), where
        now = Tables(lm, json_values)
        assert now.snapshot_id() == final_id, where
        assert data_files_on_disk(root) == now.referenced(), where
        state = read_state(lm.fs, lm.root, TOPIC)
        assert state.pending == {}, (where, state)
        assert all(state.next_offsets.get(p, 0) <= o for p, o in new_offsets.items()), (where, state)
        if state.next_offsets != new_offsets:
            state_behind.append(crasher.crashed_at)
    print(
        f"\n{mode}{' (errors table)' if json_values else ''}: {total} crash points, the table after the crash: "
        f"{dict(outcomes)}; ROOT's table state left behind the table (retention waits longer) after the crash "
        f"at: {state_behind}"
    )
    assert any(o.startswith("old") for o in outcomes) and any(o.startswith("new") for o in outcomes), outcomes
    if json_values:
        assert outcomes["old, errors table new"], outcomes  # a crash between the two commits
