"""Kill -9 of the Spark driver at random moments of a streaming write, then restart from the same
checkpoint: every source row is in the log exactly once. The default suite kills 3 times (each kill mode
once); the issue's acceptance run is 20 kills: `--kill-rounds 20` (or KAFKALOG_KILL_ROUNDS=20).

tests/spark/spark_kill_driver.py runs the query in a session of its own; every process of it (driver, JVM,
Python workers) is SIGKILLed at one moment, a random time after the run's first micro-batch commit
or on seeing a write or commit under way. Between runs the files on disk tell which phase each
kill hit. kafka-python reads the result.
"""

import collections
import json
import os
import pathlib
import random
import struct
import subprocess
import sys
import time

import pytest
from kafka.partitioner.default import murmur2  # kafka-python's port of the Java client's hash

from storage.log_manager import LogManager
from storage.staging.staged_commit import STAGED_PREFIX
from storage.topic_partition import TopicPartition
from storage.transactions.writer_state import STATE_FILE
from tests.helpers import REPO
from tests.helpers.kafka_reference import kp_committed, kp_parse
from tests.helpers.spark_procs import kill_session, session_procs
from tests.spark import spark_kill_driver as driver

pytestmark = [pytest.mark.spark, pytest.mark.long]

KILL_ROUNDS = 3  # each mode once; about 17 s a round (a driver start); the acceptance run takes 20
SEED = 20240611
MAX_KILL_DELAY_S = 3.0  # after the run's first commit: lands in write(), commit, between them, idle
AHEAD_FILES = 14  # input files written ahead of the last commit before each run
START_TIMEOUT_S = 600  # generous: JVM start on a busy 2-core machine; a hang, not a timing assertion
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_kill_driver.py")
PROJECT = REPO


def kill_rounds(config) -> int:
    return config.getoption("--kill-rounds") or int(os.environ.get("KAFKALOG_KILL_ROUNDS", KILL_ROUNDS))


def read_bytes(path: str) -> bytes:
    return pathlib.Path(path).read_bytes()


def writers_of(partition_dir: str) -> dict:
    """The partition's writer state as stored (json), {} when it has none."""
    path = os.path.join(partition_dir, STATE_FILE)
    return json.loads(read_bytes(path))["writers"] if os.path.exists(path) else {}


def batch_ids(path: str) -> set:
    return {int(f) for f in os.listdir(path) if f.isdigit()} if os.path.isdir(path) else set()


def walk_log(path: str) -> tuple[int, int]:
    """(bytes past the last whole batch, next offset after it) of a .log file, walking batchLength fields."""
    data = read_bytes(path)
    pos, next_offset = 0, -1
    while pos + 27 <= len(data):
        size = 12 + struct.unpack_from(">i", data, pos + 8)[0]
        if pos + size > len(data):
            break
        next_offset = struct.unpack_from(">q", data, pos)[0] + struct.unpack_from(">i", data, pos + 23)[0] + 1
        pos += size
    return len(data) - pos, next_offset


def disk_state(root: str, ckpt: str) -> dict:
    """What a kill left behind: Spark's offset/commit logs, staging files, writer state, torn tails."""
    offsets, commits = batch_ids(os.path.join(ckpt, "offsets")), batch_ids(os.path.join(ckpt, "commits"))
    state = {
        "last_offset": max(offsets, default=-1),
        "last_commit": max(commits, default=-1),
        "staged": sorted(f for f in os.listdir(root) if f.startswith(STAGED_PREFIX)) if os.path.isdir(root) else [],
        "partitions": {},
    }
    for p in range(driver.PARTITIONS):
        d = os.path.join(root, f"{driver.TOPIC}-{p}")
        if not os.path.isdir(d):
            continue
        writers = writers_of(d)
        assert len(writers) <= 1, f"one query, one writer id: {writers}"
        entry = next(iter(writers.values()), {"committed_batch_id": -1, "pending": None})
        walks = [walk_log(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".log")]
        state["partitions"][p] = {
            "committed": entry["committed_batch_id"],
            "pending": entry["pending"],
            "torn_bytes": sum(w[0] for w in walks),
            "log_end": max([w[1] for w in walks] + [0]),
        }
    return state


