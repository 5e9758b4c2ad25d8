"""Materialization passes SIGKILLed at random operations: each pass runs in a process of its own
(table_kill_driver.py --serve forks one per pass), which sends itself SIGKILL just before operation k of the
pass, k drawn (seeded) from the operations a healthy run of that same pass makes (counted in this process on
ROOT as it is, which is then put back as it was). Nothing is killed on a timer: where each kill falls is
known and repeatable.

Between kills the workload appends plain batches and transactions (committed, aborted, left open), a clean
pass runs after about half of them (so the next kill finds a table that moved on), and the kills' passes run
half an ORPHAN_MIN_AGE_MS apart, so a pass also cleans up after the killed ones before it.
After every kill the table, as its catalog has it, equals the model (tests/helpers/table_model.py) at the
table's own offsets: 0 rows lost, 0 twice, 0 of an aborted or open transaction; ROOT's table state is never
ahead of it. At the end, `kafkalog table ROOT --topic T` (a clean pass, on the wall clock: long after every
killed pass) catches up to the log end, the table equals the model, and its data folders hold exactly the
files its snapshots name.

Default: 6 kills (3 append, 3 upsert). The acceptance run: `--table-kills 20` (or KAFKALOG_TABLE_KILLS=20).
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.exceptions import NoSuchTableError  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.tables.materializer import materialize_topic  # noqa: E402
from storage.tables.table_state import ORPHAN_MIN_AGE_MS, read_state  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.helpers.table_model import DAY, T0, TopicModel, Workload  # noqa: E402
from tests.storage.tables.table_kill_driver import (  # noqa: E402
    Counter,
    assert_equals_model,
    counted_operations,
    data_files_on_disk,
    load_table,
    op_kind,
    referenced_files,
)

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table_kill_driver.py")
TABLE_KILLS = 6  # split between append and upsert; the acceptance run takes 20
SEED = 20260301
TOPIC = "events"
PARTITIONS = 2
HANG_S = 600  # a hang guard for one driver process, not a timing assertion


def table_kills(config) -> int:
    return config.getoption("--table-kills") or int(os.environ.get("KAFKALOG_TABLE_KILLS", TABLE_KILLS))


def count_operations(root: str, now_ms: int) -> int:
    """The operations a healthy pass at now_ms makes on ROOT as it is; ROOT is put back as it was after."""
    backup = root + ".before-count"
    shutil.copytree(root, backup)
    try:
        counter = Counter()
        with counted_operations(counter):
            rep = materialize_topic(LogManager(root), TOPIC, now_ms=now_ms)
        assert rep.error is None, rep.error
    finally:
        shutil.rmtree(root)
        os.rename(backup, root)
    return len(counter.ops)


class Driver:
    """table_kill_driver.py --serve: each pass in a process of its own, forked from one that imported once."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        with open(log_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, DRIVER, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=REPO
            )
        self.buf = b""

    def _line(self) -> str:
        deadline = time.monotonic() + HANG_S
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            assert ready, f"hang: the driver said nothing in {HANG_S}s:\n{self.log()}"
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            assert chunk, f"the driver exited {self.proc.wait()}:\n{self.log()}"
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def run(self, root: str, now_ms: int, kill_at: int) -> tuple[list[str], dict]:
        """A pass in a process of its own, SIGKILLed before operation kill_at (-1: never): (what it printed,
        how it ended)."""
        req = {"root": root, "topic": TOPIC, "now_ms": now_ms, "kill_at": kill_at}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        lines = []
        while True:
            line = self._line()
            if line.startswith('{"status"'):
                return lines, json.loads(line)
            lines.append(line)

    def killed_pass(self, root: str, now_ms: int, kill_at: int) -> str:
        """A pass whose process SIGKILLs itself before operation kill_at; what it was killed at."""
        lines, status = self.run(root, now_ms, kill_at)
        assert status == {"status": "killed", "signal": signal.SIGKILL}, (
            f"the pass was to kill itself at operation {kill_at}: {status}\n" + "\n".join(lines) + "\n" + self.log()
        )
        m = re.match(r"kill at (\d+): (.*)$", lines[-1] if lines else "")
        assert m is not None and int(m.group(1)) == kill_at, lines
        return m.group(2)

    def clean_pass(self, root: str, now_ms: int) -> dict:
        lines, status = self.run(root, now_ms, -1)
        assert status == {"status": "exited", "code": 0}, "\n".join(lines) + "\n" + self.log()
        return json.loads(lines[-1])

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-3000:]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=HANG_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = Driver(str(tmp_path_factory.mktemp("table-kill") / "driver.log"))
    try:
        yield d
    finally:
        d.close()


