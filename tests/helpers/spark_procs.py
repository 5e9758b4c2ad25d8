"""The processes of a Spark driver started in a session of its own (start_new_session=True), and how to
SIGKILL all of them at one moment: the driver, its JVM, executor JVMs and every Python worker.
Shared by tests/spark/test_spark_kill.py and tests/spark/test_spark_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat fields after the command name: state, ppid, pgrp, session, ..."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def proc_cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def session_procs(sid: int) -> list[tuple[int, int, bytes]]:
    """(pid, process group, command line) of the live (not zombie) processes of a session."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = proc_stat(int(d))
            if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
                out.append((int(d), int(fields[2]), b" ".join(proc_cmdline(int(d)))))
        except (OSError, ValueError, IndexError):
            continue
    return out


def kill_session(proc: subprocess.Popen) -> int:
    """SIGKILL every process of the driver's session at one moment (the driver's group last), then sweep
    up any forked in between; returns how many the sweep had to kill. pyspark's worker daemons call
    setpgid, so a killpg of the driver's group alone would leave them running on: a commit in flight
    would finish."""
    groups = {g for _, g, _ in session_procs(proc.pid)} | {proc.pid}
    for g in sorted(groups, key=lambda g: g == proc.pid):  # the workers first, the driver's group last
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    stragglers = set()
    for _ in range(400):  # a hang guard (20 s), not a timing assertion
        left = session_procs(proc.pid)  # processes still exiting, or forked in between
        if not left:
            return len(stragglers)
        for pid, g, _ in left:
            if g not in groups:
                stragglers.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"processes of the killed driver still run: {session_procs(proc.pid)}")


def run_script(path: str, *args: str, cwd, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """A Python script of the repository (an example, a benchmark) run to its end in this interpreter, with
    Spark's workers on it too (PYSPARK_PYTHON); stdout and stderr captured as text."""
    import sys

    env = {**os.environ, **(env or {}), "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, path, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