def phase(state: dict, earlier_staged: set) -> str:
    """Name the moment a kill hit, from what it left on disk."""
    batch = state["last_offset"]
    if batch <= state["last_commit"]:
        return "idle: between micro-batches"
    parts = state["partitions"].values()
    done = sum(1 for s in parts if s["committed"] >= batch)
    pending = [s for s in parts if s["pending"]]
    if pending:
        s = pending[0]
        first, end = s["pending"]["first_offset"], s["pending"]["next_offset"]
        if s["log_end"] >= end:
            return "commit: pending, all bytes appended (recovery completes it)"
        if s["log_end"] > first or s["torn_bytes"]:
            return "commit: pending, part appended (recovery rolls it back)"
        return "commit: pending, nothing appended yet (recovery drops it)"
    if done == len(state["partitions"]) and done:
        return "after the sink commit, before Spark's commit log"
    if done:
        return "commit: between partitions"
    if set(state["staged"]) - earlier_staged:
        return "write(): staging files written, commit not begun"
    return "batch started (planning or write()), nothing staged yet"


MODES = ("random", "in write", "in commit")


def pending_commit(root: str) -> bool:
    for p in range(driver.PARTITIONS):
        try:
            writers = writers_of(os.path.join(root, f"{driver.TOPIC}-{p}"))
        except (OSError, ValueError):
            continue
        if any(e["pending"] for e in writers.values()):
            return True
    return False


def wait_for_moment(mode: str, rng: random.Random, root: str, proc) -> float:
    """Wait, from the run's first commit, for a kill moment; returns the seconds waited.

    random: a uniform delay, landing anywhere. in write: just after a new staging file appears (a
    task is in write(), or done and the commit not begun). in commit: as soon as a partition has a
    pending commit (its bytes are being appended), or just after. Polling may miss a short window;
    then the kill lands wherever it is, MAX_KILL_DELAY_S at most after the first commit."""
    t0 = time.monotonic()
    if mode == "random":
        time.sleep(rng.uniform(0, MAX_KILL_DELAY_S))
        return time.monotonic() - t0
    known = set(os.listdir(root))
    while time.monotonic() - t0 < MAX_KILL_DELAY_S and proc.poll() is None:
        if mode == "in write":
            if any(f.startswith(STAGED_PREFIX) for f in set(os.listdir(root)) - known):
                time.sleep(rng.uniform(0, 0.1))  # the task ends and the commit begins ~0.1 s later
                break
        elif pending_commit(root):
            time.sleep(rng.uniform(0, 0.03))  # a partition's commit takes ~10-30 ms
            break
        time.sleep(0.002)
    return time.monotonic() - t0


def start(root, ckpt, n_rows, input_dir, log_path):
    out = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, DRIVER, root, ckpt, str(n_rows), input_dir],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=PROJECT,
    )
    out.close()
    return proc


def tail(path, n=40):
    lines = read_bytes(path).decode(errors="replace").splitlines()
    return "\n".join(lines[-n:])


def read_partition(root, p):
    d = os.path.join(root, f"{driver.TOPIC}-{p}")
    data = b"".join(read_bytes(os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".log"))
    return kp_parse(data), len(data)


