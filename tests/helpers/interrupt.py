"""Ctrl-C as a terminal delivers it: SIGINT to the whole foreground process group of a command, at a moment
chosen by a condition on its output or its files; then what it printed after, and whether every process it
started (the JVM and Spark's Python workers included) has gone."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kafkalog_ds.local_spark import _children

BOUND_S = 900  # a bound for a broken run on a busy machine, not a schedule: every wait is on a condition


@dataclass
class Interrupted:
    rc: int
    before: list[str]  # output lines up to the signal
    after: list[str]  # output lines after it
    left: list[str] = field(default_factory=list)  # processes still alive after the command ended: "pid comm"


def _alive(pid: int) -> str | None:
    """`comm` of a live (not zombie) process, else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
    return None if rest.startswith("Z") else name


def interrupt_at(cmd: list[str], moment: Callable[[list[str], set[int]], bool], *, env=None, cwd=None) -> Interrupted:
    """Run cmd in a process group of its own, send SIGINT to the group when moment(lines so far, pids of its
    processes) holds, and wait for it to end and for all its processes to go."""
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env, cwd=cwd
    )
    lines: list[str] = []
    family: set[int] = {p.pid}
    done = threading.Event()

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
        done.set()

    def watch() -> None:  # every process it starts, whoever becomes its parent later
        while not done.is_set():
            family.update(_children(p.pid))
            time.sleep(0.05)

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=watch, daemon=True).start()
    began = time.monotonic()
    while not moment(list(lines), set(family)):
        if p.poll() is not None or time.monotonic() - began > BOUND_S:
            p.kill()
            raise AssertionError(f"the moment never came (exit {p.returncode}); output:\n" + "\n".join(lines[-40:]))
        time.sleep(0.05)
    family.update(_children(p.pid))
    mark = len(lines)
    os.killpg(p.pid, signal.SIGINT)
    rc = p.wait(timeout=BOUND_S)
    done.wait(BOUND_S)
    began = time.monotonic()
    while any(_alive(pid) for pid in family) and time.monotonic() - began < 120:
        time.sleep(0.2)
    left = [f"{pid} {_alive(pid)}" for pid in sorted(family) if _alive(pid)]
    for pid in family:  # never leave them to the next test
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return Interrupted(rc, lines[:mark], lines[mark:], left)


def has_java(pids: set[int]) -> bool:
    return any(_alive(pid) == "java" for pid in pids)


def noise(lines: list[str]) -> list[str]:
    """Lines a user should never see after a Ctrl-C: tracebacks, Java stack frames, Spark's log lines."""
    signs = ("Traceback", "Exception", "Error:", "\tat ", "    at ", "ERROR", "WARN", "py4j")
    return [ln for ln in lines if any(s in ln for s in signs)]