def current_table(lm):
    try:
        return load_table(lm, TOPIC)
    except NoSuchTableError:  # killed before its first pass made it
        return None


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_passes_killed_at_random_operations_leave_the_table_equal_to_the_model(tmp_path, mode, pytestconfig, driver):
    total = table_kills(pytestconfig)
    kills = (total + 1) // 2 if mode == "append" else total // 2
    if kills == 0:
        pytest.skip(f"--table-kills {total}: none for {mode}")
    rng = random.Random(f"{SEED}-{mode}")
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    config = {"table.mode": mode}
    if mode == "upsert":
        config["cleanup.policy"] = "compact"
    lm.create_topic(TOPIC, PARTITIONS, config)
    model = TopicModel(TOPIC, PARTITIONS)
    work = Workload(lm, model, rng.randrange(1 << 30), keys=10)
    start = T0 + 60 * DAY
    report, outcomes, kinds = [], collections.Counter(), collections.Counter()
    for i in range(kills):
        for _ in range(rng.randrange(4, 16)):
            work.step()
        if i % 3 == 2:
            work.close_transactions()
        now = start + i * (ORPHAN_MIN_AGE_MS // 2)  # a pass finds the killed passes two rounds back dead
        before = current_table(lm)
        before_id = before.current_snapshot().snapshot_id if before is not None and before.current_snapshot() else None
        ops = count_operations(root, now)
        k = rng.randrange(ops)
        at = driver.killed_pass(root, now, k)
        kinds[op_kind(at)] += 1
        lm = LogManager(root)
        table = current_table(lm)
        where = f"kill {i + 1} ({mode}) at operation {k}/{ops}: {at}"
        if table is None or table.current_snapshot() is None:
            outcome, d = "no snapshot yet", {"offsets": {}, "rows": 0}
        else:
            d = assert_equals_model(table, model, mode, where)
            outcome = "old snapshot" if table.current_snapshot().snapshot_id == before_id else "new snapshot"
            state = read_state(lm.fs, lm.root, TOPIC)
            if state is not None:
                assert all(state.next_offsets.get(p, 0) <= o for p, o in d["offsets"].items()), (where, state)
        outcomes[outcome] += 1
        report.append(f"{where} -> {outcome}, offsets {d['offsets']}, {d['rows']} rows: 0 lost, 0 twice, 0 aborted")
        if rng.random() < 0.5:  # a pass that is not killed: the next kills find a table that moved on
            done = driver.clean_pass(root, now)
            assert done["error"] is None, done
            table = load_table(lm, TOPIC)
            d = assert_equals_model(table, model, mode, f"the clean pass after kill {i + 1}")
            report.append(
                f"  then a clean pass: {'committed' if done['committed'] else 'nothing to commit'}, "
                f"offsets {d['offsets']}, {d['rows']} rows"
            )

    # the end: every transaction ended, more records, and a clean pass by the CLI
    work.close_transactions()
    for _ in range(5):
        work.step()
    work.close_transactions()
    proc = subprocess.run(
        [sys.executable, "-m", "kafkalog_ds", "table", root, "--topic", TOPIC],
        capture_output=True,
        timeout=HANG_S,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()[-3000:]
    lm = LogManager(root)
    table = load_table(lm, TOPIC)
    d = assert_equals_model(table, model, mode, "after the clean pass")
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            assert d["offsets"][p] == log.log_end_offset, (p, d["offsets"])
    assert data_files_on_disk(root) == referenced_files(table)
    state = read_state(lm.fs, lm.root, TOPIC)
    assert state.pending == {} and state.next_offsets == d["offsets"], state
    print(
        f"\n{mode}: {kills} passes SIGKILLed ({dict(outcomes)}; killed at {dict(kinds)}), then a clean pass: "
        f"{d['rows']} rows at offsets {d['offsets']}, 0 lost, 0 twice, 0 from aborted transactions\n"
        + "\n".join(report)
    )