def test_kill_driver_at_random_moments_then_restart_every_row_once(tmp_path, pytestconfig):
    rounds = kill_rounds(pytestconfig)
    rng = random.Random(SEED)
    # every mode once, then every mode again (each pass in a seeded order), then modes drawn at random,
    # random twice as often
    first = rng.sample(MODES, len(MODES)) + rng.sample(MODES, len(MODES))
    root, ckpt, input_dir = str(tmp_path / "logs"), str(tmp_path / "ckpt"), str(tmp_path / "input")
    # Input files arrive as the query goes (one per micro-batch), AHEAD_FILES past the last commit:
    # a run makes at most ~1 + MAX_KILL_DELAY_S / 0.5 s batches before its kill, so none runs dry
    # before it, and the final run has little left to do.
    n_rows = 0

    phases = collections.Counter()
    modes = collections.Counter()
    recoveries = collections.Counter()
    staged_seen = set()
    stragglers = 0
    report = []
    for rnd in range(rounds + 1):
        log_path = str(tmp_path / f"driver-{rnd}.log")
        commits_before = batch_ids(os.path.join(ckpt, "commits"))
        n_rows = max(n_rows, (max(commits_before, default=-1) + 1 + AHEAD_FILES) * driver.ROWS_PER_FILE)
        driver.write_input(input_dir, n_rows)
        proc = start(root, ckpt, n_rows, input_dir, log_path)
        final = rnd == rounds
        try:
            if final:
                rc = proc.wait(timeout=START_TIMEOUT_S * 2)
                assert rc == 0, f"final run exited {rc}:\n{tail(log_path)}"
            else:
                deadline = time.monotonic() + START_TIMEOUT_S
                while not batch_ids(os.path.join(ckpt, "commits")) - commits_before:
                    assert proc.poll() is None, (
                        f"round {rnd}: driver exited {proc.returncode} before its first commit:\n{tail(log_path)}"
                    )
                    assert time.monotonic() < deadline, (
                        f"round {rnd}: no commit in {START_TIMEOUT_S}s:\n{tail(log_path)}"
                    )
                    time.sleep(0.02)
                mode = first[rnd] if rnd < len(first) else rng.choices(MODES, weights=[2, 1, 1])[0]
                delay = wait_for_moment(mode, rng, root, proc)
                modes[mode] += 1
                assert proc.poll() is None, f"round {rnd}: the driver finished before its kill; more input needed"
                stragglers += kill_session(proc)
        finally:
            if proc.poll() is None or session_procs(proc.pid):
                kill_session(proc)
        out = read_bytes(log_path).decode(errors="replace")
        for word in ("completed batch", "rolled back a partial commit", "dropped pending batch"):
            recoveries[word] += out.count(word)
        if final:
            break
        state = disk_state(root, ckpt)
        what = phase(state, staged_seen)
        staged_seen |= set(state["staged"])
        phases[what] += 1
        torn = sum(s["torn_bytes"] for s in state["partitions"].values())
        report.append(
            f"kill {rnd + 1:2d} ({mode}, +{delay:4.2f}s): batch {state['last_offset']}, last commit "
            f"{state['last_commit']}, {what}" + (f", {torn} torn bytes" if torn else "")
        )

    # An independent reader over every .log file: every CRC valid, offsets dense (data, aborted data and
    # transaction markers), each row once in what a read_committed consumer is given, no transaction open.
    values = collections.Counter()
    lm = LogManager(root)
    for p in range(driver.PARTITIONS):
        batches, size = read_partition(root, p)
        assert sum(b["size"] for b in batches) == size, f"partition {p}: bytes past the last batch"
        assert all(b["crc_ok"] for b in batches), f"partition {p}: bad CRC"
        offsets = [r[0] for b in batches for r in b["records"]]
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets are not dense"
        committed, still_open = kp_committed(batches)
        assert not still_open, f"partition {p}: {len(still_open)} records of a transaction left open"
        for _, _, key, value, _ in committed:  # the driver's key: null for every 5th row, else id % 11
            i = int(value)
            assert key == (None if i % 5 == 0 else str(i % 11).encode()), f"partition {p}: row {i} key {key}"
            if key is not None:
                assert (murmur2(key) & 0x7FFFFFFF) % driver.PARTITIONS == p, f"row {i} in partition {p}"
            values[i] += 1
        with lm.open_log(TopicPartition(driver.TOPIC, p)) as log:
            assert log.log_end_offset == len(offsets)
            read = log.read_records(log.log_start_offset, isolation_level="read_committed")
            assert sum(b.num_rows for b in read) == len(committed)
    twice = sorted(v for v, c in values.items() if c > 1)
    missing = sorted(set(range(n_rows)) - set(values))
    extra = sorted(set(values) - set(range(n_rows)))
    final_state = disk_state(root, ckpt)
    summary = (
        f"\n{rounds} kills, {final_state['last_commit'] + 1} micro-batches committed, {n_rows} rows\n"
        + "\n".join(report)
        + f"\nkill modes: {dict(modes)}\nphases: {dict(phases)}"
        + f"\nrecovery actions logged by drivers: {dict(recoveries)}"
        + f"\nprocesses forked after the kill volley (killed by the sweep): {stragglers}"
    )
    print(summary)
    assert not twice and not missing and not extra, (
        f"{len(twice)} rows twice (first {twice[:10]}), {len(missing)} missing (first {missing[:10]}), "
        f"extra {extra[:10]}{summary}"
    )
    assert not final_state["staged"], f"staging files left: {final_state['staged']}"
    assert all(s["pending"] is None for s in final_state["partitions"].values())
